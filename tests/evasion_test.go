package tests

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// Ways around a limit: each test is one way a caller or a configuration
// could bend a limit (docs/security.md), run against the real binary.

// A value over 128 bytes is keyed by a digest that no value sent verbatim
// can spell: the digest's text as a header value is a bucket of its own.
func TestLongValueDigestCannotBeSentVerbatim(t *testing.T) {
	parallel(t)
	s := startSidecar(t, `
policies:
  - {name: tenant, key: ["header:x-tenant"], limit: 1, window: 1h}
`)
	long := strings.Repeat("t", 200)
	tenant := func(v string) int {
		return httpStatus(s.check(envoyRequest{headers: [][2]string{{"x-tenant", v}}}.build()))
	}
	if got := tenant(long); got != 200 {
		t.Fatalf("the long value's first request: %d", got)
	}
	if got := tenant(long); got != 429 {
		t.Fatalf("the long value's second request: %d, want 429 (limit 1)", got)
	}
	// The digest's text bare, and behind the '%' that marks a digest.
	sum := sha256.Sum256([]byte(long))
	for _, forged := range []string{"sha256." + hex.EncodeToString(sum[:16]), "%sha256." + hex.EncodeToString(sum[:16])} {
		if got := tenant(forged); got != 200 {
			t.Fatalf("x-tenant %q: %d; it shares the bucket of the 200-byte value", forged, got)
		}
	}
}

// A policy on api.example.com holds for every spelling Envoy routes to the
// same virtual host: upper case, a port, a trailing dot. The request's host
// comes both from the attributes' host field and, when that is empty, from
// :authority.
func TestHostSpellingsShareThePolicy(t *testing.T) {
	parallel(t)
	s := startSidecar(t, `
policies:
  - {name: api, match: {hosts: [api.example.com]}, limit: 1, window: 1h}
  - {name: org, match: {hosts: ["*.Example.ORG."]}, limit: 1, window: 1h}
`)
	for _, hosts := range [][]string{
		{"api.example.com", "api.example.com.", "API.EXAMPLE.COM.:443", "Api.Example.Com:8443", "api.example.com.."},
		{"a.example.org", "A.EXAMPLE.ORG.", "a.example.org.:443"},
	} {
		if got := httpStatus(s.check(envoyRequest{host: hosts[0]}.build())); got != 200 {
			t.Fatalf("host %q, first request: %d", hosts[0], got)
		}
		for _, h := range hosts[1:] {
			if got := httpStatus(s.check(envoyRequest{host: h}.build())); got != 429 {
				t.Fatalf("host %q after %q spent the limit: %d, want 429", h, hosts[0], got)
			}
			req := envoyRequest{host: h}.build()
			req.Attributes.Request.Http.Host = "" // from :authority alone
			if got := httpStatus(s.check(req)); got != 429 {
				t.Fatalf(":authority %q after %q spent the limit: %d, want 429", h, hosts[0], got)
			}
		}
	}
	if got := httpStatus(s.check(envoyRequest{host: "api.example.net"}.build())); got != 200 {
		t.Fatalf("another host: %d, want 200 (no policy)", got)
	}
}

// x-client-id reaches the upstream only as the sidecar set it: every
// allowed request without a verified client has it removed, whether the
// sidecar saw one or not (Envoy forwards headers ext_authz never sees when
// allowed_headers narrows what it sends).
func TestClientIDAlwaysRemovedWithoutAVerifiedClient(t *testing.T) {
	parallel(t)
	s := startSidecar(t, ordersFor("limit: 100, window: 1m"))
	removed := func(r *authv3.CheckResponse) []string { return r.GetOkResponse().GetHeadersToRemove() }
	for _, req := range []envoyRequest{
		{},
		{headers: [][2]string{{"x-client-id", "ada"}}},
		{headers: [][2]string{{"authorization", "Basic YWRhOmFkYQ=="}}},
	} {
		r := s.check(req.build())
		if httpStatus(r) != 200 || !slices.Contains(removed(r), "x-client-id") {
			t.Fatalf("anonymous request %v: %d, headers_to_remove %v; want x-client-id removed", req.headers, httpStatus(r), removed(r))
		}
	}
	r := s.check(envoyRequest{headers: [][2]string{{"x-api-key", "key-ada"}, {"x-client-id", "bob"}}}.build())
	set := r.GetOkResponse().GetHeaders()
	if httpStatus(r) != 200 || len(set) != 1 || set[0].GetHeader().GetKey() != "x-client-id" || set[0].GetHeader().GetValue() != "ada" ||
		set[0].GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD || slices.Contains(removed(r), "x-client-id") {
		t.Fatalf("ada's request: %d, headers %v, removed %v; want x-client-id: ada, overwriting", httpStatus(r), set, removed(r))
	}
}

// A policy named peers, with no key parts, has the Redis key rl:{peers}.
// Were the replicas' heartbeat set under that key, its script and the
// heartbeat would meet each other's type (WRONGTYPE) and decisions would
// fall back. The heartbeat lives outside the policies' key space
// (rl:_peers): both work, and Redis serves every decision.
func TestPolicyNamedPeersBreaksNothing(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	rdb := srv.Client()
	replicas := startReplicas(t, 2, defaultsConfig(srv.Addr, "redis", `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: peers, match: {path_prefix: /peers}, limit: 20, window: 1h}
  - {name: others, match: {path_prefix: /others}, key: [client], limit: 20, window: 1h, mode: hybrid}
`))
	waitPeers(t, replicas, 2)
	for _, path := range []string{"/peers", "/others"} {
		counts := tally(t, drive(t, replicas, 30, 6, func(int) *authv3.CheckRequest {
			return envoyRequest{path: path, headers: [][2]string{{"x-api-key", "key-ada"}}}.build()
		}))
		if counts[200] != 20 || counts[429] != 10 {
			t.Fatalf("%s: statuses %v, want 20 × 200 and 10 × 429", path, counts)
		}
	}
	assertNotDegraded(t, replicas)
	for _, r := range replicas {
		if n := r.metric("extauthz_redis_calls_total", "result", "error"); n != 0 {
			t.Fatalf("replica %s: %v Redis calls answered with an error", r.GRPC, n)
		}
		if n := r.metric("extauthz_peers"); n != 2 {
			t.Fatalf("replica %s observes %v peers, want 2", r.GRPC, n)
		}
	}
	ctx := context.Background()
	if typ := rdb.Type(ctx, "rl:{peers}").Val(); typ != "hash" {
		t.Fatalf("the policy's key rl:{peers} is a %q, want its token bucket (hash)", typ)
	}
	if typ := rdb.Type(ctx, redisstore.PeersKey("rl:")).Val(); typ != "zset" {
		t.Fatalf("the heartbeat key %s is a %q, want a sorted set", redisstore.PeersKey("rl:"), typ)
	}
}

// The ip key keeps an IPv6 caller's /64 by default: the addresses of one
// /64 (what one host or subscriber is given) share a bucket, while IPv4
// callers keep one each. ipv4_prefix and ipv6_prefix change the lengths,
// for the peer address and for x-forwarded-for alike.
func TestIPv6CallersOfOneNetworkShareABucket(t *testing.T) {
	parallel(t)
	s := startSidecar(t, `
policies:
  - {name: per-ip, key: [ip], limit: 1, window: 1h}
`)
	from := func(ip string) int { return httpStatus(s.check(envoyRequest{sourceIP: ip}.build())) }
	if got := from("2001:db8:1:2::1"); got != 200 {
		t.Fatalf("first IPv6 caller: %d", got)
	}
	for _, ip := range []string{"2001:db8:1:2::2", "2001:db8:1:2::3", "2001:db8:1:2:dead:beef:0:1", "2001:DB8:1:2:ffff:ffff:ffff:ffff"} {
		if got := from(ip); got != 429 {
			t.Fatalf("%s, in the /64 that spent the limit: %d, want 429", ip, got)
		}
	}
	for _, ip := range []string{"2001:db8:1:3::1", "10.0.0.1", "10.0.0.2"} {
		if got := from(ip); got != 200 {
			t.Fatalf("%s, a caller of its own: %d, want 200", ip, got)
		}
	}

	// Shorter prefixes, read from x-forwarded-for behind one trusted
	// proxy: the settings under test.
	s = startSidecar(t, `
ip_trusted_hops: 1
ipv4_prefix: 24
ipv6_prefix: 48
policies:
  - {name: per-ip, key: [ip], limit: 1, window: 1h}
`)
	via := func(ip string) int {
		return httpStatus(s.check(envoyRequest{headers: [][2]string{{"x-forwarded-for", ip}}}.build()))
	}
	for _, tc := range []struct {
		ip   string
		want int
	}{
		{"198.51.100.7", 200}, {"198.51.100.200", 429}, {"198.51.101.7", 200},
		{"2001:db8:1:2::1", 200}, {"2001:db8:1:ffff::1", 429}, {"2001:db8:2::1", 200},
	} {
		if got := via(tc.ip); got != tc.want {
			t.Fatalf("x-forwarded-for %s: %d, want %d", tc.ip, got, tc.want)
		}
	}
}

// A YAML alias bomb (a policy of 2,400 unknown fields aliased 2,400
// times, 39 KB) is refused after a bounded number of steps: validate exits
// 1 saying it stopped, where an unbounded decoder formats millions of
// errors (18 s on this machine).
func TestValidateRefusesAnAliasBomb(t *testing.T) {
	parallel(t)
	const n = 2400
	var b strings.Builder
	b.WriteString("policies:\n  - &p {")
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "k%d: v", i)
	}
	b.WriteString("}\n")
	b.WriteString(strings.Repeat("  - *p\n", n))
	path := filepath.Join(t.TempDir(), "bomb.yaml")
	must(t, os.WriteFile(path, []byte(b.String()), 0o600))
	out, err := exec.Command(binary, "validate", "-config", path).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("validate: %v, want exit 1", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > 51 || !strings.HasSuffix(lines[len(lines)-1], "and more errors; checking stopped after the first 50") {
		t.Fatalf("validate printed %d lines, ending:\n%s", len(lines), tail(string(out), 3))
	}
}

// SIGTERM is answered while a reload is stuck reading the file: reloads
// run off the signal loop. The configuration path is replaced by a FIFO
// that the test opens for writing and never writes, so a reload (SIGHUP)
// blocks reading it until the process ends; the file watch ignores what
// is not a regular file.
func TestSIGTERMDuringAStuckReloadDrainsPromptly(t *testing.T) {
	parallel(t)
	s := startSidecar(t, ordersFor("limit: 100, window: 1m"))
	fifo := filepath.Join(filepath.Dir(s.config), "next.yaml")
	must(t, syscall.Mkfifo(fifo, 0o600))
	must(t, os.Rename(fifo, s.config))
	must(t, s.cmd.Process.Signal(syscall.SIGHUP))
	// Opening a FIFO for writing without blocking succeeds only once a
	// reader has it open: the reload is reading. Polling is the only way
	// to see that from outside the process.
	var w *os.File
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := os.OpenFile(s.config, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			w = f
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reload opened the configuration within 10s: %v", err)
		}
		time.Sleep(5 * time.Millisecond) // polling for the reader
	}
	defer w.Close()
	if r := s.check(adaOrder(0)); httpStatus(r) != 200 {
		t.Fatalf("a Check during the stuck reload: %d", httpStatus(r))
	}
	must(t, s.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-s.done:
		s.done <- err
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(10 * time.Second): // the -grace default: draining never waits on a reload
		t.Fatalf("extauthz did not exit within 10s of SIGTERM while a reload was stuck:\n%s", tail(s.logs.String(), 10))
	}
	logs := s.logs.String()
	if r, d := strings.Index(logs, `"msg":"reloading configuration"`), strings.Index(logs, `"msg":"shutting down"`); r < 0 || d < r || !strings.Contains(logs, `"msg":"stopped"`) {
		t.Fatalf("want the reload begun, then shutting down and stopped:\n%s", tail(logs, 10))
	}
}

// An eviction scan: with a path-keyed policy beside a per-client one, 70
// anonymous requests to distinct paths would push ada's entry out of a
// plain 64-key LRU, and ada, limited to 2 an hour, would get 2 more. Keys
// seen once wait in a quarter of the table, so the scan churns only that
// quarter: ada, seen twice, stays. bob, seen once, is pushed out; when he
// comes back the table remembers the eviction and his bucket starts empty
// from it, so he gets no more than the one unit he had left (he gets none:
// the documented price of eviction).
//
// local.max_keys is 64, not the default 100,000, so that a scan of 70
// requests overflows the table.
func TestScanOfOneOffKeysEvictsNoBudget(t *testing.T) {
	parallel(t)
	s := startSidecar(t, `
local: {max_keys: 64}
clients:
  keys: [{id: ada, key: key-ada}, {id: bob, key: key-bob}]
policies:
  - {name: per-client, match: {path_prefix: /orders}, key: [client], limit: 2, window: 1h}
  - {name: per-path, key: [path], limit: 100, window: 1m}
`)
	order := func(key string) int {
		return httpStatus(s.check(envoyRequest{path: "/orders", headers: [][2]string{{"x-api-key", key}}}.build()))
	}
	for i, key := range []string{"key-ada", "key-ada", "key-bob"} {
		if got := order(key); got != 200 {
			t.Fatalf("order %d (%s): %d", i+1, key, got)
		}
	}
	for i := 0; i < 70; i++ {
		if got := httpStatus(s.check(envoyRequest{path: fmt.Sprintf("/scan/%d", i)}.build())); got != 200 {
			t.Fatalf("scan request %d: %d", i, got)
		}
	}
	if n := s.metric("extauthz_cache_evictions_total"); n < 70+3-64 {
		t.Fatalf("%v evictions: the scan did not overflow the table", n)
	}
	if got := order("key-ada"); got != 429 {
		t.Fatalf("ada's third order after the scan: %d, want 429 (limit 2 an hour)", got)
	}
	bob := 0
	for i := 0; i < 3; i++ {
		if order("key-bob") == 200 {
			bob++
		}
	}
	// Not evicted, bob would have his 1 unit left; evicted and
	// forgotten, a fresh 2. Evicted and remembered, his bucket starts
	// empty from the eviction and refills 2 an hour: none in the
	// seconds since. So 0 is both the proof that the scan evicted him
	// and the claim (docs/modes.md, "An evicted key that comes back while its
	// eviction is remembered starts empty from that instant").
	if bob != 0 {
		t.Fatalf("bob, seen once before a scan of 70 one-off keys through a 64-key table, was admitted %d more times; want 0: evicted, and back to a bucket empty from the eviction (1 means he was never evicted, 2 that the eviction was forgotten)", bob)
	}
}

// The first enforcing denial ends the decision: requests that per-client
// denies create no entries in per-path, the policy after it, however many
// distinct paths they name.
func TestDeniedRequestCreatesNoStateAfterTheDenial(t *testing.T) {
	parallel(t)
	s := startSidecar(t, `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: per-client, key: [client], limit: 2, window: 1h}
  - {name: per-path, key: [path], limit: 100, window: 1m}
`)
	for i := 0; i < 32; i++ {
		want := 200
		if i >= 2 {
			want = 429
		}
		r := s.check(envoyRequest{path: fmt.Sprintf("/p/%d", i), headers: [][2]string{{"x-api-key", "key-ada"}}}.build())
		if got := httpStatus(r); got != want {
			t.Fatalf("request %d: %d, want %d", i+1, got, want)
		}
	}
	if n := s.metric("extauthz_cache_entries"); n != 3 {
		t.Fatalf("%v cache entries, want 3 (ada's, and the two paths she was admitted to)", n)
	}
	if n := s.metric("extauthz_decisions_total", "policy", "per-path"); n != 2 {
		t.Fatalf("per-path made %v decisions, want 2: it was asked after per-client denied", n)
	}
}

// Guessing keys costs: with clients.auth_failures at 10 a minute, 30
// unknown keys from one address get 10 × 401 and then 429s, and from then
// on that address is refused whatever key it presents, the right one too
// (else a 200 among 429s would mark a right guess). Other addresses, and
// requests without a key, are not affected; a known key spends nothing.
func TestAuthFailuresAreLimitedPerAddress(t *testing.T) {
	parallel(t)
	s := startSidecar(t, `
clients:
  keys: [{id: ada, key: key-ada}]
  auth_failures: {limit: 10, window: 1m}
policies:
  - {name: per-client, key: [client], limit: 1000, window: 1m}
`)
	from := func(ip, key string) *authv3.CheckResponse {
		req := envoyRequest{sourceIP: ip}
		if key != "" {
			req.headers = [][2]string{{"x-api-key", key}}
		}
		return s.check(req.build())
	}
	// A known key from the guesser's address spends nothing.
	for i := 0; i < 20; i++ {
		if got := httpStatus(from("203.0.113.9", "key-ada")); got != 200 {
			t.Fatalf("ada's request %d before any guess: %d", i+1, got)
		}
	}
	counts := map[int]int{}
	guessing := time.Now()
	for i := 0; i < 30; i++ {
		counts[httpStatus(from("203.0.113.9", fmt.Sprintf("guess-%d", i)))]++
	}
	if counts[401] != 10 || counts[429] != 20 {
		t.Fatalf("30 unknown keys from one address: %v, want 10 × 401 and 20 × 429", counts)
	}
	r := from("203.0.113.9", "key-ada")
	// The bucket (10 a minute: a token every 6s) was emptied by the ten
	// failures and refills from the first: the wait for the next token is
	// 6s less the time since the first failure, rounded up to whole
	// seconds, so Retry-After is 6 when the guesses took under a second
	// and 6 − ⌊elapsed⌋ at the least on a slower run.
	elapsed := int(time.Since(guessing) / time.Second)
	retry, _ := strconv.Atoi(deniedHeaders(r)["retry-after"])
	if p := problemBody(t, r); httpStatus(r) != 429 || fmt.Sprint(p["violated-policies"]) != "[_auth_failures]" ||
		deniedHeaders(r)["ratelimit-policy"] != `"_auth_failures";q=10;w=60` || retry > 6 || retry < max(6-elapsed, 1) {
		t.Fatalf("the right key from the guessing address: %d %v %v; want Retry-After in [%d, 6]", httpStatus(r), p, deniedHeaders(r), max(6-elapsed, 1))
	}
	for _, tc := range []struct{ ip, key string }{{"203.0.113.10", "key-ada"}, {"203.0.113.10", "guess-x"}, {"203.0.113.9", ""}} {
		want := 200
		if tc.key == "guess-x" {
			want = 401
		}
		if got := httpStatus(from(tc.ip, tc.key)); got != want {
			t.Fatalf("from %s with key %q: %d, want %d", tc.ip, tc.key, got, want)
		}
	}
	mfs := s.metrics()
	if n := sumMetric(mfs, "extauthz_decisions_total", "policy", "_auth_failures", "result", "allowed"); n != 11 {
		t.Fatalf("auth failures counted: %v, want 11 (10 + 1 from the other address)", n)
	}
	if n := sumMetric(mfs, "extauthz_decisions_total", "policy", "_auth_failures", "result", "denied"); n != 21 {
		t.Fatalf("auth failure refusals: %v, want 21", n)
	}
	if n := sumMetric(mfs, "extauthz_checks_total", "outcome", "over_limit"); n != 21 {
		t.Fatalf("over_limit checks: %v, want 21", n)
	}
}

// A sliding_log policy's memory in this process is bounded in bytes:
// limit × local.max_keys × 8 B at worst, which validate states, and a
// policy over local.max_log_bytes (256 MiB by default) is refused with
// the arithmetic and the ways out.
func TestSlidingLogMemoryIsBoundedInBytes(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	validate := func(cfg string) (string, int) {
		path := filepath.Join(dir, "sl.yaml")
		must(t, os.WriteFile(path, []byte(cfg), 0o600))
		out, err := exec.Command(binary, "validate", "-config", path).CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	out, code := validate("policies:\n  - {name: logins, key: [ip], limit: 100, window: 1h, algorithm: sliding_log}\n")
	if want := "sliding_log logins: up to 76.3 MiB of logs in this process (100 entries × local.max_keys 100000 × 8 B; local.max_log_bytes 256 MiB)"; code != 0 || !strings.Contains(out, want) {
		t.Fatalf("validate, limit 100: exit %d\n%s\nwant the line %q", code, out, want)
	}
	out, code = validate("policies:\n  - {name: logins, key: [ip], limit: 1000, window: 1h, algorithm: sliding_log}\n")
	if want := "policies[0].limit: 1000 needs up to 762.9 MiB of sliding logs in this process"; code != 1 || !strings.Contains(out, want) {
		t.Fatalf("validate, limit 1000: exit %d\n%s\nwant exit 1 and %q", code, out, want)
	}
	// The same policy with a table of 10,000 keys fits: 76.3 MiB.
	if out, code = validate("local: {max_keys: 10000}\npolicies:\n  - {name: logins, key: [ip], limit: 1000, window: 1h, algorithm: sliding_log}\n"); code != 0 {
		t.Fatalf("validate, limit 1000 over 10,000 keys: exit %d\n%s", code, out)
	}
}

// `extauthz serve` with neither -config nor $EXTAUTHZ_CONFIG (what `go run
// ./cmd/extauthz` does) serves the embedded demo, and says at start-up,
// in its banner and in a warning log record, that it accepts a published
// key. (The container image sets $EXTAUTHZ_CONFIG, so it never does:
// tests/deploy TestImageRequiresAMountedConfig.) The demo listens on
// 127.0.0.1:9001; when that port is taken it exits after saying so, which
// is all this test reads.
func TestDemoConfigurationSaysSo(t *testing.T) {
	parallel(t)
	cmd := exec.Command(binary, "serve", "-log-format", "json")
	cmd.Env = append(os.Environ(), "EXTAUTHZ_CONFIG=")
	stderr, err := cmd.StderrPipe()
	must(t, err)
	must(t, cmd.Start())
	defer cmd.Wait()
	defer cmd.Process.Signal(syscall.SIGTERM)
	var seen strings.Builder
	banner, warned := false, false
	sc := bufio.NewScanner(stderr)
	// Until both are seen, or the process says it is serving (everything
	// at start-up comes before that), or it exits.
	for !(banner && warned) && sc.Scan() {
		line := sc.Text()
		seen.WriteString(line + "\n")
		if strings.Contains(line, `"msg":"serving"`) {
			break
		}
		banner = banner || strings.Contains(line, "no -config and no $EXTAUTHZ_CONFIG: serving the embedded demo configuration")
		warned = warned || (strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, "accepts the published demo key key-demo-123"))
	}
	if !banner || !warned {
		t.Fatalf("start-up output does not say the demo configuration is served (banner %v, warning %v):\n%s", banner, warned, seen.String())
	}
}
