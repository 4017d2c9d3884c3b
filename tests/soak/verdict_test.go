package main

import (
	"math"
	"testing"
	"time"
)

// series is 30 minutes sampled every 10 s: level f(t) plus a ±2% wobble
// that alternates sample to sample (a GC's sawtooth), NaN for the samples
// listed in gaps (a restart).
func series(f func(t time.Duration) float64, gaps ...int) []point {
	var pts []point
	for k := 0; k <= 180; k++ {
		t := time.Duration(k) * 10 * time.Second
		v := f(t) * (1 + 0.02*float64(1-2*(k%2)))
		for _, g := range gaps {
			if g == k {
				v = math.NaN()
			}
		}
		pts = append(pts, point{at: t, v: v})
	}
	return pts
}

// The claim: a series is flat when it grew less than 5% over the last
// 10 minutes, level against level, whatever its wobble; a steady climb of
// 6% over those minutes is not flat; a restart's gap is left out.
func TestFlatnessJudgesTheLastTenMinutes(t *testing.T) {
	const span, window, end = 10 * time.Minute, time.Minute, 30 * time.Minute
	cases := []struct {
		name string
		f    func(time.Duration) float64
		gaps []int
		flat bool
	}{
		{"level with wobble", func(time.Duration) float64 { return 100 }, nil, true},
		{"grew early, level since", func(t time.Duration) float64 { return 100 + 50*math.Min(t.Minutes(), 15)/15 }, nil, true},
		// 6% over the last 10 minutes (0.6% a minute from minute 19 on).
		{"leaks 6% over the span", func(t time.Duration) float64 { return 100 * (1 + 0.006*math.Max(t.Minutes()-19.5, 0)) }, nil, false},
		{"leaks 4% over the span", func(t time.Duration) float64 { return 100 * (1 + 0.004*math.Max(t.Minutes()-19.5, 0)) }, nil, true},
		{"shrinks", func(t time.Duration) float64 { return 200 - t.Minutes() }, nil, true},
		{"restart gap in the last minute", func(time.Duration) float64 { return 100 }, []int{175, 176}, true},
	}
	for _, c := range cases {
		g := growthOf(c.name, series(c.f, c.gaps...), end, span, window)
		if ok, why := g.flat(); ok != c.flat {
			t.Errorf("%s: flat = %v (growth %.2f%%, %s), want %v", c.name, ok, 100*g.rate(), why, c.flat)
		}
	}
	// A count's resolution is one: 17 open files becoming 18 is flat, 19
	// is not.
	for _, c := range []struct {
		to   float64
		flat bool
	}{{18, true}, {19, false}} {
		pts := []point{{19 * time.Minute, 17}, {19*time.Minute + 30*time.Second, 17}, {29*time.Minute + 30*time.Second, c.to}, {30 * time.Minute, c.to}}
		g := growthOf("open files", pts, end, span, window)
		g.integer = true
		if ok, why := g.flat(); ok != c.flat {
			t.Errorf("open files 17 to %.0f: flat = %v (%s), want %v", c.to, ok, why, c.flat)
		}
	}
	// A window without samples is no verdict, and not flat.
	g := growthOf("no samples", series(func(time.Duration) float64 { return 100 }, 114, 115, 116, 117, 118, 119), end, span, window)
	if ok, _ := g.flat(); ok || g.nFirst != 0 {
		t.Errorf("a first window of gaps: flat %v with %d samples, want not flat with 0", ok, g.nFirst)
	}
}

// The claim: the oracle allows one exact bucket over the span (full at
// the start, refilled at its rate) plus a full bucket per Redis restart,
// and not one admission more.
func TestOracleBoundIsOneExactBucketPlusTheForgotten(t *testing.T) {
	o := oracle{limit: 600, window: time.Minute, span: 30 * time.Minute, restarts: 5}
	// 600 at the start, 10 a second for 1,800 s, 5 × 600 forgotten.
	if got, want := o.bound(), int64(600+18_000+3_000); got != want {
		t.Fatalf("bound %d, want %d", got, want)
	}
	if v := judge(o, []int64{100, o.bound(), 20_000}); !v.ok() {
		t.Errorf("admissions at the bound failed: %v", v)
	}
	v := judge(o, []int64{100, o.bound() + 1, 20_000})
	if v.ok() || len(v.over) != 1 || v.over[0] != 1 {
		t.Errorf("one admission over the bound on key 1: ok %v, over %v", v.ok(), v.over)
	}
	if v := judge(o, nil); v.ok() {
		t.Error("no hot key driven passed")
	}
}

// The claim: a replica is judged over the last 10 minutes of a 30-minute
// run only if it had run 10 minutes when they began (the minute before
// them, from minute 19): one never restarted, or restarted by minute 9.
func TestOnlyAWarmReplicaIsJudged(t *testing.T) {
	const span, window, end = 10 * time.Minute, time.Minute, 30 * time.Minute
	for _, c := range []struct {
		start time.Duration
		warm  bool
	}{{0, true}, {9 * time.Minute, true}, {10 * time.Minute, false}, {20 * time.Minute, false}} {
		if got := warm(c.start, end, span, window); got != c.warm {
			t.Errorf("started at %v: judged %v, want %v", c.start, got, c.warm)
		}
	}
}
