package api_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/api"
)

// hostileServer serves the API over a real socket through NewHTTPServer, with its
// header and body timeouts shortened so that the test runs quickly.
func hostileServer(t *testing.T, fake *FakeStore) string {
	t.Helper()
	srv := api.NewHTTPServer("127.0.0.1:0", api.New(api.Config{Store: fake}).Handler())
	srv.ReadHeaderTimeout = 300 * time.Millisecond
	srv.ReadTimeout = 600 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// dribble writes chunks one by one with a pause between them until the server hangs
// up, and reports how long the connection lasted and what the server answered.
func dribble(t *testing.T, addr string, head string, chunks []string, pause time.Duration) (time.Duration, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	answer := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(conn)
		answer <- string(b)
	}()
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	for _, c := range chunks {
		select {
		case a := <-answer:
			return time.Since(start), a
		case <-time.After(pause):
		}
		if _, err := io.WriteString(conn, c); err != nil {
			// The server closed the connection under us.
			break
		}
	}
	select {
	case a := <-answer:
		return time.Since(start), a
	case <-time.After(10 * time.Second):
		t.Fatal("the server kept a dribbling connection open for 10 s after the last byte")
		return 0, ""
	}
}

func TestSlowHeadersAreCutOff(t *testing.T) {
	fake := &FakeStore{}
	addr := hostileServer(t, fake)
	headers := make([]string, 40)
	for i := range headers {
		headers[i] = fmt.Sprintf("X-Slow-%d: %d\r\n", i, i)
	}
	// Forty header lines, one every 100 ms: 4 s if the server waited for them all.
	took, answer := dribble(t, addr, "POST /v1/reserve HTTP/1.1\r\nHost: idemkv\r\n", headers, 100*time.Millisecond)
	if took > 2*time.Second {
		t.Fatalf("a slowloris client held the connection for %s; the header timeout is 300 ms", took)
	}
	if answer != "" && !strings.HasPrefix(answer, "HTTP/1.1 408") {
		t.Fatalf("answer to a request whose headers never ended: %q", answer)
	}
	if fake.Calls() != 0 {
		t.Fatalf("a request with unfinished headers reached the store")
	}
}

func TestSlowBodiesAreCutOff(t *testing.T) {
	fake := &FakeStore{}
	addr := hostileServer(t, fake)
	body := `{"tenant":"acme","idempotency_key":"k","tool":"t","effect_fingerprint":"sha256:00"}`
	head := fmt.Sprintf("POST /v1/reserve HTTP/1.1\r\nHost: idemkv\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	chunks := strings.Split(body, "")
	took, answer := dribble(t, addr, head, chunks, 100*time.Millisecond)
	if took > 3*time.Second {
		t.Fatalf("a client sending its body a byte at a time held the connection for %s", took)
	}
	if answer != "" {
		resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(answer)), nil)
		if err != nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("answer to a body cut off by the read timeout: %v %q", err, answer)
		}
	}
	if fake.Calls() != 0 {
		t.Fatalf("a request with an unfinished body reached the store")
	}
}

func TestOversizedHeadersAreRefused(t *testing.T) {
	fake := &FakeStore{}
	addr := hostileServer(t, fake)
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/records/acme/k", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Big", strings.Repeat("a", 200<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		// The server may hang up before the client finished sending.
		if !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "connection reset") && !strings.Contains(err.Error(), "broken pipe") {
			t.Fatal(err)
		}
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("200 KiB of headers: %s", resp.Status)
		}
	}
	if fake.Calls() != 0 {
		t.Fatalf("a request with 200 KiB of headers reached the store")
	}
}
