// Package clients_test checks what the README tells a newcomer who sets up a cluster to
// try the clients against (issue 24, point 12): the commands must work as written.
package clients_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's three-node cluster waits on /readyz before it asks for the cluster (a
// curl before the nodes joined printed an empty one), and its data dirs are ignored by
// git (d1, d2, d3 showed up in git status).
func TestReadmeClusterExample(t *testing.T) {
	repo := filepath.Join("..")
	data, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	i := strings.Index(text, "## A three-node cluster on one machine")
	if i < 0 {
		t.Fatal("README has no three-node cluster section")
	}
	block := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(text[i:])
	if block == nil {
		t.Fatal("the cluster section has no sh block")
	}
	cmds := block[1]
	ready, cluster := strings.Index(cmds, "/readyz"), strings.Index(cmds, "/v1/cluster")
	if ready < 0 || cluster < 0 || ready > cluster {
		t.Errorf("the example asks for /v1/cluster (at %d) without waiting on /readyz first (at %d):\n%s", cluster, ready, cmds)
	}
	dirs := regexp.MustCompile(`--data-dir (\S+)`).FindAllStringSubmatch(cmds, -1)
	if len(dirs) != 3 {
		t.Fatalf("want 3 --data-dir in the example, got %d", len(dirs))
	}
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git not installed")
	}
	for _, d := range dirs {
		cmd := exec.Command(git, "check-ignore", "-q", "--no-index", filepath.Join(d[1], "000001.log"))
		cmd.Dir = repo
		if err := cmd.Run(); err != nil {
			t.Errorf("the data dir %s would show up in git status (git check-ignore: %v)", d[1], err)
		}
	}
}
