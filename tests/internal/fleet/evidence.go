package fleet

import (
	"context"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/quota/redisstore"
)

// What settles whether a degraded row measured the machine or the client:
// how busy the whole machine was (every process, not only this one and
// Redis), how many connections the fleet dialled while measuring, and how
// many breaker confirmations ran, with what verdict.

// Evidence is what one run's measured phase showed of the machine and the
// breakers.
type Evidence struct {
	// MachineCPU is the cores the whole machine was busy, every process
	// (/proc/stat), of runtime.NumCPU.
	MachineCPU float64
	// Dials is the connections the masters accepted while measuring
	// (INFO stats total_connections_received).
	Dials int64
	// ProbeConns and DecisionConns are the fleet's connections open at the
	// end of the load, by client name (CLIENT LIST): the breakers' probes
	// ("extauthz-probe") and the decisions' ("extauthz").
	ProbeConns, DecisionConns int
	// Confirms counts the breakers' confirmation probes by result;
	// BreakerOpened the masters marked down.
	Confirms      map[string]int64
	BreakerOpened int64
	// SchedP50 and SchedP99 are how long the driver's goroutines waited,
	// runnable, for a CPU (runtime/metrics /sched/latencies:seconds): a
	// simulated sidecar's Redis call cannot finish sooner than its
	// goroutine runs again, so calls this slow are the driver's wait,
	// not Redis's.
	SchedP50, SchedP99 time.Duration
}

const schedLatencies = "/sched/latencies:seconds"

func schedHistogram() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: schedLatencies}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return s[0].Value.Float64Histogram()
}

// schedQuantile is quantile q of the waits counted between h0 and h1,
// the upper bound of its bucket.
func schedQuantile(h0, h1 *metrics.Float64Histogram, q float64) time.Duration {
	if h0 == nil || h1 == nil || len(h0.Counts) != len(h1.Counts) {
		return 0
	}
	var total uint64
	for i := range h1.Counts {
		total += h1.Counts[i] - h0.Counts[i]
	}
	var seen uint64
	for i := range h1.Counts {
		seen += h1.Counts[i] - h0.Counts[i]
		if total > 0 && float64(seen) >= q*float64(total) {
			return time.Duration(min(h1.Buckets[i+1], 3600) * float64(time.Second))
		}
	}
	return 0
}

// machineTicks reads /proc/stat's first line: busy and total jiffies of
// every CPU.
func machineTicks() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		n, _ := strconv.ParseInt(f, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle and iowait
			busy += n
		}
	}
	return busy, total
}

// connsByName counts the masters' clients by CLIENT SETNAME.
func connsByName(ctx context.Context, admins []*redis.Client) map[string]int {
	out := map[string]int{}
	for _, a := range admins {
		list, err := a.ClientList(ctx).Result()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(list, "\n") {
			for _, f := range strings.Fields(line) {
				if name, ok := strings.CutPrefix(f, "name="); ok {
					out[name]++
				}
			}
		}
	}
	return out
}

// dialsOf sums total_connections_received over the masters.
func dialsOf(ctx context.Context, admins []*redis.Client) int64 {
	var total int64
	for _, a := range admins {
		info, err := a.Info(ctx, "stats").Result()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_connections_received:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				total += n
			}
		}
	}
	return total
}

// confirmsOf counts the confirmation probes by result.
func confirmsOf(m *redisstore.Metrics) map[string]int64 {
	out := map[string]int64{}
	eachCall(m, func(op, result string, n float64) {
		if op == "confirm" {
			out[result] += int64(n)
		}
	})
	return out
}

func breakerOpenedOf(m *redisstore.Metrics) int64 {
	var d dto.Metric
	m.BreakerOpened.Write(&d)
	return int64(d.GetCounter().GetValue())
}

// evidenceProbe is the state at the start of the measured phase.
type evidenceProbe struct {
	busy, total, dials, opened int64
	confirms                   map[string]int64
	sched                      *metrics.Float64Histogram
}

func startEvidence(ctx context.Context, admins []*redis.Client, m *redisstore.Metrics) evidenceProbe {
	busy, total := machineTicks()
	return evidenceProbe{busy: busy, total: total, dials: dialsOf(ctx, admins), opened: breakerOpenedOf(m), confirms: confirmsOf(m), sched: schedHistogram()}
}

// finish returns the evidence of the phase since p, on a machine of cpus
// cores.
func (p evidenceProbe) finish(ctx context.Context, admins []*redis.Client, m *redisstore.Metrics, cpus int) Evidence {
	busy, total := machineTicks()
	sched := schedHistogram()
	e := Evidence{SchedP50: schedQuantile(p.sched, sched, 0.5), SchedP99: schedQuantile(p.sched, sched, 0.99), Dials: dialsOf(ctx, admins) - p.dials, BreakerOpened: breakerOpenedOf(m) - p.opened, Confirms: map[string]int64{}}
	if total > p.total {
		e.MachineCPU = float64(busy-p.busy) / float64(total-p.total) * float64(cpus)
	}
	for r, n := range confirmsOf(m) {
		if d := n - p.confirms[r]; d > 0 {
			e.Confirms[r] = d
		}
	}
	conns := connsByName(ctx, admins)
	e.ProbeConns, e.DecisionConns = conns["extauthz-probe"], conns["extauthz"]
	return e
}
