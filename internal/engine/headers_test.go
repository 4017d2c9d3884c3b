package engine

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// A decision made from only the headers RequestHeaders names is the one
// made from all of them: a door may build Request.Headers from those alone.
func TestRequestHeadersAreAllADecisionReads(t *testing.T) {
	cfg, err := config.Parse([]byte(`
ip_trusted_hops: 1
clients:
  header: X-Key
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: per-client, key: [client], limit: 5, window: 1m}
  - {name: per-ip, key: [ip], limit: 5, window: 1m}
  - {name: per-tenant, key: [header:X-Tenant, path], limit: 5, window: 1m}
  - {name: beta, limit: 5, window: 1m, match: {headers: [{name: X-Beta, present: true}], not: {headers: [{name: X-Internal, exact: "yes"}]}}}
  - {name: weighted, limit: 50, window: 1m, cost: {header: X-Cost}}
  - {name: planned, limit: plan, plan_from: header:X-Plan}
plans:
  default: {limit: 5, window: 1m}
  gold: {limit: 50, window: 1m}
`), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	newEngine := func() *Engine {
		table, err := local.NewTable(100)
		if err != nil {
			t.Fatal(err)
		}
		e, err := Compile(cfg, Limiters{config.ModeLocal: local.New(table)}, NewMetrics(nil))
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	all, some := newEngine(), newEngine()
	if got, want := some.RequestHeaders(), []string{"x-key", "authorization", "x-forwarded-for", "x-tenant", "x-beta", "x-internal", "x-cost", "x-plan"}; !slices.Equal(got, want) {
		t.Fatalf("RequestHeaders() = %q, want %q", got, want)
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for i, h := range []map[string]string{
		{"x-key": "key-ada", "x-tenant": "t1", "x-forwarded-for": "10.0.0.1, 10.0.0.2", "x-api-key": "key-eve", "x-client-id": "bob"},
		{"authorization": "Bearer key-ada", "x-tenant": "t2", "cookie": "a=b", "x-real-ip": "6.6.6.6"},
		{"authorization": "Bearer key-eve"},
		{"x-key": "key-eve", "x-forwarded-for": "10.0.0.3"},
		{"x-forwarded-for": "10.0.0.3", "forwarded": "for=1.2.3.4", "host": "h", "x-original-uri": "/x"},
		{"x-beta": "1", "x-cost": "7", "x-plan": "gold"},
		{"x-beta": "1", "x-internal": "yes", "x-cost": "70", "x-plan": "silver"},
	} {
		only := map[string]string{}
		for _, n := range some.RequestHeaders() {
			if v, ok := h[n]; ok {
				only[n] = v
			}
		}
		full := Request{Headers: maps.Clone(h), Method: "GET", Path: "/p", Peer: "127.0.0.1"}
		part := Request{Headers: only, Method: "GET", Path: "/p", Peer: "127.0.0.1"}
		var a, b Verdict
		if err := all.Decide(context.Background(), &full, now, &a); err != nil {
			t.Fatal(err)
		}
		if err := some.Decide(context.Background(), &part, now, &b); err != nil {
			t.Fatal(err)
		}
		if a.Outcome != b.Outcome || (a.Client == nil) != (b.Client == nil) || a.CredHeader != b.CredHeader || len(a.Takes()) != len(b.Takes()) {
			t.Fatalf("request %d: all headers %+v; RequestHeaders only %+v", i, a, b)
		}
		for j := range a.Takes() {
			if ta, tb := a.Takes()[j], b.Takes()[j]; ta.Key != tb.Key || ta.Units != tb.Units || ta.Limit.Index != tb.Limit.Index {
				t.Fatalf("request %d, policy %s: key %q from all headers, %q from RequestHeaders (units %d, %d; limit %d, %d)", i, a.Takes()[j].Policy.Name, a.Takes()[j].Key, b.Takes()[j].Key,
					a.Takes()[j].Units, b.Takes()[j].Units, a.Takes()[j].Limit.Index, b.Takes()[j].Limit.Index)
			}
		}
	}
}
