package check

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/engine/enginetest"
	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// fuzzYAML exercises every identity source, matcher, algorithm and
// outcome: keys and plans, a composite header/ip key, claims and
// principals, a reject policy, a tiny limit that denies (429), a shadow
// policy, and each of the five algorithms (leaky_bucket holds requests).
const fuzzYAML = `
ip_trusted_hops: 1
clients:
  keys:
    - {id: ada, key: key-ada, plan: pro}
    - {id: bob, key: key-bob}
plans:
  pro: {limit: 1000, window: 1m}
  default: {limit: 100, window: 1m}
policies:
  - {name: all, limit: 1000000, window: 1s}
  - {name: orders, match: {path_prefix: /orders, methods: [POST], hosts: ["*.example.com"]}, key: [client], limit: plan}
  - {name: tenant, key: ["header:x-tenant", ip], limit: 5, window: 1m, burst: 10}
  - {name: sub, key: ["claim:sub", principal], limit: 3, window: 1s}
  - {name: strict, match: {path_prefix: /strict}, key: [client], limit: 2, window: 1m, on_missing_key: reject}
  - {name: routed, match: {context: {route: r1}}, key: [path], limit: 1, window: 1h}
  - {name: shadowed, key: [ip], limit: 1, window: 1h, shadow: true}
  - {name: sw, match: {methods: [GET]}, key: [ip], limit: 3, window: 1m, algorithm: sliding_window}
  - {name: fw, key: ["header:x-tenant"], limit: 3, window: 10s, algorithm: fixed_window}
  - {name: sl, match: {path_prefix: /s}, key: [path], limit: 2, window: 1m, algorithm: sliding_log}
  - {name: lb, match: {methods: [PUT]}, key: [ip], limit: 100, window: 1s, algorithm: leaky_bucket, max_delay: 50ms}
`

// maxHold is the longest a request may be held: the leaky bucket's max_delay.
const maxHold = 50 * time.Millisecond

// knownKeys are fuzzYAML's API keys.
var knownKeys = map[string]bool{"key-ada": true, "key-bob": true}

// countingLimiter counts Takes, to prove that a request never reached a
// limiter.
type countingLimiter struct {
	quota.Limiter
	takes atomic.Int64
}

func (c *countingLimiter) Take(ctx context.Context, key string, l quota.Limit, _ int64, now time.Time) (quota.Decision, error) {
	c.takes.Add(1)
	return c.Limiter.Take(ctx, key, l, 1, now)
}

type fuzzServer struct {
	srv   *Server
	cache *local.Table
	lim   *countingLimiter
	held  time.Duration // the last hold asked for; the fuzz loop is serial
}

func newFuzzServer(tb testing.TB) *fuzzServer {
	tb.Helper()
	cfg, err := config.Parse([]byte(fuzzYAML), "fuzz.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	fs := &fuzzServer{}
	if fs.cache, err = local.NewTable(1000); err != nil {
		tb.Fatal(err)
	}
	fs.lim = &countingLimiter{Limiter: local.New(fs.cache)}
	// A frozen clock: a failing input replays the same decisions. Holds
	// are recorded, not waited out.
	running := enginetest.NewWith(tb, cfg, engine.Limiters{config.ModeLocal: fs.lim},
		engine.WithHold(func(_ context.Context, d time.Duration) error { fs.held = d; return nil }))
	fs.srv = NewServer(running, WithClock(func() time.Time { return t0 }))
	return fs
}

// presentedKey is the API key a request presents, read the way Envoy
// hands headers over (the headers map, or else header_map, repeated names
// joined with commas), independently of the server's own reading.
func presentedKey(req *authv3.CheckRequest) string {
	h := req.GetAttributes().GetRequest().GetHttp()
	get := func(name string) string {
		if len(h.GetHeaders()) > 0 {
			return h.GetHeaders()[name]
		}
		var vs []string
		for _, hv := range h.GetHeaderMap().GetHeaders() {
			if strings.ToLower(hv.GetKey()) == name {
				v := hv.GetValue()
				if v == "" {
					v = string(hv.GetRawValue())
				}
				vs = append(vs, v)
			}
		}
		return strings.Join(vs, ",")
	}
	if k := strings.TrimSpace(get("x-api-key")); k != "" {
		return k
	}
	a := get("authorization")
	if len(a) > 7 && strings.EqualFold(a[:7], "bearer ") || len(a) > 7 && strings.EqualFold(a[:7], "bearer\t") {
		if k := strings.Trim(a[7:], " \t"); k != "" && !strings.ContainsAny(k, " \t") {
			return k
		}
	}
	return ""
}

// checkInvariants runs one Check and asserts what must hold for any
// request: no gRPC error, a well-formed allow or deny, and no quota taken
// (so no state created) for an unknown API key.
func (fs *fuzzServer) checkInvariants(t *testing.T, req *authv3.CheckRequest) *authv3.CheckResponse {
	t.Helper()
	takes, entries := fs.lim.takes.Load(), fs.cache.Len()
	fs.held = 0
	resp, err := fs.srv.Check(context.Background(), req)
	if err != nil {
		t.Fatalf("Check returned a gRPC error: %v", err)
	}
	if fs.held < 0 || fs.held > maxHold {
		t.Fatalf("request held for %v; the leaky bucket's max_delay is %v", fs.held, maxHold)
	}
	if resp == nil || resp.GetStatus() == nil {
		t.Fatalf("Check returned %v: no status", resp)
	}
	if _, err := proto.Marshal(resp); err != nil {
		t.Fatalf("response cannot be sent: %v", err)
	}
	code := codes.Code(resp.GetStatus().GetCode())
	if code == codes.OK {
		ok := resp.GetOkResponse()
		if ok == nil {
			t.Fatalf("OK status without ok_response: %v", resp)
		}
		checkHeaders(t, ok.GetResponseHeadersToAdd())
		checkHeaders(t, ok.GetHeaders())
	} else {
		checkDenied(t, resp, code)
	}
	if k := presentedKey(req); k != "" && !knownKeys[k] {
		if httpStatus(resp) != 401 {
			t.Fatalf("unknown API key %.40q: status %d, want 401", k, httpStatus(resp))
		}
		if fs.lim.takes.Load() != takes || fs.cache.Len() != entries {
			t.Fatalf("unknown API key %.40q reached the limiter (%d takes, %d→%d entries)", k, fs.lim.takes.Load()-takes, entries, fs.cache.Len())
		}
	}
	return resp
}

func checkHeaders(t *testing.T, hs []*corev3.HeaderValueOption) {
	t.Helper()
	for _, h := range hs {
		k, v := h.GetHeader().GetKey(), h.GetHeader().GetValue()
		if k == "" || k != strings.ToLower(k) || strings.ContainsAny(k, " :\r\n\x00") {
			t.Fatalf("response header name %q", k)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			t.Fatalf("response header %s: value %q could split or end the response", k, v)
		}
	}
}

// The gRPC status of each HTTP status the sidecar denies with.
var deniedCodes = map[int]codes.Code{
	400: codes.InvalidArgument,
	401: codes.Unauthenticated,
	429: codes.ResourceExhausted,
	431: codes.ResourceExhausted,
	500: codes.Internal,
	503: codes.Unavailable,
}

func checkDenied(t *testing.T, resp *authv3.CheckResponse, code codes.Code) {
	t.Helper()
	d := resp.GetDeniedResponse()
	if d == nil {
		t.Fatalf("status %v without denied_response", code)
	}
	st := httpStatus(resp)
	if want, ok := deniedCodes[st]; !ok || want != code {
		t.Fatalf("denied with HTTP %d and gRPC %v", st, code)
	}
	checkHeaders(t, d.GetHeaders())
	h := headerMap(d.GetHeaders())
	if h["content-type"] != "application/problem+json" {
		t.Fatalf("denied %d: content-type %q", st, h["content-type"])
	}
	var p struct {
		Type     *string   `json:"type"`
		Title    *string   `json:"title"`
		Status   *int      `json:"status"`
		Detail   *string   `json:"detail"`
		Violated *[]string `json:"violated-policies"`
	}
	dec := json.NewDecoder(strings.NewReader(d.GetBody()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil || dec.More() {
		t.Fatalf("denied %d: body %q is not one problem object: %v", st, d.GetBody(), err)
	}
	if p.Type == nil || *p.Type == "" || p.Title == nil || *p.Title == "" || p.Status == nil || *p.Status != st || p.Detail == nil {
		t.Fatalf("denied %d: problem %s lacks type, title, detail or the right status", st, d.GetBody())
	}
	switch st {
	case 401:
		if h["www-authenticate"] != "ApiKey" {
			t.Fatalf("401 without WWW-Authenticate: %v", h)
		}
	case 429, 503:
		if n, err := strconv.Atoi(h["retry-after"]); err != nil || n < 1 {
			t.Fatalf("%d: retry-after %q", st, h["retry-after"])
		}
		if p.Violated == nil || len(*p.Violated) == 0 {
			t.Fatalf("%d: no violated-policies in %s", st, d.GetBody())
		}
	}
}

// FuzzCheckProto feeds arbitrary bytes, as a serialized CheckRequest, to
// Check through the server's codec, as gRPC does: every input gets a
// well-formed answer and no gRPC error, and one protobuf cannot decode
// (invalid UTF-8, nesting too deep, malformed) a 400.
func FuzzCheckProto(f *testing.F) {
	for _, req := range seedRequests() {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte("\x0a\x07\x22\x05\x12\x03\x12\x01\xff")) // attributes.request.http.method "\xff": not UTF-8
	fs := newFuzzServer(f)
	c := newCodec()
	f.Fuzz(func(t *testing.T, data []byte) {
		var req authv3.CheckRequest
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, &req); err != nil {
			t.Fatalf("the codec refused a CheckRequest: %v", err)
		}
		resp := fs.checkInvariants(t, &req)
		if proto.Unmarshal(data, &authv3.CheckRequest{}) != nil && httpStatus(resp) != 400 {
			t.Fatalf("undecodable request: status %d, want 400", httpStatus(resp))
		}
	})
}

func seedRequests() []*authv3.CheckRequest {
	ada := NewRequest(RequestSpec{Method: "POST", Path: "/orders/1?x", Host: "api.example.com", Headers: map[string]string{"x-api-key": "key-ada"}})
	bearer := NewRequest(RequestSpec{Method: "GET", Path: "/strict", Headers: map[string]string{"authorization": "Bearer key-bob"}})
	unknown := NewRequest(RequestSpec{Method: "GET", Path: "/", Headers: map[string]string{"x-api-key": "nope", "x-forwarded-for": "1.2.3.4, 5.6.7.8"}})
	routed := NewRequest(RequestSpec{Method: "GET", Path: "/r", Context: map[string]string{"route": "r1"}, Headers: map[string]string{"x-tenant": "t1"}})
	claims := withClaim("/c", "alice")
	claims.Attributes.Source.Principal = "spiffe://cluster.local/ns/a/sa/b"
	raw := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
		HeaderMap: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":path", RawValue: []byte("/strict")},
			{Key: "X-Api-Key", RawValue: []byte("key-ada")},
			{Key: "x-api-key", Value: "key-bob"},
		}},
	}}}}
	return []*authv3.CheckRequest{ada, bearer, unknown, routed, claims, raw, {}}
}

// FuzzCheckRequest builds CheckRequests from fuzzed parts (headers, path,
// x-forwarded-for, API key, bearer, claim, principal, context), in both of
// Envoy's header forms, and asserts the same invariants as FuzzCheckProto.
func FuzzCheckRequest(f *testing.F) {
	f.Add("POST", "/orders/1", "api.example.com", "key-ada", "", "1.2.3.4", "10.0.0.1", "t1", "alice", "spiffe://a", "", false)
	f.Add("GET", "/strict", "", "", "Bearer key-bob", "", "", "", "", "", "", true)
	f.Add("GET", "/", "x", "nope", "", "junk, 1.1.1.1", "::1", "", "", "", "r1", false)
	f.Add("PUT", "/s/1", "", "key-bob", "", "", "10.0.0.2", "t2", "", "", "", false)
	f.Add("get", "/r?x#y", "[::1]:80", " ", "bearer \tnope", ",,,", "fe80::1%eth0", strings.Repeat("t", 300), "", "", "r1", true)
	f.Add("", "", "", "\xff\xfe", "Bearer \x00", "\x00", "", "\xc0", "\xff", "\xfe", "\xfd", false)
	fs := newFuzzServer(f)
	f.Fuzz(func(t *testing.T, method, path, host, apiKey, authz, xff, peer, tenant, sub, principal, route string, raw bool) {
		hs := [][2]string{{":method", method}, {":path", path}, {":authority", host}}
		for _, h := range [][2]string{{"x-api-key", apiKey}, {"authorization", authz}, {"x-forwarded-for", xff}, {"x-tenant", tenant}} {
			if h[1] != "" {
				hs = append(hs, h)
			}
		}
		http := &authv3.AttributeContext_HttpRequest{Method: method, Path: path, Host: host}
		// Envoy sends header_map with raw bytes when encode_raw_headers
		// is set; proto strings cannot carry bytes that are not UTF-8.
		if raw || !allUTF8(method, path, host, apiKey, authz, xff, tenant) {
			http = &authv3.AttributeContext_HttpRequest{HeaderMap: &corev3.HeaderMap{}}
			for _, h := range hs {
				http.HeaderMap.Headers = append(http.HeaderMap.Headers, &corev3.HeaderValue{Key: h[0], RawValue: []byte(h[1])})
			}
		} else {
			http.Headers = map[string]string{}
			for _, h := range hs {
				http.Headers[h[0]] = h[1]
			}
		}
		req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Source:  &authv3.AttributeContext_Peer{Address: socketAddress(peer, 1), Principal: principal},
			Request: &authv3.AttributeContext_Request{Http: http},
		}}
		if route != "" {
			req.Attributes.ContextExtensions = map[string]string{"route": route}
		}
		if sub != "" {
			req.Attributes.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
				JWTAuthnNamespace: {Fields: map[string]*structpb.Value{"p": structpb.NewStructValue(&structpb.Struct{
					Fields: map[string]*structpb.Value{"sub": structpb.NewStringValue(sub)},
				})}},
			}}
		}
		fs.checkInvariants(t, req)
	})
}

func allUTF8(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// The fuzz server can reach each outcome the invariants speak of, so that
// a configuration change cannot leave the fuzzers checking only allows.
func TestFuzzServerReachesEveryOutcome(t *testing.T) {
	fs := newFuzzServer(t)
	seen := map[int]bool{}
	var held bool
	leaky := NewRequest(RequestSpec{Method: "PUT", Path: "/p", Headers: map[string]string{"x-tenant": "lb"}})
	for i := 0; i < 6; i++ {
		// Two in a row: the second waits for its slot.
		for _, req := range append([]*authv3.CheckRequest{leaky, leaky}, seedRequests()...) {
			resp := fs.checkInvariants(t, req)
			held = held || fs.held > 0
			if allowed(resp) {
				seen[200] = true
			} else {
				seen[httpStatus(resp)] = true
			}
		}
	}
	if !seen[200] || !seen[401] || !seen[429] || !held {
		t.Fatalf("statuses seen %v, a leaky-bucket hold seen: %v; want 200, 401, 429 and a hold", seen, held)
	}
}
