package workload

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// Only timeouts, broken connections and outcome_unknown leave an outcome unknown
// without blame; a 500 or a body that does not parse is an anomaly.
func TestClassifyAnswers(t *testing.T) {
	cases := []struct {
		status  int
		body    string
		typ     history.Type
		anomaly string
	}{
		{200, `{"decision":"execute"}`, history.OK, ""},
		{200, `{"decision":`, history.Info, AnomalyUndecodable},
		{409, `{"error":{"code":"fenced","message":"x"}}`, history.OK, ""},
		{400, `{"error":{"code":"invalid_argument","message":"x"}}`, history.Fail, ""},
		{429, `{"error":{"code":"resource_exhausted","message":"x"}}`, history.Fail, ""},
		{503, `{"error":{"code":"outcome_unknown","message":"x"}}`, history.Info, ""},
		{503, `{"error":{"code":"unavailable","message":"x"}}`, history.Fail, ""},
		{500, `{"error":{"code":"internal","message":"x"}}`, history.Info, AnomalyServerError},
		{500, `oops`, history.Info, AnomalyUndecodable},
		{403, `{"error":{"code":"permission_denied","message":"x"}}`, history.Info, AnomalyServerError},
	}
	for _, c := range cases {
		var out struct {
			Decision string `json:"decision"`
		}
		r := classify(c.status, http.StatusText(c.status), []byte(c.body), &out)
		if r.typ != c.typ || r.anomaly != c.anomaly {
			t.Errorf("%d %s: got %s/%q, want %s/%q", c.status, c.body, r.typ, r.anomaly, c.typ, c.anomaly)
		}
		kind, _ := judge(c.status, []byte(c.body))
		if kind != c.anomaly {
			t.Errorf("%d %s: the transport judged %q, want %q", c.status, c.body, kind, c.anomaly)
		}
	}
}

// The checking transport notes bad answers whoever sent the request, and hands the
// caller the body unchanged.
func TestCheckTransportNotes(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/bad") {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"error":{"code":"internal","message":"boom"}}`))
			return
		}
		_, _ = w.Write([]byte(`{"status":"pending"}`))
	}))
	defer srv.Close()
	api := NewAPI([]string{strings.TrimPrefix(srv.URL, "http://")}, time.Second)
	defer api.Close()
	var rec struct{ Status string }
	if r := api.do(t.Context(), 0, http.MethodGet, "/v1/records/t/good", nil, &rec); r.typ != history.OK || rec.Status != "pending" {
		t.Fatalf("good answer: %+v %+v", r, rec)
	}
	if r := api.do(t.Context(), 0, http.MethodGet, "/v1/records/t/bad", nil, &rec); r.anomaly != AnomalyServerError || r.code != "internal" {
		t.Fatalf("bad answer: %+v", r)
	}
	bad := api.BadAnswers()
	if len(bad) != 1 || bad[0].Kind != AnomalyServerError || bad[0].Path != "/v1/records/t/bad" {
		t.Fatalf("noted %+v", bad)
	}
}
