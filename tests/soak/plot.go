package main

import (
	"fmt"
	"html"
	"math"
	"os"
	"strings"
	"time"
)

// The plot is hand-written SVG: five panels of lines against minutes of
// the run, which needs no library.

var replicaColors = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"}

const redisColor = "#d62728"

// event is a restart drawn on every panel.
type event struct {
	at      time.Duration
	replica int // -1: Redis
}

// panel is one chart: its lines (one per replica, or Redis's) in the
// plot's unit.
type panel struct {
	title string
	lines []line
}

type line struct {
	label, color string
	pts          []point
}

type plot struct {
	title      []string // lines of text above the panels
	panels     []panel
	events     []event
	duration   time.Duration
	firstWin   [2]time.Duration // the flatness windows, shaded
	lastWin    [2]time.Duration
	replicaCnt int
}

const (
	plotWidth   = 960
	marginLeft  = 80
	marginRight = 20
	panelHeight = 150
	panelGap    = 40
	lineHeight  = 16
)

func (p plot) write(path string) error {
	var wrapped []string
	for _, t := range p.title {
		wrapped = append(wrapped, wrap(t, 140)...)
	}
	p.title = wrapped
	var b strings.Builder
	top := 20 + lineHeight*len(p.title) + 30
	height := top + len(p.panels)*(panelHeight+panelGap) + 20
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		plotWidth, height, plotWidth, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotWidth, height)
	for i, t := range p.title {
		weight := "normal"
		if i == 0 {
			weight = "bold"
		}
		fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="%s">%s</text>`+"\n", 20+i*lineHeight, weight, html.EscapeString(t))
	}
	// Legend.
	ly := 20 + lineHeight*len(p.title) + 8
	x := 10
	for i := 0; i < p.replicaCnt; i++ {
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/><text x="%d" y="%d">replica %d (dotted: its restarts)</text>`+"\n",
			x, ly, x+20, ly, replicaColors[i%len(replicaColors)], x+25, ly+4, i)
		x += 230
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999" stroke-dasharray="4 3"/><text x="%d" y="%d">Redis restart</text>`+"\n", x, ly, x+20, ly, x+25, ly+4)
	x += 120
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="20" height="10" fill="#fff3b0"/><text x="%d" y="%d">flatness windows</text>`+"\n", x, ly-5, x+25, ly+4)

	plotW := float64(plotWidth - marginLeft - marginRight)
	xOf := func(d time.Duration) float64 {
		return marginLeft + plotW*d.Seconds()/math.Max(p.duration.Seconds(), 1)
	}
	for pi, pn := range p.panels {
		y0 := float64(top + pi*(panelHeight+panelGap))
		maxV := 0.0
		for _, l := range pn.lines {
			for _, pt := range l.pts {
				if !math.IsNaN(pt.v) {
					maxV = math.Max(maxV, pt.v)
				}
			}
		}
		maxV = niceCeil(maxV * 1.1)
		yOf := func(v float64) float64 { return y0 + panelHeight - panelHeight*v/maxV }
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" font-weight="bold">%s</text>`+"\n", marginLeft, y0-6, html.EscapeString(pn.title))
		for _, w := range [][2]time.Duration{p.firstWin, p.lastWin} {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%d" fill="#fff3b0"/>`+"\n", xOf(w[0]), y0, math.Max(xOf(w[1])-xOf(w[0]), 1), panelHeight)
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%.0f" width="%.0f" height="%d" fill="none" stroke="#333"/>`+"\n", marginLeft, y0, plotW, panelHeight)
		for g := 0; g <= 4; g++ {
			v := maxV * float64(g) / 4
			y := yOf(v)
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
				marginLeft, y, marginLeft+plotW, y, marginLeft-5, y+4, formatTick(v))
		}
		step := tickStep(p.duration)
		for t := time.Duration(0); t <= p.duration; t += step {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", xOf(t), y0+panelHeight+14, formatMinutes(t))
		}
		for _, e := range p.events {
			color, dash := "#999", "4 3"
			if e.replica >= 0 {
				color, dash = replicaColors[e.replica%len(replicaColors)], "1 3"
			}
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="%s" stroke-dasharray="%s"/>`+"\n", xOf(e.at), y0, xOf(e.at), y0+panelHeight, color, dash)
		}
		for _, l := range pn.lines {
			// A gap (NaN) ends one polyline; the next sample starts another.
			var seg []string
			flush := func() {
				if len(seg) > 1 {
					fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", l.color, strings.Join(seg, " "))
				} else if len(seg) == 1 {
					xy := strings.Split(seg[0], ",")
					fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="1.5" fill="%s"/>`+"\n", xy[0], xy[1], l.color)
				}
				seg = seg[:0]
			}
			for _, pt := range l.pts {
				if math.IsNaN(pt.v) {
					flush()
					continue
				}
				seg = append(seg, fmt.Sprintf("%.1f,%.1f", xOf(pt.at), yOf(pt.v)))
			}
			flush()
		}
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">minutes since the load started</text>`+"\n", marginLeft+int(plotW/2), height-6)
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func formatTick(v float64) string {
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}

// wrap breaks s at spaces into lines of at most n bytes (a longer word
// stays whole).
func wrap(s string, n int) []string {
	var out []string
	for len(s) > n {
		cut := strings.LastIndexByte(s[:n], ' ')
		if cut <= 0 {
			break
		}
		out = append(out, s[:cut])
		s = "    " + strings.TrimSpace(s[cut:])
	}
	return append(out, s)
}

// tickStep puts about six labels on the time axis.
func tickStep(d time.Duration) time.Duration {
	for _, s := range []time.Duration{10 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute, 10 * time.Minute} {
		if d/s <= 8 {
			return s
		}
	}
	return 30 * time.Minute
}

func formatMinutes(d time.Duration) string {
	m := d.Minutes()
	if m == math.Trunc(m) {
		return fmt.Sprintf("%.0f", m)
	}
	return fmt.Sprintf("%.1f", m)
}
