//go:build idemkv_testhooks

package api_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/internal/testhooks"
)

// In the test build the hook endpoints answer like every other route: a method a hook
// does not take is a 405 naming the ones it does, not a 404.
func TestTestBuildHookEndpointsAnswerLikeRoutes(t *testing.T) {
	h := api.New(api.Config{Store: &FakeStore{}}).Handler()
	for _, tc := range []struct {
		method, path string
		code         int
		allow        string
	}{
		{http.MethodGet, testhooks.PathHooks, http.StatusOK, ""},
		{http.MethodGet, testhooks.PathTransfer, http.StatusMethodNotAllowed, "POST"},
		{http.MethodDelete, testhooks.PathFaults, http.StatusMethodNotAllowed, "GET, HEAD, POST"},
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(tc.method, tc.path, nil))
		if w.Code != tc.code || w.Header().Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d, Allow %q; want %d, Allow %q", tc.method, tc.path, w.Code, w.Header().Get("Allow"), tc.code, tc.allow)
		}
	}
}
