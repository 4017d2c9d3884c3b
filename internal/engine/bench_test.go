package engine

import (
	"context"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// benchConfig has the kinds of policies that existed before costs,
// calendars, plan_from and richer matching: path, method, host and
// context matching, a client key, a plan limit. Its decisions are the hot
// path that must not slow down.
const benchConfig = `
clients:
  keys: [{id: ada, key: key-ada, plan: gold}]
plans:
  gold: {limit: 1000000000, window: 1s}
  default: {limit: 1000000000, window: 1s}
policies:
  - {name: other, match: {path_prefix: /other, methods: [GET]}, limit: 10, window: 1s}
  - {name: orders, match: {path_prefix: /orders, methods: [GET, POST], hosts: [api.example.com, "*.example.org"], context: {route: orders}}, key: [client], limit: 1000000000, window: 1s}
  - {name: per-plan, match: {path_prefix: /orders}, key: [client], limit: plan}
`

func benchEngine(b *testing.B) *Engine {
	cfg, err := config.Parse([]byte(benchConfig), "bench")
	if err != nil {
		b.Fatal(err)
	}
	table, _ := local.NewTable(100_000)
	e, err := Compile(cfg, Limiters{config.ModeLocal: local.New(table)}, NewMetrics(nil))
	if err != nil {
		b.Fatal(err)
	}
	return e
}

func benchRequest() *Request {
	return &Request{
		Headers: map[string]string{"x-api-key": "key-ada", ":path": "/orders/7", "user-agent": "bench"},
		Method:  "POST", Path: "/orders/7", Host: "api.example.com", Peer: "10.1.2.3",
		Context: map[string]string{"route": "orders"},
	}
}

// BenchmarkMatch is matching alone: every policy of benchConfig against
// one request, two matching.
func BenchmarkMatch(b *testing.B) {
	e := benchEngine(b)
	r := benchRequest()
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		for _, p := range e.policies {
			if p.matches(r, 0) {
				n++
			}
		}
	}
	if n == 0 {
		b.Fatal("nothing matched")
	}
}

// BenchmarkDecideLocal is one whole decision in local mode: identity,
// matching, two partition keys, two takes.
func BenchmarkDecideLocal(b *testing.B) {
	e := benchEngine(b)
	r := benchRequest()
	ctx := context.Background()
	now := time.Now()
	var v Verdict
	b.ReportAllocs()
	for b.Loop() {
		if err := e.Decide(ctx, r, now, &v); err != nil || v.Outcome != OK {
			b.Fatalf("%v %v", v.Outcome, err)
		}
	}
}

// Matching a policy that uses none of the richer conditions allocates
// nothing (docs/configuration.md, "Matching a policy without these
// conditions costs what it did before and allocates nothing"): every
// policy of benchConfig against the request BenchmarkMatch measures.
func TestMatchAllocatesNothing(t *testing.T) {
	cfg, err := config.Parse([]byte(benchConfig), "bench")
	if err != nil {
		t.Fatal(err)
	}
	table, _ := local.NewTable(1000)
	e, err := Compile(cfg, Limiters{config.ModeLocal: local.New(table)}, NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	r := benchRequest()
	matched := 0
	allocs := testing.AllocsPerRun(1000, func() {
		matched = 0
		for _, p := range e.policies {
			if p.matches(r, 0) {
				matched++
			}
		}
	})
	if matched != 2 {
		t.Fatalf("%d of benchConfig's policies matched the request, want 2 (orders, per-plan)", matched)
	}
	if allocs != 0 {
		t.Fatalf("matching benchConfig's policies: %v allocations per request, want none", allocs)
	}
}
