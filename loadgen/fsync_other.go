//go:build !linux

package loadgen

import "os"

func datasync(f *os.File) error { return f.Sync() }
