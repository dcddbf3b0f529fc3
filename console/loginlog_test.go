package console_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"log/slog"

	"github.com/idemkv/idemkv/console"
	"github.com/idemkv/idemkv/internal/testlog"
)

// Anyone may post a login; a loop of bad tokens gets its refusals, and the log a line
// a second at most, with the count of those left out.
func TestRefusedLoginsAreLoggedBoundedly(t *testing.T) {
	var logs testlog.Buffer
	srv := httptest.NewServer(console.New(console.Config{API: http.NotFoundHandler(), Auth: testAuth(t),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}).Mount(http.NotFoundHandler()))
	t.Cleanup(srv.Close)
	for range 50 {
		resp, err := http.PostForm(srv.URL+"/ui/login", url.Values{"token": {"guess"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a bad token: %d, want 401", resp.StatusCode)
		}
	}
	if n := strings.Count(logs.String(), "console: login refused"); n < 1 || n > 3 {
		t.Fatalf("50 refused logins logged %d lines, want 1 to 3 (one a second):\n%s", n, logs.String())
	}
}
