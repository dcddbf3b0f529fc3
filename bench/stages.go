package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Stages is where the time of a write goes on idemkv's leader, from the histograms
// every node keeps (idemkv_write_stage_duration_seconds and the request and apply
// histograms), scraped from each node before and after each point of new operations.
// A new operation is two writes, its reserve and its commit. Milliseconds per write.
//
// With one operation in flight each mean is one write's. With more, the API's stages
// and the propose time are still each write's, but Raft times some stages once per
// batch of entries (the leader's log append, the state machine's apply) and every
// write of a batch waits for all of it; a write also waits for Raft's leader loop to
// finish the batch before its own, which the hand-offs hold. And the machine's cores
// are busy then, so every stage holds some waiting for a core.
type Stages struct {
	// Writes is how many reserves and commits the leader served in the window.
	Writes uint64 `json:"writes"`
	// Read is the API's reading and decoding of the body; Validate its checks until
	// the store is called; Prepare the node's checks and local look-ups until the
	// write is handed to Raft.
	Read     float64 `json:"read_ms"`
	Validate float64 `json:"validate_ms"`
	Prepare  float64 `json:"prepare_ms"`
	// Handoffs is the time between Raft's stages and the request's goroutine: the
	// proposal's way to the leader loop before its append (with more than one write
	// in flight, its wait there while the loop appends the batch before), and the
	// answer's way back (the propose time less the rest of Raft's stages).
	Handoffs float64 `json:"handoffs_ms"`
	// LeaderAppend is the leader's log write until durable; Quorum from its end until
	// a quorum has the entry (Raft's commit time less the leader's append); Applied
	// the hand-off of the committed entry to the state machine and its apply.
	LeaderAppend float64 `json:"leader_append_ms"`
	Quorum       float64 `json:"quorum_ms"`
	Applied      float64 `json:"applied_ms"`
	// Respond is encoding and writing the answer.
	Respond float64 `json:"respond_ms"`
	// Rest is the handler's time outside those stages (middleware, routing,
	// authentication, headers).
	Rest float64 `json:"rest_ms"`
	// Handler is the whole handler's time (idemkv_http_request_duration_seconds).
	Handler float64 `json:"handler_ms"`
	// AppendRPC is one AppendEntries round trip from the leader to a follower, the
	// follower's log write (FollowerAppend, on the followers) inside it.
	AppendRPC      float64 `json:"append_rpc_ms"`
	FollowerAppend float64 `json:"follower_append_ms"`
}

// Own is the part of a write's time on the leader that is idemkv's own work, outside
// Raft: reading and decoding, checks and look-ups, the answer, and the rest of the
// endpoint.
func (s *Stages) Own() float64 { return s.Read + s.Validate + s.Prepare + s.Respond + s.Rest }

// scrape is the histogram sums and counts one node's /metrics showed.
type scrape map[string]float64

// Families and series the breakdown reads.
const (
	famStage   = "idemkv_write_stage_duration_seconds"
	famApply   = "idemkv_raft_apply_duration_seconds"
	famRequest = "idemkv_http_request_duration_seconds"
)

// writeEndpoints are the request series of a new operation's two writes.
var writeEndpoints = []string{"POST /v1/reserve", "POST /v1/commit"}

// parseScrape keeps the _sum and _count lines of the families the breakdown reads,
// keyed by the series as written (name and labels).
func parseScrape(r io.Reader) (scrape, error) {
	out := scrape{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, famStage) && !strings.HasPrefix(line, famApply) && !strings.HasPrefix(line, famRequest) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		series := line[:i]
		if !strings.Contains(series, "_sum") && !strings.Contains(series, "_count") {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[series] = v
	}
	return out, sc.Err()
}

// stageSeries names a stage's _sum or _count series.
func stageSeries(stage, suffix string) string {
	return fmt.Sprintf(`%s_%s{stage=%q}`, famStage, suffix, stage)
}

// delta is what a series grew by between two scrapes.
func (s scrape) delta(before scrape, series string) float64 { return s[series] - before[series] }

// mean is a histogram's mean in milliseconds over the window, 0 without samples.
func mean(before, after scrape, sum, count string) float64 {
	n := after.delta(before, count)
	if n <= 0 {
		return 0
	}
	return after.delta(before, sum) / n * 1000
}

// requestSeries sums a write endpoint's _sum or _count series over status codes.
func requestSeries(s scrape, endpoint, suffix string) float64 {
	prefix := fmt.Sprintf(`%s_%s{code=`, famRequest, suffix)
	t := 0.0
	for k, v := range s {
		if strings.HasPrefix(k, prefix) && strings.Contains(k, fmt.Sprintf(`endpoint=%q`, endpoint)) {
			t += v
		}
	}
	return t
}

// stageWindow scrapes an idemkv system's nodes when a point of new operations starts
// and ends; on any other point it does nothing.
type stageWindow struct {
	endpoints     []string
	before, after []scrape
	ok            bool
	err           error
}

func (w *stageWindow) wanted(j job) bool {
	return j.sys.Nodes > 0 && j.workload == "new" && len(j.sys.endpoints) > 0
}

func (w *stageWindow) start(ctx context.Context, j job) {
	if !w.wanted(j) {
		return
	}
	w.endpoints = j.sys.endpoints
	w.before, w.err = scrapeAll(ctx, w.endpoints)
}

func (w *stageWindow) end(ctx context.Context, j job) {
	if !w.wanted(j) || w.err != nil {
		return
	}
	w.after, w.err = scrapeAll(ctx, w.endpoints)
	w.ok = w.err == nil
}

func scrapeAll(ctx context.Context, endpoints []string) ([]scrape, error) {
	out := make([]scrape, len(endpoints))
	for i, ep := range endpoints {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ep+"/metrics", nil)
		if err != nil {
			cancel()
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			return nil, err
		}
		s, err := parseScrape(resp.Body)
		_ = resp.Body.Close()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%s/metrics: %w", ep, err)
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("%s/metrics: %s", ep, resp.Status)
		}
		out[i] = s
	}
	return out, nil
}

// breakdown computes the stages from the scrapes: the leader is the node that served
// the writes, the followers the rest.
func (w *stageWindow) breakdown() *Stages {
	leader, most := -1, 0.0
	for i := range w.after {
		if n := w.after[i].delta(w.before[i], stageSeries("read", "count")); n > most {
			leader, most = i, n
		}
	}
	if leader < 0 {
		return nil
	}
	b, a := w.before[leader], w.after[leader]
	st := func(stage string) float64 {
		return mean(b, a, stageSeries(stage, "sum"), stageSeries(stage, "count"))
	}
	s := &Stages{Writes: uint64(most), Read: st("read"), Validate: st("validate"), Prepare: st("prepare"),
		LeaderAppend: st("leader_append"), Respond: st("respond"), AppendRPC: st("append_rpc")}
	commit := st("commit")
	s.Quorum = commit - s.LeaderAppend
	s.Applied = st("fsm_enqueue") + st("fsm_apply")
	propose := mean(b, a, famApply+"_sum", famApply+"_count")
	s.Handoffs = propose - commit - s.Applied
	var hSum, hCount float64
	for _, ep := range writeEndpoints {
		hSum += requestSeries(a, ep, "sum") - requestSeries(b, ep, "sum")
		hCount += requestSeries(a, ep, "count") - requestSeries(b, ep, "count")
	}
	if hCount > 0 {
		s.Handler = hSum / hCount * 1000
	}
	s.Rest = s.Handler - (s.Read + s.Validate + s.Prepare + propose + s.Respond)
	var fSum, fCount float64
	for i := range w.after {
		if i == leader {
			continue
		}
		fSum += w.after[i].delta(w.before[i], stageSeries("follower_append", "sum"))
		fCount += w.after[i].delta(w.before[i], stageSeries("follower_append", "count"))
	}
	if fCount > 0 {
		s.FollowerAppend = fSum / fCount * 1000
	}
	return s
}
