package loadgen

import (
	"fmt"
	"os"
	"time"
)

// ProbeFsync measures the latency of making an append durable in dir, the way a
// write-ahead log does: write 4 KiB at the end of a file, then fdatasync. A store that
// acknowledges only durable writes cannot answer one client faster than this.
func ProbeFsync(dir string, samples int) (*Histogram, error) {
	if dir == "" {
		dir = os.TempDir()
	}
	f, err := os.CreateTemp(dir, "idemkv-fsync-probe-*")
	if err != nil {
		return nil, fmt.Errorf("loadgen: fsync probe: %w", err)
	}
	defer func() {
		_ = f.Close()
		_ = os.Remove(f.Name())
	}()
	block := make([]byte, 4096)
	for i := range block {
		block[i] = byte(i)
	}
	h := &Histogram{}
	for range samples {
		t0 := time.Now()
		if _, err := f.Write(block); err != nil {
			return nil, fmt.Errorf("loadgen: fsync probe: %w", err)
		}
		if err := datasync(f); err != nil {
			return nil, fmt.Errorf("loadgen: fsync probe: %w", err)
		}
		h.Record(time.Since(t0))
	}
	return h, nil
}
