package storage

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idemkv/idemkv"
)

// ErrFailed marks every operation of a store after Pebble reported a fatal error (a
// commit that could not reach its write-ahead log on a full disk, a manifest that
// could not be written): Pebble calls itself unusable then, and nothing it holds may
// be served or added to. Only a restart on a healthy disk recovers; Raft's log replays
// what Pebble lost. It is unavailable, not internal: the other replicas still serve.
var ErrFailed = fmt.Errorf("%w: storage failed", idemkv.ErrUnavailable)

// failure is a store's fatal error, set once, and who wants to hear of it.
type failure struct {
	mu    sync.Mutex
	hooks []func(error)
	// err is read on every operation, so without the lock; it is set under it.
	err atomic.Pointer[error]
}

// fail records err as the store's fatal error (the first one stays) and calls every
// hook, on the calling goroutine: the halt must not depend on who happened to call
// Pebble, nor on whether a panic further up is recovered (net/http recovers its
// handlers', and a backup runs on one).
func (f *failure) fail(err error) {
	f.mu.Lock()
	if f.err.Load() != nil {
		f.mu.Unlock()
		return
	}
	err = fmt.Errorf("%w: %w", ErrFailed, err)
	f.err.Store(&err)
	hooks := f.hooks
	f.mu.Unlock()
	for _, h := range hooks {
		h(err)
	}
}

func (f *failure) get() error {
	if p := f.err.Load(); p != nil {
		return *p
	}
	return nil
}

// Failure is the fatal error Pebble reported, wrapping ErrFailed; nil while the store
// is healthy.
func (s *Store) Failure() error { return s.failure.get() }

// OnFailure has fn called once with the store's fatal error, on the goroutine that
// met it, or at once if the store has failed already. fn must not call into the store.
// The state machine halts from it.
func (s *Store) OnFailure(fn func(error)) {
	f := &s.failure
	f.mu.Lock()
	err := f.get()
	if err == nil {
		f.hooks = append(f.hooks, fn)
	}
	f.mu.Unlock()
	if err != nil {
		fn(err)
	}
}

// fatalPanic is what Fatalf panics with, so that the store's own calls into Pebble can
// tell it from any other panic (see guard).
type fatalPanic struct{ err error }

// guard runs fn, a call into Pebble on the caller's goroutine, and turns Pebble's
// fatal error there into an error: the store has failed already (Fatalf recorded it
// before it panicked), so nothing touches the broken database again, and the caller
// (a backup's handler, Raft's snapshot) gets an answer instead of a dead goroutine.
// Pebble's own goroutines (flushes, compactions) have nobody to recover them: the
// process stops there, as it always did, and the store is marked failed first.
func guard(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fp, ok := r.(fatalPanic)
			if !ok {
				panic(r)
			}
			err = fp.err
		}
	}()
	return fn()
}

// pebbleLogger routes Pebble's printf-style logging into slog, and its fatal errors
// into the store's failure.
type pebbleLogger struct {
	l    *slog.Logger
	fail func(error)
}

func (p pebbleLogger) Infof(format string, args ...any) { p.l.Debug(fmt.Sprintf(format, args...)) }
func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...))
}

// Fatalf must not return (Pebble's contract): Pebble calls it only when continuing
// would corrupt data. It fails the store first, whatever goroutine this is, then
// panics.
func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error(msg)
	if !strings.HasPrefix(msg, "pebble: ") {
		msg = "pebble: " + msg
	}
	err := errors.New(msg)
	p.fail(err)
	panic(fatalPanic{err: fmt.Errorf("%w: %w", ErrFailed, err)})
}

// Error makes a crash of a Pebble goroutine, or net/http's log of a recovered panic,
// print the reason.
func (p fatalPanic) Error() string { return p.err.Error() }
