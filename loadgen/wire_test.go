package loadgen

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// The answers the driver reads, as the server writes them and as they might be
// written: every field the driver wants must come out as encoding/json reads it.
var answerSamples = []string{
	`{"decision":"execute","fence":6,"attempt_id":"w-1","record":{"tenant":"t","status":"pending","fence":6}}`,
	`{"decision":"replay","receipt":{"remote_id":"LIN-1842","result":{"a":[1,2,{"b":"}"}],"c":"\"{"}},"record":{"fence":9}}`,
	` { "record" : { "fence" : 1 } , "fence" : 18446744073709551615 , "decision" : "recover" } `,
	`{"status":"committed","result":null,"remote_url":"https://x/\u0041?a=\"b\""}`,
	`{"decision":"conflict","conflict":{"diff":[{"path":"/a","stored":true,"received":false}]}}`,
	`{}`,
	`{"fence":-1}`,
	`{"decision":7}`,
	`{"decision":"execute","fence":1.5}`,
}

func TestMembersReadsWhatUnmarshalReads(t *testing.T) {
	for _, s := range answerSamples {
		var got, want reserveAnswer
		gotErr := decodeAnswer([]byte(s), &got)
		wantErr := json.Unmarshal([]byte(s), &want)
		if (gotErr == nil) != (wantErr == nil) || got != want {
			t.Errorf("%s: read %+v, %v; encoding/json reads %+v, %v", s, got, gotErr, want, wantErr)
		}
		var gotC, wantC commitAnswer
		gotErr = decodeAnswer([]byte(s), &gotC)
		wantErr = json.Unmarshal([]byte(s), &wantC)
		if (gotErr == nil) != (wantErr == nil) || gotC != wantC {
			t.Errorf("%s: read %+v, %v; encoding/json reads %+v, %v", s, gotC, gotErr, wantC, wantErr)
		}
	}
}

func TestMembersRefusesWhatIsNotAnObject(t *testing.T) {
	for _, s := range []string{``, `[]`, `"x"`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{"a":"b`, `{"a":{"b":1}`, `{"a":1 "b":2}`, `{a:1}`} {
		var a reserveAnswer
		if err := decodeAnswer([]byte(s), &a); err == nil {
			t.Errorf("%q: read %+v without an error", s, a)
		}
	}
}

// FuzzMembers holds the member scanner to encoding/json on whatever it accepts: an
// object both read must give the same fields.
func FuzzMembers(f *testing.F) {
	for _, s := range answerSamples {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var want reserveAnswer
		if json.Unmarshal([]byte(s), &want) != nil {
			return
		}
		var got reserveAnswer
		if err := decodeAnswer([]byte(s), &got); err != nil {
			// encoding/json matches names without regard to case and unescapes
			// them; the scanner does neither, and the server writes neither.
			return
		}
		if got != want && !strings.ContainsAny(s, `\ABCDEFGHIJKLMNOPQRSTUVWXYZ`) {
			t.Errorf("%q: read %+v; encoding/json reads %+v", s, got, want)
		}
	})
}

// A server that closes the connection after an answer, answers chunked, or names
// the leader: the driver reads each answer whole and dials again when it must.
func TestWireReadsEveryKindOfAnswer(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "headers", http.StatusBadRequest)
			return
		}
		switch r.URL.Path {
		case "/close":
			w.Header().Set("Connection", "close")
			fmt.Fprint(w, `{"status":"committed"}`)
		case "/chunked":
			w.Header().Set(idemkv.HeaderLeader, "127.0.0.1:1")
			fl := w.(http.Flusher)
			fmt.Fprint(w, `{"decision":`)
			fl.Flush()
			fmt.Fprint(w, `"replay","fence":3}`)
		default:
			fmt.Fprint(w, `{"decision":"execute","fence":2}`)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	w := newWire("tok", 5*time.Second, 2)
	t.Cleanup(w.close)
	for range 3 {
		for _, path := range []string{"/plain", "/close", "/chunked"} {
			ans, err := w.do(t.Context(), http.MethodPost, srv.URL, path, []byte(`{}`))
			if err != nil || ans.status != http.StatusOK {
				t.Fatalf("%s: %+v, %v", path, ans, err)
			}
			var a reserveAnswer
			if err := decodeAnswer(ans.body, &a); err != nil {
				t.Fatalf("%s: %q: %v", path, ans.body, err)
			}
			if path == "/chunked" && (a.Decision != idemkv.DecisionReplay || a.Fence != 3 || ans.leader != "127.0.0.1:1") {
				t.Errorf("chunked answer read as %+v, leader %q", a, ans.leader)
			}
		}
	}
	// Each /close needs a new connection; the others reuse one.
	if n := conns.Load(); n < 3 || n > 5 {
		t.Errorf("%d connections for 9 requests of which 3 close theirs", n)
	}
}

// A server that stops answering: the request ends at its timeout, as unavailable,
// and the broken connection is not reused.
func TestWireTimesOut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				// Read the request, answer the first, then fall silent.
				r := bufio.NewReader(c)
				if _, err := http.ReadRequest(r); err == nil {
					fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{\"status\":\"x\"}")
				}
				_, _ = http.ReadRequest(r)
			}()
		}
	}()
	w := newWire("", 300*time.Millisecond, 1)
	t.Cleanup(w.close)
	base := "http://" + ln.Addr().String()
	if _, err := w.do(t.Context(), http.MethodGet, base, "/a", nil); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := w.do(t.Context(), http.MethodGet, base, "/b", nil); err == nil {
		t.Fatal("a silent server answered")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the timeout took %v", d)
	}
	if n := len(w.nodes[base].idle); n != 0 {
		t.Errorf("%d broken connections kept", n)
	}
}

// A phase ends on time even when the store does not answer: the requests in flight
// are cut off at once, as net/http's were, and not counted.
func TestWireEndsWithThePhase(t *testing.T) {
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/cluster" {
			fmt.Fprintf(w, `{"leader":{"id":"n1","api_addr":%q}}`, r.Host)
			return
		}
		select { // a store that hangs
		case <-r.Context().Done():
		case <-hang:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(hang) })
	tgt, err := NewHTTPTarget(t.Context(), HTTPConfig{Endpoints: []string{srv.URL}, Tenant: "acme", Conns: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tgt.Close() })
	start := time.Now()
	rep, err := Run(t.Context(), Config{Target: tgt, Name: "idemkv", Concurrency: 64, Duration: 300 * time.Millisecond,
		Warmup: -1, Mix: Mix{New: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 1500*time.Millisecond || rep.Elapsed > 0.3 {
		t.Errorf("a 300 ms phase took %v, and measured %v s", d, rep.Elapsed)
	}
	if rep.Ops != 0 {
		t.Errorf("%d operations counted against a store that never answered", rep.Ops)
	}
}

// A kept connection that waited longer than maxIdle is closed instead of reused: the
// server may be closing it (its idle timeout is two minutes).
func TestWireDropsConnectionsIdleTooLong(t *testing.T) {
	n := &wireNode{idle: make(chan *wireConn, 2)}
	stale, staleEnd := net.Pipe()
	fresh, freshEnd := net.Pipe()
	t.Cleanup(func() { _, _, _, _ = stale.Close(), staleEnd.Close(), fresh.Close(), freshEnd.Close() })
	n.idle <- &wireConn{c: stale, idleSince: time.Now().Add(-maxIdle - time.Second)}
	n.idle <- &wireConn{c: fresh, idleSince: time.Now()}
	if c := n.take(); c == nil || c.c != fresh {
		t.Fatalf("took %+v, want the fresh connection", c)
	}
	if _, err := stale.Write([]byte("x")); err == nil {
		t.Error("the stale connection is still open")
	}
	if c := n.take(); c != nil {
		t.Fatalf("took %+v from an empty pool", c)
	}
}
