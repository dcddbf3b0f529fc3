package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/idemkv/idemkv"
)

// Backup streams a consistent backup of the whole cluster into w (GET /v1/backup, for
// the admin role) and returns how many bytes it wrote. Any node serves it (a follower
// forwards to the leader), and it holds every write acknowledged before the call. The
// stream ends in a checksummed trailer, so a restore tells a cut copy from a whole one.
//
// Like every call it moves on to another endpoint while nothing has reached w: a node
// that is down, or has no leader yet. A transfer that breaks after its first bytes is
// returned as an error with the count so far, since w cannot be rewound: start again
// with a fresh w. Config.Timeout bounds the wait for the answer to begin, and
// idemkv.MaxBackupDuration the whole transfer.
func (c *Client) Backup(ctx context.Context, w io.Writer) (int64, error) {
	s := &stream{contentType: idemkv.BackupContentType, w: w}
	_, err := c.do(ctx, call{method: http.MethodGet, route: "/v1/backup", path: "/v1/backup",
		wait: idemkv.MaxBackupDuration, stream: s}, nil)
	return s.n, err
}

// stream is the answer of a call that is a byte stream, not JSON.
type stream struct {
	contentType string // the answer must carry it
	w           io.Writer
	n           int64 // bytes written to w, over every attempt
}

// errNoAnswer is the cause of an attempt whose answer did not begin in time.
var errNoAnswer = errors.New("client: no answer within the timeout")

func (s *stream) read(base string, resp *http.Response) error {
	if ct := resp.Header.Get("Content-Type"); ct != s.contentType {
		return fmt.Errorf("client: %s answered %q, not %q", base, ct, s.contentType)
	}
	cw := &countWriter{w: s.w}
	_, err := io.Copy(cw, resp.Body)
	s.n += cw.n
	switch {
	case err == nil:
		return nil
	case cw.err != nil:
		return fmt.Errorf("client: writing the stream from %s: %w", base, cw.err)
	case s.n == 0:
		// Nothing reached w: as good as no answer, so another node may be tried.
		return fmt.Errorf("%w: %s: reading the answer: %w", idemkv.ErrUnavailable, base, err)
	default:
		return fmt.Errorf("client: the transfer from %s broke after %d bytes: %w", base, s.n, err)
	}
}

// countWriter counts what reaches w and keeps w's own error apart from the reader's.
type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	if err != nil {
		c.err = err
	}
	return n, err
}

// answerWithin returns a child of ctx that ends d from now unless answered is called
// first, for a call whose body may rightly take far longer than its answer takes to
// begin: a node that takes the connection and says nothing is as good as down.
// answered reports whether it came in time; when it did not, the context's cause is
// errNoAnswer. The child ends with ctx, which the caller cancels.
func answerWithin(ctx context.Context, d time.Duration) (_ context.Context, answered func() bool) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := time.AfterFunc(d, func() { cancel(errNoAnswer) })
	return ctx, t.Stop
}
