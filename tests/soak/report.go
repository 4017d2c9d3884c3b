package main

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"time"
)

// report judges the run, prints its figures (a Markdown table for
// docs/reliability.md among them) and writes the plot. It returns whether
// every check passed.
func report(o options, l *load, samples []sample, events []event, lost []string) (bool, error) {
	end := o.duration
	window := o.flatSpan / 10
	var growths []growth
	var panels []panel
	for si, s := range replicaSeries {
		pn := panel{title: s.title}
		if s.unit != "" {
			pn.title += " (" + s.unit + ")"
		}
		for r := 0; r < o.replicas; r++ {
			pts := seriesOf(samples, r, si)
			pn.lines = append(pn.lines, line{label: fmt.Sprintf("replica %d", r), color: replicaColors[r%len(replicaColors)], pts: pts})
			g := growthOf(fmt.Sprintf("replica %d %s", r, s.title), pts, end, o.flatSpan, window)
			g.integer = s.integer
			growths = append(growths, g)
		}
		panels = append(panels, pn)
	}
	redisPts := seriesOf(samples, -1, 0)
	panels = append(panels, panel{title: "Redis used_memory (MiB, INFO memory)", lines: []line{{label: "Redis", color: redisColor, pts: redisPts}}})
	growths = append(growths, growthOf("Redis used_memory", redisPts, end, o.flatSpan, window))

	flat := true
	var notFlat []string
	// When each replica's running process started.
	started := make([]time.Duration, o.replicas)
	for _, e := range events {
		if e.replica >= 0 {
			started[e.replica] = e.at
		}
	}
	judgedReplica := func(r int) bool { return warm(started[r], end, o.flatSpan, window) }
	for i, g := range growths {
		if i < len(replicaSeries)*o.replicas && (!replicaSeries[i/o.replicas].judged || !judgedReplica(i%o.replicas)) {
			continue
		}
		if ok, why := g.flat(); !ok {
			flat = false
			notFlat = append(notFlat, why)
		}
	}
	redisRestarts := 0
	for _, e := range events {
		if e.replica < 0 {
			redisRestarts++
		}
	}
	admitted := make([]int64, l.hotKeys)
	for k := range admitted {
		admitted[k] = l.hot[k].admitted.Load()
	}
	ov := judge(oracle{limit: o.hot.limit, window: o.hot.window, span: l.hotSpan(), restarts: redisRestarts}, admitted)

	sent := l.churnSent.Load() + hotSent(l)
	achieved := float64(sent) / (o.duration + o.sampleEvery/2).Seconds()
	verdict := "FLAT"
	if !flat {
		verdict = "NOT FLAT"
	}
	lostVerdict := "nothing lost"
	if len(lost) > 0 {
		lostVerdict = fmt.Sprintf("%d losses", len(lost))
	}
	summary := fmt.Sprintf("%s; %s; %s", verdict, lostVerdict, map[bool]string{true: "oracle held", false: "ORACLE FAILED"}[ov.ok()])
	fmt.Println()
	fmt.Println("soak:", summary)
	fmt.Printf("load: %d calls in %v (%.0f/s of %.0f/s asked; %d skipped, all %d call slots taken), p50 %v, p99 %v, %d answered after %v; %d churn keys\n",
		sent, (o.duration + o.sampleEvery/2).Round(time.Second), achieved, o.rate, l.skipped.Load(), o.workers,
		l.lat.quantile(0.5).Round(10*time.Microsecond), l.lat.quantile(0.99).Round(10*time.Microsecond), l.slow.Load(), envoyTimeout, int64(o.duration.Seconds()*l.keysPerSec))
	fmt.Println(ov)
	machine := machineLoad(samples)
	fmt.Println(machine)
	if len(ov.over) > 0 {
		for _, k := range ov.over {
			fmt.Printf("  key h%d admitted %d, over the bound %d by %d\n", k, admitted[k], ov.bound(), admitted[k]-ov.bound())
		}
	}
	for _, why := range notFlat {
		fmt.Println("not flat:", why)
	}
	for _, why := range lost {
		fmt.Println("lost:", why)
	}

	// The table for docs/reliability.md.
	fmt.Printf("\n| series | start | end | median, minute before the last %v | median, last minute | growth |\n|---|---:|---:|---:|---:|---:|\n", o.flatSpan)
	gi := 0
	for si, s := range replicaSeries {
		for r := 0; r < o.replicas; r++ {
			f, la := firstLast(seriesOf(samples, r, si))
			g := growths[gi]
			gi++
			judged := ""
			switch {
			case !s.judged:
				judged = " (not judged: sawtooth)"
			case !judgedReplica(r):
				judged = fmt.Sprintf(" (not judged: restarted at %v)", started[r].Round(time.Second))
			}
			fmt.Printf("| replica %d %s %s | %.4g | %.4g | %.4g | %.4g | %+.1f%%%s |\n", r, s.title, s.unit, f, la, g.first, g.last, 100*g.rate(), judged)
		}
	}
	f, la := firstLast(redisPts)
	g := growths[gi]
	fmt.Printf("| Redis used_memory MiB | %.4g | %.4g | %.4g | %.4g | %+.1f%% |\n", f, la, g.first, g.last, 100*g.rate())

	title := []string{
		fmt.Sprintf("extauthz soak: %s", summary),
		fmt.Sprintf("%s, %s", o.commandLine, time.Now().UTC().Format("2006-01-02 15:04 UTC")),
		fmt.Sprintf("3 replicas, hybrid, shipped defaults; %.0f calls/s asked, %.0f/s sent, p99 %v; %.0f churn keys/h, each live %v; SIGHUP every %v; Redis restart every %v, a replica every %v",
			o.rate, achieved, l.lat.quantile(0.99).Round(10*time.Microsecond), o.keysPerHour, o.keyLife, o.hupEvery, o.redisEvery, o.replicaEvery),
		ov.String(),
		machine,
		fmt.Sprintf("flat: each series' median over the last %v against the %v before the last %v began: every growth under %.0f%%", window, window, o.flatSpan, 100*maxGrowth),
	}
	if o.machineShared != "" {
		title = append(title, o.machineShared)
	}
	for _, why := range append(notFlat, lost...) {
		title = append(title, "  "+why)
	}
	for i, t := range title {
		title[i] = strings.TrimSpace(t)
	}
	p := plot{title: title, panels: panels, events: events, duration: o.duration, replicaCnt: o.replicas,
		firstWin: [2]time.Duration{end - o.flatSpan - window, end - o.flatSpan}, lastWin: [2]time.Duration{end - window, end}}
	if err := p.write(o.svg); err != nil {
		return false, err
	}
	fmt.Println("\nplot:", o.svg)
	return flat && ov.ok() && len(lost) == 0, nil
}

// machineLoad summarises the machine's load average over the run, the
// soak's processes and everything else that ran: well above the CPU
// count, the soak shared the machine.
func machineLoad(samples []sample) string {
	var sum, hi float64
	var n int
	for _, s := range samples {
		if !math.IsNaN(s.loadAvg) {
			sum += s.loadAvg
			hi = math.Max(hi, s.loadAvg)
			n++
		}
	}
	if n == 0 {
		return "machine load: not read"
	}
	return fmt.Sprintf("machine: %d CPUs, 1-minute load average %.1f on average over the run, %.1f at most (/proc/loadavg)", runtime.NumCPU(), sum/float64(n), hi)
}
