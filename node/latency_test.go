package node_test

import (
	"fmt"
	"testing"
	"time"

	metrics "github.com/hashicorp/go-metrics/compat"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/loadgen"
	"github.com/idemkv/idemkv/node"
)

// BenchmarkReserveOneClient measures one client's reserve of new keys on a three-node
// cluster (in process, real disk and TCP) and splits its latency the way Raft sees it:
// the leader's own log write, the round trip that carries the entry to a follower and
// back (the follower's log write inside it), and the time from the leader's write to
// commit. The machine's fsync latency is measured in the same data dir for comparison.
//
//	go test -run '^$' -bench ReserveOneClient -benchtime 3000x ./node/
func BenchmarkReserveOneClient(b *testing.B) {
	sink := metrics.NewInmemSink(time.Hour, time.Hour)
	mc := metrics.DefaultConfig("idemkv")
	mc.EnableHostname, mc.EnableRuntimeMetrics, mc.EnableServiceLabel = false, false, false
	if _, err := metrics.NewGlobal(mc, sink); err != nil {
		b.Fatal(err)
	}
	defer metrics.NewGlobal(mc, &metrics.BlackholeSink{}) //nolint:errcheck // restoring the default

	c := testcluster.Start(b, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		// Production timeouts, so no election or snapshot lands in the measurement.
		d := node.DefaultConfig()
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = d.HeartbeatTimeout, d.ElectionTimeout, d.LeaderLeaseTimeout
		cfg.SnapshotThreshold, cfg.TrailingLogs, cfg.SnapshotInterval = d.SnapshotThreshold, d.TrailingLogs, d.SnapshotInterval
	}))
	leader := c.LeaderIndex(b)
	n := c.Node(leader)
	fsync, err := loadgen.ProbeFsync(c.DataDir(leader), 500)
	if err != nil {
		b.Fatal(err)
	}
	ctx := ctxT(b)
	h := &loadgen.Histogram{}
	sink.Data() // start the interval now
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		res, err := n.Reserve(ctx, reserveReq(fmt.Sprintf("one-%d", i), "a", "sha256:b"))
		if err != nil {
			b.Fatal(err)
		}
		if res.Decision != idemkv.DecisionExecute {
			b.Fatalf("reserve of a new key answered %s", res.Decision)
		}
		h.Record(time.Since(t0))
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	b.ReportMetric(ms(h.Quantile(0.5)), "reserve-p50-ms")
	b.ReportMetric(ms(h.Quantile(0.99)), "reserve-p99-ms")
	b.ReportMetric(ms(fsync.Quantile(0.5)), "fsync-p50-ms")
	b.ReportMetric(float64(h.Quantile(0.5))/float64(fsync.Quantile(0.5)), "reserve/fsync")
	mean := map[string]float64{}
	for _, iv := range sink.Data() {
		for name, s := range iv.Samples {
			if s.AggregateSample != nil && s.Count > 0 {
				mean[name] = s.AggregateSample.Mean()
			}
		}
	}
	for metric, unit := range map[string]string{
		"idemkv.raft.leader.dispatchLog":                                  "leader-log-write-ms",
		"idemkv.raft.rpc.appendEntries.storeLogs":                         "follower-log-write-ms",
		"idemkv.raft.replication.appendEntries.rpc." + c.ID((leader+1)%3): "append-rpc-ms",
		"idemkv.raft.commitTime":                                          "commit-ms",
	} {
		b.ReportMetric(mean[metric], unit)
	}
}

// BenchmarkRaftLogOneClient compares the Raft log backends: one client reserves new
// keys, in turn on a cluster of each backend (in process, real disk and TCP), so that
// whatever else loads the machine falls on both alike. It reports each backend's
// p50/p99 and the ratio of the p50s (wal/bolt), beside the data dir's fsync p50.
//
//	go test -run '^$' -bench RaftLogOneClient -benchtime 2000x ./node/
func BenchmarkRaftLogOneClient(b *testing.B) {
	for _, nodes := range []int{1, 3} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			leaders := map[string]*node.Node{}
			var dir string
			for _, backend := range node.RaftLogs {
				c := testcluster.Start(b, nodes, testcluster.WithConfig(func(i int, cfg *node.Config) {
					// Production timeouts and snapshots, so no election or snapshot lands
					// in the measurement.
					d := node.DefaultConfig()
					cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = d.HeartbeatTimeout, d.ElectionTimeout, d.LeaderLeaseTimeout
					cfg.SnapshotThreshold, cfg.TrailingLogs, cfg.SnapshotInterval = d.SnapshotThreshold, d.TrailingLogs, d.SnapshotInterval
					cfg.RaftLog = backend
				}))
				leader := c.LeaderIndex(b)
				leaders[backend], dir = c.Node(leader), c.DataDir(leader)
			}
			fsync, err := loadgen.ProbeFsync(dir, 200)
			if err != nil {
				b.Fatal(err)
			}
			ctx := ctxT(b)
			hists := map[string]*loadgen.Histogram{}
			for _, backend := range node.RaftLogs {
				hists[backend] = &loadgen.Histogram{}
			}
			b.ResetTimer()
			for i := range b.N {
				for _, backend := range node.RaftLogs {
					t0 := time.Now()
					res, err := leaders[backend].Reserve(ctx, reserveReq(fmt.Sprintf("one-%d", i), "a", "sha256:b"))
					if err != nil {
						b.Fatal(err)
					}
					if res.Decision != idemkv.DecisionExecute {
						b.Fatalf("reserve of a new key on %s answered %s", backend, res.Decision)
					}
					hists[backend].Record(time.Since(t0))
				}
			}
			b.StopTimer()
			ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
			for _, backend := range node.RaftLogs {
				b.ReportMetric(ms(hists[backend].Quantile(0.5)), backend+"-p50-ms")
				b.ReportMetric(ms(hists[backend].Quantile(0.99)), backend+"-p99-ms")
			}
			b.ReportMetric(float64(hists[node.RaftLogWAL].Quantile(0.5))/float64(hists[node.RaftLogBolt].Quantile(0.5)), "wal/bolt-p50")
			b.ReportMetric(ms(fsync.Quantile(0.5)), "fsync-p50-ms")
		})
	}
}
