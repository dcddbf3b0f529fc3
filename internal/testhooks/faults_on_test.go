//go:build idemkv_testhooks

package testhooks

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// Each storage fault fails what it names once switched on, counts what it failed,
// and stops when switched off; the endpoint switches them.
func TestStorageFaultsFireAndCount(t *testing.T) {
	t.Cleanup(func() { _ = SetFaults(nil) })
	mux := http.NewServeMux()
	Mount(mux, nil)
	set := func(names ...string) FaultState {
		b, _ := json.Marshal(FaultUpdate{Faults: names})
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(http.MethodPost, PathFaults, bytes.NewReader(b)))
		if w.Code != http.StatusOK {
			t.Fatalf("POST %s %v: %d %s", PathFaults, names, w.Code, w.Body)
		}
		var st FaultState
		if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}

	logs := WrapLogStore(raft.NewInmemStore())
	if err := logs.StoreLogs([]*raft.Log{{Index: 1, Term: 1}}); err != nil {
		t.Fatal(err)
	}
	set(FaultRaftLogWrite, FaultRaftLogRead)
	var l raft.Log
	if err := logs.StoreLogs([]*raft.Log{{Index: 2, Term: 1}}); err == nil {
		t.Error("a log write succeeded under raft-log-write")
	}
	if err := logs.GetLog(1, &l); !errors.Is(err, syscall.EIO) {
		t.Errorf("a log read under raft-log-read gave %v", err)
	}

	dir := t.TempDir()
	fs := PebbleFS()
	set(FaultPebbleFull)
	if _, err := fs.Create(fs.PathJoin(dir, "x"), vfs.WriteCategoryUnspecified); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("create under pebble-full gave %v", err)
	}

	snaps := WrapSnapshotStore(raft.NewInmemSnapshotStore())
	sink, err := snaps.Create(raft.SnapshotVersionMax, 5, 1, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("s"), 1000)
	if _, err := sink.Write(payload); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	st := set(FaultSnapshotRestore)
	_, rc, err := snaps.Open(sink.ID())
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	if !errors.Is(err, syscall.EIO) || len(got) != len(payload)/2 {
		t.Errorf("a cut snapshot read %d of %d bytes, then %v", len(got), len(payload), err)
	}

	st = set()
	if len(st.Faults) != 0 {
		t.Fatalf("faults still on: %v", st.Faults)
	}
	for f, want := range map[string]int64{FaultRaftLogWrite: 1, FaultRaftLogRead: 1, FaultPebbleFull: 1, FaultSnapshotRestore: 1} {
		if st.Injected[f] != want {
			t.Errorf("%s failed %d operations, want %d", f, st.Injected[f], want)
		}
	}
	if err := logs.StoreLogs([]*raft.Log{{Index: 2, Term: 1}}); err != nil {
		t.Errorf("a log write failed with every fault off: %v", err)
	}
}
