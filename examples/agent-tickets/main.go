// Command agent-tickets shows idemkv at the tool boundary of an agent runtime: an
// agent creates incident tickets through client.Do against a fake ticket API that
// sometimes times out after it created the ticket, a queue hands the same approval to
// two workers, a confused planner reuses an approval's key with other arguments, and
// a tool with no probe dies with its outcome unknown, which an operator settles.
//
// It prints every decision with the span attributes of docs/protocol.md section 6, then the
// ticket API's own count: one ticket per approved operation. By default it runs an
// embedded single node of its own; --endpoint points it at a running idemkv.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/node"
	"github.com/idemkv/idemkv/telemetry"
)

type options struct {
	endpoint string // empty: run an embedded node
	dataDir  string // empty: a temporary directory
	verbose  bool
}

func main() {
	var opt options
	flag.StringVar(&opt.endpoint, "endpoint", "", "API address of a running idemkv (default: start an embedded node)")
	flag.StringVar(&opt.dataDir, "data-dir", "", "data directory of the embedded node (default: a temporary one, removed on exit)")
	flag.BoolVar(&opt.verbose, "v", false, "log what the node and the client do, to stderr")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, opt, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "agent-tickets:", err)
		os.Exit(1)
	}
}

const tenant = "tenant_42"

// approval is a human approval of one operation; its key names that operation.
type approval struct {
	id   string
	args ticketArgs
	// noProbe: the runtime wires no probe for this call, as for a tool whose API
	// offers no lookup by external id.
	noProbe bool
}

func run(ctx context.Context, opt options, out io.Writer) error {
	log := slog.New(slog.DiscardHandler)
	if opt.verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	p := &printer{w: out}

	// The embedded node's server spans use the global provider, built from OTEL_*.
	shutdownTracing, err := telemetry.Setup(ctx, "agent-tickets-idemkv")
	if err != nil {
		return err
	}
	defer func() { _ = shutdownTracing(context.Background()) }()

	endpoint, conversation := opt.endpoint, "conversation_9"
	if endpoint == "" {
		addr, stopNode, err := startNode(ctx, opt.dataDir, log)
		if err != nil {
			return err
		}
		defer stopNode()
		endpoint = addr
		p.printf("idemkv: embedded single node, API at %s\n", addr)
	} else {
		// A running store remembers earlier runs: a fresh conversation keeps this run's
		// keys apart from theirs.
		conversation += "_" + randomSuffix()
		p.printf("idemkv: %s\n", endpoint)
	}
	tickets, err := startTicketAPI()
	if err != nil {
		return err
	}
	defer tickets.close()
	p.printf("ticket API: %s\n", tickets.url)

	// The spans printed below, and wherever the standard OTEL_* variables send them
	// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER=otlp|console), as the idemkv
	// binary does.
	exporters, err := telemetry.Exporters(ctx)
	if err != nil {
		return err
	}
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithSyncer(p)}
	for _, exp := range exporters {
		tpOpts = append(tpOpts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(tpOpts...)
	defer func() { _ = tp.Shutdown(context.Background()) }()
	idem, err := client.New(client.Config{
		Endpoints:      []string{endpoint},
		Logger:         log,
		TracerProvider: tp,
		Propagator:     propagation.TraceContext{},
	})
	if err != nil {
		return err
	}
	defer idem.Close()

	rt := &runtime{idem: idem, tickets: &ticketClient{base: tickets.url, http: &http.Client{}, timeout: 300 * time.Millisecond},
		conversation: conversation, p: p, tracer: tp.Tracer("agent-tickets")}
	outage := approval{id: "approval_17", args: ticketArgs{Title: "Outage X: checkout API returns 5xx", Severity: "sev1"}}
	latency := approval{id: "approval_18", args: ticketArgs{Title: "Latency on search above SLO", Severity: "sev2"}}

	p.printf("\n1. %s: the ticket API creates the ticket, then times out; the queue redelivers the approval.\n", outage.id)
	tickets.slowAfterCreate.Store(1)
	if err := rt.handle(ctx, outage, outage.args, "worker-a", "worker-b"); err != nil {
		return err
	}

	p.printf("\n2. %s: queue redelivery hands the approval to two workers at once.\n", latency.id)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, w := range []string{"worker-c", "worker-d"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = rt.handle(ctx, latency, latency.args, w)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}

	p.printf("\n3. The planner reuses %s's key with other arguments.\n", outage.id)
	reused := outage.args
	reused.Severity = "sev3"
	if err := rt.handle(ctx, outage, reused, "worker-e"); err != nil {
		return err
	}

	p.printf("\n4. A late retry of %s.\n", outage.id)
	if err := rt.handle(ctx, outage, outage.args, "worker-f"); err != nil {
		return err
	}

	paging := approval{id: "approval_19", args: ticketArgs{Title: "On-call did not acknowledge page", Severity: "sev2"}, noProbe: true}
	if err := rt.inDoubtStory(ctx, tickets, paging); err != nil {
		return err
	}

	p.printf("\nticket API's own count:\n")
	var bad []string
	for _, a := range []approval{outage, latency, paging} {
		n, _ := tickets.count(rt.key(a))
		mark := "ok"
		if n != 1 {
			mark = "WRONG"
			bad = append(bad, a.id)
		}
		p.printf("  %-12s %d ticket  %s\n", a.id, n, mark)
	}
	_, total := tickets.count("")
	p.printf("  total        %d tickets for 3 approved operations\n", total)
	if len(bad) > 0 || total != 3 {
		return fmt.Errorf("not exactly one ticket per approved operation: %v, %d in total", bad, total)
	}
	return nil
}

// runtime is the agent runtime's side: it turns an approved tool call into a Do.
type runtime struct {
	idem         *client.Client
	tickets      *ticketClient
	conversation string
	p            *printer
	tracer       trace.Tracer
}

// key names the business operation: every retry of the approval, by any worker,
// carries it.
func (rt *runtime) key(a approval) string {
	return rt.conversation + ":" + a.id + ":create_ticket"
}

// handle delivers an approval to the first worker, and again to the next one while
// the outcome is unknown, as a queue with at-least-once delivery does.
func (rt *runtime) handle(ctx context.Context, a approval, args ticketArgs, workers ...string) error {
	key := rt.key(a)
	for _, worker := range workers {
		op := client.Op{
			Tenant: tenant,
			Key:    key,
			Tool:   "create_ticket",
			Actor:  worker,
			Class:  client.NonIdempotentMutation,
			Effect: map[string]any{
				"tenant": tenant, "project": "OPS", "title": args.Title, "severity": args.Severity,
				"customer_id": "cus_9", "incident_id": "inc_" + a.id,
				// Volatile: they change on every attempt and must not change the effect.
				"trace_id":      randomSuffix(),
				"model_wording": "I will create the incident ticket now.",
			},
			Drop:     []string{"trace_id", "model_wording"},
			LeaseTTL: time.Second,
			Probe:    rt.tickets.probe(key),
		}
		if a.noProbe {
			op.Probe = nil
		}
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		dctx, delivery := rt.tracer.Start(dctx, "deliver "+a.id)
		res, err := rt.idem.Do(dctx, op, rt.tickets.createTicket(key, args))
		delivery.End()
		cancel()
		var (
			ce  *client.ConflictError
			fe  *client.StoredFailureError
			ou  *client.OutcomeUnknownError
			msg string
		)
		settled := true
		switch {
		case err == nil:
			how := "executed the tool"
			switch {
			case res.Replayed:
				how = "replayed the stored receipt; the tool did not run"
			case res.Probed:
				how = "the probe found the ticket; committed it without running the tool"
			case res.Decision == idemkv.DecisionRecover:
				how = "the probe found nothing; executed the tool"
			}
			msg = fmt.Sprintf("%s -> %s (%s)", res.Decision, res.Receipt.RemoteID, how)
		case errors.As(err, &ce):
			msg = fmt.Sprintf("conflict, nothing executed: the key holds %s (%s), this call is %s",
				ce.Conflict.ExistingFingerprint, ce.Conflict.ExistingRemoteID, ce.Conflict.ReceivedFingerprint)
		case errors.As(err, &fe):
			msg = fmt.Sprintf("stored failure: %v", err)
		case errors.Is(err, client.ErrInDoubt):
			msg = fmt.Sprintf("in doubt, left for a person: %v", err)
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &ou):
			settled = false
			msg = fmt.Sprintf("outcome unknown (%v); the record stays pending until its lease runs out", ou.Cause)
		default:
			// not_executed or store_unavailable: nothing ran; the next delivery tries again.
			settled = false
			msg = fmt.Sprintf("%s (%v)", client.KindOf(err), err)
		}
		rt.p.report(worker, msg, delivery.SpanContext().TraceID())
		if settled {
			return nil
		}
	}
	return fmt.Errorf("%s: no outcome after %d deliveries", key, len(workers))
}

// startNode runs an embedded single idemkv node with its HTTP API on loopback.
func startNode(ctx context.Context, dir string, log *slog.Logger) (apiAddr string, stop func(), err error) {
	cleanup := func() {}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "agent-tickets-"); err != nil {
			return "", nil, err
		}
		cleanup = func() { _ = os.RemoveAll(dir) }
	}
	raftAddr, err := freeAddr()
	if err != nil {
		cleanup()
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cleanup()
		return "", nil, err
	}
	cfg := node.DefaultConfig()
	cfg.DataDir, cfg.RaftAddr, cfg.APIAddr, cfg.Bootstrap, cfg.Logger = dir, raftAddr, ln.Addr().String(), true, log
	n, err := node.Open(cfg)
	if err != nil {
		ln.Close()
		cleanup()
		return "", nil, err
	}
	// The embedded node's request spans go where OTEL_* says (nowhere by default), as
	// children of the client's spans.
	srv := api.NewHTTPServer(cfg.APIAddr, api.New(api.Config{Store: n, Logger: log, Middleware: telemetry.HTTPMiddleware}).Handler())
	go func() { _ = srv.Serve(ln) }()
	stop = func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx) // API first, then the node under it
		_ = n.Close()
		cleanup()
	}
	deadline := time.Now().Add(15 * time.Second)
	for n.Ready() != nil || !n.IsLeader() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return "", nil, fmt.Errorf("the embedded node did not become a ready leader: %v", n.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cfg.APIAddr, stop, nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// printer writes the story and, as a span exporter, keeps each tool-call span until
// the story reaches it.
type printer struct {
	mu    sync.Mutex
	w     io.Writer
	spans map[trace.TraceID][]sdktrace.ReadOnlySpan
}

func (p *printer) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

// spanKeys are printed in the order of docs/protocol.md section 6.
var spanKeys = []string{
	"agent.tool.name", "agent.tool.side_effect", "agent.idempotency.key", "agent.idempotency.fingerprint",
	"agent.idempotency.decision", "agent.idempotency.receipt.remote_id", "idemkv.tenant", "idemkv.fence",
}

func (p *printer) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.spans == nil {
		p.spans = map[trace.TraceID][]sdktrace.ReadOnlySpan{}
	}
	for _, s := range spans {
		if strings.HasPrefix(s.Name(), "execute_tool ") { // not the HTTP calls under it
			id := s.SpanContext().TraceID()
			p.spans[id] = append(p.spans[id], s)
		}
	}
	return nil
}

// report prints what one delivery came to, with its tool-call span.
func (p *printer) report(worker, msg string, id trace.TraceID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "  %s: %s\n", worker, msg)
	for _, s := range p.spans[id] {
		vals := map[string]string{}
		for _, kv := range s.Attributes() {
			vals[string(kv.Key)] = kv.Value.String()
		}
		fmt.Fprintf(p.w, "      span %q\n", s.Name())
		for _, k := range spanKeys {
			if v, ok := vals[k]; ok {
				fmt.Fprintf(p.w, "        %-38s %s\n", k, v)
			}
		}
	}
	delete(p.spans, id)
}

func (p *printer) Shutdown(context.Context) error { return nil }
