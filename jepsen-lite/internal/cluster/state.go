package cluster

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/idemkv/idemkv/jepsen-lite/internal/proxy"
)

// ProcessState reads node i's process state from /proc ("T" when stopped by SIGSTOP,
// "R" or "S" when running), so that a pause can show it really stopped the process.
func (c *Cluster) ProcessState(i int) (string, error) {
	c.mu.Lock()
	cmd := c.nodes[i].cmd
	c.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return "", errors.New("cluster: the node has no process")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return "", err
	}
	// pid (comm) state ...: comm may hold spaces, so read after the last ')'.
	s := string(b)
	j := strings.LastIndexByte(s, ')')
	if j < 0 || j+2 >= len(s) {
		return "", fmt.Errorf("cluster: unreadable /proc stat %q", s)
	}
	return s[j+2 : j+3], nil
}

// LinkStats sums the counters of the links from each node in from to each in to.
func (c *Cluster) LinkStats(from, to []int) (s proxy.Stats) {
	for _, i := range from {
		for _, j := range to {
			if i != j {
				s = s.Add(c.links[i][j].Stats())
			}
		}
	}
	return s
}
