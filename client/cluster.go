package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkv/idemkv"
)

// Cluster plumbing for operators and embedders: joining a node through seed
// addresses, and asking every member for its own view. rqlite's cluster/join.go
// Joiner is the model; it lives here, not in cmd, so that a program embedding a node
// joins a cluster with the same retries, authentication and error decoding as
// `idemkv serve --join`.

// joinAttemptTimeout bounds one join request to one seed. A join commits a
// configuration change through Raft, which takes a few heartbeats (1 s each by
// default) on a healthy cluster; 15 s leaves room for an election on the way.
const joinAttemptTimeout = 15 * time.Second

// Join backoff between rounds over every seed: 200 ms doubling to 5 s, so a node
// started before its seeds finds them within 5 s of their coming up without
// hammering them while they do.
const (
	joinBackoffMin = 200 * time.Millisecond
	joinBackoffMax = 5 * time.Second
)

// JoinCluster asks the client's endpoints (the seeds), in turn, to add the node req
// describes, round after round, until one of them — or the leader it forwards to —
// accepts, or ctx ends. Every failure is retried: a seed that is down, has no leader
// yet or refuses may answer differently a moment later, and a node that cannot join
// has nothing better to do. It returns the membership the accepting node reported,
// or ctx's error joined to the last failure.
func (c *Client) JoinCluster(ctx context.Context, req *idemkv.JoinRequest) (*idemkv.ClusterInfo, error) {
	body, err := encodeBody(req)
	if err != nil {
		return nil, fmt.Errorf("client: encoding the join: %w", err)
	}
	cl := call{method: http.MethodPost, route: "/v1/cluster/join", path: "/v1/cluster/join", body: req}
	wait := joinBackoffMin
	var last error
	for round := 1; ; round++ {
		for _, seed := range c.endpoints {
			var out idemkv.ClusterInfo
			actx, cancel := context.WithTimeout(ctx, joinAttemptTimeout)
			err := c.attempt(actx, seed, cl, body, &out)
			for old, ok := olderJoin(req, err, true); ok; old, ok = olderJoin(old, err, true) {
				// A seed (or leader) of an older release: see Join.
				oldBody, _ := json.Marshal(old)
				err = c.attempt(actx, seed, call{method: cl.method, route: cl.route, path: cl.path, body: old}, oldBody, &out)
			}
			cancel()
			if err == nil {
				c.log.Info("joined the cluster", "via", seed)
				return &out, nil
			}
			if ctx.Err() != nil {
				return nil, errors.Join(context.Cause(ctx), last)
			}
			last = fmt.Errorf("%s: %w", seed, err)
			c.log.Warn("join attempt failed; retrying", "via", seed, "attempt", round, "err", err)
		}
		if err := sleep(ctx, wait); err != nil {
			return nil, errors.Join(err, last)
		}
		wait = min(2*wait, joinBackoffMax)
	}
}

// ClusterAt asks the node at endpoint (host:port or http(s)://host:port) for its own
// view of the cluster: its role, term and indexes. Unlike Cluster it neither follows
// the leader nor moves on to another node.
func (c *Client) ClusterAt(ctx context.Context, endpoint string) (*idemkv.ClusterInfo, error) {
	base, err := baseURL(endpoint, c.scheme == "https")
	if err != nil {
		return nil, err
	}
	var out idemkv.ClusterInfo
	if err := c.attempt(ctx, base, call{method: http.MethodGet, route: "/v1/cluster", path: "/v1/cluster"}, nil, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", endpoint, err)
	}
	return &out, nil
}

// NodeStatus is one member as it sees itself (idemkv status).
type NodeStatus struct {
	ID           string `json:"id"`
	APIAddr      string `json:"api_addr"`
	RaftAddr     string `json:"raft_addr"`
	Suffrage     string `json:"suffrage"`
	Role         string `json:"role,omitempty"`
	Term         uint64 `json:"term,omitempty"`
	CommitIndex  uint64 `json:"commit_index,omitempty"`
	AppliedIndex uint64 `json:"applied_index,omitempty"`
	// Lag is how many entries the node has yet to apply of those the leader knows
	// committed; nil when no leader answered or the node did not.
	Lag *uint64 `json:"lag,omitempty"`
	// Format is the data format the member advertised it reads (2: it never did);
	// ClusterFormat the cluster's format as the member's own state machine holds it
	// (0: it did not answer, or runs a release before formats).
	Format        int    `json:"format,omitempty"`
	ClusterFormat int    `json:"cluster_format,omitempty"`
	Error         string `json:"error,omitempty"`
}

// Status asks any node for the membership, then every member for its own view
// (ClusterAt). A member that does not answer is listed with its error; only failing
// to learn the membership at all is an error.
func (c *Client) Status(ctx context.Context) ([]NodeStatus, error) {
	members, err := c.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]NodeStatus, len(members.Nodes))
	var leaderCommit uint64
	leaderKnown := false
	for i, m := range members.Nodes {
		s := NodeStatus{ID: m.ID, APIAddr: m.APIAddr, RaftAddr: m.RaftAddr, Suffrage: m.Suffrage, Format: m.Format}
		if m.APIAddr == "" {
			s.Error = "no API address registered yet"
			out[i] = s
			continue
		}
		own, err := c.ClusterAt(ctx, m.APIAddr)
		if err != nil {
			s.Error = err.Error()
			out[i] = s
			continue
		}
		for _, self := range own.Nodes {
			if self.ID == m.ID {
				s.Role = self.State
			}
		}
		s.Term, s.CommitIndex, s.AppliedIndex = own.Term, own.CommitIndex, own.AppliedIndex
		s.ClusterFormat = own.Format
		if s.Role == "leader" {
			leaderCommit, leaderKnown = own.CommitIndex, true
		}
		out[i] = s
	}
	for i := range out {
		if leaderKnown && out[i].Error == "" {
			lag := uint64(0)
			if leaderCommit > out[i].AppliedIndex {
				lag = leaderCommit - out[i].AppliedIndex
			}
			out[i].Lag = &lag
		}
	}
	return out, nil
}
