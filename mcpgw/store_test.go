package mcpgw_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/mcpgw"
)

// lines counts the gateway's log records by message, beside the test log.
type lines struct {
	slog.Handler
	mu  *sync.Mutex
	got map[string]int
}

func (l lines) Handle(ctx context.Context, r slog.Record) error {
	l.mu.Lock()
	l.got[r.Message]++
	l.got["level:"+r.Level.String()]++
	l.mu.Unlock()
	return l.Handler.Handle(ctx, r)
}

func (l lines) WithAttrs(a []slog.Attr) slog.Handler {
	return lines{l.Handler.WithAttrs(a), l.mu, l.got}
}
func (l lines) WithGroup(n string) slog.Handler { return lines{l.Handler.WithGroup(n), l.mu, l.got} }

func (l lines) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for msg, c := range l.got {
		if strings.HasPrefix(msg, prefix) {
			n += c
		}
	}
	return n
}

// Issue 14 point 5: with idemkv unreachable, a mutating tools/call ends within the
// store-wait bound with a store_unavailable tool error and the tool not called; the
// outage is logged once, however many calls meet it, and again only after idemkv
// answered in between.
func TestStoreUnreachableEndsWithinTheBound(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	const storeWait = 2 * time.Second
	log := lines{testlog.NewLevel(t, "gateway: ", slog.LevelDebug).Handler(), &sync.Mutex{}, map[string]int{}}
	up := newM3Upstream()
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t)), gwOptions{
		policy: "tenant: outage\n",
		cfg:    func(c *client.Config) { c.StoreWait = storeWait; c.Timeout = time.Second },
		gwCfg:  func(c *mcpgw.Config) { c.Logger = slog.New(log) },
	})
	agent := g.m3Agent()
	const outage = "idemkv is unreachable"

	call := func(k string) (took time.Duration, code, decision string) {
		t.Helper()
		start := time.Now()
		_, res := m3Call(t, agent, "place_order", order(k, 1, "EUR"), map[string]any{mcpgw.MetaIdempotencyKey: k})
		return time.Since(start), meta(res, mcpgw.MetaError), meta(res, mcpgw.MetaDecision)
	}
	// The bound: StoreWait, plus a request timeout that may have just begun, plus
	// slack for a loaded machine.
	bound := storeWait + time.Second + 3*time.Second
	cluster.Stop(0)
	for i := range 3 {
		took, code, _ := call("down-1")
		if code != mcpgw.CodeStoreUnavailable || took > bound {
			t.Fatalf("call %d with idemkv down: code %q after %s, want %s within %s", i+1, code, took, mcpgw.CodeStoreUnavailable, bound)
		}
		t.Logf("call %d with idemkv down: %s after %s", i+1, code, took.Round(time.Millisecond))
	}
	if n := log.count(outage); n != 1 {
		t.Fatalf("%d outage lines for 3 calls in one outage, want 1", n)
	}
	if n := up.calls("place_order"); n != 0 {
		t.Fatalf("place_order ran %d times without a reservation", n)
	}

	cluster.Restart(0)
	cluster.WaitLeader()
	if err := testcluster.Eventually(30*time.Second, func() error {
		if _, code, decision := call("up-1"); decision != "execute" && decision != "replay" {
			return fmt.Errorf("with idemkv back: code %q decision %q", code, decision)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := log.count("idemkv answers again"); n != 1 {
		t.Fatalf("%d recovery lines, want 1", n)
	}
	cluster.Stop(0)
	if _, code, _ := call("down-2"); code != mcpgw.CodeStoreUnavailable {
		t.Fatalf("second outage: code %q", code)
	}
	if n := log.count(outage); n != 2 {
		t.Fatalf("%d outage lines after two outages, want 2", n)
	}
}
