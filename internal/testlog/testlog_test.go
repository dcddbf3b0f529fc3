package testlog

import (
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps what is logged to it.
type recorder struct {
	testing.TB
	lines    []string
	cleanups []func()
}

func (r *recorder) Log(args ...any)  { r.lines = append(r.lines, args[0].(string)) }
func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recorder) runCleanups() {
	for _, f := range r.cleanups {
		f()
	}
}

// A line goes to Log once, prefixed and without its newline; after cleanup, nothing.
func TestWriterLogsUntilCleanup(t *testing.T) {
	r := &recorder{TB: t}
	l := NewLevel(r, "n1: ", 0)
	l.Debug("hidden below info")
	l.Info("hello", "k", 1)
	if len(r.lines) != 1 || !strings.HasPrefix(r.lines[0], "n1: ") || !strings.Contains(r.lines[0], "msg=hello k=1") || strings.HasSuffix(r.lines[0], "\n") {
		t.Fatalf("lines %q", r.lines)
	}
	r.runCleanups()
	l.Info("after the test")
	if len(r.lines) != 1 {
		t.Fatalf("logged after cleanup: %q", r.lines)
	}
	New(r).Debug("debug shows") // a Writer made after the first cleanup is live
	if len(r.lines) != 2 || !strings.Contains(r.lines[1], "level=DEBUG") {
		t.Fatalf("New does not log debug lines: %q", r.lines)
	}
}
