//go:build idemkv_testhooks

package testhooks

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
)

// faultSwitch is one storage fault: whether it is in force, and how many operations
// it has failed.
type faultSwitch struct {
	on       atomic.Bool
	injected atomic.Int64
}

var (
	faults     = map[string]*faultSwitch{}
	transferFn atomic.Pointer[func() error]
)

func init() {
	for _, f := range StorageFaults {
		faults[f] = &faultSwitch{}
	}
}

// fire reports whether fault f is in force, counting the operation it fails.
func fire(f string) bool {
	s := faults[f]
	if !s.on.Load() {
		return false
	}
	s.injected.Add(1)
	return true
}

func currentFaults() FaultState {
	st := FaultState{Faults: []string{}, Injected: map[string]int64{}}
	for _, f := range StorageFaults {
		if faults[f].on.Load() {
			st.Faults = append(st.Faults, f)
		}
		st.Injected[f] = faults[f].injected.Load()
	}
	return st
}

// SetFaults replaces the storage faults in force.
func SetFaults(names []string) error {
	list, err := ParseFaults(names)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, f := range list {
		want[f] = true
	}
	for _, f := range StorageFaults {
		faults[f].on.Store(want[f])
	}
	return nil
}

// errInjectedRead is the I/O error of FaultPebbleRead and FaultRaftLogRead.
var errInjectedRead = fmt.Errorf("testhooks: injected read failure: %w", syscall.EIO)

// PebbleFS is the filesystem the node's Pebble store runs on: the OS's, through an
// error injector that FaultPebbleFull and FaultPebbleRead switch on.
func PebbleFS() vfs.FS {
	return errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch {
		case op.Kind.ReadOrWrite() == errorfs.OpIsWrite && fire(FaultPebbleFull):
			return syscall.ENOSPC
		case (op.Kind == errorfs.OpFileRead || op.Kind == errorfs.OpFileReadAt) && fire(FaultPebbleRead):
			return errInjectedRead
		}
		return nil
	}))
}

// WrapLogStore puts FaultRaftLogWrite, FaultRaftLogRead and FaultRaftLogStall in front of
// Raft's log.
func WrapLogStore(s raft.LogStore) raft.LogStore { return &faultyLog{LogStore: s} }

type faultyLog struct{ raft.LogStore }

var errInjectedWrite = fmt.Errorf("testhooks: injected raft log write failure: %w", syscall.EIO)

func (l *faultyLog) GetLog(index uint64, out *raft.Log) error {
	if fire(FaultRaftLogRead) {
		return errInjectedRead
	}
	return l.LogStore.GetLog(index, out)
}

func (l *faultyLog) StoreLog(e *raft.Log) error { return l.StoreLogs([]*raft.Log{e}) }

func (l *faultyLog) StoreLogs(es []*raft.Log) error {
	if fire(FaultRaftLogStall) {
		for faults[FaultRaftLogStall].on.Load() {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if fire(FaultRaftLogWrite) {
		return errInjectedWrite
	}
	if Sabotaged(RotRaftLog) {
		es = rotted(es)
	}
	return l.LogStore.StoreLogs(es)
}

// commandsStored counts the Raft log commands this process stored, for RotRaftLog.
var commandsStored atomic.Int64

// rotted returns es with the RotEntry-th command of the process, when it is among
// them, replaced by a copy whose extensions have a byte more: what reaches the disk
// differs from what Raft, its log cache and the verifier's running checksum were
// given. Checkpoints (whose extensions hold the verifier's checksum) are left alone.
func rotted(es []*raft.Log) []*raft.Log {
	for i, e := range es {
		if e.Type != raft.LogCommand || len(e.Extensions) > 0 {
			continue
		}
		if commandsStored.Add(1) != RotEntry {
			continue
		}
		out := append([]*raft.Log(nil), es...)
		c := *e
		c.Extensions = []byte{'R'}
		out[i] = &c
		return out
	}
	return es
}

// WrapSnapshotStore puts FaultSnapshotRestore in front of Raft's snapshot store.
func WrapSnapshotStore(s raft.SnapshotStore) raft.SnapshotStore {
	return &faultySnapshots{SnapshotStore: s}
}

type faultySnapshots struct{ raft.SnapshotStore }

func (s *faultySnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	meta, rc, err := s.SnapshotStore.Open(id)
	if err != nil || !fire(FaultSnapshotRestore) {
		return meta, rc, err
	}
	return meta, &cutReader{rc: rc, left: meta.Size / 2}, nil
}

// cutReader fails with an I/O error once half the snapshot has been read.
type cutReader struct {
	rc   io.ReadCloser
	left int64
}

func (c *cutReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, fmt.Errorf("testhooks: snapshot read cut midway: %w", syscall.EIO)
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.rc.Read(p)
	c.left -= int64(n)
	return n, err
}

func (c *cutReader) Close() error { return c.rc.Close() }

// SetTransfer registers the node's leadership transfer for PathTransfer.
func SetTransfer(f func() error) { transferFn.Store(&f) }

func mountFaults(mux *http.ServeMux) {
	mux.HandleFunc("GET "+PathFaults, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, currentFaults())
	})
	mux.HandleFunc("POST "+PathFaults, func(w http.ResponseWriter, r *http.Request) {
		var u FaultUpdate
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&u); err != nil {
			writeError(w, http.StatusBadRequest, idemkv.CodeInvalidArgument, fmt.Errorf("testhooks: body: %w", err))
			return
		}
		if err := SetFaults(u.Faults); err != nil {
			writeError(w, http.StatusBadRequest, idemkv.CodeInvalidArgument, err)
			return
		}
		writeJSON(w, http.StatusOK, currentFaults())
	})
	mux.HandleFunc("POST "+PathTransfer, func(w http.ResponseWriter, _ *http.Request) {
		f := transferFn.Load()
		if f == nil {
			writeError(w, http.StatusNotImplemented, idemkv.CodeInternal, errors.New("testhooks: this node cannot transfer leadership"))
			return
		}
		if err := (*f)(); err != nil {
			writeError(w, http.StatusServiceUnavailable, idemkv.CodeUnavailable, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
	})
}
