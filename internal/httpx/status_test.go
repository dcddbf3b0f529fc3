package httpx

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestStatusWriter(t *testing.T) {
	for _, c := range []struct {
		name    string
		handler func(w http.ResponseWriter)
		want    int
	}{
		{"nothing written", func(w http.ResponseWriter) {}, 200},
		{"body only", func(w http.ResponseWriter) { _, _ = w.Write([]byte("x")) }, 200},
		{"explicit status", func(w http.ResponseWriter) { w.WriteHeader(503) }, 503},
		{"first status wins", func(w http.ResponseWriter) { w.WriteHeader(404); w.WriteHeader(500) }, 404},
	} {
		rec := httptest.NewRecorder()
		sw := &StatusWriter{ResponseWriter: rec}
		c.handler(sw)
		if sw.Status() != c.want {
			t.Errorf("%s: status %d, want %d", c.name, sw.Status(), c.want)
		}
	}
	rec := httptest.NewRecorder()
	sw := &StatusWriter{ResponseWriter: rec}
	sw.Flush()
	if !rec.Flushed {
		t.Error("Flush did not reach the underlying writer")
	}
}
