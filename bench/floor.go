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
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
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
// state machine that does nothing; that Apply behind a net/http handler, reached by a
// POST over loopback on a kept connection; the same served by another process; and
// that on three voters, each its own process.
// An idemkv write on one node, as the driver times it, is the last plus idemkv's own
// work (decoding, checks, look-ups, the state machine's Pebble batch, the answer).
type Floors struct {
	EntryBytes int `json:"entry_bytes"`
	// Rounds is how many rounds' floors these are the median of (0 or 1: one).
	Rounds   int             `json:"rounds,omitempty"`
	Append   loadgen.Summary `json:"wal_append"`
	Raft     loadgen.Summary `json:"raft_apply"`
	HTTPRaft loadgen.Summary `json:"http_raft_apply"`
	// HTTPRaftServer is HTTPRaft served by another process, as idemkv's API is to
	// the driver (absent from runs before it was measured).
	HTTPRaftServer loadgen.Summary `json:"http_raft_apply_other_process"`
	// HTTPRaft3 is HTTPRaftServer on three voters, each its own process as idemkv's
	// three nodes are, sent to the leader: its append, then a follower's, before the
	// answer.
	HTTPRaft3 loadgen.Summary `json:"http_raft3_apply"`
	// HTTPRaft3Writers is how many writes a second those three voters took from
	// several writers at once (floorWriters), each on its own kept connection: the
	// most hashicorp/raft behind net/http gives the many-client points, with nothing
	// of idemkv's in it.
	HTTPRaft3Writers []FloorThroughput `json:"http_raft3_writers,omitempty"`
}

// FloorThroughput is the write rate of a floor under several writers at once.
type FloorThroughput struct {
	Writers      int     `json:"writers"`
	WritesPerSec float64 `json:"writes_per_sec"`
}

// floorWriters are the writers the three voters' floor is also measured with: as
// many writes in flight as the driver's clients keep at the many-client points that
// have targets below 256 (each client has one write, its reserve or its commit, in
// flight).
var floorWriters = []int{16, 64}

// floorLogCache is the entries the floor servers' Raft keeps in memory: idemkv's
// nodes keep 1,024 (node.go).
const floorLogCache = 1024

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
	if f.HTTPRaftServer, _, err = floorHTTPVoters(ctx, filepath.Join(tmp, "voter"), 1, entry, d); err != nil {
		return nil, err
	}
	if f.HTTPRaft3, f.HTTPRaft3Writers, err = floorHTTPVoters(ctx, filepath.Join(tmp, "voters"), 3, entry, d, floorWriters...); err != nil {
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

// floorRaftConfig is Raft's defaults with idemkv's batching: BatchApplyCh, and up to
// 512 entries an AppendEntries (node.DefaultConfig's MaxAppendEntries).
func floorRaftConfig(id raft.ServerID) *raft.Config {
	conf := raft.DefaultConfig()
	conf.LocalID = id
	conf.Logger = hclog.NewNullLogger()
	conf.BatchApplyCh = true
	conf.MaxAppendEntries = 512
	conf.SnapshotThreshold = 1 << 40 // nothing to snapshot
	return conf
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
	conf := floorRaftConfig("floor")
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

// floorServe serves POST /apply with net/http on a loopback port, its handler applying
// the body through r, and GET /leader (200 while r leads, else 503); it returns the
// address and a stop.
func floorServe(r *raft.Raft) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("floors: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /apply", func(w http.ResponseWriter, req *http.Request) {
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
	})
	mux.HandleFunc("GET /leader", func(w http.ResponseWriter, _ *http.Request) {
		if r.State() != raft.Leader {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// floorHTTP serves r's Apply with floorServe in this process and measures it with
// floorPost.
func floorHTTP(ctx context.Context, r *raft.Raft, entry []byte, d time.Duration) (loadgen.Summary, error) {
	addr, stop, err := floorServe(r)
	if err != nil {
		return loadgen.Summary{}, err
	}
	defer stop()
	return floorPost(ctx, addr, entry, d)
}

// floorPost sends entry after entry to POST /apply at addr on one kept connection,
// each written and read on the caller's goroutine as the driver sends idemkv's
// requests.
func floorPost(ctx context.Context, addr string, entry []byte, d time.Duration) (loadgen.Summary, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return loadgen.Summary{}, fmt.Errorf("floors: %w", err)
	}
	defer func() { _ = conn.Close() }()
	br := bufio.NewReader(conn)
	request := floorRequest(addr, entry)
	s, err := floorLoop(ctx, d, func() error { return floorPostOne(conn, br, request) })
	if err != nil {
		return loadgen.Summary{}, fmt.Errorf("floors: http: %w", err)
	}
	return s, nil
}

// floorRequest is the POST /apply of entry to addr, as written on the wire.
func floorRequest(addr string, entry []byte) []byte {
	return []byte("POST /apply HTTP/1.1\r\nHost: " + addr +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(entry)) + "\r\n\r\n" + string(entry))
}

// floorPostOne writes request on conn and reads its answer from br, which reads conn:
// an error unless the answer is 200.
func floorPostOne(conn net.Conn, br *bufio.Reader, request []byte) error {
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
}

// floorServerCmd is the command that serves the other-process floor from dir: this
// program again, as `bench floor-server DIR`. Tests, whose program is a test binary,
// replace it.
var floorServerCmd = func(ctx context.Context, dir string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return exec.CommandContext(ctx, exe, "floor-server", dir), nil
}

// floorVoters starts n voters on raft-wal logs under dir, each its own process running
// `bench floor-server` (floorServerCmd), makes them one cluster, and waits for its
// leader. It returns the leader's HTTP address and a stop that ends the processes
// and reports how they ended.
func floorVoters(ctx context.Context, dir string, n int) (string, func() error, error) {
	type voter struct {
		cmd        *exec.Cmd
		stdin      io.WriteCloser
		stderr     *strings.Builder
		http, raft string
	}
	var voters []*voter
	stop := func() error {
		var errs []error
		for _, v := range voters {
			_ = v.stdin.Close() // the server's end: stdin closed
		}
		for _, v := range voters {
			if err := v.cmd.Wait(); err != nil {
				errs = append(errs, fmt.Errorf("floors: a voter's process: %w: %s", err, strings.TrimSpace(v.stderr.String())))
			}
		}
		voters = nil
		return errors.Join(errs...)
	}
	fail := func(err error) (string, func() error, error) {
		return "", nil, errors.Join(err, stop())
	}
	for i := range n {
		cmd, err := floorServerCmd(ctx, filepath.Join(dir, fmt.Sprintf("voter-%d", i+1)))
		if err != nil {
			return fail(fmt.Errorf("floors: a voter's process: %w", err))
		}
		v := &voter{cmd: cmd, stderr: &strings.Builder{}}
		cmd.Stderr = v.stderr
		if v.stdin, err = cmd.StdinPipe(); err != nil {
			return fail(fmt.Errorf("floors: a voter's process: %w", err))
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return fail(fmt.Errorf("floors: a voter's process: %w", err))
		}
		if err := cmd.Start(); err != nil {
			return fail(fmt.Errorf("floors: a voter's process: %w", err))
		}
		voters = append(voters, v)
		// Its first line names its HTTP and Raft addresses.
		addrs := make(chan []string, 1)
		go func() {
			line, _ := bufio.NewReader(stdout).ReadString('\n')
			addrs <- strings.Fields(line)
			_, _ = io.Copy(io.Discard, stdout)
		}()
		select {
		case f := <-addrs:
			if len(f) != 2 {
				return fail(fmt.Errorf("floors: a voter's process named no addresses (%q)", f))
			}
			v.http, v.raft = f[0], f[1]
		case <-time.After(30 * time.Second):
			return fail(errors.New("floors: a voter's process named no addresses within 30 s"))
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
	var raftAddrs []string
	for _, v := range voters {
		raftAddrs = append(raftAddrs, v.raft)
	}
	for _, v := range voters {
		if _, err := fmt.Fprintln(v.stdin, strings.Join(raftAddrs, ",")); err != nil {
			return fail(fmt.Errorf("floors: a voter's process: %w", err))
		}
	}
	// A voter that stops answering must not hold the wait past its deadline.
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, v := range voters {
			resp, err := client.Get("http://" + v.http + "/leader")
			if err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return v.http, stop, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("floors: %d voters elected no leader within 30 s", n))
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
}

// floorHTTPVoters measures Apply behind net/http as floorHTTP does, but on n voters,
// each its own process (floorVoters), the writes sent to the leader: as the driver
// sends idemkv's writes to its leader, another process whose threads wake for each
// request, and for n > 1 one follower's append on the way. Then, on the same voters,
// the write rate with each number of writers (floorPostMany).
func floorHTTPVoters(ctx context.Context, dir string, n int, entry []byte, d time.Duration, writers ...int) (loadgen.Summary, []FloorThroughput, error) {
	leader, stop, err := floorVoters(ctx, dir, n)
	if err != nil {
		return loadgen.Summary{}, nil, err
	}
	s, err := floorPost(ctx, leader, entry, d)
	var rates []FloorThroughput
	for _, w := range writers {
		if err != nil {
			break
		}
		var rate float64
		rate, err = floorPostMany(ctx, leader, entry, d, w)
		rates = append(rates, FloorThroughput{Writers: w, WritesPerSec: rate})
	}
	if serr := stop(); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return loadgen.Summary{}, nil, err
	}
	return s, rates, nil
}

// floorPostMany has writers goroutines send entry after entry to POST /apply at addr,
// each on its own kept connection as floorPost does, for d/4 unmeasured and then for
// d, and returns the writes a second completed in the measured time.
func floorPostMany(ctx context.Context, addr string, entry []byte, d time.Duration, writers int) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	request := floorRequest(addr, entry)
	var measured atomic.Int64
	var measuring atomic.Bool
	errs := make(chan error, writers)
	end := time.Now().Add(d/4 + d)
	for range writers {
		go func() {
			errs <- func() error {
				conn, err := net.Dial("tcp", addr)
				if err != nil {
					return err
				}
				defer func() { _ = conn.Close() }()
				stopOnCancel := context.AfterFunc(ctx, func() { _ = conn.Close() })
				defer stopOnCancel()
				br := bufio.NewReader(conn)
				for time.Now().Before(end) {
					if err := floorPostOne(conn, br, request); err != nil {
						return err
					}
					if measuring.Load() {
						measured.Add(1)
					}
				}
				return nil
			}()
		}()
	}
	warm := time.NewTimer(d / 4)
	defer warm.Stop()
	var start time.Time
	var firstErr error
	for done := 0; done < writers; {
		select {
		case <-warm.C:
			start = time.Now()
			measuring.Store(true)
		case err := <-errs:
			done++
			if err != nil && firstErr == nil {
				firstErr = err
				cancel() // the others stop too
			}
		}
	}
	measuring.Store(false)
	if firstErr != nil {
		if cerr := ctx.Err(); cerr != nil && errors.Is(firstErr, net.ErrClosed) {
			firstErr = cerr
		}
		return 0, fmt.Errorf("floors: %d writers: %w", writers, firstErr)
	}
	if start.IsZero() {
		return 0, fmt.Errorf("floors: %d writers: done before the warm-up ended", writers)
	}
	return float64(measured.Load()) / time.Since(start).Seconds(), nil
}

// runFloorServer is `bench floor-server DIR`: a voter on a raft-wal log in DIR, with a
// TCP transport on loopback and hashicorp/raft configured as idemkv configures it
// (batched applies, pipelined replication off), behind floorServe. It prints its HTTP
// and Raft addresses on one line, reads the voters' Raft addresses (comma separated)
// from stdin's first line, bootstraps a cluster of them, and serves until stdin closes.
func runFloorServer(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: bench floor-server DIR")
	}
	dir := args[0]
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("floors: %w", err)
	}
	w, err := wal.Open(dir)
	if err != nil {
		return fmt.Errorf("floors: raft-wal: %w", err)
	}
	defer func() { _ = w.Close() }()
	trans, err := raft.NewTCPTransportWithConfig("127.0.0.1:0", nil, &raft.NetworkTransportConfig{
		MaxPool: 5, Timeout: 10 * time.Second, MaxRPCsInFlight: 1, Logger: hclog.NewNullLogger()})
	if err != nil {
		return fmt.Errorf("floors: raft transport: %w", err)
	}
	conf := floorRaftConfig(raft.ServerID(trans.LocalAddr()))
	// As idemkv's nodes do (node.go), the leader replicates from a cache of the
	// newest entries rather than reading each back from raft-wal.
	logs, err := raft.NewLogCache(floorLogCache, w)
	if err != nil {
		_ = trans.Close()
		return fmt.Errorf("floors: raft log cache: %w", err)
	}
	r, err := raft.NewRaft(conf, nopFSM{}, logs, w, raft.NewInmemSnapshotStore(), trans)
	if err != nil {
		_ = trans.Close()
		return fmt.Errorf("floors: raft: %w", err)
	}
	defer func() { _ = r.Shutdown().Error() }()
	addr, stop, err := floorServe(r)
	if err != nil {
		return err
	}
	defer stop()
	if _, err := fmt.Fprintln(stdout, addr, trans.LocalAddr()); err != nil {
		return err
	}
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadString('\n')
	if err != nil {
		return nil // stopped before the cluster formed
	}
	var servers []raft.Server
	for _, a := range strings.Split(strings.TrimSpace(line), ",") {
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(a), Address: raft.ServerAddress(a)})
	}
	if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
		return fmt.Errorf("floors: raft bootstrap: %w", err)
	}
	_, _ = io.Copy(io.Discard, in)
	return nil
}
