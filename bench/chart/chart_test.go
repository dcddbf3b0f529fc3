package chart

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"testing"
)

func TestWritePNGDrawsEverySeries(t *testing.T) {
	red := color.RGBA{200, 30, 30, 255}
	blue := color.RGBA{30, 30, 200, 255}
	c := Chart{Title: "new operations", XLabel: "clients", YLabel: "ops/s", Series: []Series{
		{Name: "idemkv", Color: red, Points: []Point{{1, 100}, {16, 1500}, {64, 4000}, {256, 5000}}},
		{Name: "etcd", Color: blue, Points: []Point{{1, 80}, {16, 900}, {64, 2000}, {256, 2500}}},
	}}
	var buf bytes.Buffer
	if err := c.WritePNG(&buf); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if img.Bounds() != image.Rect(0, 0, width, height) {
		t.Fatalf("bounds %v", img.Bounds())
	}
	counts := map[color.RGBA]int{}
	for y := range height {
		for x := range width {
			r, g, b, a := img.At(x, y).RGBA()
			counts[color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), uint8(a >> 8)}]++
		}
	}
	// Each line runs across the plot (hundreds of dots, thick), beyond its markers
	// and legend swatch.
	for _, s := range c.Series {
		if counts[s.Color] < 1500 {
			t.Errorf("%s: %d pixels in its colour, want a drawn line", s.Name, counts[s.Color])
		}
	}
	if counts[black] < 500 {
		t.Errorf("%d black pixels: axes and labels missing", counts[black])
	}
}

func TestWritePNGNeedsPoints(t *testing.T) {
	if err := (Chart{}).WritePNG(&bytes.Buffer{}); err == nil {
		t.Fatal("a chart without points drew something")
	}
}

func TestNiceStepAndLabels(t *testing.T) {
	for raw, want := range map[float64]float64{0.7: 1, 1: 1, 1.2: 2, 3: 5, 7: 10, 1300: 2000, 45000: 50000} {
		if got := niceStep(raw); got != want {
			t.Errorf("niceStep(%v) = %v, want %v", raw, got, want)
		}
	}
	for v, want := range map[float64]string{0: "0", 16: "16", 2000: "2k", 2500: "2.5k", 1.5e6: "1.5m", 0.5: "0.5"} {
		if got := formatNumber(v); got != want {
			t.Errorf("formatNumber(%v) = %q, want %q", v, got, want)
		}
	}
	for _, g := range font {
		for _, row := range g {
			if len(row) != 5 {
				t.Fatalf("glyph row %q is not 5 wide", row)
			}
		}
	}
}

func TestWritePanelsPNGStacksThePanels(t *testing.T) {
	red := color.RGBA{200, 30, 30, 255}
	green := color.RGBA{30, 160, 30, 255}
	long := "a legend name far longer than the margin"
	panels := []Chart{
		{Title: "three nodes", XLabel: "clients", YLabel: "ops/s", Series: []Series{{Name: "idemkv", Color: red, Points: []Point{{1, 100}, {64, 4000}}}}},
		{Title: "one node", XLabel: "clients", YLabel: "ops/s", Series: []Series{{Name: long, Color: green, Points: []Point{{1, 300}, {64, 900}}}}},
	}
	var buf bytes.Buffer
	if err := WritePanelsPNG(&buf, panels); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	b := img.Bounds()
	if b.Dy() != 2*height || b.Dx() <= width {
		t.Fatalf("bounds %v: want two panels high and wider than one panel for the long legend", b)
	}
	// Each series is drawn in its own panel only.
	count := func(c color.RGBA, y0, y1 int) int {
		n := 0
		for y := y0; y < y1; y++ {
			for x := 0; x < b.Dx(); x++ {
				r, g, bl, _ := img.At(x, y).RGBA()
				if uint8(r>>8) == c.R && uint8(g>>8) == c.G && uint8(bl>>8) == c.B {
					n++
				}
			}
		}
		return n
	}
	if top, bottom := count(red, 0, height), count(red, height, 2*height); top < 1000 || bottom != 0 {
		t.Errorf("red: %d pixels in the top panel, %d in the bottom", top, bottom)
	}
	if top, bottom := count(green, 0, height), count(green, height, 2*height); top != 0 || bottom < 1000 {
		t.Errorf("green: %d pixels in the top panel, %d in the bottom", top, bottom)
	}
	if err := WritePanelsPNG(&bytes.Buffer{}, nil); err == nil {
		t.Error("no panels drew something")
	}
}
