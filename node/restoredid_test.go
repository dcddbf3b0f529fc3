package node_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// TestRestoredDataDirRefusesAnotherNode: a restored data dir's Raft snapshot names
// the node it was restored for (--id, and the Raft address) as the new cluster's only
// voter. Started as another ID, the node was no voter: it never elected itself, and
// the restored cluster never had a leader (joins answered not_leader for good).
// Started at another Raft address, it led, but registered the address it advertises,
// not the one the configuration names: a node that joined never found the leader's
// API address, and answered unavailable to everything. Both are refused at the first
// start, which leaves the data dir as it was: the right node then starts on it, and a
// node joined to it finds the leader.
func TestRestoredDataDirRefusesAnotherNode(t *testing.T) {
	_, full := backupOfANewNode(t, 3)
	for _, tc := range []struct {
		name   string
		change func(*node.Config)
	}{
		{"another id", func(c *node.Config) { c.ID = "r2" }},
		{"another raft address", func(c *node.Config) { c.RaftAddr = opsAddr(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := opsNodeConfig(t, "r1", filepath.Join(t.TempDir(), "r1"))
			if _, err := node.Restore(rc, bytes.NewReader(full.Bytes())); err != nil {
				t.Fatal(err)
			}
			other := rc
			tc.change(&other)
			if n, err := node.Open(other); err == nil {
				led := testcluster.Eventually(5*time.Second, func() error {
					if !n.IsLeader() {
						return errors.New("not the leader")
					}
					return n.Ready()
				})
				n.Close()
				t.Fatalf("%s at %s opened the data dir restored for %s at %s (leader within 5 s: %v)", other.ID, other.RaftAddr, rc.ID, rc.RaftAddr, led)
			} else if !strings.Contains(err.Error(), "was restored for node r1 at "+rc.RaftAddr) {
				t.Fatalf("opening the data dir restored for r1 as %s at %s: %v, want it to name r1 and its address", other.ID, other.RaftAddr, err)
			}

			r := openNode(t, rc)
			waitLeaderReady(t, r)
			jc := opsNodeConfig(t, "r3", filepath.Join(t.TempDir(), "r3"))
			jc.Joining = true
			j := openNode(t, jc)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := r.Join(ctx, &idemkv.JoinRequest{ID: jc.ID, RaftAddr: jc.RaftAddr, APIAddr: jc.APIAddr, Format: j.Format()}); err != nil {
				t.Fatal(err)
			}
			if err := testcluster.Eventually(10*time.Second, func() error {
				if addr, _ := j.Leader(); addr != rc.APIAddr {
					return errors.New("the joined node names the leader's API at " + addr)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
