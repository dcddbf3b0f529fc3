package node_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	walmetrics "github.com/hashicorp/raft-wal/metrics"
	"github.com/hashicorp/raft-wal/verifier"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/loadgen"
	"github.com/idemkv/idemkv/node"
)

// rottenLog is a Raft log store whose disk, once armed, returns other bytes than it
// was given for every entry read back from it (Raft reads the newest from its cache).
type rottenLog struct {
	raft.LogStore
	armed *atomic.Bool
}

func (s rottenLog) GetLog(index uint64, out *raft.Log) error {
	if err := s.LogStore.GetLog(index, out); err != nil || !s.armed.Load() || len(out.Data) == 0 {
		return err
	}
	data := append([]byte(nil), out.Data...)
	data[len(data)-1] ^= 0x40
	out.Data = data
	return nil
}

// verifications reads node i's idemkv_raft_log_verifications_total{result}.
func verifications(c *testcluster.Cluster, i int, result string) float64 {
	return testutil.ToFloat64(c.Metrics(i).RaftLogVerifications.WithLabelValues(result))
}

// TestRaftLogVerifierReportsAFollowerWhoseLogRots: raft-wal's verifier checksums the
// entries between two of the leader's log checkpoints on every node, as written and as
// read back. A follower whose log store reads back other bytes than it was given (a
// lost or rotten segment) reports a mismatch; the healthy nodes verify their ranges
// and report none (issue 22, point 6).
func TestRaftLogVerifierReportsAFollowerWhoseLogRots(t *testing.T) {
	var armed atomic.Bool
	const rotten = 2
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.RaftLogVerifyInterval = 300 * time.Millisecond
		cfg.SnapshotThreshold = 1 << 20 // keep the ranges in the log until they are checked
		if i == rotten {
			cfg.WrapRaftStores = func(s node.RaftStores) node.RaftStores {
				s.Log = rottenLog{LogStore: s.Log, armed: &armed}
				return s
			}
		}
	}))
	if c.WaitLeader() == rotten {
		c.Stop(rotten) // hands leadership over
		c.Restart(rotten)
		c.WaitLeader()
	}
	ctx := opsCtx(t)
	write := func(prefix string) {
		for i := range 20 {
			if err := c.OnLeader(func(n *node.Node) error {
				_, err := reserveAndCommit(ctx, n, fmt.Sprintf("%s-%02d", prefix, i), i%2 == 0)
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Healthy first: every node verifies ranges and none mismatches.
	write("healthy")
	waitFor(t, 30*time.Second, "every node verified a range", func() error {
		for i := range c.Len() {
			if verifications(c, i, "ok") == 0 {
				return fmt.Errorf("%s verified no range yet", c.ID(i))
			}
		}
		return nil
	})
	for i := range c.Len() {
		if got := verifications(c, i, "mismatch"); got != 0 {
			t.Fatalf("%s reported %v mismatches on a healthy log", c.ID(i), got)
		}
	}

	armed.Store(true)
	write("rotten")
	waitFor(t, 30*time.Second, "the rotten follower reported a mismatch", func() error {
		if verifications(c, rotten, "mismatch") == 0 {
			return fmt.Errorf("%s: ok %v, mismatch 0, unchecked %v", c.ID(rotten),
				verifications(c, rotten, "ok"), verifications(c, rotten, "unchecked"))
		}
		return nil
	})
	for i := range c.Len() {
		if got := verifications(c, i, "mismatch"); i != rotten && got != 0 {
			t.Fatalf("healthy %s reported %v mismatches", c.ID(i), got)
		}
	}
}

// TestRaftLogVerifierBoundsItsRanges: the leader appends a checkpoint once
// RaftLogVerifyEntries entries followed its last one, however long the interval, so
// every node reads back a short range at a time rather than a minute of writes in one
// go (raft-wal read each entry back with a 64 KiB pread, before walread.go: at 10,000
// entries a second a minute's range had halved a two-core machine's throughput for 6
// s). Here the
// interval is an hour: every checkpoint is the entry bound's.
func TestRaftLogVerifierBoundsItsRanges(t *testing.T) {
	const bound = 40
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(_ int, cfg *node.Config) {
		cfg.RaftLogVerifyInterval = time.Hour
		cfg.RaftLogVerifyEntries = bound
		cfg.SnapshotThreshold = 1 << 20 // keep the ranges in the log until they are checked
	}))
	c.WaitLeader()
	ctx := opsCtx(t)
	// Each round writes 2*bound entries (a reserve and a commit each), and each must
	// end in a checkpoint whose range every node checks.
	for round := 1; round <= 3; round++ {
		for i := range bound {
			if err := c.OnLeader(func(n *node.Node) error {
				_, err := reserveAndCommit(ctx, n, fmt.Sprintf("bounded-%d-%03d", round, i), true)
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 30*time.Second, fmt.Sprintf("every node verified %d bounded ranges", round), func() error {
			for i := range c.Len() {
				if got := verifications(c, i, "ok"); got < float64(round) {
					return fmt.Errorf("%s verified %v ranges (unchecked %v)", c.ID(i), got, verifications(c, i, "unchecked"))
				}
			}
			return nil
		})
	}
	for i := range c.Len() {
		if got := verifications(c, i, "mismatch"); got != 0 {
			t.Fatalf("%s reported %v mismatches on a healthy log", c.ID(i), got)
		}
	}
}

// BenchmarkRaftLogVerifier measures what the verifier costs, in one run: reserves of new
// keys alternate between a three-node wal cluster without it and one whose leader
// appends a checkpoint every second (60 times the default), so every node checksums
// each entry as it is stored and reads each range back once a second.
//
//	go test -run '^$' -bench RaftLogVerifier -benchtime 2000x ./node/
func BenchmarkRaftLogVerifier(b *testing.B) {
	leaders := map[string]*node.Node{}
	settings := map[string]time.Duration{"off": -1, "1s": time.Second}
	for name, interval := range settings {
		c := testcluster.Start(b, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
			d := node.DefaultConfig()
			cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = d.HeartbeatTimeout, d.ElectionTimeout, d.LeaderLeaseTimeout
			cfg.SnapshotThreshold, cfg.TrailingLogs, cfg.SnapshotInterval = d.SnapshotThreshold, d.TrailingLogs, d.SnapshotInterval
			cfg.RaftLog = node.RaftLogWAL
			cfg.RaftLogVerifyInterval = interval
		}))
		leaders[name] = c.Node(c.LeaderIndex(b))
	}
	ctx := ctxT(b)
	hists := map[string]*loadgen.Histogram{}
	for name := range settings {
		hists[name] = &loadgen.Histogram{}
	}
	b.ResetTimer()
	for i := range b.N {
		for _, name := range []string{"off", "1s"} {
			t0 := time.Now()
			if _, err := leaders[name].Reserve(ctx, reserveReq(fmt.Sprintf("v-%d", i), "a", "sha256:b")); err != nil {
				b.Fatal(err)
			}
			hists[name].Record(time.Since(t0))
		}
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	for name, h := range hists {
		b.ReportMetric(ms(h.Quantile(0.5)), "verify-"+name+"-p50-ms")
		b.ReportMetric(ms(h.Quantile(0.99)), "verify-"+name+"-p99-ms")
	}
}

// BenchmarkVerifierPerEntry is the verifier's CPU per entry of 200 bytes (a reserve's
// size): the checksum as it is stored, and the read-back of a range at a checkpoint.
func BenchmarkVerifierPerEntry(b *testing.B) {
	for _, verify := range []bool{false, true} {
		b.Run(fmt.Sprintf("verifier=%v", verify), func(b *testing.B) {
			var store raft.LogStore = raft.NewInmemStore()
			if verify {
				v := verifier.NewLogStore(store, func(l *raft.Log) (bool, error) { return l.Index%4096 == 0, nil },
					func(verifier.VerificationReport) {}, &walmetrics.NoOpCollector{})
				defer v.Close()
				store = v
			}
			data := make([]byte, 200)
			b.ReportAllocs()
			for i := range b.N {
				l := &raft.Log{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: data}
				if err := store.StoreLogs([]*raft.Log{l}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
