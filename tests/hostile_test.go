package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// volumeRequests is how many distinct unknown API keys, and distinct
// client IPs, the memory tests send: 2^19 (524,288), derived from the
// claim and heapSlack. The claim is that no state is kept per unknown key,
// and none per IP beyond the cache's bound. State kept per key holds at
// least a word (8 bytes: a pointer, a map slot, the smallest size class
// but the tiny allocator's), so over 2^19 keys it is at least 4 MiB, twice
// heapSlack: it fails the heap bound with a factor of two to spare, as it
// did at a million (the count until issue 36: 2 MiB over a million keys
// is 2 bytes a key, where 4 here is still under a word). The count costs
// time: 14,900-18,700 Checks/s on the 2-core machine the suite is sized
// for, so a million took 55-70 s a test, alone in the serial group.
const volumeRequests = 2 * heapSlack / 8

// volumeGiveUp is how long a volume run may take before loadgen gives up
// (its -max; its default is 2 minutes): a guard against a run that hangs,
// not a claim. A million Checks took about a minute alone on a quiet
// machine, and did not finish within 2 minutes alone on a machine loaded
// by other work.
var volumeGiveUp = []string{"-max", "10m"}

// warmRequests run before the baseline is measured, so that gRPC's
// buffers, stream workers and (for the IP test) a full cache are part of
// it, and what is compared is growth during the volume run.
const warmRequests = 50_000

// Memory bounds for the volume tests, with what was measured over a
// million requests. heapSlack bounds growth of the live heap after forced
// GCs (measured: +0.1 to +0.2 MiB for unknown keys, +0.2 to +0.3 MiB for
// IPs), so state of a word per request fails it (volumeRequests). rssSlack
// bounds growth of resident memory, which also holds freed heap the
// runtime keeps (measured: +0.4 to +1.6 MiB for unknown keys, +1.6 to
// +4.8 MiB for IPs). rssCeiling bounds the whole process with 10,000
// tracked keys: it catches state that the growth bounds cannot, taken
// before the baseline (a second table filled in the warm-up). Measured on
// the 2-core machine alone, 2026-12-04, at 17,500-24,800 Checks/s: 53.6
// to 55.7 MiB after the warm-up and 57.6 to 65.7 MiB after the run, with
// 6 MiB of live heap (GOGC 400, internal/gctune, lets the heap reach five
// times its live data between collections, and the runtime returns freed
// pages lazily); 34.4-35.1 MiB was read at a third of that rate on a
// loaded machine, and the 64 MiB ceiling set then failed in a quiet
// make test at 65.6. The ceiling is the highest reading plus rssSlack, the
// growth a run may show, rounded to 80 MiB: a coarse guard against a
// process far larger than its cache (whose 10,000 keys hold about 11 MiB,
// 1,131 bytes resident a key, docs/benchmarks.md); the growth bounds
// above are the claim.
const (
	heapSlack  = 2 << 20
	rssSlack   = 16 << 20
	rssCeiling = 80 << 20
)

// startVolumeSidecar runs the race-free binary with pprof on, so that
// heap?gc=1 can force a collection before memory is read.
func startVolumeSidecar(t *testing.T, cfg string) *sidecar {
	t.Helper()
	path := filepath.Join(t.TempDir(), "extauthz.yaml")
	if err := os.WriteFile(path, []byte("listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}\n"+cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return startProcess(t, fastBinary, path, nil, "-pprof")
}

// liveMemory forces two garbage collections (pprof's heap?gc=1) and
// returns the heap in use and the resident set size.
func (s *sidecar) liveMemory() (heap, rss float64) {
	s.t.Helper()
	for i := 0; i < 2; i++ {
		resp, err := http.Get("http://" + s.Admin + "/debug/pprof/heap?gc=1")
		if err != nil {
			s.t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	mfs := s.metrics()
	return sumMetric(mfs, "go_memstats_heap_alloc_bytes"), sumMetric(mfs, "process_resident_memory_bytes")
}

// stackInUse returns the memory of the goroutine stacks, as the runtime
// counts it (whole stack spans).
func (s *sidecar) stackInUse() float64 {
	return sumMetric(s.metrics(), "go_memstats_stack_inuse_bytes")
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// volumeRequests distinct unknown API keys: every one a 401, no policy
// runs, no cache entry is created, and memory stays where it was.
func TestUnknownAPIKeysLeaveMemoryFlat(t *testing.T) {
	serial(t, "half a million Checks keep both cores busy for half a minute; its resident-memory bound is the process's alone: starved beside other tests (7m39s at nice 10) its RSS grew past the bound with a flat heap, freed pages returned late")
	s := startVolumeSidecar(t, `
local: {max_keys: 10000}
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: per-client, key: [client], limit: 100, window: 1m}
  - {name: per-ip, key: [ip], limit: 1000000, window: 1s}
`)
	runLoadgen(t, []*sidecar{s}, warmRequests, 32, append(volumeGiveUp, "-vary", "apikey")...)
	heap0, rss0 := s.liveMemory()

	res := runLoadgen(t, []*sidecar{s}, volumeRequests, 32, append(volumeGiveUp, "-vary", "apikey")...)
	heap1, rss1 := s.liveMemory()
	t.Logf("%d unknown keys in %v (%.0f/s, p99 %v): heap %s → %s, RSS %s → %s",
		volumeRequests, res.Elapsed.Round(time.Millisecond), res.Throughput, res.P99, mib(heap0), mib(heap1), mib(rss0), mib(rss1))

	if res.Statuses["401"] != volumeRequests || len(res.Statuses) != 1 {
		t.Fatalf("statuses = %v, want %d × 401", res.Statuses, volumeRequests)
	}
	mfs := s.metrics()
	if n := sumMetric(mfs, "extauthz_cache_entries"); n != 0 {
		t.Fatalf("cache entries = %v: unknown keys created state", n)
	}
	if n := sumMetric(mfs, "extauthz_decisions_total"); n != 0 {
		t.Fatalf("decisions = %v: a policy ran for an unknown key", n)
	}
	if n := sumMetric(mfs, "extauthz_checks_total", "outcome", "unauthorized"); n != warmRequests+volumeRequests {
		t.Fatalf("unauthorized checks = %v, want %d", n, warmRequests+volumeRequests)
	}
	if heap1-heap0 > heapSlack {
		t.Fatalf("live heap grew by %s over %d unknown keys (bound %s)", mib(heap1-heap0), volumeRequests, mib(heapSlack))
	}
	if rss1-rss0 > rssSlack {
		t.Fatalf("resident memory grew by %s over %d unknown keys (bound %s)", mib(rss1-rss0), volumeRequests, mib(rssSlack))
	}
}

// volumeRequests distinct client IPs: every one allowed (its first
// request), the cache never above max_keys, and memory flat once the
// cache is full.
func TestDistinctIPsKeepCacheAtItsBound(t *testing.T) {
	serial(t, "half a million Checks keep both cores busy for half a minute; its resident-memory bound is the process's alone: starved beside other tests (7m39s at nice 10) its RSS grew 22 MiB with the heap flat at 6 MiB, freed pages returned late")
	const maxKeys = 10_000
	s := startVolumeSidecar(t, fmt.Sprintf(`
local: {max_keys: %d}
policies:
  - {name: per-ip, key: [ip], limit: 10, window: 1m}
`, maxKeys))
	runLoadgen(t, []*sidecar{s}, warmRequests, 32, append(volumeGiveUp, "-vary", "ip")...)
	if n := s.metric("extauthz_cache_entries"); n != maxKeys {
		t.Fatalf("after %d distinct IPs the cache holds %v entries, want it full at %d", warmRequests, n, maxKeys)
	}
	heap0, rss0 := s.liveMemory()
	evictions0 := s.metric("extauthz_cache_evictions_total")

	peak := sampleGauge(s.Admin, "extauthz_cache_entries")
	res := runLoadgen(t, []*sidecar{s}, volumeRequests, 32, append(volumeGiveUp, "-vary", "ip")...)
	maxSeen := peak()
	heap1, rss1 := s.liveMemory()
	t.Logf("%d distinct IPs in %v (%.0f/s, p99 %v): cache peak %v; heap %s → %s, RSS %s → %s",
		volumeRequests, res.Elapsed.Round(time.Millisecond), res.Throughput, res.P99, maxSeen, mib(heap0), mib(heap1), mib(rss0), mib(rss1))

	if res.Statuses["200"] != volumeRequests {
		t.Fatalf("statuses = %v: each IP's first request should be allowed", res.Statuses)
	}
	if n := s.metric("extauthz_cache_entries"); n != maxKeys || maxSeen > maxKeys {
		t.Fatalf("cache ended at %v entries and peaked at %v; the bound is %d", n, maxSeen, maxKeys)
	}
	// The warm-up's last maxKeys IPs are still cached when the run sends
	// them again; every other IP evicts one entry.
	if ev := s.metric("extauthz_cache_evictions_total") - evictions0; ev < volumeRequests-maxKeys {
		t.Fatalf("evictions = %v, want at least %d", ev, volumeRequests-maxKeys)
	}
	if heap1-heap0 > heapSlack || rss1-rss0 > rssSlack || rss1 > rssCeiling {
		t.Fatalf("heap %s → %s, RSS %s → %s: want growth within %s (heap) and %s (RSS), RSS under %s",
			mib(heap0), mib(heap1), mib(rss0), mib(rss1), mib(heapSlack), mib(rssSlack), mib(rssCeiling))
	}
}

// sampleGauge polls a gauge on the admin port until the returned function
// is called, and that function returns the largest value seen. Polling is
// measurement here, not synchronisation: the final value is read after.
func sampleGauge(admin, name string) func() float64 {
	var peak atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			resp, err := http.Get("http://" + admin + "/metrics")
			if err != nil {
				continue
			}
			p := expfmt.NewTextParser(model.UTF8Validation)
			mfs, err := p.TextToMetricFamilies(resp.Body)
			resp.Body.Close()
			if err == nil {
				if v := int64(sumMetric(mfs, name)); v > peak.Load() {
					peak.Store(v)
				}
			}
		}
	}()
	return func() float64 {
		close(stop)
		wg.Wait()
		return float64(peak.Load())
	}
}

func problemBody(t *testing.T, resp *authv3.CheckResponse) map[string]any {
	t.Helper()
	var p map[string]any
	if err := json.Unmarshal([]byte(resp.GetDeniedResponse().GetBody()), &p); err != nil {
		t.Fatalf("denied body %q: %v", resp.GetDeniedResponse().GetBody(), err)
	}
	if deniedHeaders(resp)["content-type"] != "application/problem+json" {
		t.Fatalf("denied without problem+json: %v", deniedHeaders(resp))
	}
	return p
}

// A 64 KiB header value as a plain header, as the API key (header and
// bearer), as a header:NAME key component, as raw bytes in header_map, and
// a 64 KiB header name: each gets its ordinary answer.
func Test64KiBHeaders(t *testing.T) {
	parallel(t)
	s := startSidecar(t, `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: tenant, match: {path_prefix: /t}, key: ["header:x-tenant"], limit: 1, window: 1m}
  - {name: everyone, limit: 1000, window: 1m}
`)
	big := strings.Repeat("v", 64<<10)
	other := big[:len(big)-1] + "w" // the same length, a different value

	if r := s.check(envoyRequest{headers: [][2]string{{"x-junk", big}}}.build()); httpStatus(r) != 200 {
		t.Fatalf("64 KiB plain header: %d", httpStatus(r))
	}
	if r := s.check(envoyRequest{headers: [][2]string{{strings.Repeat("x", 64<<10), "v"}}}.build()); httpStatus(r) != 200 {
		t.Fatalf("64 KiB header name: %d", httpStatus(r))
	}
	for _, h := range [][2]string{{"x-api-key", big}, {"authorization", "Bearer " + big}} {
		r := s.check(envoyRequest{headers: [][2]string{h}}.build())
		if p := problemBody(t, r); httpStatus(r) != 401 || p["detail"] != "API key longer than 1024 bytes." || deniedHeaders(r)["www-authenticate"] != "ApiKey" {
			t.Fatalf("64 KiB %s: %d %v", h[0], httpStatus(r), p)
		}
	}
	// As a key component: its own bucket (limit 1), counted, and distinct
	// from another value of the same length.
	for i, want := range []int{200, 429} {
		if r := s.check(envoyRequest{path: "/t", headers: [][2]string{{"x-tenant", big}}}.build()); httpStatus(r) != want {
			t.Fatalf("64 KiB x-tenant, request %d: %d, want %d", i+1, httpStatus(r), want)
		}
	}
	if r := s.check(envoyRequest{path: "/t", headers: [][2]string{{"x-tenant", other}}}.build()); httpStatus(r) != 200 {
		t.Fatalf("another 64 KiB x-tenant shared the first one's bucket: %d", httpStatus(r))
	}
	raw := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
		HeaderMap: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":path", RawValue: []byte("/t")},
			{Key: "x-tenant", RawValue: []byte(strings.Repeat("\xff", 64<<10))},
		}},
	}}}}
	if r := s.check(raw); httpStatus(r) != 200 {
		t.Fatalf("64 KiB of raw non-UTF-8 bytes as x-tenant: %d", httpStatus(r))
	}
	if got := s.metric("extauthz_decisions_total", "policy", "tenant", "result", "denied"); got != 1 {
		t.Fatalf("tenant denials = %v, want 1", got)
	}
}

// A request with no attributes at all (an empty CheckRequest: zero bytes
// on the wire) is answered: allowed from one anonymous bucket per policy,
// whatever the policy's key is made of, and a clear 401 from a policy that
// rejects requests without a client.
func TestRequestWithNoAttributes(t *testing.T) {
	parallel(t)
	s := startSidecar(t, `
clients: {keys: [{id: ada, key: key-ada}]}
policies:
  - {name: nokey, limit: 10, window: 1m}
  - {name: ip, key: [ip], limit: 10, window: 1m}
  - {name: composite, key: [client, "header:x-t", "claim:sub", principal, path], limit: 10, window: 1m}
`)
	for i := 0; i < 2; i++ {
		if r := s.check(&authv3.CheckRequest{}); httpStatus(r) != 200 || okHeaders(r)["ratelimit"] == "" {
			t.Fatalf("empty request %d: %d %v", i+1, httpStatus(r), okHeaders(r))
		}
	}
	// Two requests, three policies: one shared bucket each.
	if got := s.metric("extauthz_cache_entries"); got != 3 {
		t.Fatalf("cache entries = %v, want one anonymous bucket per policy", got)
	}
	if got := s.metric("extauthz_decisions_total", "result", "allowed"); got != 6 {
		t.Fatalf("allowed decisions = %v, want 6", got)
	}

	s = startSidecar(t, "clients: {keys: [{id: ada, key: key-ada}]}\npolicies:\n  - {name: p, key: [client], limit: 10, window: 1m, on_missing_key: reject}\n")
	r := s.check(&authv3.CheckRequest{})
	if p := problemBody(t, r); httpStatus(r) != 401 || p["detail"] != "Policy p needs client to identify the caller." {
		t.Fatalf("empty request under a reject policy: %d %v", httpStatus(r), p)
	}
	if got := s.metric("extauthz_cache_entries"); got != 0 {
		t.Fatalf("a rejected empty request created %v cache entries", got)
	}
}

// The caps in force end to end: a request matching more than 32 policies
// gets a 500 problem and a warning in the log; a CheckRequest over the
// 4 MiB gRPC receive limit is refused by gRPC with RESOURCE_EXHAUSTED,
// while one just under it is decided (its 3.9 MiB API key refused unhashed).
func TestRequestCaps(t *testing.T) {
	parallel(t)
	var cfg strings.Builder
	cfg.WriteString("clients: {keys: [{id: ada, key: key-ada}]}\npolicies:\n")
	for i := 0; i < 33; i++ {
		fmt.Fprintf(&cfg, "  - {name: p%d, match: {path_prefix: /many}, limit: 10, window: 1m}\n", i)
	}
	cfg.WriteString("  - {name: everyone, limit: 1000, window: 1m}\n")
	s := startSidecar(t, cfg.String())

	r := s.check(envoyRequest{path: "/many"}.build())
	if p := problemBody(t, r); httpStatus(r) != 500 || !strings.Contains(fmt.Sprint(p["detail"]), "more than 32 rate limit policies") {
		t.Fatalf("34 matching policies: %d %v", httpStatus(r), p)
	}
	if !s.logShows("request matches too many policies", 10*time.Second) {
		t.Fatalf("no warning logged:\n%s", tail(s.logs.String(), 10))
	}
	if got := s.metric("extauthz_checks_total", "outcome", "error"); got != 1 {
		t.Fatalf("error outcomes = %v, want 1", got)
	}

	under := envoyRequest{headers: [][2]string{{"x-api-key", strings.Repeat("k", 4<<20-100<<10)}}}.build()
	if r := s.check(under); httpStatus(r) != 401 {
		t.Fatalf("3.9 MiB CheckRequest: %d, want 401 for its over-long key", httpStatus(r))
	}
	over := envoyRequest{headers: [][2]string{{"x-junk", strings.Repeat("j", 4<<20)}}}.build()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.Client.Check(ctx, over); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("4 MiB CheckRequest: %v, want RESOURCE_EXHAUSTED from gRPC", err)
	}
	if r := s.check(envoyRequest{}.build()); httpStatus(r) != 200 {
		t.Fatalf("after the refusals, an ordinary request: %d", httpStatus(r))
	}
}
