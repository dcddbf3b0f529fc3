//go:build !idemkv_testhooks

package api_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/internal/testhooks"
)

// In the production build the debug endpoints of the test build do not exist: no
// request can switch a sabotage on, offset the clock or inject a storage fault.
func TestProductionBuildHasNoDebugEndpoints(t *testing.T) {
	h := api.New(api.Config{Store: &FakeStore{}}).Handler()
	for _, r := range []*http.Request{
		httptest.NewRequest(http.MethodGet, testhooks.PathHooks, nil),
		httptest.NewRequest(http.MethodGet, testhooks.PathStateHash, nil),
		httptest.NewRequest(http.MethodGet, testhooks.PathFaults, nil),
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusNotFound {
			t.Errorf("%s answered %d in the production build", r.URL.Path, w.Code)
		}
	}
}
