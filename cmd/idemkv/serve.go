package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/console"
	"github.com/idemkv/idemkv/expiry"
	"github.com/idemkv/idemkv/internal/connlimit"
	"github.com/idemkv/idemkv/internal/testhooks"
	"github.com/idemkv/idemkv/metrics"
	"github.com/idemkv/idemkv/node"
	"github.com/idemkv/idemkv/storage"
	"github.com/idemkv/idemkv/telemetry"
)

type serveOptions struct {
	node           node.Config
	httpAddr       string
	advertiseHTTP  string
	join           []string
	peerAddresses  []string
	logLevel       string
	logFormat      string
	pprof          bool
	maxToolLabels  int
	maxToolsTenant int
	maxLongPolls   int
	maxPollsToken  int
	maxPollsTenant int
	maxConns       int
	maxConnsSource int
	cacheMB        int64
	shutdownGrace  time.Duration
	noConsole      bool
	limits         idemkv.Limits
	extra          serveExtras
}

func newServeCommand() *cobra.Command {
	o := serveOptions{node: node.DefaultConfig(), limits: idemkv.DefaultLimits(), shutdownGrace: 10 * time.Second,
		maxToolLabels: metrics.DefaultMaxToolLabels, maxToolsTenant: metrics.DefaultMaxToolLabelsPerTenant, maxLongPolls: api.DefaultMaxLongPolls, maxPollsToken: api.DefaultMaxLongPollsPerCaller,
		maxConns: api.DefaultMaxConns, maxConnsSource: api.DefaultMaxConnsPerSource}
	o.node.Sweep = expiry.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run an idemkv node",
		Long: `Run an idemkv node.

A fresh node without --join bootstraps a single-node cluster; a node whose data dir
already holds state just restarts. With --join (any member's API address), a new node
asks the cluster to add it and retries until it is in.

  idemkv serve
  idemkv serve --id n2 --data-dir d2 --http-addr 127.0.0.1:7430 --raft-addr 127.0.0.1:7431 --join 127.0.0.1:7420`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runServe(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.node.ID, "id", o.node.ID, "node ID, unique in the cluster and fixed for a data dir")
	f.StringVar(&o.node.DataDir, "data-dir", o.node.DataDir, "directory for the Raft log, snapshots and the Pebble store")
	f.StringVar(&o.node.RaftLog, "raft-log", "", raftLogUsage)
	f.IntVar(&o.node.RaftWALSegmentBytes, "raft-wal-segment-bytes", o.node.RaftWALSegmentBytes, "size of the wal backend's segment files; compaction frees the log's disk space a segment at a time")
	f.DurationVar(&o.node.RaftLogVerifyInterval, "raft-log-verify-interval", o.node.RaftLogVerifyInterval, "how often the leader asks every node to check its Raft log against the leader's checksum (raft-wal's verifier); negative turns it off")
	f.IntVar(&o.node.RaftLogVerifyEntries, "raft-log-verify-entries", o.node.RaftLogVerifyEntries, "most Raft log entries one check covers: the leader asks sooner than --raft-log-verify-interval once this many followed its last checkpoint, so no node reads back a long range at once")
	f.StringVar(&o.httpAddr, "http-addr", o.node.APIAddr, "address the HTTP API listens on")
	f.StringVar(&o.node.RaftAddr, "raft-addr", o.node.RaftAddr, "address Raft listens on")
	f.StringVar(&o.advertiseHTTP, "advertise-http-addr", "", "API address clients and peers use to reach this node (default --http-addr)")
	f.StringVar(&o.node.RaftAdvertise, "advertise-raft-addr", "", "Raft address peers dial (default --raft-addr)")
	f.StringSliceVar(&o.join, "join", nil, "API address of a member to join through (repeatable; tried in turn)")
	f.StringSliceVar(&o.peerAddresses, "peer-address", nil, "ID=HOST:PORT: dial peer ID at this address instead of its advertised one (NAT, proxies; repeatable)")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	f.BoolVar(&o.pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on the API address, to admin tokens only")
	f.IntVar(&o.maxToolLabels, "metrics-max-tools", o.maxToolLabels, "distinct tool names that get metric series of their own; the rest count as \"other\"")
	f.IntVar(&o.maxToolsTenant, "metrics-max-tools-per-tenant", o.maxToolsTenant, "of those, how many one tenant's requests may claim (a name counts for the tenant that used it first)")
	f.IntVar(&o.maxLongPolls, "max-long-polls", o.maxLongPolls, "long-polls (get with wait_ms) this node holds at once; beyond, 429 resource_exhausted")
	f.IntVar(&o.maxPollsToken, "max-long-polls-per-token", o.maxPollsToken, "long-polls one token holds on this node at once; beyond, 429 resource_exhausted")
	f.IntVar(&o.maxPollsTenant, "max-long-polls-per-tenant", 0, "long-polls on one tenant's records this node holds at once, of every token together (default: half of --max-long-polls); beyond, 429 resource_exhausted")
	f.IntVar(&o.maxConns, "max-conns", o.maxConns,
		"API connections this node holds at once; past it a new one takes the place of an idle one (no request in flight) of the source holding the most, or waits")
	f.IntVar(&o.maxConnsSource, "max-conns-per-source", o.maxConnsSource,
		"one IPv4 address's or IPv6 /64's share of --max-conns; past it a new one takes the place of that source's oldest idle one (busy ones are kept)")
	f.BoolVar(&o.noConsole, "no-console", false, "do not serve the operator console at /ui (docs/console.md)")
	f.DurationVar(&o.shutdownGrace, "shutdown-grace", o.shutdownGrace, "how long shutdown waits for requests in flight")

	f.DurationVar(&o.node.HeartbeatTimeout, "heartbeat-timeout", o.node.HeartbeatTimeout, "Raft heartbeat timeout")
	f.DurationVar(&o.node.ElectionTimeout, "election-timeout", o.node.ElectionTimeout, "Raft election timeout")
	f.DurationVar(&o.node.LeaderLeaseTimeout, "leader-lease-timeout", o.node.LeaderLeaseTimeout, "Raft leader lease timeout (at most the heartbeat timeout)")
	f.Uint64Var(&o.node.SnapshotThreshold, "snapshot-threshold", o.node.SnapshotThreshold, "log entries between snapshots")
	f.DurationVar(&o.node.SnapshotInterval, "snapshot-interval", o.node.SnapshotInterval, "how often to check whether to snapshot")
	f.Uint64Var(&o.node.TrailingLogs, "trailing-logs", o.node.TrailingLogs, "log entries kept after a snapshot")
	f.Int64Var(&o.cacheMB, "cache-mb", storage.DefaultCacheBytes>>20, "MiB of Pebble block cache for the stored records' index, filter and data blocks")
	f.DurationVar(&o.node.ApplyTimeout, "apply-timeout", o.node.ApplyTimeout, "longest a write waits for replication when the client set no deadline")

	f.IntVar(&o.limits.MaxPayloadBytes, "max-payload-bytes", o.limits.MaxPayloadBytes, "largest result + error details stored per record")
	f.DurationVar(&o.limits.DefaultLeaseTTL, "default-lease-ttl", o.limits.DefaultLeaseTTL, "lease when a reserve gives no lease_ttl_ms")
	f.DurationVar(&o.limits.MinLeaseTTL, "min-lease-ttl", o.limits.MinLeaseTTL, "shortest lease_ttl_ms accepted")
	f.DurationVar(&o.limits.MaxLeaseTTL, "max-lease-ttl", o.limits.MaxLeaseTTL, "longest lease_ttl_ms accepted")
	f.DurationVar(&o.limits.DefaultTTL, "default-ttl", o.limits.DefaultTTL, "record retention when a reserve gives no ttl_ms or expires_at")
	f.DurationVar(&o.limits.MinTTL, "min-ttl", o.limits.MinTTL, "shortest retention accepted")
	f.DurationVar(&o.limits.MaxTTL, "max-ttl", o.limits.MaxTTL, "longest retention accepted")
	f.DurationVar(&o.node.Sweep.Interval, "sweep-interval", o.node.Sweep.Interval, "how often the leader sweeps expired records")
	f.IntVar(&o.node.Sweep.BatchLimit, "sweep-batch", o.node.Sweep.BatchLimit, "most records one sweep log entry deletes")
	f.Float64Var(&o.node.Sweep.Share, "sweep-share", o.node.Sweep.Share, "largest fraction of time a sweep round keeps an entry in flight (0-1], so writes do not queue behind sweeps")
	o.extra.register(cmd)
	return cmd
}

// raftLogUsage is --raft-log's help, for serve and restore.
var raftLogUsage = fmt.Sprintf("Raft log backend: %s (default: the one the data dir holds; a new data dir gets %s). "+
	"A data dir keeps its backend; see docs/operations.md to move a node to the other", strings.Join(node.RaftLogs, " or "), node.DefaultRaftLog)

func newLogger(level, format string, w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json, not %q", format)
}

func parsePeerAddresses(list []string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range list {
		id, addr, ok := strings.Cut(p, "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("--peer-address %q: want ID=HOST:PORT", p)
		}
		out[id] = addr
	}
	return out, nil
}

// The node is the API's store. Checked here, in a file of every build, because api must
// not import node (it stays free of Raft and Pebble) and a test-only check would not run
// in the binary's build.
var _ api.Store = (*node.Node)(nil)

// runServe runs a node until ctx ends (SIGINT or SIGTERM), then shuts down in order:
// leadership handed over, API drained, node closed.
func runServe(ctx context.Context, o serveOptions) error {
	logger, err := newLogger(o.logLevel, o.logFormat, os.Stderr)
	if err != nil {
		return err
	}
	routeLibraryLogs(logger)
	if err := o.limits.Validate(); err != nil {
		return err
	}
	if o.cacheMB < 1 {
		return fmt.Errorf("--cache-mb must be at least 1, not %d", o.cacheMB)
	}
	o.node.CacheBytes = o.cacheMB << 20
	if sh := o.node.Sweep.Share; sh <= 0 || sh > 1 {
		return fmt.Errorf("--sweep-share must be in (0, 1], not %g", sh)
	}
	if o.maxConns < 1 || o.maxConnsSource < 1 {
		return fmt.Errorf("--max-conns and --max-conns-per-source must be at least 1, not %d and %d", o.maxConns, o.maxConnsSource)
	}
	peers, err := parsePeerAddresses(o.peerAddresses)
	if err != nil {
		return err
	}
	tuneGC(logger)
	ln, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return fmt.Errorf("listen for the API: %w", err)
	}
	defer ln.Close()
	cfg := o.node
	cfg.APIAddr = o.advertiseHTTP
	if cfg.APIAddr == "" {
		cfg.APIAddr = ln.Addr().String()
	}
	cfg.PeerAddresses = peers
	cfg.Bootstrap = len(o.join) == 0
	cfg.Joining = len(o.join) > 0
	cfg.Limits = o.limits
	cfg.Logger = logger
	cfg.Metrics = metrics.New()
	cfg.Metrics.Tools.SetMax(o.maxToolLabels, o.maxToolsTenant)
	// Raft's own timers of a write's stages, beside the API's and the node's: this
	// process serves one node.
	if err := node.InstallRaftStageSink(cfg.Metrics); err != nil {
		return err
	}

	ex, err := o.extra.setup(ctx, &cfg, logger)
	if err != nil {
		return err
	}
	defer ex.close()

	shutdownTracing, err := telemetry.Setup(ctx, "idemkv")
	if err != nil {
		return err
	}
	defer func() {
		flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdownTracing(flushCtx); err != nil {
			logger.Warn("flushing traces", "err", err)
		}
	}()

	wireTestFaults(&cfg)
	n, err := node.Open(cfg)
	if err != nil {
		return err
	}
	testhooks.SetTransfer(n.TransferLeadership)
	if err := n.RegisterMetrics(cfg.Metrics); err != nil {
		_ = n.Close()
		return err
	}
	// A span per request wraps everything, authentication included.
	middleware := telemetry.HTTPMiddleware
	if ex.middleware != nil {
		middleware = func(h http.Handler) http.Handler { return telemetry.HTTPMiddleware(ex.middleware(h)) }
	}
	conflicts := console.NewConflicts(0)
	handler := api.New(api.Config{
		Store:         n,
		Logger:        logger,
		Metrics:       cfg.Metrics,
		Middleware:    middleware,
		ForwardScheme: ex.forwardScheme,
		Forward:       ex.forwardClient,
		Pprof:         o.pprof,

		MaxLongPolls:          o.maxLongPolls,
		MaxLongPollsPerCaller: o.maxPollsToken,
		MaxLongPollsPerTenant: o.maxPollsTenant,
		OnReserve:             conflicts.Observe,
	}).Handler()
	if !o.noConsole {
		cc := console.Config{API: handler, Peers: ex.forwardClient, PeerScheme: ex.forwardScheme, Conflicts: conflicts, Logger: logger}
		if ex.authn != nil {
			cc.Auth = ex.authn
		}
		// Each API request a console page makes goes through handler, spans and
		// authentication included.
		handler = console.New(cc).Mount(handler)
	}
	srv := api.NewHTTPServer(o.httpAddr, handler)
	// A flood of idle sockets from one host fills that host's share, not the node.
	limited := connlimit.New(ln, o.maxConns, o.maxConnsSource)
	ln, srv.ConnState = limited, limited.ConnState
	srv.ErrorLog = httpErrorLog(logger)
	srv.TLSConfig = ex.apiTLS
	serveErr := make(chan error, 1)
	go func() {
		var err error
		if srv.TLSConfig != nil {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			serveErr <- err
		}
		close(serveErr)
	}()
	logger.Info("idemkv serving", "id", cfg.ID, "api", cfg.APIAddr, "raft", cfg.RaftAdvertiseOrAddr(), "data_dir", cfg.DataDir, "version", version)

	joinCtx, stopJoin := context.WithCancel(ctx)
	joinDone := make(chan struct{})
	go func() {
		defer close(joinDone)
		if len(o.join) > 0 {
			seeds := make([]string, len(o.join))
			for i, m := range o.join {
				seeds[i] = ex.forwardScheme + "://" + m
			}
			// The join client carries the peer TLS and the join token itself.
			jc, err := client.New(client.Config{Endpoints: seeds, HTTPClient: ex.joinClient, Timeout: 15 * time.Second, Logger: logger})
			if err != nil {
				logger.Error("cannot join", "err", err)
				return
			}
			defer jc.Close()
			held := n.HeldState()
			join := &idemkv.JoinRequest{ID: cfg.ID, RaftAddr: cfg.RaftAdvertiseOrAddr(), APIAddr: cfg.APIAddr, Format: n.Format(),
				HoldsState: &held, Stage: idemkv.JoinLearner}
			if info, err := jc.JoinCluster(joinCtx, join); err == nil {
				promoteWhenCaughtUp(joinCtx, n, jc, join, info.CommitIndex, logger)
			}
			// A join through a leader of a release before formats records no format,
			// and so does one through a seed of that release (it drops the field it does
			// not know before it forwards): join again, at the leader itself, until the
			// replicated state holds this node's format (docs/operations.md,
			// "Upgrading"), so the cluster's can rise without this node leading.
			t := time.NewTicker(readvertiseEvery)
			defer t.Stop()
			for {
				select {
				case <-joinCtx.Done():
					return
				case <-t.C:
				}
				leader, isLeader := n.Leader()
				if !n.AdvertisePending() || isLeader || leader == "" {
					continue
				}
				lc, err := client.New(client.Config{Endpoints: []string{ex.forwardScheme + "://" + leader}, HTTPClient: ex.joinClient, Timeout: readvertiseEvery, Logger: logger})
				if err != nil {
					continue
				}
				actx, cancel := context.WithTimeout(joinCtx, readvertiseEvery)
				_, _ = lc.Join(actx, join)
				cancel()
				lc.Close()
			}
		}
	}()

	select {
	case <-ctx.Done():
		logger.Info("shutting down")
	case err := <-serveErr:
		logger.Error("API server failed", "err", err)
	}
	stopJoin()
	<-joinDone
	// Hand leadership over while the API still forwards, so clients in flight meet a
	// new leader instead of an election.
	if err := n.TransferLeadership(); err != nil {
		logger.Warn("leadership transfer failed", "err", err)
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), o.shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		logger.Warn("API shutdown", "err", err)
	}
	if err := n.Close(); err != nil {
		return err
	}
	logger.Info("stopped")
	return nil
}

// readvertiseEvery is how often a node whose format the replicated state does not hold
// joins again to advertise it.
const readvertiseEvery = 10 * time.Second

// serveGCPercent is the garbage collector's target when GOGC is not set. A node's
// heap is mostly short-lived request garbage; collecting at 4× the live heap instead
// of 2× cut the CPU a 3-node cluster spends per new operation enough to raise its
// throughput 7–15% at 64 clients (bench/README.md), for a heap that peaks at a few
// hundred MiB. GOGC and GOMEMLIMIT still override it.
const serveGCPercent = 400

func tuneGC(logger *slog.Logger) {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	debug.SetGCPercent(serveGCPercent)
	logger.Debug("garbage collector target set", "gogc", serveGCPercent)
}

// promoteWhenCaughtUp makes a node that joined as a learner a voter once it holds what
// the cluster had committed when it joined (at commit): a voter counts toward every
// quorum, so one that held nothing yet (or could not be reached at the raft_addr it
// gave) left the others short of one while a member was down. It asks until its own
// configuration makes it a voter (an answer is not enough: a leader of a release
// before stages refuses the stage, and is asked again until a newer one leads), and
// gives up on a refusal that asking again cannot change (an operator removed it
// meanwhile). A node that is a voter already (a restart, or a join through a release
// before stages, which adds voters at once) has nothing to do.
func promoteWhenCaughtUp(ctx context.Context, n *node.Node, jc *client.Client, join *idemkv.JoinRequest, commit uint64, logger *slog.Logger) {
	t := time.NewTicker(promoteCheckEvery)
	defer t.Stop()
	waiting := time.Now()
	for !n.CaughtUpTo(commit) {
		if time.Since(waiting) > promoteLogEvery {
			logger.Info("joined as a learner; catching up before becoming a voter", "commit_index", commit, "applied_index", n.AppliedIndex())
			waiting = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	promote := *join
	promote.Stage = idemkv.JoinPromote
	wait := promoteCheckEvery
	for !n.Voter() {
		_, err := jc.Join(ctx, &promote)
		if err == nil {
			logger.Info("caught up: asked to be a voter", "commit_index", commit)
		} else if idemkv.CodeOf(err) == idemkv.CodeInvalidArgument && !strings.Contains(err.Error(), "unknown field") {
			logger.Error("caught up, but the cluster refused to make this node a voter; it stays a learner", "err", err)
			return
		} else {
			logger.Warn("asking to be a voter failed; asking again", "err", err, "retry_in", wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, promoteRetryMax)
	}
	logger.Info("caught up and promoted to voter", "commit_index", commit)
}

// How often a learner checks whether it caught up, how often it says it waits, and
// the longest pause between two requests to be made a voter.
const (
	promoteCheckEvery = 100 * time.Millisecond
	promoteLogEvery   = 10 * time.Second
	promoteRetryMax   = 10 * time.Second
)
