package tests

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/extauthz/extauthz/tests/internal/testcerts"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// startAnchorXDS builds envoyproxy/ratelimit (buildAnchor: the version
// tools/bench pins, from the module proxy) and runs it as Envoy Gateway
// does: configured over xDS from xdsAddr with the test's client
// certificate, counting in the Redis at redisAddr, at its defaults
// otherwise (its gRPC door plaintext, as the environment xdsEnv gives
// extauthz). It returns a client of its rate limit service.
func startAnchorXDS(t *testing.T, certs testcerts.Files, xdsAddr, redisAddr string, env ...string) rlsv3.RateLimitServiceClient {
	t.Helper()
	addr := runAnchor(t, buildAnchor(t, t.TempDir()), append([]string{
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + xdsAddr, "CONFIG_GRPC_XDS_NODE_ID=" + gatewayNode,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + certs.ClientCert,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + certs.ClientKey, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + certs.CA,
		// As xdsEnv shortens extauthz's: reconnecting is not measured here.
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=100ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=200ms",
	}, env...)...)
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	must(t, err)
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// anchorPair sends each request to extauthz and to the anchor, one after
// the other, and records every answer that differs.
type anchorPair struct {
	t      *testing.T
	ours   *ratelimitProc
	anchor rlsv3.RateLimitServiceClient
	calls  int
	// codes counts the answers whose overall code (Envoy's decision)
	// differs.
	codes int
	diffs []string // answers that differ
}

// scriptStep is one request of the script, sent n times.
type scriptStep struct {
	name   string
	domain string
	ds     []*ratelimitv3.RateLimitDescriptor
	n      int
}

func (s *anchorPair) run(steps []scriptStep) {
	s.t.Helper()
	for _, st := range steps {
		for i := 0; i < st.n; i++ {
			req := &rlsv3.RateLimitRequest{Domain: st.domain, Descriptors: st.ds}
			ours := s.ours.shouldRateLimit(req)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			theirs, err := s.anchor.ShouldRateLimit(ctx, req)
			cancel()
			if err != nil {
				s.t.Fatalf("%s, call %d: envoyproxy/ratelimit: %v", st.name, i+1, err)
			}
			s.calls++
			if ours.GetOverallCode() != theirs.GetOverallCode() {
				s.codes++
			}
			if d := responseDiff(ours, theirs); d != "" {
				s.diffs = append(s.diffs, st.name+", call "+strconv.Itoa(i+1)+": "+d)
			}
		}
	}
}

// responseDiff compares two answers whole: the overall code, every
// status (code, current limit, remaining) and whatever else is set; the
// time until the window resets may differ by the second the two calls
// straddled.
func responseDiff(ours, theirs *rlsv3.RateLimitResponse) string {
	a, b := proto.Clone(ours).(*rlsv3.RateLimitResponse), proto.Clone(theirs).(*rlsv3.RateLimitResponse)
	if len(a.Statuses) == len(b.Statuses) {
		for i := range a.Statuses {
			da, db := a.Statuses[i].GetDurationUntilReset().AsDuration(), b.Statuses[i].GetDurationUntilReset().AsDuration()
			if d := da - db; d >= -time.Second && d <= time.Second && (da == 0) == (db == 0) {
				a.Statuses[i].DurationUntilReset, b.Statuses[i].DurationUntilReset = nil, nil
			}
		}
	}
	// The reset header, in seconds, likewise.
	if len(a.ResponseHeadersToAdd) == len(b.ResponseHeadersToAdd) {
		for i, ha := range a.ResponseHeadersToAdd {
			hb := b.ResponseHeadersToAdd[i]
			if !strings.HasSuffix(strings.ToLower(ha.GetKey()), "reset") || ha.GetKey() != hb.GetKey() {
				continue
			}
			va, errA := strconv.Atoi(ha.GetValue())
			vb, errB := strconv.Atoi(hb.GetValue())
			if errA == nil && errB == nil && va-vb >= -1 && va-vb <= 1 {
				ha.Value = hb.GetValue()
			}
		}
	}
	if proto.Equal(a, b) {
		return ""
	}
	return "extauthz {" + prototext.Format(ours) + "} envoyproxy/ratelimit {" + prototext.Format(theirs) + "}"
}

// awaitVersion waits until both sides answer with the rule probe-<v>,
// which only version v has: both have swapped v in.
func (s *anchorPair) awaitVersion(v string) {
	s.t.Helper()
	probe := &rlsv3.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*ratelimitv3.RateLimitDescriptor{chainRequest("probe-" + v)}}
	if !within(5*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		theirs, err := s.anchor.ShouldRateLimit(ctx, probe)
		return err == nil && theirs.GetStatuses()[0].GetCurrentLimit() != nil &&
			s.ours.shouldRateLimit(probe).GetStatuses()[0].GetCurrentLimit() != nil
	}) {
		s.t.Fatalf("version %s not applied by both within 5s of the push", v)
	}
}

// anchorScriptConfig is a version of the listener's configuration
// (listenerDomain: a route rule, shadow mode, month, year, unlimited,
// distinct masked addresses) with a route of two rules, a probe rule
// naming the version, and edit applied to the descriptor list.
func anchorScriptConfig(v string, edit func([]*rlsconfv3.RateLimitDescriptor) []*rlsconfv3.RateLimitDescriptor) *rlsconfv3.RateLimitConfig {
	c := listenerDomain(
		routeChain("pair", 0, hourLimit(2), false),
		routeChain("pair", 1, hourLimit(4), false),
		routeChain("probe-"+v, 0, hourLimit(1000), false),
	)
	if edit != nil {
		c.Descriptors = edit(c.Descriptors)
	}
	return c
}

// withHits is d with its own hits_addend n.
func withHits(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// pairRule is the request descriptor of rule i of route pair.
func pairRule(i int) *ratelimitv3.RateLimitDescriptor {
	outer := "httproute/default/pair/rule/" + strconv.Itoa(i) + "/match/-1"
	inner := "rule-" + strconv.Itoa(i) + "-match--1"
	return gwDescriptor(outer, outer, inner, inner)
}

// envoyproxy/ratelimit side by side with extauthz, both run as Envoy
// Gateway runs its rate limit service, subscribed to the same xDS server
// (built as Envoy Gateway's, mutual TLS 1.3), each counting in a
// redis-server of its own: a scripted request sequence over the shapes
// Envoy Gateway's translator writes, then a limit added and one changed,
// then one removed, each pushed to both. Every answer is compared whole
// (codes, current limits, remaining; the reset time to the second): 0
// differences. The script crosses the two places where extauthz's own
// all-or-nothing counting would differ (a request of two rules whose
// first is over; a limit raised after denied requests): in the anchor's
// environment extauthz counts each descriptor as the anchor does
// (rls.counting: each, engine.TakeEach). At the defaults Envoy Gateway
// runs with, and again with the response headers and the dynamic
// metadata both sides can add switched on for both, under the global
// shadow and quota modes, and under STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT.
//
// The script's windows are an hour and longer: a run straddling the
// hour (a few seconds in 3,600) resets both sides' hour counts, and a
// request whose two calls straddled it differs for that alone: such a
// run logs its differences instead of failing.
func TestRatelimitXDSBesideAnchor(t *testing.T) {
	parallelLong(t, "it builds envoyproxy/ratelimit through the module proxy and runs it beside the binary, five times")
	t.Run("defaults", func(t *testing.T) { besideAnchor(t) })
	t.Run("response headers and dynamic metadata", func(t *testing.T) {
		besideAnchor(t, "LIMIT_RESPONSE_HEADERS_ENABLED=true", "RESPONSE_DYNAMIC_METADATA=true")
	})
	t.Run("global shadow mode", func(t *testing.T) { besideAnchor(t, "SHADOW_MODE=true") })
	t.Run("global quota mode", func(t *testing.T) {
		besideAnchor(t, "QUOTA_MODE=true", "RESPONSE_DYNAMIC_METADATA=true", "LIMIT_RESPONSE_HEADERS_ENABLED=true")
	})
	// Only the descriptors over their limit count when one is: the pair
	// of rules then differs from the default run (the second rule is
	// not counted while the first is over).
	t.Run("stop increment when over limit", func(t *testing.T) {
		besideAnchor(t, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true")
	})
}

// besideAnchor runs the script, with env set for both sides: 0 answers
// may differ.
func besideAnchor(t *testing.T, env ...string) {
	certs := testcerts.Write(t, "xds")
	x := newXDSServer(t, certs, "127.0.0.1:0")
	x.push("1", anchorScriptConfig("1", nil), sharedDomain())
	ours := append(xdsEnv(certs, x.addr), "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+testredis.Start(t).Addr)
	s := &anchorPair{t: t,
		ours:   startRatelimit(t, ratelimitBinary(t), nil, append(ours, env...)...),
		anchor: startAnchorXDS(t, certs, x.addr, testredis.Start(t).Addr, env...),
	}
	s.awaitVersion("1")
	began := time.Now()
	const dom = "default/eg/http"
	shared := gwDescriptor("default/shared-policy/0", "default/shared-policy/0", "rule-0-match--1", "rule-0-match--1")
	one := func(name string, d *ratelimitv3.RateLimitDescriptor, n int) scriptStep {
		return scriptStep{name: name, domain: dom, ds: []*ratelimitv3.RateLimitDescriptor{d}, n: n}
	}
	both := []*ratelimitv3.RateLimitDescriptor{pairRule(0), pairRule(1)}
	s.run([]scriptStep{
		one("route rule, 3 an hour", chainRequest("backend"), 5),
		one("shadow mode", chainRequest("shadowed"), 3),
		one("month unit", chainRequest("monthly"), 3),
		one("year unit", chainRequest("yearly"), 3),
		one("unlimited", chainRequest("open"), 3),
		one("distinct masked address 10.0.0.1", byIP("10.0.0.1"), 3),
		one("distinct masked address 10.0.0.2", byIP("10.0.0.2"), 3),
		// A descriptor's own hits_addend (2 an hour): a question (0)
		// counts nothing and is OK up to the limit, the limit included;
		// more than one hit at once counts them all, over the limit too.
		one("hits_addend 0, a question at 0 of 2", withHits(byIP("10.0.0.4"), 0), 1),
		one("hits_addend 2, to the limit", withHits(byIP("10.0.0.4"), 2), 1),
		one("hits_addend 0, a question at 2 of 2", withHits(byIP("10.0.0.4"), 0), 1),
		one("hits_addend 3, over (5 of 2)", withHits(byIP("10.0.0.4"), 3), 1),
		one("hits_addend 0, a question at 5 of 2", withHits(byIP("10.0.0.4"), 0), 1),
		{name: "shared rule's domain", domain: "default/shared-policy/0", ds: []*ratelimitv3.RateLimitDescriptor{shared}, n: 2},
		one("an unknown route", chainRequest("nobody"), 2),
		{name: "an unknown domain", domain: "default/eg/other", ds: []*ratelimitv3.RateLimitDescriptor{chainRequest("backend")}, n: 2},
		{name: "two rules of a route in one request, both within", domain: dom, ds: both, n: 2},
		one("the first rule (2 an hour) alone, over", pairRule(0), 1),
		// All or nothing would count neither rule here; the anchor counts
		// both (the second's count shows in the next step).
		{name: "two rules in one request, the first over", domain: dom, ds: both, n: 2},
		{name: "the second rule (4 an hour) alone after", domain: dom, ds: []*ratelimitv3.RateLimitDescriptor{pairRule(1)}, n: 3},
	})

	// Version 2: a rule added (1 an hour), the route rule's limit raised
	// from 3 to 6 (after 5 requests, 2 of them denied: the anchor counted
	// them, so 1 more is allowed, not 3).
	x.push("2", anchorScriptConfig("2", func(ds []*rlsconfv3.RateLimitDescriptor) []*rlsconfv3.RateLimitDescriptor {
		ds[0] = routeChain("backend", 0, hourLimit(6), false)
		return append(ds, routeChain("added", 0, hourLimit(1), false))
	}), sharedDomain())
	s.awaitVersion("2")
	s.run([]scriptStep{
		{name: "route rule raised to 6", domain: dom, ds: []*ratelimitv3.RateLimitDescriptor{chainRequest("backend")}, n: 4},
		one("added rule", chainRequest("added"), 2),
		one("year unit, unchanged", chainRequest("yearly"), 1),
		one("distinct masked address 10.0.0.3", byIP("10.0.0.3"), 3),
	})

	// Version 3: the year rule removed (unlimited then: no current
	// limit), the route rule back to 3 (over: both counted more).
	x.push("3", anchorScriptConfig("3", func(ds []*rlsconfv3.RateLimitDescriptor) []*rlsconfv3.RateLimitDescriptor {
		var kept []*rlsconfv3.RateLimitDescriptor
		for _, d := range ds {
			if !strings.Contains(d.Key, "/yearly/") {
				kept = append(kept, d)
			}
		}
		return kept
	}), sharedDomain())
	s.awaitVersion("3")
	s.run([]scriptStep{
		one("year rule removed", chainRequest("yearly"), 2),
		one("route rule at 3 again", chainRequest("backend"), 2),
		one("month unit, unchanged", chainRequest("monthly"), 1),
	})

	straddled := began.Truncate(time.Hour) != time.Now().Truncate(time.Hour)
	t.Logf("%d requests to each; %d answers differ; %d overall codes differ", s.calls, len(s.diffs), s.codes)
	for _, d := range s.diffs {
		if straddled {
			t.Logf("in a run that straddled the hour: %s", d)
			continue
		}
		t.Error(d)
	}
}
