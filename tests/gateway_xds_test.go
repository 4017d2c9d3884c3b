package tests

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	cachetypes "github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/extauthz/extauthz/tests/internal/testcerts"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// xdsServer is a rate limit configuration server built as Envoy
// Gateway's (internal/globalratelimit/runner): go-control-plane's
// pkg/server/v3 over a snapshot cache keyed by node id, gRPC over TLS
// 1.3 with client certificates required.
type xdsServer struct {
	t     *testing.T
	addr  string
	cache cachev3.SnapshotCache
	creds credentials.TransportCredentials
	grpc  *grpc.Server

	mu    sync.Mutex
	nacks []string // the error_detail of every NACK received
	acks  []string // the version of every ACK
}

const gatewayNode = "envoy-ratelimit"

func newXDSServer(t *testing.T, certs testcerts.Files, addr string) *xdsServer {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(certs.ServerCert, certs.ServerKey)
	must(t, err)
	pool, err := loadCAPool(certs.CA)
	must(t, err)
	x := &xdsServer{t: t, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)}
	x.creds = credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
	})
	x.start(addr)
	t.Cleanup(x.stop)
	return x
}

// start serves on addr ("127.0.0.1:0": a port the kernel picks).
func (x *xdsServer) start(addr string) {
	x.t.Helper()
	lis, err := net.Listen("tcp", addr)
	must(x.t, err)
	x.addr = lis.Addr().String()
	x.grpc = grpc.NewServer(grpc.Creds(x.creds))
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, req *discoveryv3.DiscoveryRequest) error {
		x.mu.Lock()
		defer x.mu.Unlock()
		if d := req.GetErrorDetail(); d != nil {
			x.nacks = append(x.nacks, d.GetMessage())
		} else if req.GetVersionInfo() != "" {
			x.acks = append(x.acks, req.GetVersionInfo())
		}
		return nil
	}}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(x.grpc, serverv3.NewServer(context.Background(), x.cache, cb))
	go x.grpc.Serve(lis)
}

func (x *xdsServer) stop() { x.grpc.Stop() }

// push sets the node's snapshot.
func (x *xdsServer) push(version string, cfgs ...*rlsconfv3.RateLimitConfig) {
	x.t.Helper()
	res := make([]cachetypes.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]cachetypes.Resource{resourcev3.RateLimitConfigType: res})
	must(x.t, err)
	must(x.t, x.cache.SetSnapshot(context.Background(), gatewayNode, snap))
}

func (x *xdsServer) nacked() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]string(nil), x.nacks...)
}

func (x *xdsServer) acked(version string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, v := range x.acks {
		if v == version {
			return true
		}
	}
	return false
}

// Envoy Gateway's translator's shapes (internal/xds/translator/ratelimit.go).
func hourLimit(n uint32) *rlsconfv3.RateLimitPolicy {
	return &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: n}
}

// routeChain is a route rule's chain: httproute/<ns>/<name>/rule/<i>/match/-1, then rule-<i>-match--1.
func routeChain(route string, rule int, p *rlsconfv3.RateLimitPolicy, shadow bool) *rlsconfv3.RateLimitDescriptor {
	outer := "httproute/default/" + route + "/rule/" + strconv.Itoa(rule) + "/match/-1"
	inner := "rule-" + strconv.Itoa(rule) + "-match--1"
	return &rlsconfv3.RateLimitDescriptor{Key: outer, Value: outer, Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: inner, Value: inner, RateLimit: p, ShadowMode: shadow},
	}}
}

// listenerDomain is the first listener's configuration: a rule of 3 an
// hour on route backend, a shadow-mode rule, a month and a year, an
// unlimited one, and distinct masked remote addresses (2 an hour each).
func listenerDomain(extra ...*rlsconfv3.RateLimitDescriptor) *rlsconfv3.RateLimitConfig {
	ds := []*rlsconfv3.RateLimitDescriptor{
		routeChain("backend", 0, hourLimit(3), false),
		routeChain("shadowed", 0, hourLimit(1), true),
		routeChain("monthly", 0, &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MONTH, RequestsPerUnit: 2}, false),
		routeChain("yearly", 0, &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_YEAR, RequestsPerUnit: 2}, false),
		routeChain("open", 0, &rlsconfv3.RateLimitPolicy{Unlimited: true}, false),
		{Key: "httproute/default/byip/rule/0/match/0", Value: "httproute/default/byip/rule/0/match/0", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "masked_remote_address", Value: "0.0.0.0/0", Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "remote_address", RateLimit: hourLimit(2)},
			}},
		}},
	}
	ds = append(ds, extra...)
	return &rlsconfv3.RateLimitConfig{Name: "default/eg/http", Domain: "default/eg/http", Descriptors: ds}
}

// sharedDomain is a shared rule's domain (a second listener's rules
// would be another domain too): 1 an hour across routes.
func sharedDomain() *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: "default/shared-policy/0", Domain: "default/shared-policy/0", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "default/shared-policy/0", Value: "default/shared-policy/0", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "rule-0-match--1", Value: "rule-0-match--1", RateLimit: hourLimit(1)},
		}},
	}}
}

func chainRequest(route string) *ratelimitv3.RateLimitDescriptor {
	outer := "httproute/default/" + route + "/rule/0/match/-1"
	return gwDescriptor(outer, outer, "rule-0-match--1", "rule-0-match--1")
}

func byIP(ip string) *ratelimitv3.RateLimitDescriptor {
	k := "httproute/default/byip/rule/0/match/0"
	return gwDescriptor(k, k, "masked_remote_address", "0.0.0.0/0", "remote_address", ip)
}

// xdsEnv is Envoy Gateway's environment for a server at addr, with the
// test's certificates, and reconnection waits shortened from the
// anchor's 10s-60s: the test measures reconnecting, not the wait.
func xdsEnv(certs testcerts.Files, addr string) []string {
	return append(loopbackEnv(),
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+addr, "CONFIG_GRPC_XDS_NODE_ID="+gatewayNode,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT="+certs.ClientCert,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY="+certs.ClientKey, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT="+certs.CA,
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=100ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=200ms")
}

// admittedOf counts the OK answers of n requests.
func admittedOf(p *ratelimitProc, n int, domain string, d *ratelimitv3.RateLimitDescriptor) int {
	ok := 0
	for i := 0; i < n; i++ {
		if p.ask(domain, d).GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

// within polls cond every 10ms until it holds or d passes.
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}

// limited reports whether a descriptor has a rate limit in the running
// configuration (its status names one), asking with the descriptor's
// hits_addend 0, which spends nothing.
func limited(p *ratelimitProc, domain string, d *ratelimitv3.RateLimitDescriptor) bool {
	q := proto.Clone(d).(*ratelimitv3.RateLimitDescriptor)
	q.HitsAddend = wrapperspb.UInt64(0)
	resp := p.shouldRateLimit(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{q}})
	return resp.GetStatuses()[0].GetCurrentLimit() != nil
}

// The descriptors come over xDS from a server built as Envoy Gateway's,
// over mutual TLS 1.3: the binary waits for the first configuration, then
// decides as the configuration says in every shape the translator
// writes; an update is applied within a second; a bad one is NACKed with
// its error and the running configuration kept; the server gone keeps the
// last good configuration, and a server back on the same address is
// reconnected to.
func TestRatelimitXDS(t *testing.T) {
	serial(t, "an update pushed over xDS must be applied within a second of wall time, and the server's absence and return are timed")
	certs := testcerts.Write(t, "xds")
	x := newXDSServer(t, certs, "127.0.0.1:0")
	x.push("1", listenerDomain(), sharedDomain())
	p := startRatelimit(t, ratelimitBinary(t), nil, xdsEnv(certs, x.addr)...)
	const dom = "default/eg/http"

	t.Run("decisions", func(t *testing.T) {
		for _, c := range []struct {
			name        string
			domain      string
			d           *ratelimitv3.RateLimitDescriptor
			n, admitted int
		}{
			{"route rule, 3 an hour", dom, chainRequest("backend"), 5, 3},
			{"shadow mode never denies", dom, chainRequest("shadowed"), 4, 4},
			{"month unit", dom, chainRequest("monthly"), 4, 2},
			{"year unit", dom, chainRequest("yearly"), 4, 2},
			{"unlimited", dom, chainRequest("open"), 10, 10},
			{"distinct remote address 10.0.0.1", dom, byIP("10.0.0.1"), 4, 2},
			{"distinct remote address 10.0.0.2", dom, byIP("10.0.0.2"), 4, 2},
			{"shared rule's domain", "default/shared-policy/0", gwDescriptor("default/shared-policy/0", "default/shared-policy/0", "rule-0-match--1", "rule-0-match--1"), 3, 1},
			{"an unknown route", dom, chainRequest("nobody"), 5, 5},
		} {
			if got := admittedOf(p, c.n, c.domain, c.d); got != c.admitted {
				t.Errorf("%s: %d of %d admitted, want %d", c.name, got, c.n, c.admitted)
			}
		}
	})

	added := chainRequest("added")
	t.Run("update within a second", func(t *testing.T) {
		start := time.Now()
		x.push("2", listenerDomain(routeChain("added", 0, hourLimit(1), false)), sharedDomain())
		if !within(time.Second, func() bool { return limited(p, dom, added) }) {
			t.Fatalf("the added rule was not applied within 1s of the push")
		}
		t.Logf("update applied %v after the push", time.Since(start).Round(time.Millisecond))
		if got := admittedOf(p, 3, dom, added); got != 1 {
			t.Fatalf("the added rule of 1 an hour admitted %d of 3", got)
		}
	})

	t.Run("bad update NACKed, running config kept", func(t *testing.T) {
		dup := routeChain("backend", 0, hourLimit(9), false) // the same key and value twice in one list
		x.push("3", listenerDomain(dup), sharedDomain())
		var nacks []string
		if !within(5*time.Second, func() bool { nacks = x.nacked(); return len(nacks) > 0 }) {
			t.Fatal("no NACK for an update with a duplicate descriptor")
		}
		if want := "is already described by descriptors[0]"; !strings.Contains(nacks[0], want) {
			t.Fatalf("NACK error %q, want it to say %q", nacks[0], want)
		}
		if !limited(p, dom, added) || admittedOf(p, 1, dom, added) != 0 {
			t.Fatal("after a NACK the running configuration (version 2: the added rule, spent) is not what answers")
		}
	})

	t.Run("server gone, then back", func(t *testing.T) {
		addr := x.addr
		x.stop()
		// Gone: the last good configuration answers.
		if got := admittedOf(p, 2, dom, chainRequest("backend")); got != 0 {
			t.Fatalf("with the server gone, the route rule (spent) admitted %d", got)
		}
		x.push("4", listenerDomain(), sharedDomain()) // the added rule removed
		x.start(addr)
		if !within(5*time.Second, func() bool { return !limited(p, dom, added) }) {
			t.Fatalf("the server came back on %s with version 4; not applied within 5s", addr)
		}
	})
}

// With FORCE_START_WITHOUT_INITIAL_CONFIG (as Envoy Gateway sets it) and
// no server at start, the binary serves at once, answering OK with no
// limits and healthy; the server appearing later configures it.
func TestRatelimitXDSForceStart(t *testing.T) {
	parallel(t)
	certs := testcerts.Write(t, "xds")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := lis.Addr().String()
	lis.Close() // nobody there yet
	p := startRatelimit(t, ratelimitBinary(t), nil, append(xdsEnv(certs, addr), "FORCE_START_WITHOUT_INITIAL_CONFIG=true")...)
	const dom = "default/eg/http"
	if code, body := healthcheck(t, p.Admin); code != 200 || body != "OK" {
		t.Fatalf("/healthcheck with no configuration yet = %d %q, want 200 OK", code, body)
	}
	if got := admittedOf(p, 5, dom, chainRequest("backend")); got != 5 {
		t.Fatalf("with no configuration, %d of 5 admitted; want all", got)
	}
	x := newXDSServer(t, certs, addr)
	x.push("1", listenerDomain())
	if !within(5*time.Second, func() bool { return limited(p, dom, chainRequest("backend")) }) {
		t.Fatal("the server appeared; its configuration was not applied within 5s")
	}
	if got := admittedOf(p, 5, dom, chainRequest("backend")); got != 3 {
		t.Fatalf("route rule: %d of 5 admitted, want 3", got)
	}
}

// One variable turns on hybrid: EXTAUTHZ_OVERLAY names an extauthz file
// (here default_mode: hybrid) merged with the environment and with what
// xDS sends. The route rule is still exact (3 of 5 an hour) and its
// decisions are hybrid mode's; a setting the environment already gives
// (listen.grpc) in the file is an error naming both.
func TestRatelimitOverlayHybrid(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	certs := testcerts.Write(t, "xds")
	x := newXDSServer(t, certs, "127.0.0.1:0")
	x.push("1", listenerDomain())
	overlay := filepath.Join(t.TempDir(), "hybrid.yaml")
	must(t, os.WriteFile(overlay, []byte("default_mode: hybrid\n"), 0o600))
	env := append(xdsEnv(certs, x.addr), "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+srv.Addr, "EXTAUTHZ_OVERLAY="+overlay)
	p := startRatelimit(t, ratelimitBinary(t), nil, env...)
	if got := admittedOf(p, 5, "default/eg/http", chainRequest("backend")); got != 3 {
		t.Fatalf("route rule in hybrid mode: %d of 5 admitted, want 3", got)
	}
	policy := "default/eg/http.httproute/default/backend/rule/0/match/-1_httproute/default/backend/rule/0/match/-1.rule-0-match--1_rule-0-match--1"
	if n := p.metric("extauthz_decisions_total", "policy", policy, "mode", "hybrid", "result", "allowed"); n != 3 {
		t.Fatalf("extauthz_decisions_total{mode=hybrid,result=allowed} = %v for the route rule, want 3", n)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	must(t, os.WriteFile(bad, []byte("listen: {grpc: 127.0.0.1:9}\n"), 0o600))
	code, _, stderr := runRatelimit(t, ratelimitBinary(t), append(env, "EXTAUTHZ_OVERLAY="+bad))
	if want := "listen.grpc: is set by the environment (HOST, PORT, GRPC_HOST, GRPC_PORT, GRPC_UDS, GRPC_SERVER_*)"; code != 1 || !strings.Contains(stderr, want) {
		t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and %q", code, stderr, want)
	}
}

// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: started before any
// configuration (FORCE_START_WITHOUT_INITIAL_CONFIG), /healthcheck fails
// until the first one with a domain arrives, then answers OK.
func TestRatelimitHealthyWithConfig(t *testing.T) {
	parallel(t)
	certs := testcerts.Write(t, "xds")
	x := newXDSServer(t, certs, "127.0.0.1:0")
	p := startRatelimit(t, ratelimitBinary(t), nil, append(xdsEnv(certs, x.addr),
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true")...)
	if code, _ := healthcheck(t, p.Admin); code != 500 {
		t.Fatalf("/healthcheck with no configuration = %d, want 500", code)
	}
	x.push("1", listenerDomain())
	if !within(5*time.Second, func() bool { code, _ := healthcheck(t, p.Admin); return code == 200 }) {
		t.Fatal("/healthcheck still failing 5s after a configuration with a domain was pushed")
	}
}

// nobodyListens reports whether a TCP connection to addr is refused
// (nothing listens there).
func nobodyListens(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
		return false
	}
	return true
}

// Without FORCE_START_WITHOUT_INITIAL_CONFIG, as the anchor: with the xDS
// server absent at start, the process retries it and opens no listener
// (neither the gRPC door nor /healthcheck answers) however many attempts
// fail; the server appearing, its first configuration is applied and the
// process serves and decides by it. A SIGTERM while it waits ends it
// with exit 0. A first update that is refused (NACKed) ends the wait as
// the anchor's does: the process serves with no descriptors (every
// request OK) and applies the next good update.
func TestRatelimitXDSAbsentAtStart(t *testing.T) {
	parallel(t)
	certs := testcerts.Write(t, "xds")
	xdsAddr := freeLoopbackPort(t)
	_, httpPort, _ := net.SplitHostPort(freeLoopbackPort(t))
	_, grpcPort, _ := net.SplitHostPort(freeLoopbackPort(t))
	// Fixed ports (set after loopbackEnv's 0s, so these win): the test
	// asks them before the process serves, when no log names them.
	env := append(xdsEnv(certs, xdsAddr), "PORT="+httpPort, "GRPC_PORT="+grpcPort)
	s, ready := spawnRatelimit(t, ratelimitBinary(t), env...)
	const unavailable = `"msg":"xds: the configuration server is unavailable`
	if !within(10*time.Second, func() bool { return strings.Count(s.logs.String(), unavailable) >= 2 }) {
		t.Fatalf("no two failed attempts at the absent xDS server logged within 10s")
	}
	select {
	case <-ready:
		t.Fatal("serving with the xDS server absent and FORCE_START_WITHOUT_INITIAL_CONFIG off")
	default:
	}
	for _, port := range []string{httpPort, grpcPort} {
		if !nobodyListens("127.0.0.1:" + port) {
			t.Fatalf("127.0.0.1:%s answers while the first configuration has not arrived; the anchor opens no listener", port)
		}
	}
	x := newXDSServer(t, certs, xdsAddr)
	x.push("1", listenerDomain())
	s.await(ready, nil)
	p := &ratelimitProc{sidecar: s}
	if got := admittedOf(p, 5, "default/eg/http", chainRequest("backend")); got != 3 {
		t.Fatalf("route rule after the server appeared: %d of 5 admitted, want 3", got)
	}
	if code, body := healthcheck(t, s.Admin); code != 200 || body != "OK" {
		t.Fatalf("/healthcheck = %d %q, want 200 OK", code, body)
	}

	t.Run("SIGTERM while waiting", func(t *testing.T) {
		w, _ := spawnRatelimit(t, ratelimitBinary(t), xdsEnv(certs, freeLoopbackPort(t))...)
		if !w.logShows("xds: waiting for the first configuration", 10*time.Second) {
			t.Fatal("no waiting line logged within 10s")
		}
		if err := w.stop(); err != nil {
			t.Fatalf("SIGTERM while waiting: %v, want exit 0", err)
		}
	})

	t.Run("first update refused", func(t *testing.T) {
		bad := newXDSServer(t, certs, "127.0.0.1:0")
		bad.push("1", listenerDomain(routeChain("backend", 0, hourLimit(9), false)))
		p := startRatelimit(t, ratelimitBinary(t), nil, xdsEnv(certs, bad.addr)...)
		// The NACK goes out as the process starts serving: it reaches the
		// server's callback shortly after, not before.
		if !within(5*time.Second, func() bool { return len(bad.nacked()) > 0 }) {
			t.Fatal("serving, but the refused first update was not NACKed within 5s")
		}
		if got := admittedOf(p, 5, "default/eg/http", chainRequest("backend")); got != 5 {
			t.Fatalf("with no descriptors, %d of 5 admitted; want all", got)
		}
		bad.push("2", listenerDomain())
		if !within(5*time.Second, func() bool { return limited(p, "default/eg/http", chainRequest("backend")) }) {
			t.Fatal("the good update after a refused first one was not applied within 5s")
		}
	})
}
