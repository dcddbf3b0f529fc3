package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/idemkv/idemkv"
)

// Log keys.
const (
	logKeyErr    = "err"
	logKeyMethod = "method"
	logKeyPath   = "path"
	logKeyCode   = "code"
	logKeyLeader = "leader"
)

// errorBody is the wire shape of every error (idemkv.ErrorBody, its one owner).
type errorBody = idemkv.ErrorBody

// answer writes v, or err when the store failed. A store that returns neither is a bug
// that must not reach the wire as "null".
func answer[T any](s *Server, w http.ResponseWriter, r *http.Request, v *T, err error) {
	if err == nil && v == nil {
		err = fmt.Errorf("api: the store answered %s with neither a result nor an error", r.URL.Path)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, withoutHistory(v))
}

// withoutHistory returns v, an answer, with the history of every record in it left
// out: answers carry a record's history only when GET asks for it (?history=true),
// which writes its answer itself. This is the one place answers drop it.
func withoutHistory(v any) any {
	switch a := v.(type) {
	case *idemkv.Record:
		return a.WithoutHistory()
	case *idemkv.ReserveResult:
		if a != nil && a.Record.HasHistory() {
			c := *a
			c.Record = a.Record.WithoutHistory()
			return &c
		}
	case *idemkv.ListResult:
		if a != nil {
			return &idemkv.ListResult{Records: recordsWithoutHistory(a.Records), Next: a.Next}
		}
	case *idemkv.ApprovalsResult:
		if a != nil {
			return &idemkv.ApprovalsResult{Approvals: recordsWithoutHistory(a.Approvals), Next: a.Next}
		}
	}
	return v
}

func recordsWithoutHistory(recs []*idemkv.Record) []*idemkv.Record {
	out := make([]*idemkv.Record, len(recs))
	for i, r := range recs {
		out[i] = r.WithoutHistory()
	}
	return out
}

func (s *Server) writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	writeJSON(s.log, w, r, status, v)
}

// writeJSON, writeError and writeErrorStatus are free functions of a logger, so that
// WriteError (for middleware outside any Server) needs no Server to answer.
func writeJSON(log *slog.Logger, w http.ResponseWriter, r *http.Request, status int, v any) {
	// Encode before writing anything, so that a value that cannot be encoded becomes a
	// clean 500 instead of half a body behind a 200. The Encoder writes what
	// json.Marshal does, newline added, into a pooled buffer: Marshal's copy of its
	// result and the append of the newline were two allocations of the whole answer.
	// The answers of writes are appended directly (appendAnswer), the same bytes.
	buf := answerBuffers.Get().(*bytes.Buffer)
	defer putAnswerBuffer(buf)
	if b, ok := appendAnswer(buf.AvailableBuffer(), v); ok {
		buf.Write(append(b, '\n'))
	} else if err := json.NewEncoder(buf).Encode(v); err != nil {
		writeError(log, w, r, fmt.Errorf("api: encoding the answer: %w", err))
		return
	}
	h := w.Header()
	h["Content-Type"] = contentTypeJSON
	// Answers about idempotency keys change with every write: a cache must never
	// replay one.
	h["Cache-Control"] = cacheNoStore
	w.WriteHeader(status)
	if _, err := w.Write(buf.Bytes()); err != nil {
		log.LogAttrs(r.Context(), slog.LevelDebug, "writing the answer failed",
			slog.String(logKeyPath, r.URL.Path), slog.Any(logKeyErr, err))
	}
}

// The values of the headers every JSON answer carries, shared by all answers rather
// than a slice allocated per answer by Header.Set. No one writes into a header's
// values: net/http copies them when it writes the header, and Set and Add replace or
// reallocate them.
var (
	contentTypeJSON = []string{"application/json"}
	cacheNoStore    = []string{"no-store"}
)

// answerBuffers holds the buffers answers are encoded into.
var answerBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledAnswer bounds the buffers kept: a page of large records is rare, and
// keeping its buffer would hold that much memory per pooled buffer.
const maxPooledAnswer = 64 << 10

func putAnswerBuffer(b *bytes.Buffer) {
	if b.Cap() > maxPooledAnswer {
		return
	}
	b.Reset()
	answerBuffers.Put(b)
}

// writeError writes err with the status of its wire code. Errors that wrap no sentinel
// are logged and leave the node as a generic internal error.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	writeError(s.log, w, r, err)
}

func writeError(log *slog.Logger, w http.ResponseWriter, r *http.Request, err error) {
	if idemkv.CodeOf(err) == idemkv.CodeInternal &&
		(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		// The store cut the request short without saying how far it got. A read changed
		// nothing, so it may simply be tried again; a write may have been applied, and
		// unavailable would tell the caller it certainly was not (docs/protocol.md).
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			err = fmt.Errorf("%w: the read was cancelled or timed out (%v)", idemkv.ErrUnavailable, err)
		} else {
			err = fmt.Errorf("%w: the request was cancelled or timed out, and the store did not say whether the write was applied (%v); retry with the same attempt_id",
				idemkv.ErrOutcomeUnknown, err)
		}
	}
	e := idemkv.AsError(err)
	status := idemkv.HTTPStatus(e.Code)
	level := slog.LevelDebug
	switch {
	case e.Code == idemkv.CodeInternal:
		level = slog.LevelError
	case status >= http.StatusInternalServerError:
		level = slog.LevelInfo
	}
	log.LogAttrs(r.Context(), level, "request failed",
		slog.String(logKeyMethod, r.Method), slog.String(logKeyPath, r.URL.Path),
		slog.String(logKeyCode, e.Code), slog.Any(logKeyErr, err))
	writeErrorStatus(log, w, r, status, e)
}

// writeErrorStatus is the one place an error body is written. Only a route that exists
// for other methods (405) uses a status other than that of the code.
func (s *Server) writeErrorStatus(w http.ResponseWriter, r *http.Request, status int, e *idemkv.Error) {
	writeErrorStatus(s.log, w, r, status, e)
}

func writeErrorStatus(log *slog.Logger, w http.ResponseWriter, r *http.Request, status int, e *idemkv.Error) {
	writeJSON(log, w, r, status, errorBody{Error: e})
}

// unmatched answers a request no route takes, in the error shape of the API rather
// than the mux's plain text.
func (s *Server) unmatched(w http.ResponseWriter, r *http.Request) {
	rec := &recorder{header: http.Header{}}
	s.routes.ServeHTTP(rec, r)
	switch rec.code {
	case http.StatusNotFound:
		s.writeError(w, r, idemkv.Errorf(idemkv.ErrNotFound, "no endpoint %s %s", r.Method, r.URL.Path))
	case http.StatusMethodNotAllowed:
		allow := rec.header.Get("Allow")
		w.Header().Set("Allow", allow)
		s.writeErrorStatus(w, r, http.StatusMethodNotAllowed, &idemkv.Error{
			Code:    idemkv.CodeInvalidArgument,
			Message: fmt.Sprintf("%s is not allowed on %s; use %s", r.Method, r.URL.Path, strings.TrimSpace(allow)),
		})
	default:
		// The mux's own redirects (a path to clean) pass through unchanged.
		for k, vv := range rec.header {
			w.Header()[k] = vv
		}
		w.WriteHeader(rec.code)
		_, _ = w.Write(rec.body.Bytes())
	}
}

// recorder keeps what the mux answers to an unmatched request.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.body.Write(b)
}
