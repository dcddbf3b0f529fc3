//go:build !idemkv_testhooks

package testhooks

import (
	"net/http"
	"time"
)

// Enabled reports whether the hooks are compiled in. In this build they are not.
const Enabled = false

// Now is the time the node stamps on commands: the wall clock.
func Now() time.Time { return time.Now() }

// ClockOffset is always zero in this build.
func ClockOffset() time.Duration { return 0 }

// Sabotaged is always false in this build.
func Sabotaged(Mode) bool { return false }

// Mount registers nothing in this build: the debug endpoints do not exist.
func Mount(*http.ServeMux, SnapshotFunc) {}
