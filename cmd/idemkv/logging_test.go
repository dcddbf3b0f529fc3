package main

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// With --log-format json every line the process writes is a JSON record with a real
// level: Raft's warnings, net/http's TLS handshake errors and OpenTelemetry's exporter
// errors used to bypass the logger (bare text lines) or arrive as INFO.
func TestJSONLogsAreJSONAllOfThem(t *testing.T) {
	e := newSecureEnv(t)
	p := e.proc(t, "n1", "")
	p.args = append(p.args, "--log-format", "json")
	// Spans go, soon, to a collector that refuses them: the exporter's errors must be
	// records too. (A 400 is not retried, so the error comes at once.)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no", http.StatusBadRequest)
	}))
	t.Cleanup(collector.Close)
	p.env = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL, "OTEL_BSP_SCHEDULE_DELAY=100"}
	p.start()
	e.waitReady(t, p)
	// A request with a span (health probes make none), for the exporter to send.
	if a := e.req(t, http.MethodGet, p.httpAddr, "/v1/cluster", e.tokens["admin"], nil); a.status != http.StatusOK {
		t.Fatalf("cluster: %d %s %v", a.status, a.body, a.err)
	}

	// A client that is not TLS at all: net/http logs a handshake error.
	conn, err := net.Dial("tcp", p.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = conn.Read(make([]byte, 512))
	conn.Close()

	type line struct {
		Level     string `json:"level"`
		Msg       string `json:"msg"`
		Component string `json:"component"`
	}
	waitFor(t, 30*time.Second, "a handshake error and an exporter error in the log", func() error {
		var handshake, otel bool
		for _, raw := range strings.Split(strings.TrimSpace(p.output()), "\n") {
			var l line
			if err := json.Unmarshal([]byte(raw), &l); err != nil {
				t.Fatalf("a log line that is not JSON: %q", raw)
			}
			if l.Level == "" || l.Msg == "" {
				t.Fatalf("a record without level or message: %q", raw)
			}
			if strings.Contains(l.Msg, "TLS handshake error") {
				handshake = true
				if l.Level != "WARN" || l.Component != "http" {
					t.Fatalf("handshake error as %s from %q: %q", l.Level, l.Component, raw)
				}
			}
			if l.Component == "otel" {
				otel = true
				if l.Level != "WARN" && l.Level != "ERROR" {
					t.Fatalf("exporter error as %s: %q", l.Level, raw)
				}
			}
		}
		switch {
		case !handshake:
			return errNotYet("no TLS handshake error logged")
		case !otel:
			return errNotYet("no OpenTelemetry error logged")
		}
		return nil
	})
}

type errNotYet string

func (e errNotYet) Error() string { return string(e) }
