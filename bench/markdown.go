package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/idemkv/idemkv/loadgen"
)

// markdown writes results.md: the like-for-like pairings first, each with its
// durability, its new operations and replays with idemkv ÷ peer, and its targets; then
// idemkv's Raft log backends side by side; then the scale points and the rest.
func markdown(r *Results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "New operations (reserve → commit) and replays, %s per point after %s of warm-up, %d CPUs, fsync p50 %.2f ms / p99 %.2f ms",
		r.Duration, r.Warmup, r.CPUs, r.Fsync.P50, r.Fsync.P99)
	if r.LoadAtStart != "" {
		fmt.Fprintf(&b, ", load average %s at the start and %s at the end", r.LoadAtStart, r.LoadAtEnd)
	}
	b.WriteString(".\n")
	if settled := maxSettle(r); settled > 0 {
		fmt.Fprintf(&b, "Before each point the system was left to go idle (under a fifth of a core: the flushes, compactions and checkpoints of the point before it done), %.0f s at most.\n", settled)
	}
	if r.Rounds > 1 {
		fmt.Fprintf(&b, "Every system was measured in %d rounds, one system at a time, the rounds one after another: each point is its system's round of median throughput, with every round's throughput in brackets, and idemkv ÷ peer divides the medians.\n", r.Rounds)
	}
	if r.PGReplication != nil {
		var sb []string
		for _, s := range r.PGReplication.Standbys {
			sb = append(sb, fmt.Sprintf("%s %s/%s", s.Name, s.State, s.SyncState))
		}
		fmt.Fprintf(&b, "PostgreSQL replication, checked before each of its points: synchronous_standby_names `%s`; %s.\n",
			r.PGReplication.Names, strings.Join(sb, ", "))
	}
	label := func(name string) string {
		for _, s := range r.Systems {
			if s.Name == name {
				return s.Label
			}
		}
		return name
	}
	verdictsFor := func(p pairing) []Verdict {
		var out []Verdict
		for _, v := range r.Targets {
			if strings.Contains(v.Target, p.short+",") {
				out = append(out, v)
			}
		}
		return out
	}
	// Each idemkv system's stage breakdown is printed once, in its first pairing.
	staged := map[string]bool{}
	// The floors are printed once, in the first one-node pairing; the three voters'
	// floor in the first three-node one.
	floored, floored3 := false, false
	for _, p := range pairings {
		idem := pairingSystems(r, p)
		if len(idem) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n### %s\n\n%s\n\nNew operations (reserve → commit):\n\n", p.title, p.durability)
		b.WriteString("| clients | system | ops/s | p50 ms | p99 ms | reserve p50 ms | CPU s / 1k ops | driver CPU s / 1k ops | idemkv ÷ peer |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range clientCounts(r.New) {
			peer := find(r.New, p.peer, c)
			for _, s := range idem {
				if pt := find(r.New, s.Name, c); pt != nil {
					fmt.Fprintf(&b, "| %d | %s | %s | %.2f | %.2f | %.2f | %s | %s | %s |\n", c, s.Label, opsCell(pt), pt.P50, pt.P99, pt.ReserveP50, cpuCell(pt), driverCell(pt), ratio(pt, peer))
				}
			}
			if peer != nil {
				fmt.Fprintf(&b, "| %d | %s | %s | %.2f | %.2f | %.2f | %s | %s | — |\n", c, label(p.peer), opsCell(peer), peer.P50, peer.P99, peer.ReserveP50, cpuCell(peer), driverCell(peer))
			}
		}
		var peerReplay *Point
		for i := range r.Replay {
			if r.Replay[i].System == p.peer {
				peerReplay = &r.Replay[i]
			}
		}
		var rows []string
		for _, s := range idem {
			for i := range r.Replay {
				if pt := &r.Replay[i]; pt.System == s.Name {
					rows = append(rows, fmt.Sprintf("| %s | %s | %d | %s | %.2f | %.2f | %s | %s | %s |\n", s.Label, routeText(p, pt.Route), pt.Concurrency, opsCell(pt), pt.P50, pt.P99, cpuCell(pt), driverCell(pt), ratio(pt, peerReplay)))
				}
			}
		}
		if peerReplay != nil {
			rows = append(rows, fmt.Sprintf("| %s | %s | %d | %s | %.2f | %.2f | %s | %s | — |\n", label(p.peer), routeText(p, ""), peerReplay.Concurrency, opsCell(peerReplay), peerReplay.P50, peerReplay.P99, cpuCell(peerReplay), driverCell(peerReplay)))
		}
		if len(rows) > 0 {
			b.WriteString("\nReplays (reserve of a committed key with the same effect):\n\n| system | sent to | clients | ops/s | p50 ms | p99 ms | CPU s / 1k ops | driver CPU s / 1k ops | idemkv ÷ peer |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
			b.WriteString(strings.Join(rows, ""))
		}
		stageTable(&b, r, slices.DeleteFunc(slices.Clone(idem), func(s SystemInfo) bool { return staged[s.Name] }), p.peer, label(p.peer))
		for _, s := range idem {
			staged[s.Name] = true
		}
		if p.nodes == 1 && !floored {
			floored = floorTable(&b, r, idem, find(r.New, p.peer, 1), label(p.peer))
		}
		if p.nodes == 3 && !floored3 {
			floored3 = floor3Table(&b, r, idem, &p, find(r.New, p.peer, 1), label(p.peer))
		}
		if vs := verdictsFor(p); len(vs) > 0 {
			b.WriteString("\nTargets:\n\n")
			writeVerdicts(&b, vs)
		}
	}
	backendTable(&b, r)
	var unpaired []string
	for _, s := range r.Systems {
		if s.Nodes == 0 && !slices.ContainsFunc(pairings, func(p pairing) bool { return p.peer == s.Name && len(pairingSystems(r, p)) > 0 }) {
			unpaired = append(unpaired, s.Name)
		}
		// An idemkv system measured without its peer (bench --idemkv3 alone) has no
		// pairing to print it in.
		if s.Nodes > 0 && !staged[s.Name] {
			unpaired = append(unpaired, s.Name)
		}
	}
	if !floored {
		floorTable(&b, r, systemsOfSize(r, 1), nil, "")
	}
	if !floored3 {
		floor3Table(&b, r, systemsOfSize(r, 3), nil, nil, "")
	}
	if len(unpaired) > 0 {
		fmt.Fprintf(&b, "\n### Without a system to compare with\n\n| system | workload | clients | ops/s | p50 ms | p99 ms | CPU s / 1k ops |\n|---|---|---:|---:|---:|---:|---:|\n")
		for _, ps := range [][]Point{r.New, r.Replay} {
			for _, pt := range ps {
				if slices.Contains(unpaired, pt.System) {
					fmt.Fprintf(&b, "| %s | %s | %d | %.0f | %.2f | %.2f | %s |\n", label(pt.System), pt.Workload, pt.Concurrency, pt.OpsPerSec, pt.P50, pt.P99, cpuCell(&pt))
				}
			}
		}
		for _, s := range r.Systems {
			if s.Nodes > 0 && slices.Contains(unpaired, s.Name) {
				stageTable(&b, r, []SystemInfo{s}, "", "")
			}
		}
	}
	if len(r.Scale) > 0 {
		b.WriteString("\n### idemkv reserve latency against stored records\n\n| system | records | clients | ops/s | reserve p50 ms | reserve p99 ms |\n|---|---:|---:|---:|---:|---:|\n")
		for _, p := range r.Scale {
			fmt.Fprintf(&b, "| %s | %d | %d | %.0f | %.2f | %.2f |\n", label(p.System), p.Records, p.Concurrency, p.OpsPerSec, p.ReserveP50, p.ReserveP99)
		}
		if vs := scaleVerdicts(r.Scale); len(vs) > 0 {
			b.WriteString("\n")
			writeVerdicts(&b, vs)
		}
	}
	errs := uint64(0)
	for _, ps := range [][]Point{r.New, r.Replay, r.Scale} {
		for _, p := range ps {
			errs += p.Errors
		}
	}
	met, all := 0, 0
	for _, v := range r.Targets {
		all++
		if v.Met {
			met++
		}
	}
	fmt.Fprintf(&b, "\nFailed operations across all points: %d. Targets met: %d of %d.\n", errs, met, all)
	return b.String()
}

// backendTable sets idemkv's Raft log backends side by side, each against the first.
func backendTable(b *strings.Builder, r *Results) {
	var backends []string
	for _, s := range r.Systems {
		if s.Nodes > 0 && !slices.Contains(backends, s.Backend) {
			backends = append(backends, s.Backend)
		}
	}
	if len(backends) < 2 {
		return
	}
	fmt.Fprintf(b, "\n### Raft log backends: %s\n\n| nodes | workload | clients |", strings.Join(backends, " vs "))
	for _, be := range backends {
		fmt.Fprintf(b, " %s ops/s |", be)
	}
	for _, be := range backends[1:] {
		fmt.Fprintf(b, " %s ÷ %s |", be, backends[0])
	}
	for _, be := range backends {
		fmt.Fprintf(b, " %s p99 ms |", be)
	}
	b.WriteString("\n|---:|---|---:|" + strings.Repeat("---:|", 3*len(backends)-1) + "\n")
	for _, nodes := range []int{3, 1} {
		type row struct {
			workload, route string
			clients         int
		}
		var rows []row
		for _, c := range clientCounts(r.New) {
			rows = append(rows, row{"new", "", c})
		}
		for _, pt := range r.Replay {
			if pt.System == idemkvName(nodes, backends[0]) {
				rows = append(rows, row{"replay", pt.Route, pt.Concurrency})
			}
		}
		for _, rw := range rows {
			pts := make([]*Point, len(backends))
			for i, be := range backends {
				if rw.workload == "new" {
					pts[i] = find(r.New, idemkvName(nodes, be), rw.clients)
				} else {
					pts[i] = findRoute(r.Replay, idemkvName(nodes, be), rw.route)
				}
			}
			if !slices.ContainsFunc(pts, func(p *Point) bool { return p != nil }) {
				continue
			}
			what := "new operations"
			if rw.workload == "replay" {
				what = "replays"
				if nodes > 1 {
					what += ", " + rw.route
				}
			}
			fmt.Fprintf(b, "| %d | %s | %d |", nodes, what, rw.clients)
			for _, p := range pts {
				b.WriteString(" " + cell(p, func(p *Point) string { return fmt.Sprintf("%.0f", p.OpsPerSec) }) + " |")
			}
			for _, p := range pts[1:] {
				b.WriteString(" " + ratio(p, pts[0]) + " |")
			}
			for _, p := range pts {
				b.WriteString(" " + cell(p, func(p *Point) string { return fmt.Sprintf("%.2f", p.P99) }) + " |")
			}
			b.WriteString("\n")
		}
	}
}

// cpuCell is a point's CPU seconds per thousand operations, all the system's
// processes together.
func cpuCell(p *Point) string {
	if p == nil || p.CPU == nil {
		return "—"
	}
	return fmt.Sprintf("%.3f", p.CPU.PerKOps)
}

// maxSettle is the longest wait of any point for its system to go idle, in seconds.
func maxSettle(r *Results) float64 {
	m := 0.0
	for _, pts := range [][]Point{r.New, r.Replay} {
		for _, p := range pts {
			m = max(m, p.SettledAfter)
		}
	}
	return m
}

// opsCell is a point's throughput, and each round's when it had more than one.
func opsCell(p *Point) string {
	if len(p.Rounds) < 2 {
		return fmt.Sprintf("%.0f", p.OpsPerSec)
	}
	each := make([]string, len(p.Rounds))
	for i, r := range p.Rounds {
		each[i] = fmt.Sprintf("%.0f", r.OpsPerSec)
	}
	return fmt.Sprintf("%.0f (%s)", p.OpsPerSec, strings.Join(each, ", "))
}

// driverCell is the driver's own CPU seconds per thousand operations of a point.
func driverCell(p *Point) string {
	if p == nil || p.DriverCPU == nil {
		return "—"
	}
	return fmt.Sprintf("%.3f", p.DriverCPU.PerKOps)
}

// stageTable writes, for each idemkv system, where a write's time went on its leader at
// each point of new operations that has a breakdown (a column each), beside the
// client's p50 and the peer's at the same number of clients, and how much of it was
// idemkv's own work.
func stageTable(b *strings.Builder, r *Results, idem []SystemInfo, peer, peerLabel string) {
	type col struct {
		s  SystemInfo
		pt *Point
	}
	var cols []col
	for _, s := range idem {
		for _, c := range clientCounts(r.New) {
			if pt := find(r.New, s.Name, c); pt != nil && pt.Stages != nil {
				cols = append(cols, col{s, pt})
			}
		}
	}
	if len(cols) == 0 {
		return
	}
	systems := map[string]bool{}
	for _, c := range cols {
		systems[c.s.Name] = true
	}
	clients := func(n int) string {
		if n == 1 {
			return "1 client"
		}
		return fmt.Sprintf("%d clients", n)
	}
	b.WriteString("\nWhere a write's time goes on the leader (ms per write, means from the nodes' histograms over each point; a new operation is two writes, its reserve and its commit). With more than one client Raft times its log append and its state machine's apply once per batch of entries, and each write of a batch waits for all of it; the hand-offs then hold a write's wait for Raft's leader loop, busy with the batch before; and every stage holds some waiting for a core:\n\n| stage |")
	for _, c := range cols {
		if len(systems) == 1 {
			fmt.Fprintf(b, " %s |", clients(c.pt.Concurrency))
		} else {
			fmt.Fprintf(b, " %s, %s |", c.s.Label, clients(c.pt.Concurrency))
		}
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", len(cols)) + "\n")
	rows := []struct {
		name      string
		f         func(*Stages) float64
		followers bool // a figure of the followers' part, which one node has not
	}{
		{"HTTP read and decode", func(s *Stages) float64 { return s.Read }, false},
		{"validation (API)", func(s *Stages) float64 { return s.Validate }, false},
		{"validation and local look-ups (node)", func(s *Stages) float64 { return s.Prepare }, false},
		{"hand-offs to Raft's goroutines and back", func(s *Stages) float64 { return s.Handoffs }, false},
		{"leader's log append, until durable", func(s *Stages) float64 { return s.LeaderAppend }, false},
		{"then until a quorum has it", func(s *Stages) float64 { return s.Quorum }, true},
		{"then until applied", func(s *Stages) float64 { return s.Applied }, false},
		{"answer encoded and written", func(s *Stages) float64 { return s.Respond }, false},
		{"rest of the endpoint (routing, authentication, headers)", func(s *Stages) float64 { return s.Rest }, false},
		{"**the endpoint, in all**", func(s *Stages) float64 { return s.Handler }, false},
		{"inside the quorum wait: one AppendEntries round trip", func(s *Stages) float64 { return s.AppendRPC }, true},
		{"inside that: a follower's log write", func(s *Stages) float64 { return s.FollowerAppend }, true},
		{"idemkv's own work: reading, checks, look-ups, the answer, the rest", (*Stages).Own, false},
	}
	for _, row := range rows {
		fmt.Fprintf(b, "| %s |", row.name)
		for _, c := range cols {
			if row.followers && c.s.Nodes == 1 {
				b.WriteString(" — |")
				continue
			}
			fmt.Fprintf(b, " %.3f |", row.f(c.pt.Stages))
		}
		b.WriteString("\n")
	}
	b.WriteString("| its share of the endpoint |")
	for _, c := range cols {
		fmt.Fprintf(b, " %s |", ownShare(c.pt.Stages))
	}
	b.WriteString("\n| the client's p50 of a new operation (both writes) |")
	for _, c := range cols {
		fmt.Fprintf(b, " %.3f |", c.pt.P50)
	}
	b.WriteString("\n")
	if peer != "" {
		fmt.Fprintf(b, "| %s: p50 of a new operation |", peerLabel)
		for _, c := range cols {
			if pp := find(r.New, peer, c.pt.Concurrency); pp != nil {
				fmt.Fprintf(b, " %.3f |", pp.P50)
			} else {
				b.WriteString(" — |")
			}
		}
		b.WriteString("\n")
	}
}

// ownShare is idemkv's own work as a share of the endpoint's time, in percent.
func ownShare(s *Stages) string {
	if s.Handler <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f%%", 100*s.Own()/s.Handler)
}

// floorTable writes the floors of a lone writer's write (floor.go) beside the reserve
// of each one-node idemkv system and of its peer at 1 client, and reports whether
// there were floors to write.
func floorTable(b *strings.Builder, r *Results, idem []SystemInfo, peer *Point, peerLabel string) bool {
	f := r.Floors
	if f == nil {
		return false
	}
	fmt.Fprintf(b, "\nFloors of one write by a lone writer on this machine, with nothing of idemkv's in it (%s; a %d-byte entry, a state machine that does nothing), beside the reserve at 1 client (p50 at the client):\n\n| write | p50 ms | mean ms |\n|---|---:|---:|\n", floorsWhen(f), f.EntryBytes)
	fmt.Fprintf(b, "| raft-wal's append of one entry, until durable | %.3f | %.3f |\n", f.Append.P50, f.Append.Mean)
	fmt.Fprintf(b, "| hashicorp/raft, one voter on raft-wal: Apply until applied | %.3f | %.3f |\n", f.Raft.P50, f.Raft.Mean)
	fmt.Fprintf(b, "| that Apply behind net/http: a POST over loopback on a kept connection | %.3f | %.3f |\n", f.HTTPRaft.P50, f.HTTPRaft.Mean)
	if f.HTTPRaftServer.Count > 0 {
		fmt.Fprintf(b, "| the same, served by another process (as idemkv's API is to the driver) | %.3f | %.3f |\n", f.HTTPRaftServer.P50, f.HTTPRaftServer.Mean)
	}
	floorReserves(b, r, idem, peer, peerLabel, f.HTTPRaftServer,
		"a write path without Raft's goroutine hand-offs and net/http's between the request and the fsync")
	return true
}

// floorsWhen says when the floors were measured.
func floorsWhen(f *Floors) string {
	if f.Rounds > 1 {
		return fmt.Sprintf("measured at the start of each of %d rounds, once the first system was idle; each row its round of median p50", f.Rounds)
	}
	return "measured before the points"
}

// floor3Table writes the floor of a write on three voters (Floors.HTTPRaft3) beside
// the reserve of each three-node idemkv system and of its peer at 1 client, and
// reports whether there was one to write.
func floor3Table(b *strings.Builder, r *Results, idem []SystemInfo, p *pairing, peer *Point, peerLabel string) bool {
	f := r.Floors
	if f == nil || f.HTTPRaft3.Count == 0 {
		return false
	}
	fmt.Fprintf(b, "\nThe floor of one write on three voters, with nothing of idemkv's in it (%s: hashicorp/raft as idemkv configures it on raft-wal, each voter its own process, a state machine that does nothing, a %d-byte entry POSTed to the leader's net/http handler over loopback on a kept connection), beside the reserve at 1 client (p50 at the client):\n\n| write | p50 ms | mean ms |\n|---|---:|---:|\n", floorsWhen(f), f.EntryBytes)
	fmt.Fprintf(b, "| hashicorp/raft, three voters: Apply behind net/http, from another process | %.3f | %.3f |\n", f.HTTPRaft3.P50, f.HTTPRaft3.Mean)
	floorReserves(b, r, idem, peer, peerLabel, f.HTTPRaft3,
		"a Raft whose leader sends an entry to its followers while it appends it (hashicorp/raft appends first), with fewer goroutine hand-offs on the way")
	floorRates(b, r, idem, p, peerLabel)
	return true
}

// floorRates writes the three voters' floor under several writers at once
// (Floors.HTTPRaft3Writers) beside the new operations of the three-node idemkv systems
// and of the peer at as many clients, each client keeping one write in flight, so a
// floor of w writes a second is at most w/2 new operations (a reserve and a commit);
// and says, for each target of the pairing p at those clients, whether the floor
// itself reaches it.
func floorRates(b *strings.Builder, r *Results, idem []SystemInfo, p *pairing, peerLabel string) {
	f := r.Floors
	if f == nil || len(f.HTTPRaft3Writers) == 0 {
		return
	}
	b.WriteString("\nThe same three voters under several writers at once, each on its own kept connection, beside the new operations at as many clients (each client keeps one write, its reserve or its commit, in flight, so w writes a second are at most w/2 new operations):\n\n| writers (clients) | floor: writes/s | floor ÷ 2: new operations/s |")
	for _, s := range idem {
		fmt.Fprintf(b, " %s: ops/s |", s.Label)
	}
	if p != nil {
		fmt.Fprintf(b, " %s: ops/s |", peerLabel)
	}
	b.WriteString("\n|---:|---:|---:|" + strings.Repeat("---:|", len(idem)))
	if p != nil {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	var says []string
	for _, t := range f.HTTPRaft3Writers {
		ops := t.WritesPerSec / 2
		fmt.Fprintf(b, "| %d | %.0f | %.0f |", t.Writers, t.WritesPerSec, ops)
		for _, s := range idem {
			fmt.Fprintf(b, " %s |", cell(find(r.New, s.Name, t.Writers), func(pt *Point) string { return fmt.Sprintf("%.0f", pt.OpsPerSec) }))
		}
		if p == nil {
			b.WriteString("\n")
			continue
		}
		peer := find(r.New, p.peer, t.Writers)
		fmt.Fprintf(b, " %s |\n", cell(peer, func(pt *Point) string { return fmt.Sprintf("%.0f", pt.OpsPerSec) }))
		want, ok := p.newTarget(t.Writers)
		if !ok || peer == nil || peer.OpsPerSec <= 0 {
			continue
		}
		need := want * peer.OpsPerSec
		if ops < need {
			says = append(says, fmt.Sprintf("at %d clients the target, %.1f× the peer's %.0f, is %.0f new operations/s, above the floor's %.0f: with nothing of idemkv's in it, hashicorp/raft behind net/http does not reach it on this machine", t.Writers, want, peer.OpsPerSec, need, ops))
		} else {
			says = append(says, fmt.Sprintf("at %d clients the floor's %.0f new operations/s reach the target, %.1f× the peer's %.0f (%.0f), with %.0f%% to spare for idemkv's own work", t.Writers, ops, want, peer.OpsPerSec, need, 100*(ops/need-1)))
		}
	}
	if len(says) > 0 {
		fmt.Fprintf(b, "\nAgainst the targets (the peer: %s): %s.\n", peerLabel, strings.Join(says, "; "))
	}
}

// floorReserves ends a floors table with the reserves at 1 client of the idemkv
// systems and of the peer, and says what the last floor leaves idemkv's own work
// against the peer: how far the peer's reserve is above it, or that it is below, and
// then what it would take (takes) to match the peer.
func floorReserves(b *strings.Builder, r *Results, idem []SystemInfo, peer *Point, peerLabel string, last loadgen.Summary, takes string) {
	var over []string
	for _, s := range idem {
		if pt := find(r.New, s.Name, 1); pt != nil {
			fmt.Fprintf(b, "| %s: a reserve | %.3f | — |\n", s.Label, pt.ReserveP50)
			if s.Backend == "wal" && last.Count > 0 { // the floors are raft-wal's
				over = append(over, fmt.Sprintf("%s %+.3f ms", s.Label, pt.ReserveP50-last.P50))
			}
		}
	}
	if peer != nil {
		fmt.Fprintf(b, "| %s: a reserve | %.3f | — |\n", peerLabel, peer.ReserveP50)
	}
	if last.Count == 0 || peer == nil || peer.ReserveP50 <= 0 {
		return
	}
	less := ""
	if len(over) > 0 {
		less = " Each reserve on raft-wal less that floor: " + strings.Join(over, "; ") + "."
	}
	if peer.ReserveP50 < last.P50 {
		fmt.Fprintf(b, "\nThe reserve of %s (p50 %.3f ms) takes less than the last floor (%.3f ms): on this machine a write through hashicorp/raft behind net/http, with nothing of idemkv's in it, is already slower, so no change to idemkv's own work brings its one-client writes level with the peer's. That would take %s.%s\n",
			peerLabel, peer.ReserveP50, last.P50, takes, less)
		return
	}
	fmt.Fprintf(b, "\nThe reserve of %s (p50 %.3f ms) is %.3f ms above the last floor (%.3f ms): all that is left for idemkv's own work on a write (decoding, checks, look-ups, its state machine's Pebble batch, the answer) if it is to match the peer.%s\n",
		peerLabel, peer.ReserveP50, peer.ReserveP50-last.P50, last.P50, less)
}

func cell(p *Point, f func(*Point) string) string {
	if p == nil {
		return "—"
	}
	return f(p)
}

// ratio is a's throughput over b's.
func ratio(a, b *Point) string {
	if a == nil || b == nil || b.OpsPerSec == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", a.OpsPerSec/b.OpsPerSec)
}

func routeText(p pairing, route string) string {
	switch {
	case route == routeSpread:
		return "all 3 nodes, each client pinned to one"
	case route == routeLeader && p.nodes > 1:
		return "the leader"
	case route == routeLeader:
		return "the node"
	case p.peer == sysPGSync:
		return "the primary"
	case p.peer == sysEtcd:
		return "any member; the transaction goes through the Raft log"
	}
	return "the server"
}

func clientCounts(points []Point) []int {
	var out []int
	for _, p := range points {
		if !slices.Contains(out, p.Concurrency) {
			out = append(out, p.Concurrency)
		}
	}
	slices.Sort(out)
	return out
}

func writeVerdicts(b *strings.Builder, vs []Verdict) {
	for _, v := range vs {
		mark := "missed"
		if v.Met {
			mark = "met"
		}
		fmt.Fprintf(b, "- %s — **%s**: %s\n", v.Target, mark, v.Measured)
	}
}
