// Package testlog sends a test's logs to t.Log, so they show only when the test fails
// (or with -v) and are attributed to the test that wrote them. It is the one copy of
// the adapter that about eleven test files used to write for themselves.
package testlog

import (
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Writer sends each write to tb.Log as one entry, trailing newlines trimmed, after
// prefix. Lines written once the test's cleanup has started are dropped: background
// goroutines (a Raft node, a sweeper) may still log while they shut down, and testing
// panics on a Log after the test has completed.
type Writer struct {
	mu     sync.Mutex
	tb     testing.TB
	prefix string
	done   bool
}

// NewWriter returns a Writer for tb.
func NewWriter(tb testing.TB, prefix string) *Writer {
	w := &Writer{tb: tb, prefix: prefix}
	tb.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return w
}

func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.tb.Log(w.prefix + strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

var _ io.Writer = (*Writer)(nil)

// New returns a text logger at debug level that writes to tb.Log.
func New(tb testing.TB) *slog.Logger { return NewLevel(tb, "", slog.LevelDebug) }

// NewLevel returns a text logger writing to tb.Log from level up, each line after prefix.
func NewLevel(tb testing.TB, prefix string, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(NewWriter(tb, prefix), &slog.HandlerOptions{Level: level}))
}

// Buffer keeps what is written to it, for a test to read while the goroutines of a
// server still write.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
