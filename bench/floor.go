package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"

	"github.com/idemkv/idemkv/loadgen"
)

// Floors are what one write costs a lone writer on this machine with nothing of
// idemkv's in it, layer by layer, so that a run shows which part of a one-client
// write is the machine's, which Raft's and which idemkv's: raft-wal's append of one
// entry until durable; hashicorp/raft on one voter over raft-wal applying it to a
// state machine that does nothing; and that Apply behind a net/http handler, reached
// by a POST over loopback on a kept connection. An idemkv write on one node is the
// last plus idemkv's own work (decoding, checks, look-ups, the state machine's Pebble
// batch, the answer).
type Floors struct {
	EntryBytes int             `json:"entry_bytes"`
	Append     loadgen.Summary `json:"wal_append"`
	Raft       loadgen.Summary `json:"raft_apply"`
	HTTPRaft   loadgen.Summary `json:"http_raft_apply"`
}

// floorEntryBytes is the size of the floors' entries: about an idemkv reserve's
// command.
const floorEntryBytes = 400

// probeFloors measures the floors in a directory made under dir (the data dirs'
// disk), each for d after a warm-up of d/4, and removes it.
func probeFloors(ctx context.Context, dir string, d time.Duration) (*Floors, error) {
	if dir == "" {
		dir = os.TempDir()
	}
	tmp, err := os.MkdirTemp(dir, "idemkv-floors-*")
	if err != nil {
		return nil, fmt.Errorf("floors: %w", err)
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	f := &Floors{EntryBytes: floorEntryBytes}
	entry := make([]byte, floorEntryBytes)
	for i := range entry {
		entry[i] = byte('a' + i%26)
	}
	if f.Append, err = floorAppend(ctx, filepath.Join(tmp, "append"), entry, d); err != nil {
		return nil, err
	}
	r, closeRaft, err := floorRaft(filepath.Join(tmp, "raft"))
	if err != nil {
		return nil, err
	}
	defer closeRaft()
	apply := func() error { return r.Apply(entry, 0).Error() }
	if f.Raft, err = floorLoop(ctx, d, apply); err != nil {
		return nil, fmt.Errorf("floors: raft: %w", err)
	}
	if f.HTTPRaft, err = floorHTTP(ctx, r, entry, d); err != nil {
		return nil, err
	}
	return f, nil
}

// floorLoop calls op for d/4 unmeasured, then for d, and summarizes each call's time.
func floorLoop(ctx context.Context, d time.Duration, op func() error) (loadgen.Summary, error) {
	h := &loadgen.Histogram{}
	for i, span := range []time.Duration{d / 4, d} {
		end := time.Now().Add(span)
		for time.Now().Before(end) {
			if err := ctx.Err(); err != nil {
				return loadgen.Summary{}, err
			}
			t := time.Now()
			if err := op(); err != nil {
				return loadgen.Summary{}, err
			}
			if i == 1 {
				h.Record(time.Since(t))
			}
		}
	}
	return h.Summarize(), nil
}

// floorAppend appends one entry at a time to a raft-wal log in dir, as a Raft leader's
// dispatch does.
func floorAppend(ctx context.Context, dir string, entry []byte, d time.Duration) (loadgen.Summary, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return loadgen.Summary{}, fmt.Errorf("floors: %w", err)
	}
	w, err := wal.Open(dir)
	if err != nil {
		return loadgen.Summary{}, fmt.Errorf("floors: raft-wal: %w", err)
	}
	var index uint64
	s, err := floorLoop(ctx, d, func() error {
		index++
		return w.StoreLogs([]*raft.Log{{Index: index, Term: 1, Type: raft.LogCommand, Data: entry}})
	})
	if cerr := w.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return loadgen.Summary{}, fmt.Errorf("floors: raft-wal append: %w", err)
	}
	return s, nil
}

// nopFSM is a state machine that does nothing.
type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("floors: no snapshots") }
func (nopFSM) Restore(io.ReadCloser) error         { return errors.New("floors: no snapshots") }

// floorRaft starts one voter on a raft-wal log in dir, with Raft's defaults but for
// BatchApplyCh (idemkv's setting), and waits until it leads.
func floorRaft(dir string) (*raft.Raft, func(), error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("floors: %w", err)
	}
	w, err := wal.Open(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("floors: raft-wal: %w", err)
	}
	conf := raft.DefaultConfig()
	conf.LocalID = "floor"
	conf.Logger = hclog.NewNullLogger()
	conf.BatchApplyCh = true
	conf.SnapshotThreshold = 1 << 40 // nothing to snapshot
	addr, trans := raft.NewInmemTransport("")
	r, err := raft.NewRaft(conf, nopFSM{}, w, w, raft.NewInmemSnapshotStore(), trans)
	if err != nil {
		_ = w.Close()
		return nil, nil, fmt.Errorf("floors: raft: %w", err)
	}
	stop := func() {
		_ = r.Shutdown().Error()
		_ = w.Close()
	}
	if err := r.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{ID: conf.LocalID, Address: addr}}}).Error(); err != nil {
		stop()
		return nil, nil, fmt.Errorf("floors: raft bootstrap: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.State() != raft.Leader {
		if time.Now().After(deadline) {
			stop()
			return nil, nil, errors.New("floors: the lone voter did not lead within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return r, stop, nil
}

// floorHTTP serves POST /apply with net/http on loopback, its handler applying the body
// through r, and sends it entry after entry on one kept connection, written and read
// on the caller's goroutine as the driver sends idemkv's requests.
func floorHTTP(ctx context.Context, r *raft.Raft, entry []byte, d time.Duration) (loadgen.Summary, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return loadgen.Summary{}, fmt.Errorf("floors: %w", err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, 1<<20))
		if err == nil {
			err = r.Apply(body, 0).Error()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"applied":true}` + "\n"))
	})}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return loadgen.Summary{}, fmt.Errorf("floors: %w", err)
	}
	defer func() { _ = conn.Close() }()
	br := bufio.NewReader(conn)
	request := []byte("POST /apply HTTP/1.1\r\nHost: " + ln.Addr().String() +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(entry)) + "\r\n\r\n" + string(entry))
	s, err := floorLoop(ctx, d, func() error {
		if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			return err
		}
		if _, err := conn.Write(request); err != nil {
			return err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %s", resp.Status)
		}
		return err
	})
	if err != nil {
		return loadgen.Summary{}, fmt.Errorf("floors: http: %w", err)
	}
	return s, nil
}
