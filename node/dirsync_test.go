package node_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/freeport"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/node"
)

// The child of TestPowerLossKeepsTheDataDirEntries opens a node in this data dir.
const (
	envDirSyncChild   = "IDEMKV_TEST_DIRSYNC_DATADIR"
	envDirSyncRaftLog = "IDEMKV_TEST_DIRSYNC_RAFTLOG"
)

// TestPowerLossKeepsTheDataDirEntries: a directory entry is data of the directory that
// holds it, made durable only by a sync of that directory. A power cut on a file system
// that drops unsynced entries (ext4 without its auto_da_alloc luck, XFS) loses a
// directory whose files were all synced: wal/ with the term and vote of a node that
// just joined, which could then vote twice in one term, or the data dir itself.
//
// The model is the real process on the real disk: a child process opens a new node in
// a data dir two levels below an existing directory, bootstraps it and writes, under
// strace, which records every directory it creates, every file it creates in the data
// dir, every rename into it, and every fsync of a directory, in order. An entry
// survives the cut only if its parent was synced after it was made, and the parent
// survives too; the test lists the entries that would be dropped (issue 22, point 5).
// Pebble syncs its own directory's parent (pebble/); raft-wal syncs inside wal/ only,
// Raft's snapshot store syncs inside snapshots/ only, bbolt syncs raft.db but not the
// directory holding it.
func TestPowerLossKeepsTheDataDirEntries(t *testing.T) {
	if dir := os.Getenv(envDirSyncChild); dir != "" {
		dirSyncChild(t, dir, os.Getenv(envDirSyncRaftLog))
		return
	}
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("needs strace (apt-get install strace) to see the node's directory syncs")
	}
	for _, backend := range node.RaftLogs {
		t.Run(backend, func(t *testing.T) {
			root := t.TempDir()
			dataDir := filepath.Join(root, "var", "idemkv")
			trace := filepath.Join(t.TempDir(), "strace.out")
			cmd := exec.Command(strace, "-f", "-qq", "-y", "-o", trace,
				"-e", "trace=mkdir,mkdirat,rename,renameat,renameat2,open,openat,creat,fsync,fdatasync",
				os.Args[0], "-test.run=^TestPowerLossKeepsTheDataDirEntries$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), envDirSyncChild+"="+dataDir, envDirSyncRaftLog+"="+backend)
			out, err := cmd.CombinedOutput()
			if err != nil {
				if strings.Contains(string(out), "ptrace") {
					t.Skipf("strace cannot trace here: %s", out)
				}
				t.Fatalf("the child failed: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), "dirsync child: wrote") {
				t.Fatalf("the child did not run:\n%s", out)
			}
			lost, checked, err := undurableEntries(trace, root, dataDir)
			if err != nil {
				t.Fatal(err)
			}
			if checked < 5 {
				t.Fatalf("only %d entries checked (%v): the trace missed the node's work", checked, lost)
			}
			if len(lost) > 0 {
				t.Fatalf("a power cut may drop %d of %d entries of the new data dir: %s", len(lost), checked, strings.Join(lost, ", "))
			}
			t.Logf("%d entries of the new data dir, each synced into its parent", checked)
		})
	}
}

// dirSyncChild opens a new single-node cluster in dataDir, writes through it and closes
// it. It takes no snapshot: a snapshot's Pebble checkpoint, made beside pebble/, syncs
// the data dir, and would hide every entry made before it; a node that has just joined
// has taken none.
func dirSyncChild(t *testing.T, dataDir, backend string) {
	raftAddr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	cfg := node.DefaultConfig()
	cfg.ID, cfg.DataDir, cfg.RaftLog, cfg.Bootstrap = "n1", dataDir, backend, true
	cfg.RaftAddr, cfg.APIAddr = raftAddr, "127.0.0.1:1"
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
	cfg.Logger = testlog.New(t)
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := testcluster.Eventually(20*time.Second, func() error {
		if !n.IsLeader() {
			return errors.New("not the leader yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: "k", Tool: "t", Fingerprint: fp("k"), AttemptID: "a"}); err != nil {
		t.Fatal(err)
	}
	fmt.Println("dirsync child: wrote")
}

var (
	// The calls of interest, as strace -y prints them: the first path argument, and
	// for a rename the second; an fd as N</path>.
	traceCall   = regexp.MustCompile(`^\d+\s+(\w+)\((.*)`)
	traceString = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)
	traceFD     = regexp.MustCompile(`^\d+</([^>]*)>`)
)

// undurableEntries reads an strace log and returns the entries under root (the data
// dir's ancestors from root down, and the entries directly in dataDir) that exist now
// but were not synced into their parent after they were last made, and how many were
// checked.
func undurableEntries(trace, root, dataDir string) (lost []string, checked int, err error) {
	f, err := os.Open(trace)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	made := map[string]int{}   // path → line of its last creation
	synced := map[string]int{} // dir → line of its last sync
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 0; sc.Scan(); line++ {
		m := traceCall.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		call, args := m[1], m[2]
		strs := traceString.FindAllStringSubmatch(args, -1)
		switch call {
		case "mkdir", "mkdirat", "creat":
			if len(strs) > 0 {
				made[filepath.Clean(strs[0][1])] = line
			}
		case "open", "openat":
			if len(strs) > 0 && strings.Contains(args, "O_CREAT") {
				made[filepath.Clean(strs[0][1])] = line
			}
		case "rename", "renameat", "renameat2":
			if len(strs) > 1 {
				made[filepath.Clean(strs[1][1])] = line
			}
		case "fsync", "fdatasync":
			if fd := traceFD.FindStringSubmatch(args); fd != nil {
				synced["/"+fd[1]] = line
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, 0, err
	}
	if len(made) == 0 {
		return nil, 0, errors.New("the trace holds no creation at all")
	}
	var check []string
	for p := dataDir; p != root; p = filepath.Dir(p) {
		check = append(check, p)
	}
	entries, err := os.ReadDir(dataDir)
	if err != nil {
		return nil, 0, err
	}
	for _, e := range entries {
		check = append(check, filepath.Join(dataDir, e.Name()))
	}
	for _, p := range check {
		at, ok := made[p]
		if !ok {
			continue // made by nobody in the trace: it was there before
		}
		checked++
		if s, ok := synced[filepath.Dir(p)]; !ok || s < at {
			rel, _ := filepath.Rel(root, p)
			lost = append(lost, rel)
		}
	}
	return lost, checked, nil
}
