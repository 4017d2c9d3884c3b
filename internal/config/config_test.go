package config

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Each file under testdata/bad holds one mistake and, on its first line,
// the exact message it must produce: "# want: <path>: <reason>".
func TestBadFiles(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			want := wantLine(t, f)
			_, err := Load(f)
			if err == nil {
				t.Fatalf("Load succeeded; want error %q", want)
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if line == f+": "+want {
					return
				}
			}
			t.Fatalf("error:\n%v\nwant a line:\n%s: %s", err, f, want)
		})
	}
}

func wantLine(t *testing.T, path string) string {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Scan()
	want, ok := strings.CutPrefix(sc.Text(), "# want: ")
	if !ok {
		t.Fatalf("%s: first line must be '# want: ...'", path)
	}
	return want
}

func TestFullExample(t *testing.T) {
	t.Setenv("REDIS_PASSWORD", "not-read-by-validation")
	c, err := Load("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Redis == nil || c.Redis.Timeout != 20*time.Millisecond || c.Redis.KeyPrefix != "rl:" || len(c.Redis.Addrs) != 1 {
		t.Fatalf("redis = %+v", c.Redis)
	}
	if c.DefaultMode != ModeHybrid || c.Local.MaxKeys != 100000 || c.Local.SliceIdle != time.Second || c.Local.LeaseTTL != 60*time.Second {
		t.Fatalf("mode/local = %v %+v", c.DefaultMode, c.Local)
	}
	if c.Listen.HTTP != "127.0.0.1:9002" || c.HTTP != (HTTP{URIHeader: "x-original-url", MethodHeader: "x-original-method"}) {
		t.Fatalf("listen.http, http = %q, %+v", c.Listen.HTTP, c.HTTP)
	}
	if c.Fallback.PeerTTL != 15*time.Second || c.Fallback.MinPeers != 1 {
		t.Fatalf("fallback = %+v", c.Fallback)
	}
	if len(c.Clients.Keys) != 2 || !c.Clients.Keys[1].Plaintext || c.Clients.Keys[0].Plan != "enterprise" {
		t.Fatalf("clients = %+v", c.Clients)
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "plaintext key for client \"demo\"") {
		t.Fatalf("warnings = %q", c.Warnings)
	}
	p := c.Policies[0]
	if p.Name != "orders" || p.Limit != 100 || p.Window != time.Minute || p.Burst != 100 ||
		p.Algorithm != TokenBucket || p.Mode != ModeHybrid || p.OnRedisError != OnErrorFallback ||
		p.OnMissingKey != MissingAnonymous || p.Shadow {
		t.Fatalf("policy = %+v", p)
	}
	if p.Match.PathPrefix != "/orders" || p.Match.Methods[0] != "POST" || p.Match.Hosts[0] != "api.example.com" || p.Match.Context["route"] != "orders" {
		t.Fatalf("match = %+v", p.Match)
	}
	if len(p.Key) != 1 || p.Key[0].Kind != KeyClient {
		t.Fatalf("key = %+v", p.Key)
	}
	pp := c.Policies[1]
	if !pp.UsePlan || len(pp.Key) != 2 || pp.Key[1] != (KeyPart{Kind: KeyHeader, Name: "x-tenant"}) {
		t.Fatalf("plan policy = %+v", pp)
	}
	if plan := c.Plans["enterprise"]; plan.Limit != 1000 {
		t.Fatalf("plans.enterprise = %+v", plan)
	}
	if plan := c.Plans[DefaultPlan]; plan.Limit != 10 {
		t.Fatalf("plans.default = %+v", plan)
	}
}

func TestDefaultsAndEmbedded(t *testing.T) {
	c, err := Parse([]byte("{}"), "empty")
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen.GRPC != DefaultGRPC || c.Listen.Admin != DefaultAdmin || c.DefaultMode != ModeLocal ||
		c.Clients.Header != "x-api-key" || !c.Clients.Strip || !c.Clients.Bearer || c.Redis != nil ||
		c.Listen.HTTP != "" || c.HTTP.URIHeader != "x-original-uri" || c.HTTP.MethodHeader != "x-original-method" {
		t.Fatalf("defaults = %+v", c)
	}
	d := Default()
	if d.Source != EmbeddedSource || d.Redis != nil || len(d.Policies) == 0 || len(d.Warnings) != 0 {
		t.Fatalf("embedded default = %+v", d)
	}
	for _, p := range d.Policies {
		if p.Mode != ModeLocal {
			t.Fatalf("embedded policy %s is %s, want local", p.Name, p.Mode)
		}
	}
}

func TestKeyShorthand(t *testing.T) {
	c, err := Parse([]byte("policies:\n  - {name: a, limit: 1, window: 1s, key: ip}\n"), "x")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Policies[0].Key) != 1 || c.Policies[0].Key[0].Kind != KeyIP {
		t.Fatalf("key: ip should be a list of one, got %+v", c.Policies[0].Key)
	}
}

func TestAllErrorsReported(t *testing.T) {
	_, err := Parse([]byte("policies:\n  - {name: a, limit: x, window: 1s}\n  - {name: b, limit: 1, window: y}\n"), "two.yaml")
	if err == nil {
		t.Fatal("want errors")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "two.yaml: policies[0].limit:") || !strings.HasPrefix(lines[1], "two.yaml: policies[1].window:") {
		t.Fatalf("got %q", lines)
	}
}

func TestRedisTLSShapes(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want *ClientTLS
	}{
		{"tls: false", nil},
		{"tls: true", &ClientTLS{}},
		{"tls: {server_name: redis.internal, ca_file: /dev/null}", &ClientTLS{ServerName: "redis.internal", CAFile: "/dev/null"}},
	} {
		c, err := Parse([]byte("redis:\n  addrs: [127.0.0.1:6379]\n  "+tc.yaml+"\n"), "t")
		if err != nil {
			t.Fatalf("%s: %v", tc.yaml, err)
		}
		got := c.Redis.TLS
		if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
			t.Fatalf("%s: TLS = %+v, want %+v", tc.yaml, got, tc.want)
		}
	}
}

// Aliases that multiply (a list of aliases to a policy whose list is
// itself aliased) are refused after a bounded amount of work, with a clear
// message, instead of expanding to millions of values.
func TestAliasExpansionIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("x: &m [")
	for i := 0; i < 2000; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("GET")
	}
	b.WriteString("]\np: &p {name: a, limit: 1, window: 1s, match: {methods: *m}}\npolicies: [")
	for i := 0; i < 2000; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("*p")
	}
	b.WriteString("]\n")
	_, err := Parse([]byte(b.String()), "laughs.yaml")
	if err == nil || !strings.Contains(err.Error(), "expands to more than") {
		t.Fatalf("err = %.300v", err)
	}
	if n := strings.Count(err.Error(), "\n"); n > maxErrors+1 {
		t.Fatalf("%d error lines; at most %d are kept", n, maxErrors+1)
	}
}

// rls.domains are read relative to the configuration file; answers carry
// the RateLimit headers unless told otherwise.
func TestRLSSection(t *testing.T) {
	c, err := Parse([]byte("rls: {domains: [ratelimit, /etc/rl/a.yaml]}\n"), "conf/extauthz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join("conf", "ratelimit"), "/etc/rl/a.yaml"}; strings.Join(c.RLS.Domains, " ") != strings.Join(want, " ") || !c.RLS.ResponseHeaders {
		t.Fatalf("rls = %+v", c.RLS)
	}
	c, err = Parse([]byte("rls: {response_headers: false}\n"), "x.yaml")
	if err != nil || c.RLS.ResponseHeaders || len(c.RLS.Domains) != 0 || c.RLS.OnUndecodable != UndecodableDeny {
		t.Fatalf("rls = %+v, %v; want a request that does not decode denied by default", c.RLS, err)
	}
	c, err = Parse([]byte("rls: {on_undecodable: allow}\n"), "x.yaml")
	if err != nil || c.RLS.OnUndecodable != UndecodableAllow || c.RLS.Counting != CountingAllOrNothing {
		t.Fatalf("rls = %+v, %v; want all or nothing by default", c.RLS, err)
	}
	for _, v := range []string{CountingEach, CountingEachStopWhenOver, CountingAllOrNothing} {
		c, err = Parse([]byte("rls: {counting: "+v+"}\n"), "x.yaml")
		if err != nil {
			t.Fatalf("counting %s: %v", v, err)
		}
		if c.RLS.Counting != v {
			t.Fatalf("counting %s: rls = %+v", v, c.RLS)
		}
	}
	_, err = Parse([]byte("rls: {counting: anchor}\n"), "x.yaml")
	if err == nil || !strings.Contains(err.Error(), "rls.counting") || !strings.Contains(err.Error(), `"anchor" is not a way of counting`) {
		t.Fatalf("counting: anchor: %v; want an error naming rls.counting", err)
	}
}

// Two shapes of alias bomb: a policy of a thousand unknown
// fields, and one of a thousand context entries, each aliased a thousand
// times (about 20 KB). Every refused field and every map entry counts
// toward the bound, and decoding stops once maxErrors are kept, so each
// file costs a bounded number of steps: at most maxValues nodes and
// maxErrors refusals, where the unknown fields once cost a million
// refusals, each formatting the list of known fields.
func TestAliasBombsStopEarly(t *testing.T) {
	const n = 1000
	fields := make([]string, n)
	for i := range fields {
		fields[i] = fmt.Sprintf("k%d: v", i)
	}
	aliases := strings.Repeat("  - *p\n", n)
	for name, doc := range map[string]string{
		"unknown fields":   "policies:\n  - &p {" + strings.Join(fields, ", ") + "}\n" + aliases,
		"context entries":  "policies:\n  - &p {name: p, limit: 1, window: 1m, match: {context: {" + strings.Join(fields, ", ") + "}}}\n" + aliases,
		"aliases of lists": "x: &x [" + strings.Repeat("GET, ", n) + "GET]\npolicies:\n  - &p {name: p, limit: 1, window: 1m, match: {methods: *x}}\n" + aliases,
	} {
		_, err := Parse([]byte(doc), "bomb.yaml")
		var es *Errors
		if !errors.As(err, &es) {
			t.Fatalf("%s: err = %.200v", name, err)
		}
		if refusals := len(es.List) + es.dropped; es.visited > maxValues+1 || refusals > maxErrors+1 {
			t.Fatalf("%s: %d nodes decoded and %d errors formatted; the bounds are %d and %d\n%.300v",
				name, es.visited, refusals, maxValues, maxErrors, err)
		}
		if !strings.Contains(err.Error(), "expands to more than") && !strings.Contains(err.Error(), "checking stopped after the first 50") {
			t.Fatalf("%s: the error does not say decoding stopped:\n%.300v", name, err)
		}
	}
}

func TestBytes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "4096": 4096, "4096B": 4096, "256MiB": 256 << 20, "1 GiB": 1 << 30, "3KiB": 3072} {
		if got, ok := parseBytes(in); !ok || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "-1", "1.5MiB", "1 MB", "9223372036854775807GiB", "MiB"} {
		if got, ok := parseBytes(in); ok {
			t.Errorf("parseBytes(%q) = %d; want an error", in, got)
		}
	}
	for in, want := range map[int64]string{0: "0 B", 800: "800 B", 256 << 20: "256 MiB", 80_000_000: "76.3 MiB", 3 << 30: "3 GiB"} {
		if got := FormatBytes(in); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", in, got, want)
		}
	}
	if got := SlidingLogBytes(MaxSlidingLogLimit, math.MaxInt); got != math.MaxInt64 {
		t.Errorf("SlidingLogBytes does not saturate: %d", got)
	}
}

func TestCostShapes(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want Cost
	}{
		{"", Cost{Units: 1}},
		{"cost: 0", Cost{Units: 0}},
		{"cost: 10", Cost{Units: 10}},
		{"cost: {header: X-Cost}", Cost{Units: 1, RequestValue: RequestValue{From: CostHeader, Name: "x-cost"}}},
		{"cost: {claim: units, default: 3}", Cost{Units: 3, RequestValue: RequestValue{From: CostClaim, Name: "units"}}},
		{"cost: {metadata: {namespace: envoy.filters.http.lua, key: cost}}", Cost{Units: 1, RequestValue: RequestValue{From: CostMetadata, Name: "cost", Namespace: "envoy.filters.http.lua"}}},
	} {
		c, err := Parse([]byte("policies:\n  - {name: a, limit: 10, window: 1s}\n"), "t")
		if tc.yaml != "" {
			c, err = Parse([]byte("policies:\n  - name: a\n    limit: 10\n    window: 1s\n    "+tc.yaml+"\n"), "t")
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.yaml, err)
		}
		if got := c.Policies[0].Cost; got != tc.want {
			t.Fatalf("%s: cost = %+v, want %+v", tc.yaml, got, tc.want)
		}
	}
}

func TestCalendarWindows(t *testing.T) {
	c, err := Parse([]byte(`
plans:
  free: {limit: 1000, window: 1mo}
  default: {limit: 100, window: 1d}
policies:
  - {name: monthly, limit: 5000, window: 1mo, calendar: true, time_zone: Europe/Paris}
  - {name: daily, limit: plan, calendar: true}
  - {name: rolling, limit: 10, window: 1d}
`), "t")
	if err != nil {
		t.Fatal(err)
	}
	m, d, r := c.Policies[0], c.Policies[1], c.Policies[2]
	if !m.Calendar || m.Period != PeriodMonth || m.Window != 30*24*time.Hour || m.Algorithm != FixedWindow || m.TimeZone.String() != "Europe/Paris" {
		t.Fatalf("monthly = %+v", m)
	}
	if !d.Calendar || d.TimeZone != time.UTC || d.Algorithm != FixedWindow || c.Plans["free"].Period != PeriodMonth || c.Plans["default"].Period != PeriodDay {
		t.Fatalf("daily = %+v, plans %+v", d, c.Plans)
	}
	if r.Calendar || r.Period != "" || r.Window != 24*time.Hour || r.Algorithm != TokenBucket {
		t.Fatalf("rolling = %+v", r)
	}
}

func TestLimitFromRequestShapes(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want LimitSource
		str  string
	}{
		{"{claim: rpm, default: 100, max: 1000}", LimitSource{RequestValue{CostClaim, "rpm", ""}, 100, 1000}, "claim:rpm (default 100, max 1000)"},
		{"{header: X-Tenant-Limit, default: 5, max: 5}", LimitSource{RequestValue{CostHeader, "x-tenant-limit", ""}, 5, 5}, "header:x-tenant-limit (default 5, max 5)"},
		{"{metadata: {namespace: envoy.filters.http.lua, key: rpm}, default: 1, max: 9}", LimitSource{RequestValue{CostMetadata, "rpm", "envoy.filters.http.lua"}, 1, 9}, "metadata:envoy.filters.http.lua/rpm (default 1, max 9)"},
	} {
		c, err := Parse([]byte("policies:\n  - name: a\n    key: [\"claim:sub\"]\n    window: 1m\n    limit: "+tc.yaml+"\n"), "t")
		if err != nil {
			t.Fatalf("%s: %v", tc.yaml, err)
		}
		p := c.Policies[0]
		if p.LimitFrom != tc.want || p.Limit != tc.want.Default || p.Window != time.Minute || p.UsePlan || p.Algorithm != TokenBucket {
			t.Fatalf("%s: policy = %+v, want limit from %+v", tc.yaml, p, tc.want)
		}
		if got := p.LimitFrom.String(); got != tc.str {
			t.Fatalf("%s: String() = %q, want %q", tc.yaml, got, tc.str)
		}
	}
	// Every algorithm, calendar windows and a fixed burst take a limit
	// read per request; a number keeps no source.
	c, err := Parse([]byte(`
policies:
  - {name: log, limit: {claim: n, default: 10, max: 300}, window: 1m, algorithm: sliding_log}
  - {name: shaped, limit: {claim: n, default: 10, max: 1000}, window: 1s, algorithm: leaky_bucket}
  - {name: monthly, limit: {claim: n, default: 10, max: 1000}, window: 1mo, calendar: true}
  - {name: burst, limit: {claim: n, default: 10, max: 1000}, window: 1m, burst: 50, cost: {header: x-cost}}
  - {name: fixed, limit: 10, window: 1m}
`), "t")
	if err != nil {
		t.Fatal(err)
	}
	if m := c.Policies[2]; !m.Calendar || m.Period != PeriodMonth || m.LimitFrom.Max != 1000 {
		t.Fatalf("monthly = %+v", m)
	}
	if b := c.Policies[3]; b.Burst != 50 || b.LimitFrom.Default != 10 {
		t.Fatalf("burst = %+v", b)
	}
	if f := c.Policies[4]; f.LimitFrom != (LimitSource{}) {
		t.Fatalf("a number has a source: %+v", f.LimitFrom)
	}
}

// Reflection is on unless the file turns it off; an explicit false stays.
func TestReflectionOnUnlessTurnedOff(t *testing.T) {
	for doc, want := range map[string]bool{"{}": true, "listen: {reflection: true}": true, "listen: {reflection: false}": false} {
		c, err := Parse([]byte(doc), "x")
		if err != nil {
			t.Fatal(err)
		}
		if c.Listen.Reflection != want {
			t.Errorf("%s: reflection %v, want %v", doc, c.Listen.Reflection, want)
		}
	}
}

// WAIT after lease calls is off unless wait_replicas is set; its timeout
// then defaults to DefaultWaitTimeout.
func TestRedisWait(t *testing.T) {
	off, err := Parse([]byte("redis: {addrs: [127.0.0.1:6379]}\n"), "off.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if off.Redis.WaitReplicas != 0 || off.Redis.WaitTimeout != 0 {
		t.Fatalf("defaults: wait_replicas %d, wait_timeout %v; want no WAIT", off.Redis.WaitReplicas, off.Redis.WaitTimeout)
	}
	on, err := Parse([]byte("redis: {addrs: [127.0.0.1:6379], wait_replicas: 1}\n"), "on.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if on.Redis.WaitReplicas != 1 || on.Redis.WaitTimeout != DefaultWaitTimeout {
		t.Fatalf("wait_replicas 1: got %d, %v; want 1, %v", on.Redis.WaitReplicas, on.Redis.WaitTimeout, DefaultWaitTimeout)
	}
	set, err := Parse([]byte("redis: {addrs: [127.0.0.1:6379], wait_replicas: 2, wait_timeout: 25ms}\n"), "set.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if set.Redis.WaitReplicas != 2 || set.Redis.WaitTimeout != 25*time.Millisecond {
		t.Fatalf("got %d, %v; want 2, 25ms", set.Redis.WaitReplicas, set.Redis.WaitTimeout)
	}
}

func TestRedisSentinel(t *testing.T) {
	c, err := Parse([]byte(`
redis:
  sentinel:
    master_name: rl
    addrs: [10.0.0.1:26379, 10.0.0.2:26379]
    username: watcher
    password_env: SENTINEL_PASSWORD
  password_env: REDIS_PASSWORD
  tls: true
default_mode: redis
`), "sentinel.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := Sentinel{MasterName: "rl", Addrs: []string{"10.0.0.1:26379", "10.0.0.2:26379"}, Username: "watcher", PasswordEnv: "SENTINEL_PASSWORD"}
	if c.Redis.Sentinel == nil || !reflect.DeepEqual(*c.Redis.Sentinel, want) {
		t.Fatalf("sentinel = %+v, want %+v", c.Redis.Sentinel, want)
	}
	if len(c.Redis.Addrs) != 0 || c.Redis.PasswordEnv != "REDIS_PASSWORD" || c.Redis.TLS == nil {
		t.Fatalf("redis = %+v", c.Redis)
	}
}

// The sections decoded straight into Config's own types (headers, http,
// listen.tls, redis.sentinel, rls.limit_headers) take exactly their YAML
// keys: each key lands in its field, an unknown key is refused with the
// known ones listed, and listen.tls has no key for ClientSAN (only
// envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN sets it).
func TestSectionsDecodedIntoConfigTypes(t *testing.T) {
	c, err := Parse([]byte(`
listen: {grpc: 127.0.0.1:1, tls: {cert_file: testdata/full.yaml, key_file: testdata/full.yaml, client_ca_file: testdata/full.yaml}}
headers: {legacy: true}
http: {uri_header: X-URI, method_header: X-Method}
redis: {sentinel: {master_name: m, addrs: [127.0.0.1:26379], username: u, password_env: P}}
rls: {limit_headers: {remaining: X-Left}}
`), "sections.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		got, want any
	}{
		{*c.Listen.TLS, ServerTLS{CertFile: "testdata/full.yaml", KeyFile: "testdata/full.yaml", ClientCAFile: "testdata/full.yaml"}},
		{c.Headers, Headers{Legacy: true}},
		{c.HTTP, HTTP{URIHeader: "x-uri", MethodHeader: "x-method"}},
		{c.Redis.Sentinel.MasterName + " " + strings.Join(c.Redis.Sentinel.Addrs, ",") + " " + c.Redis.Sentinel.Username + " " + c.Redis.Sentinel.PasswordEnv, "m 127.0.0.1:26379 u P"},
		{*c.RLS.LimitHeaders, LimitHeaders{Limit: "RateLimit-Limit", Remaining: "X-Left", Reset: "RateLimit-Reset"}},
	}
	for i, w := range want {
		if w.got != w.want {
			t.Errorf("section %d: %+v, want %+v", i, w.got, w.want)
		}
	}
	for _, tc := range []struct{ yaml, err string }{
		{"listen: {grpc: 127.0.0.1:1, tls: {cert_file: a, key_file: b, client_san: x}}", "listen.tls.client_san: unknown field; known fields: cert_file, client_ca_file, key_file"},
		{"headers: {modern: true}", "headers.modern: unknown field; known fields: legacy"},
		{"http: {uri: x}", "http.uri: unknown field; known fields: method_header, uri_header"},
		{"redis: {sentinel: {master_name: m, addrs: [127.0.0.1:26379], password: x}}", "redis.sentinel.password: unknown field; known fields: addrs, master_name, password_env, username"},
		{"rls: {limit_headers: {other: x}}", "rls.limit_headers.other: unknown field; known fields: limit, remaining, reset"},
	} {
		if _, err := Parse([]byte(tc.yaml), "s.yaml"); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.yaml, err, tc.err)
		}
	}
}
