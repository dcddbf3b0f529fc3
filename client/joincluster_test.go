package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// JoinCluster goes round the seeds until one accepts: past a seed that is down and
// past refusals, as `idemkv serve --join` did in cmd before it moved here.
func TestJoinClusterRetriesAcrossSeeds(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	n := startNode(t, newMemStore())
	var joins atomic.Int32
	var got idemkv.JoinRequest
	n.setHook(func(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
		if r.URL.Path != "/v1/cluster/join" {
			return false
		}
		if joins.Add(1) < 3 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":{"code":"unavailable","message":"no leader is known; retry"}}`))
			return true
		}
		_ = json.NewDecoder(r.Body).Decode(&got)
		_ = json.NewEncoder(w).Encode(idemkv.ClusterInfo{Term: 4, Nodes: []idemkv.NodeInfo{{ID: "n1"}, {ID: got.ID}}})
		return true
	})
	c := newClient(t, Config{Endpoints: []string{deadURL, n.srv.URL}})
	info, err := c.JoinCluster(ctxT(t), &idemkv.JoinRequest{ID: "n9", RaftAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2"})
	if err != nil {
		t.Fatal(err)
	}
	if joins.Load() != 3 || got.ID != "n9" || got.RaftAddr != "127.0.0.1:1" || len(info.Nodes) != 2 || info.Term != 4 {
		t.Fatalf("joins %d, node got %+v, answer %+v", joins.Load(), got, info)
	}

	// A cluster that never accepts: JoinCluster keeps trying until ctx ends and then
	// says why the last attempt failed.
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	joins.Store(-1 << 20)
	_, err = c.JoinCluster(ctx, &idemkv.JoinRequest{ID: "n9", RaftAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2"})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, idemkv.ErrUnavailable) {
		t.Fatalf("join against a cluster that refuses: %v", err)
	}
}

// Status asks every member for its own view and computes the lag from the leader.
func TestStatusAsksEveryMember(t *testing.T) {
	n := startNode(t, newMemStore())
	c := newClient(t, Config{Endpoints: []string{n.srv.URL}})
	nodes, err := c.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0].Role != "leader" || nodes[0].Term != 3 || nodes[0].Lag == nil || *nodes[0].Lag != 0 || nodes[0].Error != "" {
		t.Fatalf("status %+v", nodes)
	}
}

// A node of the release before data formats refuses a join's format as an unknown
// field (it decodes strictly): Join and JoinCluster send the join again without it, as
// that release's nodes send it. Found running a new node against the real previous
// binary, which it could not join.
func TestJoinWithoutFormatForAnOlderRelease(t *testing.T) {
	n := startNode(t, newMemStore())
	sent := olderRelease(n, "format")
	c := newClient(t, Config{Endpoints: []string{n.srv.URL}})
	req := &idemkv.JoinRequest{ID: "n9", RaftAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2", Format: 3}
	for name, join := range map[string]func() (*idemkv.ClusterInfo, error){
		"Join":        func() (*idemkv.ClusterInfo, error) { return c.Join(ctxT(t), req) },
		"JoinCluster": func() (*idemkv.ClusterInfo, error) { return c.JoinCluster(ctxT(t), req) },
	} {
		*sent = nil
		info, err := join()
		if bodies := *sent; err != nil || info.Term != 4 || len(bodies) != 2 || bodies[0]["format"] != float64(3) || bodies[1]["format"] != nil || bodies[1]["id"] != "n9" {
			t.Errorf("%s: %+v, %v; bodies %v", name, info, err, bodies)
		}
	}
	if req.Format != 3 {
		t.Error("the caller's request was changed")
	}
}

// A node of a release before holds_state refuses that field as unknown: the join goes
// again without it, its format kept. A release before data formats, which knows
// neither, names format first, and gets neither.
func TestJoinWithoutHoldsStateForAnOlderRelease(t *testing.T) {
	for _, release := range []struct {
		name    string
		unknown []string // the fields it refuses, in the order it meets them
		want    map[string]any
	}{
		{"before holds_state", []string{"holds_state"}, map[string]any{"format": float64(3), "holds_state": nil}},
		{"before formats", []string{"format", "holds_state"}, map[string]any{"format": nil, "holds_state": nil}},
	} {
		n := startNode(t, newMemStore())
		sent := olderRelease(n, release.unknown...)
		c := newClient(t, Config{Endpoints: []string{n.srv.URL}})
		held := true
		req := &idemkv.JoinRequest{ID: "n9", RaftAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2", Format: 3, HoldsState: &held}
		for name, join := range map[string]func() (*idemkv.ClusterInfo, error){
			"Join":        func() (*idemkv.ClusterInfo, error) { return c.Join(ctxT(t), req) },
			"JoinCluster": func() (*idemkv.ClusterInfo, error) { return c.JoinCluster(ctxT(t), req) },
		} {
			*sent = nil
			info, err := join()
			bodies := *sent
			if err != nil || info.Term != 4 || len(bodies) < 2 || bodies[0]["holds_state"] != true {
				t.Errorf("%s, %s: %+v, %v; bodies %v", release.name, name, info, err, bodies)
				continue
			}
			last := bodies[len(bodies)-1]
			for f, v := range release.want {
				if last[f] != v {
					t.Errorf("%s, %s: the accepted join has %s = %v, want %v", release.name, name, f, last[f], v)
				}
			}
		}
		if req.HoldsState == nil || req.Format != 3 {
			t.Error("the caller's request was changed")
		}
	}
}

// A release before stages refuses the stage: a learner's join (a node joining by
// itself) goes again as that release's plain join, a voter at once, as it adds every
// node; a promotion, and a stage an operator asked for, are never dropped: that
// release would answer a member's join as a no-op, and the node would stay a learner
// believing itself promoted.
func TestJoinStagesForAnOlderRelease(t *testing.T) {
	n := startNode(t, newMemStore())
	sent := olderRelease(n, "stage")
	c := newClient(t, Config{Endpoints: []string{n.srv.URL}})
	learner := &idemkv.JoinRequest{ID: "n9", RaftAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2", Format: 3, Stage: idemkv.JoinLearner}
	if _, err := c.JoinCluster(ctxT(t), learner); err != nil || len(*sent) != 2 || (*sent)[1]["stage"] != nil {
		t.Errorf("a learner joining by itself: %v; bodies %v", err, *sent)
	}
	for _, req := range []*idemkv.JoinRequest{
		{ID: "n9", RaftAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2", Format: 3, Stage: idemkv.JoinPromote},
		{ID: "n9", RaftAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2", Format: 3, Stage: idemkv.JoinLearner},
	} {
		*sent = nil
		if _, err := c.Join(ctxT(t), req); err == nil || len(*sent) != 1 {
			t.Errorf("stage %s through Join: %v, %d requests; want the refusal, never the stage dropped", req.Stage, err, len(*sent))
		}
	}
}

// olderRelease makes n answer joins as a release that does not know the fields
// unknown, in the order it meets them: the first one a join holds is refused as an
// unknown field; a join without any of them is answered. It returns the join bodies
// n was sent.
func olderRelease(n *testNode, unknown ...string) *[]map[string]any {
	var bodies []map[string]any
	n.setHook(func(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
		if r.URL.Path != "/v1/cluster/join" {
			return false
		}
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		bodies = append(bodies, body)
		w.Header().Set("Content-Type", "application/json")
		for _, f := range unknown {
			if _, ok := body[f]; ok {
				w.WriteHeader(http.StatusBadRequest)
				_, _ = fmt.Fprintf(w, `{"error":{"code":"invalid_argument","message":"unknown field \"%s\"","field":"%s"}}`, f, f)
				return true
			}
		}
		_ = json.NewEncoder(w).Encode(idemkv.ClusterInfo{Term: 4, Nodes: []idemkv.NodeInfo{{ID: "n1"}}})
		return true
	})
	return &bodies
}
