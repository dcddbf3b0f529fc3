// Package chart draws line charts as PNG with the standard library alone: a few
// straight lines, markers, a grid and labels in a built-in 5x7 bitmap font. It exists so
// the comparison can show throughput against concurrency without a plotting dependency.
package chart

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"strings"
)

// Point is one measurement.
type Point struct{ X, Y float64 }

// Series is one line.
type Series struct {
	Name   string
	Color  color.RGBA
	Points []Point
}

// Chart describes the picture. X is drawn on a log2 scale (concurrency doubles), Y
// linearly from zero.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
}

const (
	width, height = 900, 540 // of one panel
	left          = 90
	minRight      = 190
	top, bottom   = 50, 70
	scale         = 2 // font pixels per glyph dot
)

var (
	white = color.RGBA{255, 255, 255, 255}
	black = color.RGBA{30, 30, 30, 255}
	grid  = color.RGBA{225, 225, 225, 255}
)

// WritePNG draws c into w.
func (c Chart) WritePNG(w io.Writer) error { return WritePanelsPNG(w, []Chart{c}) }

// WritePanelsPNG draws the charts one above the other into one picture, their plots
// aligned: the margin for the legends fits the longest name of any.
func WritePanelsPNG(w io.Writer, charts []Chart) error {
	if len(charts) == 0 {
		return fmt.Errorf("chart: no charts")
	}
	right := minRight
	for _, c := range charts {
		for _, s := range c.Series {
			right = max(right, 52+textWidth(s.Name)+10)
		}
	}
	img := image.NewRGBA(image.Rect(0, 0, width-minRight+right, height*len(charts)))
	fillRect(img, img.Bounds(), white)
	for i, c := range charts {
		if err := c.draw(img, image.Rect(0, i*height, img.Bounds().Dx(), (i+1)*height), right); err != nil {
			return err
		}
	}
	return png.Encode(w, img)
}

// draw draws c inside r, leaving right pixels for the legend.
func (c Chart) draw(img *image.RGBA, r image.Rectangle, right int) error {
	minX, maxX, maxY := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range c.Series {
		for _, p := range s.Points {
			minX, maxX, maxY = math.Min(minX, p.X), math.Max(maxX, p.X), math.Max(maxY, p.Y)
		}
	}
	if math.IsInf(minX, 0) {
		return fmt.Errorf("chart: %q has no points", c.Title)
	}
	if maxX == minX {
		maxX = minX * 2
	}
	step := niceStep(maxY / 5)
	maxY = math.Ceil(maxY/step) * step
	if maxY == 0 {
		maxY, step = 1, 0.2
	}
	x0, y0 := r.Min.X+left, r.Min.Y+top
	plotW, plotH := r.Dx()-left-right, r.Dy()-top-bottom
	px := func(x float64) int {
		return x0 + int(math.Round((math.Log2(x)-math.Log2(minX))/(math.Log2(maxX)-math.Log2(minX))*float64(plotW)))
	}
	py := func(y float64) int { return y0 + plotH - int(math.Round(y/maxY*float64(plotH))) }

	for y := 0.0; y <= maxY+step/2; y += step {
		line(img, x0, py(y), x0+plotW, py(y), grid, 0)
		label := formatNumber(y)
		text(img, x0-10-textWidth(label), py(y)-7*scale/2, label, black)
	}
	xs := map[float64]bool{}
	for _, s := range c.Series {
		for _, p := range s.Points {
			xs[p.X] = true
		}
	}
	for x := range xs {
		line(img, px(x), y0, px(x), y0+plotH, grid, 0)
		label := formatNumber(x)
		text(img, px(x)-textWidth(label)/2, y0+plotH+10, label, black)
	}
	line(img, x0, y0, x0, y0+plotH, black, 0)
	line(img, x0, y0+plotH, x0+plotW, y0+plotH, black, 0)
	text(img, x0+plotW/2-textWidth(c.XLabel)/2, r.Max.Y-bottom/2+4, c.XLabel, black)
	text(img, r.Min.X+10, y0-30, c.YLabel, black)
	text(img, r.Min.X+r.Dx()/2-textWidth(c.Title)/2, r.Min.Y+12, c.Title, black)

	for i, s := range c.Series {
		for j, p := range s.Points {
			x, y := px(p.X), py(p.Y)
			fillRect(img, image.Rect(x-4, y-4, x+5, y+5), s.Color)
			if j > 0 {
				prev := s.Points[j-1]
				line(img, px(prev.X), py(prev.Y), x, y, s.Color, 1)
			}
		}
		ly := y0 + 20 + i*30
		fillRect(img, image.Rect(x0+plotW+20, ly, x0+plotW+44, ly+4), s.Color)
		text(img, x0+plotW+52, ly-5, s.Name, black)
	}
	return nil
}

// niceStep rounds a raw grid step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func formatNumber(v float64) string {
	switch {
	case v >= 1e6:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e6), ".0") + "m"
	case v >= 1e3:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e3), ".0") + "k"
	case v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func fillRect(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

// line draws from (x0,y0) to (x1,y1) with Bresenham's algorithm, each dot a square of
// half-width thick.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA, thick int) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		fillRect(img, image.Rect(x0-thick, y0-thick, x0+thick+1, y0+thick+1), c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

func textWidth(s string) int { return len([]rune(s)) * 6 * scale }

// text draws s with its top-left corner at (x, y). Letters are drawn lower case;
// characters without a glyph leave a gap.
func text(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range strings.ToLower(s) {
		if g, ok := font[r]; ok {
			for row, bits := range g {
				for col, b := range bits {
					if b == '#' {
						fillRect(img, image.Rect(x+col*scale, y+row*scale, x+(col+1)*scale, y+(row+1)*scale), c)
					}
				}
			}
		}
		x += 6 * scale
	}
}
