package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/tests/internal/loadgen"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The load generators every row can be driven by: the one in this
// repository (tests/internal/loadgen, which decodes only the status of
// each answer) and ghz.
const (
	inProcess = "in-process"
	byGhz     = "ghz"
)

// target is one row: a server, how each load generator drives it, and
// what each measured round saw.
type target struct {
	name  string
	p     *testredis.Proc // the process answering (Addr, HTTP, Admin)
	meter cpuMeter        // whose CPU the row's decisions cost
	http  bool            // the HTTP door (p.HTTP), not gRPC (p.Addr)
	owns  bool            // p is this row's process, to stop at the end
	// drive runs n requests with one load generator; a generator the row
	// is not driven by is absent.
	drive   map[string]func(n int) (loadgen.Result, error)
	samples map[string][]sample
}

// sample is one measured round of one row with one load generator.
type sample struct {
	res      loadgen.Result
	cpu      time.Duration // server CPU per decision
	degraded float64       // decisions made without Redis
	errors   int           // calls that failed or were not allowed
	scripts  int64         // script calls the shared Redis served
}

// measureRounds warms every row up with every generator, then runs
// rounds interleaved rounds of n requests per row and generator, so that
// a noisy neighbour hurts every row alike.
func measureRounds(ctx context.Context, targets []*target, rdb *redis.Client, n, rounds int) error {
	gens := []string{inProcess, byGhz}
	for _, t := range targets {
		for _, g := range gens {
			if d := t.drive[g]; d != nil {
				if _, err := d(max(n/10, 2000)); err != nil {
					return fmt.Errorf("%s (%s): warm-up: %w", t.name, g, err)
				}
			}
		}
	}
	for r := 0; r < rounds; r++ {
		for _, t := range targets {
			for _, g := range gens {
				d := t.drive[g]
				if d == nil {
					continue
				}
				s, err := measureOne(ctx, t, d, rdb, n)
				if err != nil {
					return fmt.Errorf("%s (%s): %w", t.name, g, err)
				}
				if t.samples == nil {
					t.samples = map[string][]sample{}
				}
				t.samples[g] = append(t.samples[g], s)
			}
		}
	}
	return nil
}

func measureOne(ctx context.Context, t *target, drive func(int) (loadgen.Result, error), rdb *redis.Client, n int) (sample, error) {
	var s sample
	d0, err := degradedDecisions(t.p)
	if err != nil {
		return s, err
	}
	scripts0 := scriptCalls(ctx, rdb)
	s.cpu, err = t.meter.measure(func() (int, error) {
		s.res, err = drive(n)
		return n, err
	})
	if err != nil {
		return s, err
	}
	s.scripts = scriptCalls(ctx, rdb) - scripts0
	d1, err := degradedDecisions(t.p)
	if err != nil {
		return s, err
	}
	s.degraded = d1 - d0
	s.errors = n - s.res.Statuses["200"]
	return s, nil
}

// summary is a row's figures with one generator over its rounds: the
// round of median throughput, the median CPU per decision, and sums.
type summary struct {
	ok       bool // the row was driven by this generator
	res      loadgen.Result
	cpu      time.Duration
	degraded float64
	errors   int
	scripts  int64
	decided  int
}

func (t *target) summary(gen string) summary {
	ss := t.samples[gen]
	if len(ss) == 0 {
		return summary{}
	}
	sm := summary{ok: true}
	byRate := slices.Clone(ss)
	sort.Slice(byRate, func(i, j int) bool { return byRate[i].res.Throughput < byRate[j].res.Throughput })
	sm.res = byRate[len(byRate)/2].res
	cpus := make([]time.Duration, len(ss))
	for i, s := range ss {
		cpus[i] = s.cpu
		sm.degraded += s.degraded
		sm.errors += s.errors
		sm.scripts += s.scripts
		sm.decided += s.res.Requests
	}
	slices.Sort(cpus)
	sm.cpu = cpus[len(cpus)/2]
	return sm
}

// printRows prints one table of rows, each against its ceiling (the row
// ceilingOf names), one line per row and load generator.
func printRows(targets []*target, ceilingOf func(*target) *target) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tload generator\tdecisions/s\tof ceiling\tp50\tp99\tp99 vs ceiling\tCPU per decision\tCPU vs ceiling\tdegraded\terrors\t")
	for _, t := range targets {
		top := ceilingOf(t)
		for _, g := range []string{byGhz, inProcess} {
			m, c := t.summary(g), top.summary(g)
			if !m.ok {
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f%%\t%s\t%s\t%.2f×\t%s\t%.2f×\t%.0f\t%d\t\n", t.name, g, m.res.Throughput, 100*m.res.Throughput/c.res.Throughput,
				us(m.res.P50), us(m.res.P99), float64(m.res.P99)/float64(c.res.P99), cpuText(m.cpu), float64(m.cpu)/float64(c.cpu), m.degraded, m.errors)
		}
	}
	tw.Flush()
}

// cpuGate is the target "row's CPU per decision ≤ factor × the
// ceiling's", with ghz's figures; a row ghz could not drive is not met,
// and says why.
func cpuGate(row, ceiling *target, factor float64, why string) targetCheck {
	m, c := row.summary(byGhz), ceiling.summary(byGhz)
	if !m.ok || !c.ok || m.cpu <= 0 || c.cpu <= 0 {
		return targetCheck{fmt.Sprintf("%s ≤ %.2f× %s's CPU per decision: not measured (%s)", row.name, factor, ceiling.name, why), false}
	}
	r := float64(m.cpu) / float64(c.cpu)
	return targetCheck{fmt.Sprintf("%s ≤ %.2f× %s's CPU per decision, ghz (%s vs %s: %.2f×)", row.name, factor, ceiling.name, cpuText(m.cpu), cpuText(c.cpu), r), r <= factor}
}
