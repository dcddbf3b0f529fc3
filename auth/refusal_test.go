package auth_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv/auth"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSpace(l.b.String()), "\n")
}

func (l *lockedBuffer) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Len()
}

// TestUnauthenticatedFloodStaysOutOfTheLog: anyone can send requests without a token.
// 100 of them with 60 KB paths used to add 100 INFO lines and 5.9 MB to the log; now
// the log gets one line per second at most, with the path clipped and its length given,
// and the next line says how many were left out.
func TestUnauthenticatedFloodStaysOutOfTheLog(t *testing.T) {
	f, err := auth.Parse([]byte(yamlFile()))
	if err != nil {
		t.Fatal(err)
	}
	var log lockedBuffer
	a, err := auth.New(f, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("an unauthenticated request reached the API")
	})))
	t.Cleanup(srv.Close)
	long := "/v1/records/acme/" + strings.Repeat("x", 60<<10)
	send := func() {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + long)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("status %d, want 401", resp.StatusCode)
		}
	}

	start := time.Now()
	for range 100 {
		send()
	}
	flood := time.Since(start)
	lines := log.lines()
	// One line per second begun: the flood takes well under a second here, but allow
	// for a loaded machine.
	if maxLines := int(flood/time.Second) + 1; len(lines) > maxLines {
		t.Fatalf("100 refusals in %v logged %d lines (%d bytes), want at most %d", flood, len(lines), log.len(), maxLines)
	}
	if n := log.len(); n > len(lines)*1024 {
		t.Fatalf("100 refusals logged %d bytes in %d lines, want under 1 KiB a line", n, len(lines))
	}
	first := lines[0]
	for _, want := range []string{"unauthenticated request", "path_bytes=" + strconv.Itoa(len(long)), "suppressed=0", "/v1/records/acme/xxx"} {
		if !strings.Contains(first, want) {
			t.Fatalf("the first line does not say %q: %s", want, first)
		}
	}

	// The next line, once a second has passed, counts the ones left out: every refusal
	// is a line or counted in the next one.
	sent := 100
	deadline := time.Now().Add(30 * time.Second)
	for len(log.lines()) == len(lines) {
		if time.Now().After(deadline) {
			t.Fatal("no second line within 30 s of refusals")
		}
		send()
		sent++
		time.Sleep(50 * time.Millisecond) // paces the polling requests, waits for nothing
	}
	accounted := 0
	for _, line := range log.lines() {
		m := regexp.MustCompile(`suppressed=(\d+)`).FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("a line does not count what was left out: %s", line)
		}
		n, _ := strconv.Atoi(m[1])
		accounted += 1 + n
	}
	if accounted != sent {
		t.Fatalf("%d refusals, %d logged or counted as left out:\n%s", sent, accounted, strings.Join(log.lines(), "\n"))
	}
}
