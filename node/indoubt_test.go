package node_test

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// inDoubtPages pages through ListInDoubt on n with req (its After is where to start)
// and returns each page's tenant/key names.
func inDoubtPages(t *testing.T, n *node.Node, req idemkv.InDoubtRequest) [][]string {
	t.Helper()
	var pages [][]string
	for {
		res, err := n.ListInDoubt(ctxT(t), &req)
		if err != nil {
			t.Fatalf("ListInDoubt %+v: %v", req, err)
		}
		var names []string
		for _, rec := range res.Records {
			if !rec.InDoubt || rec.Status != idemkv.StatusPending || rec.Tool != "create_ticket" || rec.Attempts != 1 {
				t.Fatalf("listed %+v", rec)
			}
			names = append(names, rec.Tenant+"/"+rec.Key)
		}
		pages = append(pages, names)
		if res.Next == "" {
			return pages
		}
		if len(pages) > 10 {
			t.Fatalf("no last page after %v", pages)
		}
		req.After = res.Next
	}
}

// TestListInDoubtAcrossTenants: an operator paged by idemkv_records_in_doubt lists the
// in-doubt records of every tenant, oldest first, page by page across tenants; a
// resolved record leaves the list, a cursor at it still resumes, and a follower
// answers the same, locally when stale and through the leader otherwise.
func TestListInDoubtAcrossTenants(t *testing.T) {
	c := testcluster.Start(t, 3)
	ctx := ctxT(t)

	// Marked in an order that is neither tenant nor key order, each in a later
	// millisecond than the one before.
	order := []struct{ tenant, key string }{{"zeta", "k5"}, {"acme", "k4"}, {"zeta", "k3"}, {"acme", "k2"}, {"zeta", "k1"}}
	var marked []*idemkv.Record
	var want []string
	for i, m := range order {
		req := &idemkv.ReserveRequest{Tenant: m.tenant, Key: m.key, Tool: "create_ticket", Actor: "worker",
			Fingerprint: fmt.Sprintf("sha256:%02x", i), AttemptID: fmt.Sprintf("attempt-%d", i)}
		var res *idemkv.ReserveResult
		if err := c.OnLeader(func(n *node.Node) (err error) { res, err = n.Reserve(ctx, req); return err }); err != nil {
			t.Fatal(err)
		}
		var rec *idemkv.Record
		if err := c.OnLeader(func(n *node.Node) (err error) {
			rec, err = n.Doubt(ctx, &idemkv.DoubtRequest{Tenant: m.tenant, Key: m.key, Fingerprint: req.Fingerprint, Fence: res.Fence})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if len(marked) > 0 && rec.InDoubtSince <= marked[len(marked)-1].InDoubtSince {
			t.Fatalf("%s/%s in doubt since %s, not after %s", m.tenant, m.key, rec.InDoubtSince, marked[len(marked)-1].InDoubtSince)
		}
		marked = append(marked, rec)
		want = append(want, m.tenant+"/"+m.key)
		if err := testcluster.Eventually(5*time.Second, func() error {
			if time.Now().UnixMilli() <= int64(rec.InDoubtSince) {
				return errors.New("still the millisecond of the last mark")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Neither a pending record nor a committed one is in doubt.
	if err := c.OnLeader(func(n *node.Node) error {
		_, err := n.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: "k0", Tool: "create_ticket", Fingerprint: "sha256:aa", AttemptID: "running"})
		return err
	}); err != nil {
		t.Fatal(err)
	}

	leader := c.Node(c.WaitLeader())
	if got := inDoubtPages(t, leader, idemkv.InDoubtRequest{}); !slices.Equal(got[0], want) || len(got) != 1 {
		t.Fatalf("one page: %v, want %v", got, want)
	}
	paged := [][]string{want[0:2], want[2:4], want[4:5]}
	if got := inDoubtPages(t, leader, idemkv.InDoubtRequest{Limit: 2}); !slices.EqualFunc(got, paged, slices.Equal) {
		t.Fatalf("pages of 2: %v, want %v", got, paged)
	}

	follower := c.Node((c.WaitLeader() + 1) % 3)
	if _, err := follower.ListInDoubt(ctx, &idemkv.InDoubtRequest{}); !errors.Is(err, idemkv.ErrNotLeader) {
		t.Fatalf("linearizable on a follower node: %v, want ErrNotLeader", err)
	}
	c.WaitConverged()
	if got := inDoubtPages(t, follower, idemkv.InDoubtRequest{Limit: 2, Consistency: idemkv.Stale}); !slices.EqualFunc(got, paged, slices.Equal) {
		t.Fatalf("stale pages of 2 on a follower: %v, want %v", got, paged)
	}
	// Through a follower's API, linearizable: it forwards to the leader.
	var page idemkv.ListResult
	if code, raw := httpCall(t, http.MethodGet, c.Endpoint((c.WaitLeader()+1)%3), "/v1/in-doubt?limit=2", nil, &page); code != http.StatusOK ||
		len(page.Records) != 2 || page.Records[0].Key != "k5" || page.Records[1].Key != "k4" || page.Next != idemkv.DoubtPositionOf(marked[1]).String() {
		t.Fatalf("GET /v1/in-doubt on a follower: %d %s", code, raw)
	}

	// Settle acme/k4 (the last of page one) as not executed and acme/k2 as committed.
	for i, outcome := range map[int]idemkv.ResolveOutcome{1: idemkv.ResolveNotExecuted, 3: idemkv.ResolveCommitted} {
		req := &idemkv.ResolveRequest{Tenant: marked[i].Tenant, Key: marked[i].Key, Fingerprint: marked[i].Fingerprint, Outcome: outcome}
		if outcome == idemkv.ResolveCommitted {
			req.RemoteSystem, req.RemoteID = "linear", "LIN-2"
		}
		if err := c.OnLeader(func(n *node.Node) error { _, err := n.Resolve(ctx, req); return err }); err != nil {
			t.Fatal(err)
		}
	}
	left := []string{want[0], want[2], want[4]}
	leader = c.Node(c.WaitLeader())
	if got := inDoubtPages(t, leader, idemkv.InDoubtRequest{}); !slices.Equal(got[0], left) {
		t.Fatalf("after resolving: %v, want %v", got, left)
	}
	// The next of the first page named acme/k4, which is gone: the walk resumes after it.
	if got := inDoubtPages(t, leader, idemkv.InDoubtRequest{Limit: 2, After: page.Next}); !slices.EqualFunc(got, [][]string{{want[2], want[4]}}, slices.Equal) {
		t.Fatalf("resuming after a resolved record: %v, want [[%s %s]]", got, want[2], want[4])
	}
	c.WaitConverged()
	follower = c.Node((c.WaitLeader() + 1) % 3)
	if got := inDoubtPages(t, follower, idemkv.InDoubtRequest{Consistency: idemkv.Stale}); !slices.Equal(got[0], left) {
		t.Fatalf("stale on a follower after resolving: %v, want %v", got, left)
	}
}
