package api

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/telemetry"
)

// hopHeaders belong to one connection, not to the request or answer a proxy relays
// (RFC 9110 section 7.6.1).
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// forwardIfFollower forwards r to the leader when this node knows it is not the leader,
// and reports whether it did. Asking the store first would only fail with ErrNotLeader
// after a round through the node.
func (s *Server) forwardIfFollower(w http.ResponseWriter, r *http.Request, body []byte, wait time.Duration) bool {
	if _, isLeader := s.store.Leader(); isLeader {
		return false
	}
	s.forwardToLeader(w, r, body, wait)
	return true
}

// forwardToLeader proxies r, with body, to the leader and relays its answer. wait is
// the long-poll the leader may spend before answering.
func (s *Server) forwardToLeader(w http.ResponseWriter, r *http.Request, body []byte, wait time.Duration) {
	if r.Header.Get(HeaderForwarded) != "" {
		s.writeError(w, r, idemkv.Errorf(idemkv.ErrUnavailable,
			"this node is not the leader and the request was already forwarded once; retry"))
		return
	}
	addr, isLeader := s.store.Leader()
	switch {
	case isLeader:
		// Leadership came back between the store's refusal and now; the caller's retry
		// will find it settled one way or the other.
		s.writeError(w, r, idemkv.Errorf(idemkv.ErrUnavailable, "leadership changed while serving the request; retry"))
		return
	case addr == "":
		s.writeError(w, r, idemkv.Errorf(idemkv.ErrUnavailable, "no leader is known; retry"))
		return
	}

	ctx, cancel := context.WithTimeout(r.Context(), s.forwardTimeout+wait)
	defer cancel()
	out, err := http.NewRequestWithContext(ctx, r.Method, s.scheme+"://"+addr+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "cannot build a request to the leader",
			slog.String(logKeyLeader, addr), slog.Any(logKeyErr, err))
		s.writeError(w, r, idemkv.Errorf(idemkv.ErrUnavailable, "the leader's address %q is not usable; retry", addr))
		return
	}
	copyHeaders(out.Header, r.Header)
	// This node checked where the request came from (crossOrigin); the leader, whose
	// Host the browser never named, must not check again.
	for _, h := range []string{"Origin", "Sec-Fetch-Site", "Sec-Fetch-Mode", "Sec-Fetch-Dest", "Sec-Fetch-User"} {
		out.Header.Del(h)
	}
	telemetry.Inject(r.Context(), out.Header)
	out.Header.Set(HeaderForwarded, "1")
	// Once the request's headers are on the wire the leader may act on it, so a forward
	// that fails after that leaves a write's outcome unknown; one that never got that
	// far (no connection, a failed handshake) certainly did nothing.
	var sent atomic.Bool
	out = out.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { sent.Store(true) }}))

	resp, err := s.forward.Do(out)
	if err != nil {
		level := slog.LevelWarn
		if r.Context().Err() != nil {
			level = slog.LevelDebug // the caller left; nobody reads the answer
		}
		s.log.LogAttrs(r.Context(), level, "forwarding to the leader failed",
			slog.String(logKeyMethod, r.Method), slog.String(logKeyPath, r.URL.Path),
			slog.String(logKeyLeader, addr), slog.Any(logKeyErr, err))
		if sent.Load() && r.Method != http.MethodGet && r.Method != http.MethodHead {
			s.writeError(w, r, idemkv.Errorf(idemkv.ErrOutcomeUnknown,
				"the request reached the leader at %s but no answer came back; the write may have happened, retry with the same attempt_id", addr))
			return
		}
		s.writeError(w, r, idemkv.Errorf(idemkv.ErrUnavailable, "the leader at %s did not answer; retry", addr))
		return
	}
	defer resp.Body.Close()
	copyHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	if _, err := io.Copy(w, resp.Body); err != nil {
		// The status is out already: all that is left is to cut the connection, which
		// the caller sees as a broken body and retries. Returning would end a chunked
		// answer cleanly, and a backup relayed from a leader that died midway would
		// look complete (as the leader's own backup path aborts too).
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "relaying the leader's answer failed",
			slog.String(logKeyPath, r.URL.Path), slog.String(logKeyLeader, addr), slog.Any(logKeyErr, err))
		panic(http.ErrAbortHandler)
	}
}

// copyHeaders replaces in dst the end-to-end headers of src: everything but hop-by-hop
// headers and those the Connection header names. Authentication and trace context
// (traceparent, tracestate) travel with the rest.
func copyHeaders(dst, src http.Header) {
	skip := map[string]bool{}
	for _, h := range hopHeaders {
		skip[h] = true
	}
	for _, v := range src["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				skip[textproto.CanonicalMIMEHeaderKey(name)] = true
			}
		}
	}
	for k, vv := range src {
		if skip[k] {
			continue
		}
		dst[k] = append([]string(nil), vv...)
	}
}
