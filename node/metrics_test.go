package node_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
)

// scrape reads /metrics of endpoint as Prometheus would.
func scrape(t *testing.T, endpoint string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + endpoint + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return families
}

// sample returns the value of the sample of family name whose labels include want
// (a gauge or counter value, or a histogram's count), and whether there is one.
func sample(families map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := families[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func TestMetricsPresentAndMovingAfterTraffic(t *testing.T) {
	ctx := opsCtx(t)
	c := testcluster.Start(t, 3)
	for i := range c.Len() {
		if err := c.Node(i).RegisterMetrics(c.Metrics(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Node(0).RegisterMetrics(c.Metrics(0)); err == nil {
		t.Fatal("registering a node twice on one registry succeeded")
	}
	li := c.WaitLeader()
	fi := (li + 1) % c.Len()
	leader := c.Endpoint(li)

	before := scrape(t, leader)
	for name, labels := range map[string]map[string]string{
		"idemkv_raft_state":                    {"state": "leader"},
		"idemkv_raft_term":                     nil,
		"idemkv_raft_commit_index":             nil,
		"idemkv_raft_applied_index":            nil,
		"idemkv_raft_last_log_index":           nil,
		"idemkv_raft_last_contact_seconds":     nil,
		"idemkv_records_stored":                nil,
		"idemkv_raft_leader_changes_total":     nil,
		"idemkv_expiry_backlog_records":        nil,
		"go_goroutines":                        nil,
		"process_resident_memory_bytes":        nil,
		"idemkv_fsm_apply_batch_entries":       nil,
		"idemkv_raft_apply_duration_seconds":   nil,
		"idemkv_expiry_sweep_duration_seconds": nil,
		"idemkv_raft_votes_withheld":           nil,
	} {
		if _, ok := sample(before, name, labels); !ok {
			t.Errorf("/metrics lacks %s%v", name, labels)
		}
	}
	if v, _ := sample(before, "idemkv_raft_state", map[string]string{"state": "leader"}); v != 1 {
		t.Errorf("the leader reports raft_state{leader} = %v", v)
	}
	if v, _ := sample(before, "idemkv_raft_state", map[string]string{"state": "follower"}); v != 0 {
		t.Errorf("the leader reports raft_state{follower} = %v", v)
	}
	if v, _ := sample(before, "idemkv_raft_votes_withheld", nil); v != 0 {
		t.Errorf("the leader reports raft_votes_withheld = %v", v)
	}
	if v, _ := sample(before, "idemkv_raft_last_contact_seconds", nil); v != 0 {
		t.Errorf("the leader's last contact is %v, want 0", v)
	}

	const n = 25
	for i := range n {
		key := fmt.Sprintf("m:%d", i)
		if _, err := reserveAndCommit(ctx, c.Node(li), key, true); err != nil {
			t.Fatal(err)
		}
		// Through the API, so that the decision and request metrics move too; the first
		// reserve of each key was the node's, this one replays.
		code, body := opsPost(t, leader, "/v1/reserve", fmt.Sprintf(
			`{"tenant":"acme","idempotency_key":%q,"tool":"create_ticket","effect_fingerprint":%q}`, key, fp(key)))
		if code != http.StatusOK || !strings.Contains(body, `"decision":"`+string(idemkv.DecisionReplay)+`"`) {
			t.Fatalf("replay through the API: %d %s", code, body)
		}
	}

	var after map[string]*dto.MetricFamily
	// The record count is recounted at most every few seconds.
	if err := testcluster.Eventually(10*time.Second, func() error {
		after = scrape(t, leader)
		if v, _ := sample(after, "idemkv_records_stored", nil); v != n {
			return fmt.Errorf("records_stored %v, want %d", v, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"idemkv_raft_commit_index", "idemkv_raft_applied_index", "idemkv_raft_last_log_index",
		"idemkv_raft_apply_duration_seconds", "idemkv_fsm_apply_batch_entries"} {
		b, _ := sample(before, name, nil)
		a, _ := sample(after, name, nil)
		if a < b+2*n {
			t.Errorf("%s went from %v to %v after %d reserve+commit pairs", name, b, a, n)
		}
	}
	if v, _ := sample(after, "idemkv_decisions_total", map[string]string{"tool": "create_ticket", "decision": "replay"}); v != n {
		t.Errorf("decisions_total{create_ticket,replay} = %v, want %d", v, n)
	}
	if v, _ := sample(after, "idemkv_http_request_duration_seconds", map[string]string{"endpoint": "POST /v1/reserve", "code": "200"}); v != n {
		t.Errorf("request count of POST /v1/reserve = %v, want %d", v, n)
	}

	// A follower knows its state, hears from the leader and applies the same entries.
	if err := testcluster.Eventually(10*time.Second, func() error {
		f := scrape(t, c.Endpoint(fi))
		if v, _ := sample(f, "idemkv_raft_state", map[string]string{"state": "follower"}); v != 1 {
			return fmt.Errorf("follower raft_state{follower} = %v", v)
		}
		if v, ok := sample(f, "idemkv_raft_last_contact_seconds", nil); !ok || v < 0 || v > 5 {
			return fmt.Errorf("follower last contact %v (present %v)", v, ok)
		}
		la, _ := sample(after, "idemkv_raft_applied_index", nil)
		if v, _ := sample(f, "idemkv_raft_applied_index", nil); v < la {
			return fmt.Errorf("follower applied %v, leader %v", v, la)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Leadership moves: the old leader counts the change and reports it.
	changes, _ := sample(after, "idemkv_raft_leader_changes_total", nil)
	if err := c.Node(li).TransferLeadership(); err != nil {
		t.Fatal(err)
	}
	if err := testcluster.Eventually(10*time.Second, func() error {
		m := scrape(t, leader)
		if v, _ := sample(m, "idemkv_raft_state", map[string]string{"state": "leader"}); v != 0 {
			return fmt.Errorf("still leader")
		}
		if v, _ := sample(m, "idemkv_raft_leader_changes_total", nil); v <= changes {
			return fmt.Errorf("leader changes %v, was %v", v, changes)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func opsPost(t *testing.T, endpoint, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+endpoint+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
