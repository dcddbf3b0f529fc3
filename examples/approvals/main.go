// Command approvals is a refund agent that asks a person before it refunds, through
// idemkv's approvals bound to the effect (docs/protocol.md "Approvals").
//
// Run it with no arguments: it starts an embedded idemkv node and a payments service
// that counts refunds, then runs the agent as a separate process three times. The
// first two runs suspend waiting for the approval and are killed with SIGKILL; the
// approver then sees one card, approves it, and the third run refunds. A fourth run
// replays the refund. Whatever the kills and resumes, there is one approval request
// and one refund.
//
// "approvals agent" is the agent itself: it reserves the refund with an approval
// requirement, and either waits for the decision (-wait) or exits as suspended.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/node"
)

const (
	tenant = "shop"
	key    = "ticket-4711:refund"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "agent" {
		if err := agent(os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "agent:", err)
			os.Exit(1)
		}
		return
	}
	if err := demo(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "approvals:", err)
		os.Exit(1)
	}
}

// refundOp is the agent's tool call: the effect is what the approver approves.
func refundOp(wait time.Duration) client.Op {
	return client.Op{Tenant: tenant, Key: key, Tool: "refund", Actor: "refund-agent",
		Effect: map[string]any{"order": "A-17", "amount_cents": 4000, "currency": "EUR"},
		Approval: &client.ApprovalRequirement{Required: true, TTL: time.Hour,
			Summary: "Refund 40.00 EUR to order A-17 (ticket 4711: parcel lost)", Wait: wait}}
}

// agent is one run of the refund agent.
func agent(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	endpoint := fs.String("endpoint", "", "idemkv API address")
	payments := fs.String("payments", "", "payments service address")
	wait := fs.Duration("wait", 0, "how long to wait for the decision (0: suspend at once)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := client.New(client.Config{Endpoints: []string{*endpoint}})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintf(out, "agent %d: refund for %s\n", os.Getpid(), key)
	res, err := c.Do(context.Background(), refundOp(*wait), func(ctx context.Context) (*client.Result, error) {
		return refund(ctx, *payments)
	})
	var pending *client.ApprovalPendingError
	switch {
	case errors.As(err, &pending):
		fmt.Fprintf(out, "agent %d: suspended, waiting for approval %s\n", os.Getpid(), pending.ApprovalID)
		return nil
	case client.IsApprovalDenied(err):
		fmt.Fprintf(out, "agent %d: the refund was denied: %v\n", os.Getpid(), err)
		return nil
	case err != nil:
		return err
	case res.Replayed:
		fmt.Fprintf(out, "agent %d: already refunded: %s (replayed, nothing sent)\n", os.Getpid(), res.Receipt.RemoteID)
	default:
		fmt.Fprintf(out, "agent %d: refunded: %s\n", os.Getpid(), res.Receipt.RemoteID)
	}
	return nil
}

func refund(ctx context.Context, payments string) (*client.Result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+payments+"/refunds?order=A-17&amount_cents=4000", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, client.NotExecuted(err)
	}
	defer resp.Body.Close()
	id, _ := io.ReadAll(resp.Body)
	return &client.Result{RemoteSystem: "payments", RemoteID: strings.TrimSpace(string(id))}, nil
}

// demo runs the whole story and prints its transcript.
func demo(ctx context.Context, out io.Writer) error {
	dir, err := os.MkdirTemp("", "approvals-example-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	endpoint, stop, err := startNode(ctx, dir)
	if err != nil {
		return err
	}
	defer stop()
	var refunds atomic.Int32
	payments, err := startPayments(&refunds)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "idemkv on %s, payments on %s\n", endpoint, payments)

	// Two runs that wait for the decision and are killed while they wait: a worker
	// that crashed, a graph resumed and interrupted again.
	for run := 1; run <= 2; run++ {
		cmd := exec.Command(self, "agent", "-endpoint", endpoint, "-payments", payments, "-wait", "10m")
		if err := startAndKillWhenWaiting(ctx, cmd, out, endpoint); err != nil {
			return err
		}
		fmt.Fprintf(out, "demo: killed agent run %d with SIGKILL while it waited\n", run)
	}

	approver, err := client.New(client.Config{Endpoints: []string{endpoint}})
	if err != nil {
		return err
	}
	defer approver.Close()
	page, err := approver.Approvals(ctx, &idemkv.ApprovalsRequest{Tenant: tenant})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "approver: %d card(s) waiting\n", len(page.Approvals))
	for _, rec := range page.Approvals {
		fmt.Fprintf(out, "  [%s] %s: %q\n      effect %s\n", rec.Approval.ID, rec.Key, rec.Approval.Summary, rec.Effect)
	}
	if len(page.Approvals) != 1 {
		return fmt.Errorf("want exactly one card, got %d", len(page.Approvals))
	}
	card := page.Approvals[0]
	if _, err := approver.DecideApproval(ctx, &idemkv.DecideApprovalRequest{Tenant: tenant, Key: card.Key, ApprovalID: card.Approval.ID,
		Fingerprint: card.Fingerprint, Decision: idemkv.VerdictApprove, Approver: "ana@support", Reason: "carrier confirmed the loss"}); err != nil {
		return err
	}
	fmt.Fprintf(out, "approver: approved %s\n", card.Approval.ID)

	// The third run is resumed after the decision and refunds; a fourth replays.
	for run := 3; run <= 4; run++ {
		cmd := exec.Command(self, "agent", "-endpoint", endpoint, "-payments", payments)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("agent run %d: %w", run, err)
		}
	}
	fmt.Fprintf(out, "payments: %d refund(s) made\n", refunds.Load())
	if refunds.Load() != 1 {
		return fmt.Errorf("want exactly one refund, got %d", refunds.Load())
	}
	return nil
}

// startAndKillWhenWaiting runs the agent until its request is listed as waiting and its
// long-poll is parked, then kills it.
func startAndKillWhenWaiting(ctx context.Context, cmd *exec.Cmd, out io.Writer, endpoint string) error {
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return err
	}
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(out, bufio.NewReader(pr)); close(copied) }()
	c, err := client.New(client.Config{Endpoints: []string{endpoint}})
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec, err := c.Get(ctx, &idemkv.GetRequest{Tenant: tenant, Key: key})
		if err == nil && rec.Status == idemkv.StatusAwaitingApproval {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			_ = pw.Close()
			<-copied
			return fmt.Errorf("the agent never asked for approval: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // let its long-poll park: the kill lands mid-wait
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	_ = cmd.Wait()
	_ = pw.Close()
	<-copied // the agent's output is all written before the demo writes again
	return nil
}

func startPayments(refunds *atomic.Int32) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := refunds.Add(1)
			fmt.Fprintf(w, "re_%04d\n", n)
		}))
	}()
	return ln.Addr().String(), nil
}

// startNode runs an embedded single idemkv node with its HTTP API on loopback.
func startNode(ctx context.Context, dir string) (apiAddr string, stop func(), err error) {
	raft, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	raftAddr := raft.Addr().String()
	raft.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	cfg := node.DefaultConfig()
	cfg.DataDir, cfg.RaftAddr, cfg.APIAddr, cfg.Bootstrap = dir, raftAddr, ln.Addr().String(), true
	cfg.Logger = slog.New(slog.DiscardHandler)
	n, err := node.Open(cfg)
	if err != nil {
		ln.Close()
		return "", nil, err
	}
	srv := api.NewHTTPServer(cfg.APIAddr, api.New(api.Config{Store: n}).Handler())
	go func() { _ = srv.Serve(ln) }()
	stop = func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx) // the API first, then the node under it
		_ = n.Close()
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
