package client

import (
	"context"
	"encoding/json"
	"errors"
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
