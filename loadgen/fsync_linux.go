package loadgen

import (
	"os"
	"syscall"
)

// datasync is fdatasync: what Pebble's WAL, bolt and PostgreSQL's WAL use on Linux.
func datasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
