package main

import (
	"bufio"
	"context"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The series sampled from each replica's /metrics, in the order of
// sample.replica's columns. judged: the flatness verdict counts it;
// heap in use does not: between two collections it climbs from the live
// heap to the GC's goal and drops back (12 to 50 MiB every few seconds in
// the smoke runs), so a sample every 10 s lands at a random phase of that
// sawtooth; the goal the runtime sets after each collection (GOGC above
// the heap it found live) is the level a leak raises, and is judged in
// its place. integer: a count, whose resolution is one (verdict.go).
var replicaSeries = []struct {
	metric, title, unit string
	scale               float64 // the plot's unit
	judged, integer     bool
}{
	{"process_resident_memory_bytes", "RSS", "MiB", 1 << 20, true, false},
	{"go_memstats_heap_inuse_bytes", "Go heap in use", "MiB", 1 << 20, false, false},
	{"go_memstats_next_gc_bytes", "Go heap goal (next GC)", "MiB", 1 << 20, true, false},
	{"go_goroutines", "goroutines", "", 1, true, true},
	{"process_open_fds", "open files", "", 1, true, true},
}

// sample is one sampling round: each replica's series (NaN where the
// replica was not serving or did not answer) and Redis's used_memory
// (NaN while it restarts).
type sample struct {
	at          time.Duration // since the load started
	replica     [][]float64   // [replica][series]
	redisMemory float64       // INFO memory used_memory, bytes
	redisKeys   float64       // DBSIZE
	loadAvg     float64       // the machine's 1-minute load average (/proc/loadavg): what else ran
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// scrape reads the named metrics (unlabelled lines, or one exact
// labelled line) from a replica's admin endpoint.
func scrape(ctx context.Context, admin string, names []string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+admin+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || !want[name] {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}

// takeSample reads every replica's series and Redis's memory.
func takeSample(ctx context.Context, at time.Duration, replicas []*replica, rdb *redis.Client) sample {
	s := sample{at: at, redisMemory: math.NaN(), redisKeys: math.NaN(), loadAvg: math.NaN()}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			s.loadAvg, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	names := make([]string, len(replicaSeries))
	for i, m := range replicaSeries {
		names[i] = m.metric
	}
	for _, r := range replicas {
		row := make([]float64, len(replicaSeries))
		for i := range row {
			row[i] = math.NaN()
		}
		if r.serving.Load() {
			if got, err := scrape(ctx, r.admin, names); err == nil {
				for i, n := range names {
					if v, ok := got[n]; ok {
						row[i] = v
					}
				}
			}
		}
		s.replica = append(s.replica, row)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if info, err := rdb.Info(rctx, "memory").Result(); err == nil {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				s.redisMemory, _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	if n, err := rdb.DBSize(rctx).Result(); err == nil {
		s.redisKeys = float64(n)
	}
	return s
}
