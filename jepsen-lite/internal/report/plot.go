// Package report turns a jepsen-lite run into what a person reads: summary.json, an
// SVG of throughput and latency over time with the fault windows shaded, and the live
// progress line.
package report

import (
	"fmt"
	"html"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
	"github.com/idemkv/idemkv/jepsen-lite/internal/nemesis"
	"github.com/idemkv/idemkv/jepsen-lite/internal/progress"
)

// Bucket is one second of the run.
type Bucket struct {
	OK, Fail, Info int
	P50, P99       time.Duration
}

// Buckets groups completed operations by the second they completed in.
func Buckets(ops []history.Op, duration time.Duration) []Bucket {
	n := int(math.Ceil(duration.Seconds()))
	if n < 1 {
		n = 1
	}
	out := make([]Bucket, n)
	lat := make([][]time.Duration, n)
	for i := range ops {
		op := &ops[i]
		if op.Type == history.Invoke || op.In.Final {
			continue
		}
		b := int(time.Duration(op.Return) / time.Second)
		if b < 0 || b >= n {
			continue
		}
		switch op.Type {
		case history.OK:
			out[b].OK++
			lat[b] = append(lat[b], op.Latency())
		case history.Fail:
			out[b].Fail++
		case history.Info:
			out[b].Info++
		}
	}
	for i, l := range lat {
		if len(l) == 0 {
			continue
		}
		sort.Slice(l, func(a, b int) bool { return l[a] < l[b] })
		out[i].P50 = l[len(l)*50/100]
		out[i].P99 = l[min(len(l)-1, len(l)*99/100)]
	}
	return out
}

var familyColor = map[string]string{
	nemesis.FamilyPartition:  "#e6550d",
	nemesis.FamilyKill:       "#de2d26",
	nemesis.FamilyPause:      "#756bb1",
	nemesis.FamilyMembership: "#31a354",
	nemesis.FamilySnapshot:   "#3182bd",
	nemesis.FamilyClock:      "#b8860b",
	nemesis.FamilyCombined:   "#e377c2",
	nemesis.FamilyChurn:      "#17becf",
	nemesis.FamilyStorage:    "#8c564b",
	nemesis.FamilyClockJump:  "#bcbd22",
}

// WriteSVG draws throughput (top) and latency (bottom, log scale) per second, with
// every fault window shaded across both and labelled, and the progress verdict on
// top of the throughput: each fault window's write availability, a green bar from
// each heal to the second throughput was back (red when it was not back in time), and
// a red bar over each quiet window that acknowledged no write.
func WriteSVG(w io.Writer, title string, buckets []Bucket, faults []nemesis.Fault, windows []progress.Window) error {
	const (
		width, left, right = 1200, 70, 20
		top, panelH, gap   = 72, 220, 50
		height             = top + 2*panelH + gap + 60
	)
	plotW := float64(width - left - right)
	n := len(buckets)
	x := func(sec float64) float64 { return float64(left) + plotW*sec/float64(n) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))

	// Fault windows. Labels go in the first of three rows where they fit; a label
	// that fits nowhere is left out (the window's tooltip still names it).
	var rowEnd [3]float64
	for _, f := range faults {
		x0, x1 := x(float64(f.Start)/1e9), x(float64(f.End)/1e9)
		if x1-x0 < 1 {
			x1 = x0 + 1
		}
		c := familyColor[f.Family]
		if c == "" {
			c = "#999999"
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" fill-opacity="0.18"><title>%s</title></rect>`+"\n",
			x0, top, x1-x0, 2*panelH+gap, c, html.EscapeString(f.Kind+": "+f.Detail+errSuffix(f)))
		labelW := 6.0 * float64(len(f.Kind))
		for row := range rowEnd {
			if x0 >= rowEnd[row] {
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="%s" font-size="10">%s</text>`+"\n", x0+2, top-4-12*row, c, html.EscapeString(f.Kind))
				rowEnd[row] = x0 + labelW + 4
				break
			}
		}
	}

	// Throughput panel.
	maxT := 1
	for _, bk := range buckets {
		maxT = max(maxT, bk.OK, bk.Fail, bk.Info)
	}
	maxT = niceCeil(maxT)
	yT := func(v int) float64 { return float64(top+panelH) - float64(panelH)*float64(v)/float64(maxT) }
	axes(&b, left, top, int(plotW), panelH, "ops/s")
	for _, v := range []int{0, maxT / 2, maxT} {
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%d</text>`+"\n", left-4, yT(v)+4, v)
	}
	series := []struct {
		name, color string
		val         func(Bucket) int
	}{
		{"ok", "#2ca02c", func(bk Bucket) int { return bk.OK }},
		{"info (unknown)", "#ff7f0e", func(bk Bucket) int { return bk.Info }},
		{"fail", "#d62728", func(bk Bucket) int { return bk.Fail }},
	}
	for si, s := range series {
		var pts []string
		for i, bk := range buckets {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(float64(i)+0.5), yT(s.val(bk))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", s.color, strings.Join(pts, " "))
		legend(&b, left+int(plotW)-360+si*120, top+14, s.color, s.name)
	}

	// Latency panel, log scale from 1 ms to 10 s.
	ltop := top + panelH + gap
	axes(&b, left, ltop, int(plotW), panelH, "latency (ok ops)")
	lo, hi := math.Log10(1), math.Log10(10000)
	yL := func(d time.Duration) float64 {
		ms := math.Max(float64(d)/1e6, 1)
		v := math.Min((math.Log10(ms)-lo)/(hi-lo), 1)
		return float64(ltop+panelH) - float64(panelH)*v
	}
	for _, ms := range []int{1, 10, 100, 1000, 10000} {
		y := yL(time.Duration(ms) * time.Millisecond)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", left, left+int(plotW), y, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-4, y+4, time.Duration(ms)*time.Millisecond)
	}
	for si, s := range []struct {
		name, color string
		val         func(Bucket) time.Duration
	}{
		{"p50", "#1f77b4", func(bk Bucket) time.Duration { return bk.P50 }},
		{"p99", "#9467bd", func(bk Bucket) time.Duration { return bk.P99 }},
	} {
		var pts []string
		for i, bk := range buckets {
			if bk.OK == 0 {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(float64(i)+0.5), yL(s.val(bk))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", s.color, strings.Join(pts, " "))
		legend(&b, left+int(plotW)-240+si*120, ltop+14, s.color, s.name)
	}

	drawProgress(&b, windows, x, top, panelH)

	// Time axis.
	step := max(1, niceCeil(n/12))
	for s := 0; s <= n; s += step {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%ds</text>`+"\n", x(float64(s)), ltop+panelH+16, s)
	}
	// Legend of families.
	lx := left
	for _, fam := range nemesis.Families {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s" fill-opacity="0.35"/><text x="%d" y="%d">%s</text>`+"\n",
			lx, height-22, familyColor[fam], lx+16, height-12, fam)
		lx += 110
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// drawProgress marks availability and recovery on the throughput panel.
func drawProgress(b *strings.Builder, windows []progress.Window, x func(float64) float64, top, panelH int) {
	for i, w := range windows {
		x0, x1 := x(w.Start), x(w.End)
		if len(w.Faults) == 0 {
			if w.Acked == 0 && w.End-w.Start >= 1 {
				fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="6" fill="#d62728"><title>no acknowledged write without a fault</title></rect>`+"\n",
					x0, top+panelH-6, x1-x0)
			}
			continue
		}
		avail := "n/a"
		if w.Availability != nil {
			avail = fmt.Sprintf("%.0f%%", 100**w.Availability)
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%d" font-size="9" fill="#333"><title>%s: %d of %d writes acknowledged</title>%s</text>`+"\n",
			x0+1, top+10+10*(i%2), html.EscapeString(strings.Join(w.Faults, "+")), w.Acked, w.Writes, avail)
		switch {
		case w.RecoveredIn != nil:
			fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="4" fill="#2ca02c"><title>write throughput back %.1f s after the heal</title></rect>`+"\n",
				x1, top+panelH-4, x(w.End+*w.RecoveredIn)-x1, *w.RecoveredIn)
		case w.NotJudged == "":
			fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="6" fill="#d62728"><title>write throughput not back in time</title></rect>`+"\n",
				x1, top+panelH-6, x(w.End+5)-x1)
		}
	}
}

func errSuffix(f nemesis.Fault) string {
	if f.Err == "" {
		return ""
	}
	return " (" + f.Err + ")"
}

func axes(b *strings.Builder, x, y, w, h int, label string) {
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", x, y, w, h)
	fmt.Fprintf(b, `<text x="%d" y="%d" transform="rotate(-90 %d %d)" text-anchor="middle">%s</text>`+"\n",
		x-50, y+h/2, x-50, y+h/2, html.EscapeString(label))
}

func legend(b *strings.Builder, x, y int, color, name string) {
	fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/><text x="%d" y="%d">%s</text>`+"\n",
		x, x+20, y-4, y-4, color, x+24, y, html.EscapeString(name))
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v int) int {
	if v <= 1 {
		return 1
	}
	p := 1
	for p*10 < v {
		p *= 10
	}
	for _, m := range []int{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
