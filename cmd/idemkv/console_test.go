package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func getText(t *testing.T, u string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// TestServeMountsTheConsole: idemkv serve serves the console at /ui/ beside the API,
// feeds its conflict ring from the reserves it answers, and --no-console leaves /ui
// to the API (a 404 in its error shape).
func TestServeMountsTheConsole(t *testing.T) {
	p := newProc(t, "n1", "")
	p.start()
	p.waitReady()
	base := "http://" + p.httpAddr
	status, h, body := getText(t, base+"/ui/")
	if status != http.StatusOK || !strings.Contains(body, `id="auth-off"`) || !strings.Contains(h.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Fatalf("/ui/: %d, CSP %q\n%s", status, h.Get("Content-Security-Policy"), body)
	}
	reserve := func(title string) string {
		code, b := call(t, http.MethodPost, p.httpAddr, "/v1/reserve", map[string]any{
			"tenant": "acme", "idempotency_key": "ticket-1", "tool": "create_ticket", "effect": map[string]any{"title": title}})
		if code != http.StatusOK {
			t.Fatalf("reserve: %d %s", code, b)
		}
		return string(b)
	}
	reserve("Disk full")
	if got := reserve("Disk fine"); !strings.Contains(got, `"decision":"conflict"`) {
		t.Fatalf("second reserve: %s", got)
	}
	if _, _, body := getText(t, base+"/ui/conflicts"); !strings.Contains(body, "ticket-1") || !strings.Contains(body, `class="conflict"`) {
		t.Fatalf("/ui/conflicts does not show the conflict the node answered:\n%s", body)
	}
	p.kill()

	q := newProc(t, "n2", "")
	q.extra = []string{"--no-console"}
	q.start()
	q.waitReady()
	if status, _, body := getText(t, "http://"+q.httpAddr+"/ui/"); status != http.StatusNotFound || strings.Contains(body, "<html") {
		t.Fatalf("/ui/ with --no-console: %d\n%s", status, body)
	}
}
