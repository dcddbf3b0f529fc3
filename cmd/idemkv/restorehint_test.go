package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/freeport"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// TestRestoreNamesAStartTheNodeAccepts: restore prints the serve command to start the
// restored node with, and the first start refuses any Raft address but the restored
// one. The command it prints is accepted, with an IP and with a host name given as
// --raft-addr alone (a name is advertised as given, never as the IP it listens on;
// docs/operations.md said otherwise and asked for --advertise-raft-addr).
func TestRestoreNamesAStartTheNodeAccepts(t *testing.T) {
	c := testcluster.Start(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.Node(c.WaitLeader()).Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: "k1", Tool: "t",
		Fingerprint: "sha256:x", AttemptID: "a1"}); err != nil {
		t.Fatal(err)
	}
	var backup bytes.Buffer
	if err := c.Node(0).Backup(ctx, &backup); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "cluster.backup")
	if err := os.WriteFile(file, backup.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	ipAddr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	_, port, err := net.SplitHostPort(ipAddr)
	if err != nil {
		t.Fatal(err)
	}
	for _, raftAddr := range []string{ipAddr, net.JoinHostPort("localhost", port)} {
		t.Run(raftAddr, func(t *testing.T) {
			dataDir := filepath.Join(t.TempDir(), "r1")
			out, err := cli(t, "restore", "--from", file, "--data-dir", dataDir, "--id", "r1", "--raft-addr", raftAddr)
			if err != nil {
				t.Fatalf("restore: %v\n%s", err, out)
			}
			_, start, ok := strings.Cut(out, "start it with: idemkv serve ")
			if !ok {
				t.Fatalf("restore printed no start command:\n%s", out)
			}
			cfg := node.DefaultConfig()
			args := strings.Fields(start)
			for i := 0; i+1 < len(args); i += 2 {
				switch args[i] {
				case "--id":
					cfg.ID = args[i+1]
				case "--data-dir":
					cfg.DataDir = args[i+1]
				case "--raft-addr":
					cfg.RaftAddr = args[i+1]
				case "--advertise-raft-addr":
					cfg.RaftAdvertise = args[i+1]
				default:
					t.Fatalf("unknown flag %q in the printed start command %q", args[i], start)
				}
			}
			if cfg.APIAddr, err = freeport.Addr(); err != nil {
				t.Fatal(err)
			}
			n, err := node.Open(cfg)
			if err != nil {
				t.Fatalf("the start restore printed (idemkv serve %s) is refused: %v", strings.TrimSpace(start), err)
			}
			defer n.Close()
			if err := testcluster.Eventually(20*time.Second, func() error {
				if !n.IsLeader() {
					return errors.New("not the leader")
				}
				return n.Ready()
			}); err != nil {
				t.Fatalf("the restored node started as printed: %v", err)
			}
		})
	}
}
