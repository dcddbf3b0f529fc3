package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench/etcdtarget"
	"github.com/idemkv/idemkv/bench/pgtarget"
	"github.com/idemkv/idemkv/loadgen"
)

// Names of the peers in results.json; idemkv's systems are named by idemkvName.
const (
	sysPGSync = "postgres-sync"
	sysPG     = "postgres"
	sysEtcd   = "etcd"
)

// Routes of a replay point: to the leader, as the Go client sends everything, or
// spread over the nodes with each worker pinned to one (loadgen.HTTPConfig.Pinned).
const (
	routeLeader = "leader"
	routeSpread = "spread"
)

// syncStandbys is how many standbys the replicated PostgreSQL must have streaming in
// quorum before a point is measured on it.
const syncStandbys = 2

// cluster is one idemkv cluster under test: its Raft log backend and its nodes.
type cluster struct {
	backend   string
	endpoints []string
}

// clusterFlag collects repeated --idemkv3/--idemkv1 values of the form BACKEND=ADDRS.
type clusterFlag struct {
	nodes    int
	clusters *[]cluster
}

func (f clusterFlag) String() string {
	if f.clusters == nil {
		return ""
	}
	parts := make([]string, len(*f.clusters))
	for i, c := range *f.clusters {
		parts[i] = c.backend + "=" + strings.Join(c.endpoints, ",")
	}
	return strings.Join(parts, " ")
}

func (f clusterFlag) Set(v string) error {
	backend, addrs, ok := strings.Cut(v, "=")
	if !ok || backend == "" || addrs == "" {
		return fmt.Errorf("%q is not BACKEND=ADDRS (e.g. bolt=127.0.0.1:7420,…)", v)
	}
	eps := strings.Split(addrs, ",")
	if len(eps) != f.nodes {
		return fmt.Errorf("%s: %d addresses for a %d-node cluster", backend, len(eps), f.nodes)
	}
	for _, c := range *f.clusters {
		if c.backend == backend {
			return fmt.Errorf("two %d-node clusters with the %s log", f.nodes, backend)
		}
	}
	*f.clusters = append(*f.clusters, cluster{backend: backend, endpoints: eps})
	return nil
}

// system is one store under comparison.
type system struct {
	SystemInfo
	// open connects with conns connections; route is a replay point's route
	// (idemkv only; empty for every other point).
	open func(ctx context.Context, conns int, route string) (loadgen.Target, error)
	// endpoints are an idemkv system's API addresses, whose /metrics the stage
	// breakdown scrapes.
	endpoints []string
}

func plural(n int, s string) string {
	if n == 1 {
		return s
	}
	return s + "s"
}

func idemkvName(nodes int, backend string) string { return fmt.Sprintf("idemkv-%d/%s", nodes, backend) }

func idemkvSystem(o options, nodes int, c cluster) system {
	return system{
		SystemInfo: SystemInfo{Name: idemkvName(nodes, c.backend), Label: fmt.Sprintf("idemkv, %d %s, %s log", nodes, plural(nodes, "node"), c.backend),
			Legend: fmt.Sprintf("idemkv %d %s", nodes, c.backend), Nodes: nodes, Backend: c.backend},
		open: func(ctx context.Context, conns int, route string) (loadgen.Target, error) {
			// The target rewrites its endpoints in place.
			eps := append([]string(nil), c.endpoints...)
			return loadgen.NewHTTPTarget(ctx, loadgen.HTTPConfig{Endpoints: eps, Tenant: o.tenant, Conns: conns,
				Pinned: route == routeSpread})
		},
		endpoints: c.endpoints,
	}
}

// systems lists what the flags name, in the order points are measured: each pairing's
// systems next to each other, so that whatever else the machine does falls on both.
func systems(o options, replication *pgReplication) []system {
	var out []system
	for _, c := range o.idemkv3 {
		out = append(out, idemkvSystem(o, 3, c))
	}
	if o.pgSync != "" {
		out = append(out, system{SystemInfo: SystemInfo{Name: sysPGSync, Label: "PostgreSQL primary + 2 quorum-sync standbys", Legend: "pg + 2 sync"},
			open: func(ctx context.Context, conns int, _ string) (loadgen.Target, error) {
				t, err := pgtarget.New(ctx, pgtarget.Config{DSN: o.pgSync, Tenant: o.tenant, Conns: conns})
				if err != nil {
					return nil, err
				}
				if err := replication.check(ctx, t); err != nil {
					_ = t.Close()
					return nil, err
				}
				return t, nil
			}})
	}
	for _, c := range o.idemkv1 {
		out = append(out, idemkvSystem(o, 1, c))
	}
	if o.pg != "" {
		out = append(out, system{SystemInfo: SystemInfo{Name: sysPG, Label: "PostgreSQL, 1 server", Legend: "pg 1"},
			open: func(ctx context.Context, conns int, _ string) (loadgen.Target, error) {
				return pgtarget.New(ctx, pgtarget.Config{DSN: o.pg, Tenant: o.tenant, Conns: conns})
			}})
	}
	if o.etcd != "" {
		out = append(out, system{SystemInfo: SystemInfo{Name: sysEtcd, Label: "etcd, 3 members", Legend: "etcd 3"},
			open: func(ctx context.Context, _ int, _ string) (loadgen.Target, error) {
				return etcdtarget.New(ctx, etcdtarget.Config{Endpoints: strings.Split(o.etcd, ","), Tenant: o.tenant})
			}})
	}
	return out
}

// pgReplication checks, each time the replicated PostgreSQL is opened, that its
// standbys stream in quorum, and keeps what it saw for results.json.
type pgReplication struct {
	Names    string             `json:"synchronous_standby_names"`
	Standbys []pgtarget.Standby `json:"standbys"`
}

func (r *pgReplication) check(ctx context.Context, t *pgtarget.Target) error {
	names, standbys, err := t.Replication(ctx)
	if err != nil {
		return err
	}
	r.Names, r.Standbys = names, standbys
	return r.judge()
}

// judge refuses what it saw unless syncStandbys standbys stream in quorum.
func (r *pgReplication) judge() error {
	n := 0
	for _, s := range r.Standbys {
		if s.State == "streaming" && s.SyncState == "quorum" {
			n++
		}
	}
	if n < syncStandbys {
		return fmt.Errorf("%w: %d of %d standbys streaming in quorum (synchronous_standby_names %q, standbys %+v)",
			idemkv.ErrInvalidArgument, n, syncStandbys, r.Names, r.Standbys)
	}
	return nil
}

// pairing is one comparison the report leads with: idemkv's systems of a size against
// the peer that keeps acknowledged writes as durable.
type pairing struct {
	title      string
	short      string // in the targets' lines
	durability string
	nodes      int
	peer       string
	// newTarget is the least idemkv ÷ peer ratio of new operations the issue asks for
	// at a client count (false: none there).
	newTarget func(clients int) (float64, bool)
	// spreadReplayTarget, when positive, is the least ratio of idemkv's replays spread
	// over the nodes to the peer's replays.
	spreadReplayTarget float64
	// cpuTargetAt, when positive, is the client count at which idemkv's CPU per new
	// operation, across all its processes, must be at or below the peer's.
	cpuTargetAt int
}

var pairings = []pairing{
	{
		title: "3 idemkv nodes vs PostgreSQL primary + 2 quorum-sync standbys",
		short: "vs PostgreSQL + 2 quorum-sync standbys",
		durability: "idemkv acknowledges a write once 2 of its 3 nodes have fsynced it (a Raft quorum); " +
			"PostgreSQL once the primary has flushed its WAL and 1 of the 2 standbys has flushed it too " +
			"(`synchronous_standby_names = 'ANY 1 (s1, s2)'`, `synchronous_commit = on`: remote flush). " +
			"PostgreSQL's reserve is a write statement (INSERT … ON CONFLICT), which a standby cannot run, " +
			"so its replays go to the primary.",
		nodes: 3, peer: sysPGSync,
		newTarget: func(c int) (float64, bool) {
			switch c {
			case 1, 16:
				return 1.0, true
			case 64, 256:
				return 1.5, true
			}
			return 0, false
		},
		spreadReplayTarget: 2,
		cpuTargetAt:        64,
	},
	{
		title: "1 idemkv node vs 1 PostgreSQL",
		short: "vs 1 PostgreSQL",
		durability: "Each acknowledges a write once it has fsynced it on its one server " +
			"(PostgreSQL with `fsync = on`, `synchronous_commit = on`, no standby).",
		nodes: 1, peer: sysPG,
		newTarget: func(int) (float64, bool) {
			return 1.0, true
		},
		cpuTargetAt: 64,
	},
	{
		title:      "3 idemkv nodes vs 3 etcd members",
		short:      "vs 3 etcd members",
		durability: "Both acknowledge a write once a quorum (2 of 3) has fsynced it to its Raft log.",
		nodes:      3, peer: sysEtcd,
		newTarget: func(c int) (float64, bool) {
			if c == 64 {
				return 1.5, true
			}
			return 0, false
		},
	},
}
