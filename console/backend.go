package console

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
)

// localHost names the API's in-process handler in the URLs the console's client uses.
const localHost = "console.local"

// localTransport hands each request to the API's handler in this process: the API
// then authenticates the session's token, checks the role, forwards to the leader when
// this node is a follower, and answers in its own shapes.
type localTransport struct {
	api    http.Handler
	remote string // the browser's address, for the API's logs
}

func (t localTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	sr := r.Clone(r.Context())
	sr.RequestURI = r.URL.RequestURI()
	sr.RemoteAddr = t.remote
	if sr.Body == nil {
		sr.Body = http.NoBody
	}
	rw := &recorder{header: http.Header{}}
	t.api.ServeHTTP(rw, sr)
	if rw.status == 0 {
		rw.status = http.StatusOK
	}
	// The console's client keeps asking this node, which forwards what it must: it
	// must not follow the leader's address with the session's token over the network.
	rw.header.Del(idemkv.HeaderLeader)
	return &http.Response{
		Status: http.StatusText(rw.status), StatusCode: rw.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rw.header, Body: io.NopCloser(bytes.NewReader(rw.body.Bytes())),
		ContentLength: int64(rw.body.Len()), Request: r,
	}, nil
}

// recorder is the ResponseWriter of an in-process request.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *recorder) Header() http.Header { return w.header }

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *recorder) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(p)
}

func (w *recorder) Flush() {}

// apiClient is the client of one console request: it talks to this node's API
// in-process with the session's token, one attempt per call, so that an action is one
// API call and its error (outcome_unknown included) reaches the operator as it is.
func (s *Server) apiClient(r *http.Request, v viewer) *client.Client {
	c, err := client.New(client.Config{
		Endpoints:   []string{"http://" + localHost},
		Token:       v.sess.token,
		HTTPClient:  &http.Client{Transport: localTransport{api: s.api, remote: r.RemoteAddr}},
		MaxAttempts: 1,
		Timeout:     DefaultCallTimeout,
		Logger:      s.log,
	})
	if err != nil {
		// The configuration above is constant and valid.
		panic(fmt.Sprintf("console: %v", err))
	}
	return c
}

// peerClient asks other nodes for their own view of the cluster, with the session's
// token, through the client the API forwards with.
func (s *Server) peerClient(v viewer) *client.Client {
	c, err := client.New(client.Config{
		Endpoints:   []string{s.peerScheme + "://" + localHost},
		Token:       v.sess.token,
		HTTPClient:  s.peers,
		MaxAttempts: 1,
		Timeout:     DefaultPeerTimeout,
		Logger:      s.log,
	})
	if err != nil {
		panic(fmt.Sprintf("console: %v", err))
	}
	return c
}

// nodeView is one member as the overview shows it.
type nodeView struct {
	idemkv.NodeInfo
	Role         string
	Term         uint64
	AppliedIndex uint64
	Lag          *uint64
	Clock        *idemkv.ClockInfo
	Error        string
}

// clusterView asks this node for the membership and every member for its own view
// (applied index, clock), all at once, each bounded by DefaultPeerTimeout.
func (s *Server) clusterView(ctx context.Context, r *http.Request, v viewer) (*idemkv.ClusterInfo, []nodeView, error) {
	info, err := s.apiClient(r, v).Cluster(ctx)
	if err != nil {
		return nil, nil, err
	}
	peers := s.peerClient(v)
	out := make([]nodeView, len(info.Nodes))
	var wg sync.WaitGroup
	for i, m := range info.Nodes {
		out[i] = nodeView{NodeInfo: m, Role: m.State}
		if m.APIAddr == "" {
			out[i].Error = "no API address registered yet"
			continue
		}
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, DefaultPeerTimeout)
			defer cancel()
			own, err := peers.ClusterAt(pctx, s.peerScheme+"://"+m.APIAddr)
			if err != nil {
				out[i].Error = err.Error()
				return
			}
			for _, self := range own.Nodes {
				if self.ID == m.ID {
					out[i].Role = self.State
				}
			}
			out[i].Term, out[i].AppliedIndex, out[i].Clock = own.Term, own.AppliedIndex, own.Clock
		})
	}
	wg.Wait()
	var leaderCommit uint64
	for i := range out {
		if out[i].Error == "" && out[i].Role == "leader" {
			leaderCommit = out[i].AppliedIndex
		}
	}
	if leaderCommit > 0 {
		for i := range out {
			if out[i].Error == "" {
				lag := uint64(0)
				if leaderCommit > out[i].AppliedIndex {
					lag = leaderCommit - out[i].AppliedIndex
				}
				out[i].Lag = &lag
			}
		}
	}
	return info, out, nil
}

// nodeMetrics is what the overview reads from this node's GET /metrics.
type nodeMetrics struct {
	// Decisions totals reserve decisions by tool and decision since the node started.
	Decisions        map[string]map[string]float64
	InDoubt          float64
	InDoubtOldest    time.Duration
	ApprovalsWaiting float64
	ApprovalOldest   time.Duration
}

// metrics reads this node's /metrics through the API, as the monitor role may.
func (s *Server) metrics(ctx context.Context, r *http.Request, v viewer) (*nodeMetrics, error) {
	ctx, cancel := context.WithTimeout(ctx, DefaultCallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+localHost+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	if v.sess.token != "" {
		req.Header.Set("Authorization", "Bearer "+v.sess.token)
	}
	resp, err := localTransport{api: s.api, remote: r.RemoteAddr}.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		if e := idemkv.ParseErrorBody(body); e != nil {
			return nil, e
		}
		return nil, fmt.Errorf("console: GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("console: reading /metrics: %w", err)
	}
	m := &nodeMetrics{Decisions: map[string]map[string]float64{}}
	gauge := func(name string) float64 {
		if f := fams[name]; f != nil && len(f.Metric) > 0 && f.Metric[0].Gauge != nil {
			return f.Metric[0].Gauge.GetValue()
		}
		return 0
	}
	if f := fams["idemkv_decisions_total"]; f != nil {
		for _, mt := range f.Metric {
			var tool, decision string
			for _, l := range mt.Label {
				switch l.GetName() {
				case "tool":
					tool = l.GetValue()
				case "decision":
					decision = l.GetValue()
				}
			}
			if m.Decisions[tool] == nil {
				m.Decisions[tool] = map[string]float64{}
			}
			m.Decisions[tool][decision] += mt.GetCounter().GetValue()
		}
	}
	m.InDoubt = gauge("idemkv_records_in_doubt")
	m.InDoubtOldest = time.Duration(gauge("idemkv_in_doubt_oldest_age_seconds") * float64(time.Second))
	m.ApprovalsWaiting = gauge("idemkv_approvals_waiting")
	m.ApprovalOldest = time.Duration(gauge("idemkv_approval_oldest_waiting_seconds") * float64(time.Second))
	return m, nil
}

// rates turns the decision counters into per-second rates: each overview that reads
// the metrics leaves a sample, and a rate is the difference to the oldest sample of
// the last rateWindow. The samples are this node's counters, whoever read them.
type rates struct {
	mu      sync.Mutex
	samples []rateSample
}

type rateSample struct {
	at    time.Time
	total map[string]map[string]float64
}

const (
	rateWindow   = time.Minute
	rateMinSpan  = 5 * time.Second
	rateMaxKept  = 64
	rateMinSpace = 2 * time.Second
)

// toolRate is one tool's row on the overview.
type toolRate struct {
	Tool            string
	Total           float64
	Conflicts       float64
	PerSecond       float64
	ConflictsPerSec float64
}

// observe adds a sample taken at now and returns the rates by tool, busiest first,
// and the span they were measured over (0 when there is no earlier sample yet).
func (rt *rates) observe(now time.Time, total map[string]map[string]float64) ([]toolRate, time.Duration) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for len(rt.samples) > 0 && now.Sub(rt.samples[0].at) > rateWindow {
		rt.samples = rt.samples[1:]
	}
	var base *rateSample
	if len(rt.samples) > 0 && now.Sub(rt.samples[0].at) >= rateMinSpan {
		base = &rt.samples[0]
	}
	if n := len(rt.samples); (n == 0 || now.Sub(rt.samples[n-1].at) >= rateMinSpace) && n < rateMaxKept {
		rt.samples = append(rt.samples, rateSample{at: now, total: total})
	}
	var span time.Duration
	if base != nil {
		span = now.Sub(base.at)
	}
	out := make([]toolRate, 0, len(total))
	for tool, byDecision := range total {
		tr := toolRate{Tool: tool}
		for d, n := range byDecision {
			tr.Total += n
			if d == string(idemkv.DecisionConflict) {
				tr.Conflicts += n
			}
		}
		if base != nil {
			var before, beforeConflicts float64
			for d, n := range base.total[tool] {
				before += n
				if d == string(idemkv.DecisionConflict) {
					beforeConflicts += n
				}
			}
			tr.PerSecond = max(0, tr.Total-before) / span.Seconds()
			tr.ConflictsPerSec = max(0, tr.Conflicts-beforeConflicts) / span.Seconds()
		}
		out = append(out, tr)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PerSecond != out[j].PerSecond {
			return out[i].PerSecond > out[j].PerSecond
		}
		if out[i].Total != out[j].Total {
			return out[i].Total > out[j].Total
		}
		return out[i].Tool < out[j].Tool
	})
	return out, span
}
