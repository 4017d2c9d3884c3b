package httpauth

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/engine/enginetest"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fixture is the HTTP door on a frozen clock with a local cache, in
// process (httptest's recorder: no network).
type fixture struct {
	t       testing.TB
	running *engine.Running
	srv     *Server
	m       *engine.Metrics
	now     time.Time
	holds   []time.Duration // leaky-bucket holds, recorded instead of slept
	wire    string          // the last answer as sent
}

func newFixture(t testing.TB, yaml string) *fixture {
	t.Helper()
	cfg := parse(t, yaml)
	f := &fixture{t: t, now: t0}
	hold := func(_ context.Context, d time.Duration) error { f.holds = append(f.holds, d); return nil }
	f.running = enginetest.New(t, cfg, engine.WithHold(hold)).Running
	f.m = f.running.Metrics()
	f.srv = New(f.running, WithClock(func() time.Time { return f.now }))
	return f
}

func parse(t testing.TB, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// do sends one auth request: method and target as the proxy sends them,
// then header name/value pairs.
func (f *fixture) do(method, target string, headers ...string) *http.Response {
	f.t.Helper()
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = "127.0.0.1:40000"
	for i := 0; i+1 < len(headers); i += 2 {
		if strings.EqualFold(headers[i], "host") {
			r.Host = headers[i+1]
			continue
		}
		r.Header.Add(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	f.srv.ServeHTTP(w, r)
	// Through the wire format and back, as a proxy reads it.
	var wire bytes.Buffer
	if err := w.Result().Write(&wire); err != nil {
		f.t.Fatal(err)
	}
	f.wire = wire.String()
	resp, err := http.ReadResponse(bufio.NewReader(&wire), r)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp
}

// nginx sends what proxies/nginx/extauthz.conf's auth location sends.
func (f *fixture) nginx(method, uri string, headers ...string) *http.Response {
	f.t.Helper()
	return f.do("GET", NginxPath, append([]string{"X-Original-Method", method, "X-Original-URI", uri, "Host", "api.example.com"}, headers...)...)
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	var b strings.Builder
	buf := make([]byte, 512)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// wantHeaders fails unless every name has exactly the given value ("" for
// absent).
func wantHeaders(t *testing.T, resp *http.Response, kv ...string) {
	t.Helper()
	for i := 0; i+1 < len(kv); i += 2 {
		got := resp.Header.Values(kv[i])
		if kv[i+1] == "" && len(got) == 0 {
			continue
		}
		if len(got) != 1 || got[0] != kv[i+1] {
			t.Fatalf("%d: header %s = %q, want %q (all: %v)", resp.StatusCode, kv[i], got, kv[i+1], resp.Header)
		}
	}
}

const ordersYAML = `
clients:
  keys:
    - {id: ada, key: key-ada}
policies:
  - name: orders
    match: {path_prefix: /orders, methods: [POST]}
    key: [client]
    limit: 3
    window: 1m
`

const tooMany = `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"Retry after 15 s.","violated-policies":["orders"]}`

// nginx: the original method and URI come in the configured headers; the
// answer carries what nginx's auth_request_set copies, and a denial's body
// also in X-Extauthz-Problem, since auth_request drops the body.
func TestNginxAllowAndDeny(t *testing.T) {
	f := newFixture(t, ordersYAML)
	resp := f.nginx("POST", "/orders/1?x=1", "X-Api-Key", "key-ada")
	if resp.StatusCode != 200 {
		t.Fatalf("first request: %d %s", resp.StatusCode, body(t, resp))
	}
	wantHeaders(t, resp, "RateLimit-Policy", `"orders";q=3;w=60`, "RateLimit", `"orders";r=2;t=20`,
		"X-Client-Id", "ada", envoyRemove, "", ProblemHeader, "")
	f.nginx("POST", "/orders/1", "X-Api-Key", "key-ada")
	f.nginx("POST", "/orders/1", "X-Api-Key", "key-ada")
	f.now = t0.Add(5 * time.Second)
	resp = f.nginx("POST", "/orders/1", "X-Api-Key", "key-ada")
	if resp.StatusCode != 429 {
		t.Fatalf("fourth request: %d", resp.StatusCode)
	}
	// Next token at 20s; now is 5s: wait 15s.
	wantHeaders(t, resp, "Retry-After", "15", "RateLimit-Policy", `"orders";q=3;w=60`, "RateLimit", `"orders";r=0;t=15`,
		"Content-Type", "application/problem+json", ProblemHeader, tooMany, "X-Client-Id", "")
	if b := body(t, resp); b != tooMany {
		t.Fatalf("body = %s\nwant   %s", b, tooMany)
	}
	// The spelling on the wire is the specification's.
	for _, h := range []string{"\r\nRateLimit-Policy: ", "\r\nRateLimit: ", "\r\nRetry-After: "} {
		if !strings.Contains(f.wire, h) {
			t.Fatalf("no %q in the answer:\n%s", h, f.wire)
		}
	}

	// The method is the original one: a GET is not an order.
	if resp := f.nginx("GET", "/orders/1", "X-Api-Key", "key-ada"); resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
		t.Fatalf("GET /orders: %d %v", resp.StatusCode, resp.Header)
	}
	if got := testutil.ToFloat64(f.m.Checks.WithLabelValues(Door, "over_limit")); got != 1 {
		t.Fatalf(`checks_total{door="http",outcome="over_limit"} = %v`, got)
	}
	if got := testutil.ToFloat64(f.m.Checks.WithLabelValues(Door, "ok")); got != 4 {
		t.Fatalf(`checks_total{door="http",outcome="ok"} = %v`, got)
	}
}

// An unknown key is a 401 with WWW-Authenticate before any policy runs.
func TestUnknownKey(t *testing.T) {
	f := newFixture(t, ordersYAML)
	for _, cred := range [][]string{{"X-Api-Key", "key-eve"}, {"Authorization", "Bearer key-eve"}} {
		resp := f.nginx("POST", "/orders", cred...)
		wantHeaders(t, resp, "WWW-Authenticate", "ApiKey", "Content-Type", "application/problem+json", "X-Client-Id", "")
		var p engine.Problem
		if resp.StatusCode != 401 || json.Unmarshal([]byte(body(t, resp)), &p) != nil || p.Status != 401 || p.Detail != "Unknown API key." {
			t.Fatalf("%v: %d %+v", cred, resp.StatusCode, p)
		}
	}
	if got := testutil.ToFloat64(f.m.Decisions.WithLabelValues("orders", "local", "allowed")); got != 0 {
		t.Fatalf("a policy ran for an unknown key: %v decisions", got)
	}
}

// Envoy's http_service: the original path after path_prefix, the original
// method and Host; on a 200, Envoy removes the headers we name.
func TestEnvoyConvention(t *testing.T) {
	f := newFixture(t, ordersYAML)
	resp := f.do("POST", "/envoy/orders/1?x=1", "Host", "api.example.com", "X-Api-Key", "key-ada")
	wantHeaders(t, resp, "RateLimit", `"orders";r=2;t=20`, "X-Client-Id", "ada", envoyRemove, "x-api-key", ProblemHeader, "")
	resp = f.do("POST", "/envoy/orders/1", "Authorization", "Bearer key-ada")
	wantHeaders(t, resp, "RateLimit", `"orders";r=1;t=40`, envoyRemove, "authorization")
	// An anonymous caller's x-client-id is removed, so it cannot be forged.
	resp = f.do("GET", "/envoy/", "X-Client-Id", "ada")
	wantHeaders(t, resp, "X-Client-Id", "", envoyRemove, "x-client-id")
	if resp.StatusCode != 200 {
		t.Fatalf("anonymous GET: %d", resp.StatusCode)
	}
	f.do("POST", "/envoy/orders", "X-Api-Key", "key-ada")
	resp = f.do("POST", "/envoy/orders", "X-Api-Key", "key-ada")
	if resp.StatusCode != 429 || body(t, resp) == "" {
		t.Fatalf("fourth order: %d", resp.StatusCode)
	}
	wantHeaders(t, resp, envoyRemove, "", ProblemHeader, "", "Retry-After", "20")
}

// Traefik's forwardAuth and Caddy's forward_auth: X-Forwarded-Method, -Uri
// and -Host.
func TestForwardAuthConvention(t *testing.T) {
	f := newFixture(t, `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: orders, match: {path_prefix: /orders, methods: [POST], hosts: [api.example.com]}, key: [client], limit: 1, window: 1m}
`)
	fwd := func(host string) *http.Response {
		return f.do("GET", ForwardAuthPath, "X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/orders?page=2",
			"X-Forwarded-Host", host, "X-Forwarded-Proto", "https", "X-Api-Key", "key-ada", "Host", "127.0.0.1:9002")
	}
	wantHeaders(t, fwd("API.example.com:443"), "RateLimit", `"orders";r=0;t=60`, "X-Client-Id", "ada")
	if resp := fwd("api.example.com"); resp.StatusCode != 429 {
		t.Fatalf("second order: %d", resp.StatusCode)
	}
	// Another host is another site: no policy applies.
	if resp := fwd("other.example.com"); resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
		t.Fatalf("other host: %d %v", resp.StatusCode, resp.Header)
	}
}

// The path the proxy calls picks the convention, never a header: every
// proxy passes the client's headers on, so a client must not be able to
// describe its request in another convention's headers.
func TestConventionIsChosenByPath(t *testing.T) {
	f := newFixture(t, ordersYAML)
	spoof := []string{"X-Original-Method", "GET", "X-Original-URI", "/free", "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/free"}
	// Through Caddy: the forwarded headers are Caddy's; X-Original-* the client's.
	resp := f.do("GET", ForwardAuthPath, "X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/orders", "X-Forwarded-Host", "h",
		"X-Api-Key", "key-ada", "X-Original-Method", "GET", "X-Original-URI", "/free")
	wantHeaders(t, resp, "RateLimit", `"orders";r=2;t=20`)
	// Through nginx: X-Original-* are nginx's; the forwarded ones the client's.
	resp = f.nginx("POST", "/orders", "X-Api-Key", "key-ada", "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/free")
	wantHeaders(t, resp, "RateLimit", `"orders";r=1;t=40`)
	// Through Envoy: neither.
	resp = f.do("POST", "/envoy/orders", append([]string{"X-Api-Key", "key-ada"}, spoof...)...)
	wantHeaders(t, resp, "RateLimit", `"orders";r=0;t=60`)
}

// A proxy that does not send what its convention needs gets a 400 naming
// the header (nginx and the forward-auth proxies turn it into an error for
// the client), never a guess; an unknown path is a 404. Both count as
// errors.
func TestMisconfiguredProxy(t *testing.T) {
	f := newFixture(t, ordersYAML)
	cases := []struct {
		name    string
		resp    *http.Response
		status  int
		problem bool // the body is also in X-Extauthz-Problem (nginx)
		detail  string
	}{
		{"no uri", f.do("GET", NginxPath, "X-Original-Method", "POST"), 400, true, "Header x-original-uri is missing"},
		{"no method", f.do("GET", NginxPath, "X-Original-URI", "/orders"), 400, true, "Header x-original-method is missing"},
		{"uri twice", f.do("GET", NginxPath, "X-Original-Method", "POST", "X-Original-URI", "/free", "X-Original-URI", "/orders"), 400, true, "is repeated"},
		{"no forwarded host", f.do("GET", ForwardAuthPath, "X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/orders"), 400, false, "Header X-Forwarded-Host is missing"},
		{"unknown path", f.do("GET", "/auth", "X-Original-Method", "POST", "X-Original-URI", "/orders"), 404, false, "No such endpoint"},
		{"nginx path with a suffix", f.do("GET", "/nginx/x"), 404, false, "No such endpoint"},
	}
	for _, c := range cases {
		b := body(t, c.resp)
		var p engine.Problem
		if c.resp.StatusCode != c.status || json.Unmarshal([]byte(b), &p) != nil || !strings.Contains(p.Detail, c.detail) {
			t.Errorf("%s: %d %s; want %d with %q", c.name, c.resp.StatusCode, b, c.status, c.detail)
		}
		if got := c.resp.Header.Get(ProblemHeader); (got == b) != c.problem {
			t.Errorf("%s: %s = %q", c.name, ProblemHeader, got)
		}
	}
	if got := testutil.ToFloat64(f.m.Checks.WithLabelValues(Door, "error")); got != float64(len(cases)) {
		t.Fatalf(`checks_total{door="http",outcome="error"} = %v, want %d`, got, len(cases))
	}
	if got := testutil.ToFloat64(f.m.Decisions.WithLabelValues("orders", "local", "allowed")); got != 0 {
		t.Fatalf("a misconfigured request was decided: %v", got)
	}
}

// A URI nginx or a forward-auth proxy passes as the client wrote it is
// normalised before policies match it, as Envoy normalises its :path: an
// encoded or dotted path cannot slip past a path_prefix.
func TestRawURIsAreNormalised(t *testing.T) {
	f := newFixture(t, `
policies:
  - {name: orders, match: {path_prefix: /orders/}, limit: 100, window: 1m}
`)
	for _, uri := range []string{"/orders/1", "/%6Frders/1", "//orders//1", "/x/../orders/1", "/%2E%2E/orders/1?a", "/./orders/", "/orders%2F1", "/x/..%2forders/1"} {
		resp := f.nginx("GET", uri)
		if resp.Header.Get("RateLimit") == "" {
			t.Errorf("nginx %q escaped the orders policy", uri)
		}
		resp = f.do("GET", ForwardAuthPath, "X-Forwarded-Method", "GET", "X-Forwarded-Uri", uri, "X-Forwarded-Host", "h")
		if resp.Header.Get("RateLimit") == "" {
			t.Errorf("forward-auth %q escaped the orders policy", uri)
		}
	}
	for _, uri := range []string{"/orders", "/ordersx/1", "/orders%252F1"} {
		if resp := f.nginx("GET", uri); resp.Header.Get("RateLimit") != "" {
			t.Errorf("%q matched path_prefix /orders/", uri)
		}
	}
}

// ingress-nginx's auth-url sends the whole original URL in X-Original-URL:
// with http.uri_header set to it, host and path come from the URL.
func TestOriginalURL(t *testing.T) {
	f := newFixture(t, `
http: {uri_header: x-original-url}
policies:
  - {name: orders, match: {path_prefix: /orders, hosts: [api.example.com]}, limit: 5, window: 1m}
`)
	resp := f.do("GET", NginxPath, "X-Original-Method", "GET", "X-Original-URL", "https://api.example.com/%6frders?x=1", "Host", "127.0.0.1:9002")
	wantHeaders(t, resp, "RateLimit", `"orders";r=4;t=12`)
	// The default header is not read once another is configured.
	resp = f.do("GET", NginxPath, "X-Original-Method", "GET", "X-Original-URI", "/orders", "Host", "api.example.com")
	if resp.StatusCode != 400 {
		t.Fatalf("x-original-uri with uri_header x-original-url: %d", resp.StatusCode)
	}
}

// The client IP comes from X-Forwarded-For only through ip_trusted_hops:
// behind one proxy, the entry it appended; without hops, the peer (the
// proxy itself).
func TestClientIPThroughTrustedHops(t *testing.T) {
	for _, c := range []struct {
		hops int
		want string
	}{{0, "127.0.0.1"}, {1, "10.0.0.7"}, {2, "6.6.6.6"}} {
		f := newFixture(t, "ip_trusted_hops: "+string(rune('0'+c.hops))+`
policies:
  - {name: per-ip, key: [ip], limit: 1, window: 1m}
`)
		xff := []string{"X-Forwarded-For", "6.6.6.6, 10.0.0.7"}
		f.nginx("GET", "/", xff...)
		// The same IP is now out of tokens; any other has a full bucket.
		if resp := f.nginx("GET", "/", xff...); resp.StatusCode != 429 {
			t.Fatalf("hops %d: the second request from one client: %d", c.hops, resp.StatusCode)
		}
		other := []string{"X-Forwarded-For", "6.6.6.6, 10.0.0.8"}
		if c.hops == 2 {
			other = []string{"X-Forwarded-For", "6.6.6.5, 10.0.0.7"}
		}
		resp := f.nginx("GET", "/", other...)
		if c.hops == 0 && resp.StatusCode != 429 {
			t.Fatalf("hops 0: every client is the proxy's address, one bucket; got %d", resp.StatusCode)
		}
		if c.hops > 0 && resp.StatusCode != 200 {
			t.Fatalf("hops %d: another client (%v) was denied", c.hops, other)
		}
	}
}

// Both doors decide with one Running: one set of counts, and one compile
// per reload that both see.
func TestDoorsShareTheRunningConfiguration(t *testing.T) {
	f := newFixture(t, ordersYAML)
	grpcDoor := check.NewServer(f.running, check.WithClock(func() time.Time { return f.now }))
	checkReq := check.NewRequest(check.RequestSpec{Method: "POST", Path: "/orders", Headers: map[string]string{"x-api-key": "key-ada"}, Time: t0})
	grpcCheck := func() *authv3.CheckResponse {
		resp, err := grpcDoor.Check(context.Background(), checkReq)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	grpcCheck()
	grpcCheck()
	if resp := f.nginx("POST", "/orders", "X-Api-Key", "key-ada"); resp.StatusCode != 200 || resp.Header.Get("RateLimit") != `"orders";r=0;t=60` {
		t.Fatalf("third order, by HTTP: %d %v", resp.StatusCode, resp.Header)
	}
	if resp := grpcCheck(); codes.Code(resp.GetStatus().GetCode()) != codes.ResourceExhausted {
		t.Fatalf("fourth order, by gRPC: %v", resp.GetStatus())
	}

	// A reload of the running configuration is seen by both doors.
	next := strings.Replace(ordersYAML, "limit: 3", "limit: 7", 1)
	if err := f.running.Update(parse(t, next)); err != nil {
		t.Fatal(err)
	}
	if resp := f.nginx("POST", "/orders", "X-Api-Key", "key-ada"); resp.Header.Get("RateLimit-Policy") != `"orders";q=7;w=60` {
		t.Fatalf("HTTP door after the reload: %v", resp.Header)
	}
	resp := grpcCheck()
	var policy string
	for _, h := range resp.GetOkResponse().GetResponseHeadersToAdd() {
		if h.GetHeader().GetKey() == "ratelimit-policy" {
			policy = h.GetHeader().GetValue()
		}
	}
	if policy != `"orders";q=7;w=60` {
		t.Fatalf("gRPC door after the reload: %v", resp)
	}
	if got := testutil.ToFloat64(f.m.Checks.WithLabelValues("grpc", "ok")) + testutil.ToFloat64(f.m.Checks.WithLabelValues(Door, "ok")); got != 5 {
		t.Fatalf("ok checks over both doors = %v, want 5", got)
	}
}

// Every algorithm runs through this door; the leaky bucket holds the 200
// until the request's slot.
func TestLeakyBucketHoldsThe200(t *testing.T) {
	f := newFixture(t, `
policies:
  - {name: shaped, limit: 10, window: 1s, algorithm: leaky_bucket, max_delay: 150ms}
`)
	// A slot every 100ms, held at most 150ms: at one instant the first
	// passes at once, the second is held 100ms, the third would wait 200ms.
	for i, want := range []int{200, 200, 429} {
		resp := f.nginx("GET", "/")
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	if len(f.holds) != 1 || f.holds[0] != 100*time.Millisecond {
		t.Fatalf("holds = %v, want [100ms]", f.holds)
	}
}

// headers.legacy adds the X-RateLimit-* headers to allows and denials.
func TestLegacyHeaders(t *testing.T) {
	f := newFixture(t, "headers: {legacy: true}\n"+ordersYAML)
	resp := f.nginx("POST", "/orders", "X-Api-Key", "key-ada")
	wantHeaders(t, resp, "X-RateLimit-Limit", "3", "X-RateLimit-Remaining", "2", "X-RateLimit-Reset", "20")
	f.nginx("POST", "/orders", "X-Api-Key", "key-ada")
	f.nginx("POST", "/orders", "X-Api-Key", "key-ada")
	resp = f.nginx("POST", "/orders", "X-Api-Key", "key-ada")
	wantHeaders(t, resp, "X-RateLimit-Limit", "3", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "20")
}

// The door's own cost per auth request, beyond net/http's: what nginx
// sends, decided in local mode far from the limit. `make bench-micro`.
func BenchmarkServeHTTP(b *testing.B) {
	f := newFixture(b, `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: bench, match: {path_prefix: /orders}, key: [client], limit: 1000000000, window: 1m}
`)
	r := httptest.NewRequest("GET", NginxPath, nil)
	r.RemoteAddr = "127.0.0.1:40000"
	for k, v := range map[string]string{"X-Original-Method": "POST", "X-Original-Uri": "/orders?page=1", "X-Forwarded-For": "10.0.0.1",
		"User-Agent": "curl/8.0", "Accept": "*/*", "X-Api-Key": "key-ada"} {
		r.Header.Set(k, v)
	}
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		f.srv.ServeHTTP(w, r)
		if w.status != 200 {
			b.Fatalf("status %d", w.status)
		}
	}
}

// discardWriter is a ResponseWriter that keeps only the status.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }

// A limit read from the request (a header a trusted gateway sets, here)
// is the one the RateLimit headers advertise, allowed or denied, whether
// it is the default, max or one between them.
func TestLimitFromRequestHeaders(t *testing.T) {
	f := newFixture(t, `
policies:
  - {name: tenants, key: ["header:x-tenant"], limit: {header: x-tenant-limit, default: 2, max: 10}, window: 1m}
`)
	for _, tc := range []struct{ tenant, limit, q string }{
		{"a", "5", "5"}, {"b", "", "2"}, {"c", "99", "10"},
	} {
		h := []string{"X-Tenant", tc.tenant}
		if tc.limit != "" {
			h = append(h, "X-Tenant-Limit", tc.limit)
		}
		resp := f.nginx("GET", "/", h...)
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Policy") != `"tenants";q=`+tc.q+`;w=60` {
			t.Fatalf("tenant %s: %d %v, want 200 with q=%s", tc.tenant, resp.StatusCode, resp.Header, tc.q)
		}
	}
	for i := 0; i < 4; i++ {
		f.nginx("GET", "/", "X-Tenant", "a", "X-Tenant-Limit", "5")
	}
	if resp := f.nginx("GET", "/", "X-Tenant", "a", "X-Tenant-Limit", "5"); resp.StatusCode != 429 || resp.Header.Get("RateLimit-Policy") != `"tenants";q=5;w=60` {
		t.Fatalf("sixth request of tenant a: %d %v, want 429 with q=5", resp.StatusCode, resp.Header)
	}
}
