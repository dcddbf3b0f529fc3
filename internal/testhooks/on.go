//go:build idemkv_testhooks

package testhooks

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv"
)

// Enabled reports whether the hooks are compiled in. In this build they are.
const Enabled = true

var (
	offsetNanos atomic.Int64
	modes       atomic.Uint32
)

// The environment is read in init so that a node is broken from its first command on,
// before any request could reach a debug endpoint. A malformed value stops the binary:
// a silently ignored sabotage setting would let a checker pass for the wrong reason.
func init() {
	d, err := ParseClockOffset(os.Getenv(EnvClockOffset))
	if err != nil {
		panic(err)
	}
	m, err := ParseModes(os.Getenv(EnvSabotage))
	if err != nil {
		panic(err)
	}
	offsetNanos.Store(int64(d))
	modes.Store(uint32(m))
}

// Now is the time the node stamps on commands: the wall clock plus the offset.
func Now() time.Time { return time.Now().Add(ClockOffset()) }

// ClockOffset is the offset currently added to the node's stamped time.
func ClockOffset() time.Duration { return time.Duration(offsetNanos.Load()) }

// Sabotaged reports whether any mode in m is switched on.
func Sabotaged(m Mode) bool { return Mode(modes.Load())&m != 0 }

// SetClockOffset changes the clock offset.
func SetClockOffset(d time.Duration) { offsetNanos.Store(int64(d)) }

// SetSabotage replaces the set of sabotage modes.
func SetSabotage(m Mode) { modes.Store(uint32(m)) }

func current() State {
	return State{ClockOffsetMs: ClockOffset().Milliseconds(), Sabotage: Mode(modes.Load()).Names()}
}

// Mount registers the debug endpoints on mux: PathHooks to read and change the hooks,
// and PathStateHash, answered by snapshot.
func Mount(mux *http.ServeMux, snapshot SnapshotFunc) {
	mux.HandleFunc("GET "+PathHooks, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, current())
	})
	mux.HandleFunc("POST "+PathHooks, func(w http.ResponseWriter, r *http.Request) {
		var u StateUpdate
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&u); err != nil {
			writeError(w, http.StatusBadRequest, idemkv.CodeInvalidArgument, fmt.Errorf("testhooks: body: %w", err))
			return
		}
		var m Mode
		if u.Sabotage != nil {
			var err error
			if m, err = ParseModes(*u.Sabotage...); err != nil {
				writeError(w, http.StatusBadRequest, idemkv.CodeInvalidArgument, err)
				return
			}
		}
		if u.ClockOffsetMs != nil {
			SetClockOffset(time.Duration(*u.ClockOffsetMs) * time.Millisecond)
		}
		if u.Sabotage != nil {
			SetSabotage(m)
		}
		writeJSON(w, http.StatusOK, current())
	})
	mountFaults(mux)
	mux.HandleFunc("GET "+PathStateHash, func(w http.ResponseWriter, _ *http.Request) {
		if snapshot == nil {
			writeError(w, http.StatusNotImplemented, idemkv.CodeInternal, fmt.Errorf("testhooks: this node has no state hash"))
			return
		}
		s, err := snapshot()
		if err != nil {
			writeError(w, http.StatusInternalServerError, idemkv.CodeInternal, err)
			return
		}
		writeJSON(w, http.StatusOK, s)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// The error shape matches docs/protocol.md section 2 so that one decoder reads every error.
func writeError(w http.ResponseWriter, status int, code string, err error) {
	writeJSON(w, status, map[string]any{"error": &idemkv.Error{Code: code, Message: err.Error()}})
}
