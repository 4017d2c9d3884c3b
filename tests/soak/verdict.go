package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Flat: a series grew less than maxGrowth over the last span of the run.
// The level at each end of that span is the median of the samples in a
// window of span/10 (a minute of the 30-minute run's 10): the last window
// ends with the run; the first ends where the span starts, so that both
// sit at the same phase of the restart schedule (the Redis restart period
// divides the span: each window is the minute before a Redis restart,
// 4-5 minutes after the previous one, and no replica restarts inside
// either). The median, not the mean, so that one sample taken during a
// garbage collection's peak or a burst of calls in flight does not move
// the level; a leak moves every sample.
//
// A replica is judged only if it had run for at least the span when the
// span began (warm: its per-key tables fill to local.max_keys, 100,000
// by default, as new keys arrive; at a million an hour that took a fresh
// replica about 11 minutes in the first 30-minute run, and a bounded
// table filling is not a leak). A replica restarted later is plotted and
// reported, not judged. Redis is always judged: the equal phase of the
// windows compares it 4-5 minutes after a restart at both ends.
//
// A count (goroutines, open files)
// has a resolution of one, and one more open file on 17 is 5.9%: a count
// is flat also when it grew by no more than one.
const maxGrowth = 0.05

// point is one sample of one series.
type point struct {
	at time.Duration
	v  float64
}

// growth is one series' verdict.
type growth struct {
	series      string
	first, last float64 // medians of the two windows
	nFirst      int     // samples in each window
	nLast       int
	integer     bool // a count: growth by one is within its resolution
}

func (g growth) rate() float64 { return g.last/g.first - 1 }

// flat reports whether the series grew less than maxGrowth, with a reason
// when it cannot tell (a window without samples).
func (g growth) flat() (bool, string) {
	if g.nFirst == 0 || g.nLast == 0 || g.first <= 0 || math.IsNaN(g.first) || math.IsNaN(g.last) {
		return false, fmt.Sprintf("%s: no level to compare (%d and %d samples)", g.series, g.nFirst, g.nLast)
	}
	if r := g.rate(); r >= maxGrowth && !(g.integer && g.last-g.first <= 1) {
		return false, fmt.Sprintf("%s grew %.1f%% (%.4g to %.4g), limit %.0f%%", g.series, 100*r, g.first, g.last, 100*maxGrowth)
	}
	return true, ""
}

// growthOf measures series over the span ending at end: the median of the
// samples in [end-span-window, end-span) against the median of those in
// (end-window, end]. NaN samples (the process was restarting) are left
// out.
func growthOf(series string, pts []point, end, span, window time.Duration) growth {
	var a, b []float64
	for _, p := range pts {
		if math.IsNaN(p.v) {
			continue
		}
		if p.at >= end-span-window && p.at < end-span {
			a = append(a, p.v)
		}
		if p.at > end-window && p.at <= end {
			b = append(b, p.v)
		}
	}
	return growth{series: series, first: median(a), last: median(b), nFirst: len(a), nLast: len(b)}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// The oracle: every hot key is one token bucket of limit tokens per
// window (capacity limit, refilling limit/window continuously), kept over
// its limit for the whole run. One exact bucket fed the same calls admits
// at most limit + limit·T/window over T (full at the start, refilled at
// its rate since). A Redis restart without persistence forgets the key:
// the bucket Redis keeps comes back full, handing out again at most the
// limit tokens already spent, and nothing else does; so with R restarts
// during the hot load a key may be admitted at most
//
//	limit + limit·T/window + R·limit
//
// and no more. T runs from the first hot call sent to the last answered,
// which contains every arrival the servers saw.
type oracle struct {
	limit    int
	window   time.Duration
	span     time.Duration // T
	restarts int           // R
}

// exact is what one exact bucket admits at most over the span.
func (o oracle) exact() float64 {
	return float64(o.limit) + float64(o.limit)*o.span.Seconds()/o.window.Seconds()
}

// bound is exact plus what the restarts let Redis forget.
func (o oracle) bound() int64 {
	return int64(math.Floor(o.exact() + float64(o.restarts*o.limit)))
}

// oracleVerdict is the oracle's result over every hot key.
type oracleVerdict struct {
	oracle
	admitted   []int64
	maxKey     int // the key admitted most
	over       []int
	meanOfFull float64 // mean admitted ÷ exact: how much of one bucket the fleet used
}

func judge(o oracle, admitted []int64) oracleVerdict {
	v := oracleVerdict{oracle: o, admitted: admitted}
	var sum float64
	for k, n := range admitted {
		if n > admitted[v.maxKey] {
			v.maxKey = k
		}
		if n > o.bound() {
			v.over = append(v.over, k)
		}
		sum += float64(n)
	}
	if len(admitted) > 0 && o.exact() > 0 {
		v.meanOfFull = sum / float64(len(admitted)) / o.exact()
	}
	return v
}

func (v oracleVerdict) ok() bool { return len(v.admitted) > 0 && len(v.over) == 0 }

func (v oracleVerdict) String() string {
	if len(v.admitted) == 0 {
		return "oracle: no hot key was driven"
	}
	verdict := "held"
	if !v.ok() {
		verdict = fmt.Sprintf("FAILED on %d of %d keys", len(v.over), len(v.admitted))
	}
	return fmt.Sprintf("oracle %s: %d hot keys at %d/%v over %v, %d Redis restarts; most admitted %d (key h%d) of at most %d (one exact bucket %.1f + %d × %d forgotten); mean %.3f of one exact bucket",
		verdict, len(v.admitted), v.limit, v.window, v.span.Round(time.Second), v.restarts, v.admitted[v.maxKey], v.maxKey,
		v.bound(), v.exact(), v.restarts, v.limit, v.meanOfFull)
}

// warm reports whether a process started at start (since the load
// began) is judged over the span ending at end: it ran for at least the
// span before the span's first window.
func warm(start, end, span, window time.Duration) bool {
	return end-span-window-start >= span
}
