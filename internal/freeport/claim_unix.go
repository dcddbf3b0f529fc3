//go:build unix

package freeport

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// claim takes a write lock on byte port of f without waiting, and says whether it got
// it. A process's own locks never conflict with each other.
func claim(f *os.File, port int) (bool, error) {
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: int64(port), Len: 1}
	err := syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EACCES):
		return false, nil
	default:
		return false, fmt.Errorf("freeport: claim port %d: %w", port, err)
	}
}
