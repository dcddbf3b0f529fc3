//go:build !idemkv_testhooks

package testhooks

import "time"

// Enabled reports whether the hooks are compiled in. In this build they are not.
const Enabled = false

// Now is the time the node stamps on commands: the wall clock.
func Now() time.Time { return time.Now() }

// ClockOffset is always zero in this build.
func ClockOffset() time.Duration { return 0 }

// Sabotaged is always false in this build.
func Sabotaged(Mode) bool { return false }

// Mount does not exist in this build: the debug endpoints are compiled only with the
// tag (api/debug_on.go mounts them), so this build imports no HTTP stack.
