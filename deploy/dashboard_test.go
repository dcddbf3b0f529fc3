package deploy_test

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/idemkv/idemkv/metrics"
)

// TestDashboardQueriesExistingMetrics keeps the Grafana dashboard in step with the
// metrics the server exports: every series a panel queries must be one of them.
func TestDashboardQueriesExistingMetrics(t *testing.T) {
	raw, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("the dashboard is not valid JSON: %v", err)
	}

	m := metrics.New()
	// Vectors show up once they have a child; the node's figures once registered.
	m.Decisions.WithLabelValues("create_ticket", "execute").Inc()
	m.Requests.WithLabelValues("POST /v1/reserve", "200").Observe(0.001)
	m.RaftLogVerifications.WithLabelValues("ok").Inc()
	if err := m.RegisterNode(func() metrics.NodeStats { return metrics.NodeStats{State: "leader"} }); err != nil {
		t.Fatal(err)
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]string{}
	for _, f := range families {
		exported[f.GetName()] = f.GetType().String()
	}

	series := regexp.MustCompile(`\b(idemkv_[a-z_]+|process_[a-z_]+|go_[a-z_]+)\b`)
	queried := map[string]bool{}
	panels := 0
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		panels++
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, target := range p.Targets {
			names := series.FindAllString(target.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: %q names no idemkv series", p.Title, target.Expr)
			}
			for _, n := range names {
				base := n
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if b, ok := strings.CutSuffix(n, suffix); ok && exported[b] == "HISTOGRAM" {
						base = b
					}
				}
				if _, ok := exported[base]; !ok {
					t.Errorf("panel %q queries %s, which the server does not export", p.Title, n)
				}
				queried[base] = true
			}
		}
	}
	// Every idemkv metric is on the dashboard somewhere.
	var missing []string
	for name := range exported {
		if strings.HasPrefix(name, "idemkv_") && !queried[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("metrics on no panel: %v", missing)
	}
	if panels < 10 || dash.Title == "" {
		t.Errorf("dashboard %q has %d panels", dash.Title, panels)
	}
}
