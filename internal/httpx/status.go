// Package httpx holds the small HTTP helpers that more than one server-side package
// needs. It must stay free of idemkv's domain: no records, no Raft, no telemetry.
package httpx

import "net/http"

// StatusWriter remembers the status a handler wrote, for metrics and spans. Unwrap
// lets http.ResponseController reach the connection's writer and deadlines; Flush
// keeps streaming handlers able to flush through it.
type StatusWriter struct {
	http.ResponseWriter
	code int
}

func (w *StatusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *StatusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *StatusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Status is the status written, 200 if the handler wrote none.
func (w *StatusWriter) Status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}
