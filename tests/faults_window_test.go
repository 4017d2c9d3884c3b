package tests

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// A fixed window under the network faults that take Redis away from the
// replicas (issue 32): the anchor's policy (3 per second per user, 20
// users, the rate limit service door; tests/faults_anchor_test.go) at
// redis mode and hybrid mode side by side, each with three replicas at the
// shipped defaults behind a proxy of its own. A network fault makes Redis
// forget nothing, so each mode admits no more than one exact window per
// key: the limit in every second the run touched. Before the fix redis
// mode admitted 600, 598 and 576 of 540 under the blackhole, 80ms ± 40 and
// 250ms: a window's Redis count and the replicas' fallback shares of the
// same window added up (docs/reliability.md).

// windowFaults are the faults the window runs under: those that send
// decisions to the fallback.
var windowFaults = []string{"latency 80ms ±40ms", "latency 250ms (above the 150ms call timeout)", "blackhole (timeout toxic)"}

// windowFaultsShort is the one make test runs: the blackhole, where every
// replica falls back at once and comes back at once.
var windowFaultsShort = []string{"blackhole (timeout toxic)"}

func TestWindowUnderNetworkFaults(t *testing.T) {
	serial(t, "it measures decisions through injected network faults at the breaker's defaults: other tests' load would add faults of its own")
	x := startToxiproxy(t)
	section, _ := domainDir(t, map[string]string{"faults.yaml": anchorDomain})
	var modes []*modeUnderFault
	for _, mode := range []string{"redis", "hybrid"} {
		addr := x.proxy(mode, testredis.Start(t).Addr)
		bin := fastBinary
		if *faultsBinary != "" {
			bin = *faultsBinary
		}
		var replicas []*sidecar
		var addrs []string
		for range 3 {
			r := startProcess(t, bin, writeConfig(t, defaultsConfig(addr, mode, section)), nil)
			replicas = append(replicas, r)
			addrs = append(addrs, r.GRPC)
		}
		waitPeers(t, replicas, 3)
		m := rlsMode(t, mode, mode, addrs)
		m.replicas = replicas
		m.server = m.serverSideOf("rls")
		m.degraded = degradedOf(replicas)
		modes = append(modes, m)
	}
	var rows []string
	for i, f := range faultMatrix {
		switch {
		case !slices.Contains(windowFaults, f.name):
			continue
		case *faultsOnly != "":
			if !strings.Contains(f.name, *faultsOnly) {
				continue
			}
		case !*faultsFull && !slices.Contains(windowFaultsShort, f.name):
			continue
		}
		t.Run(strings.ReplaceAll(f.name, " ", "_"), func(t *testing.T) {
			plan := defaultFaultPlan
			plan.sourceNet = 180 + i
			runs := runNetFault(t, x, modes, f, plan)
			for _, r := range runs {
				rows = append(rows, r.row(f.name+", fixed window", runs[0]))
				t.Log(rows[len(rows)-1])
				if r.errors > 0 {
					t.Errorf("%s mode: %d gRPC errors of %d decisions (first: %v; the replicas failed %v and answered %v after 250ms); want none", r.mode, r.errors, r.decisions, r.firstError, r.server.failed, r.server.slow)
				}
				if r.allowed > r.exact {
					t.Errorf("%s mode admitted %d; one exact window per key allows at most %d (a network fault makes Redis forget nothing); windows over the limit:\n%s", r.mode, r.allowed, r.exact, overWindows(r, anchorLimit))
				} else {
					t.Logf("%s mode: windows over the limit, by when their calls were sent:\n%s", r.mode, overWindows(r, anchorLimit))
				}
			}
		})
	}
	t.Logf("\n%s", strings.Join(rows, "\n"))
}

// overWindows lists, per key, the one-second windows in which r admitted
// more than limit, each with where it lies against the fault: the window
// each reply says it was decided in (its reset), else the one its call
// was sent in (a call sent just before a window turned may have been
// decided in the next).
func overWindows(r *faultRun, limit int) string {
	type kw struct {
		key int
		w   time.Time
	}
	counts := map[kw][]time.Duration{}
	for _, a := range r.admissions {
		w := a.window
		if w.IsZero() {
			w = a.at.Truncate(time.Second)
		}
		counts[kw{a.key, w}] = append(counts[kw{a.key, w}], a.at.Sub(w).Round(time.Millisecond))
	}
	var lines []string
	for k, sent := range counts {
		if len(sent) <= limit {
			continue
		}
		slices.Sort(sent)
		lines = append(lines, fmt.Sprintf("  key %2d, window from %+.3fs after the fault began (it ended at %+.3fs): %d, sent at %v into it", k.key, k.w.Sub(r.faultAt).Seconds(), r.clearedAt.Sub(r.faultAt).Seconds(), len(sent), sent))
	}
	slices.Sort(lines)
	if len(lines) == 0 {
		lines = append(lines, "  none")
	}
	// And every window's admissions over the keys, to show where a run
	// fell short of the limit.
	perWindow := map[time.Time]int{}
	for k, sent := range counts {
		perWindow[k.w] += len(sent)
	}
	var ws []time.Time
	for w := range perWindow {
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b time.Time) int { return a.Compare(b) })
	var all []string
	for _, w := range ws {
		all = append(all, fmt.Sprintf("%+.1fs: %d", w.Sub(r.faultAt).Seconds(), perWindow[w]))
	}
	lines = append(lines, "  every window, from when it began after the fault did: "+strings.Join(all, ", "))
	return strings.Join(lines, "\n")
}
