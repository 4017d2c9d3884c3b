package check

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/engine/enginetest"
	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/tracing"
)

// Trace and span ids as Envoy would send them: the gRPC metadata carries
// the context of Envoy's ext_authz span, the HTTP headers what the client
// sent.
const (
	envoyTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	envoySpan   = "00f067aa0ba902b7"
	clientTrace = "80f198ee56343ba864fe8b2a57d3eff7"
	clientSpan  = "e457b5a2e4d86bd1"
)

// tracedFixture is a Server whose spans land in an in-memory exporter.
func tracedFixture(t *testing.T, yaml string, limiters engine.Limiters) (*Server, *tracetest.InMemoryExporter) {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var running *engine.Running
	if limiters == nil {
		running = enginetest.New(t, cfg).Running
	} else {
		running = enginetest.NewWith(t, cfg, limiters)
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	srv := NewServer(running, WithTracer(tracing.New(tp)))
	return srv, exp
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestCheckSpanParent: the Check span continues the trace context in the
// gRPC metadata (Envoy's ext_authz span) when there is one, else the one
// in the request's headers, in W3C or either B3 form; an unsampled parent
// yields no span (Envoy's sampling decision stands).
func TestCheckSpanParent(t *testing.T) {
	srv, exp := tracedFixture(t, `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: orders, key: [client], limit: 1000, window: 1m}
`, nil)
	traceparent := "00-" + envoyTrace + "-" + envoySpan + "-01"
	clientHeaders := map[string]string{"traceparent": "00-" + clientTrace + "-" + clientSpan + "-01"}
	for _, tc := range []struct {
		name              string
		md                metadata.MD
		headers           map[string]string
		wantTrace, wantPa string // "" : no span at all
	}{
		{"W3C in metadata", metadata.Pairs("traceparent", traceparent), nil, envoyTrace, envoySpan},
		{"metadata wins over headers", metadata.Pairs("traceparent", traceparent), clientHeaders, envoyTrace, envoySpan},
		{"W3C in headers", nil, clientHeaders, clientTrace, clientSpan},
		{"B3 single in metadata", metadata.Pairs("b3", envoyTrace+"-"+envoySpan+"-1"), nil, envoyTrace, envoySpan},
		{"B3 multi in headers", nil, map[string]string{"x-b3-traceid": clientTrace, "x-b3-spanid": clientSpan, "x-b3-sampled": "1"}, clientTrace, clientSpan},
		{"unsampled W3C", metadata.Pairs("traceparent", "00-"+envoyTrace+"-"+envoySpan+"-00"), nil, "", ""},
		{"unsampled B3", nil, map[string]string{"x-b3-traceid": clientTrace, "x-b3-spanid": clientSpan, "x-b3-sampled": "0"}, "", ""},
		{"no context: a root span", nil, nil, "new", "0000000000000000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exp.Reset()
			ctx := context.Background()
			if tc.md != nil {
				ctx = metadata.NewIncomingContext(ctx, tc.md)
			}
			headers := map[string]string{"x-api-key": "key-ada"}
			for k, v := range tc.headers {
				headers[k] = v
			}
			if _, err := srv.Check(ctx, NewRequest(RequestSpec{Method: "POST", Path: "/orders", Headers: headers, ID: "req-1"})); err != nil {
				t.Fatal(err)
			}
			spans := exp.GetSpans()
			if tc.wantTrace == "" {
				if len(spans) != 0 {
					t.Fatalf("an unsampled parent made %d spans", len(spans))
				}
				return
			}
			if len(spans) != 1 {
				t.Fatalf("%d spans, want 1", len(spans))
			}
			s := spans[0]
			if s.Name != tracing.CheckSpanName || s.SpanKind != trace.SpanKindServer {
				t.Errorf("span %q kind %v", s.Name, s.SpanKind)
			}
			if tc.wantTrace != "new" && s.SpanContext.TraceID().String() != tc.wantTrace {
				t.Errorf("trace %s, want %s", s.SpanContext.TraceID(), tc.wantTrace)
			}
			if got := s.Parent.SpanID().String(); got != tc.wantPa {
				t.Errorf("parent span %s, want %s", got, tc.wantPa)
			}
			if tc.wantTrace != "new" && !s.Parent.IsRemote() {
				t.Error("the parent is not marked remote")
			}
			a := attrs(s)
			if a["extauthz.outcome"].AsString() != "ok" || a["http.response.status_code"].AsInt64() != 200 ||
				a["extauthz.client"].AsString() != "ada" || a["extauthz.policy"].AsString() != "orders" {
				t.Errorf("attributes %v", s.Attributes)
			}
			if got := a["http.request.header.x-request-id"].AsStringSlice(); len(got) != 1 || got[0] != "req-1" {
				t.Errorf("x-request-id %v, want [req-1]", got)
			}
		})
	}
}

// TestCheckSpanOutcomes: a denial is a decision, recorded with its status
// and not as an error; a gRPC error (Envoy applies failure_mode_allow to
// it) is an error.
func TestCheckSpanOutcomes(t *testing.T) {
	srv, exp := tracedFixture(t, "policies:\n  - {name: p, limit: 1, window: 1m}\n", nil)
	for range 2 {
		srv.Check(context.Background(), NewRequest(RequestSpec{Method: "GET", Path: "/"}))
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	deny := spans[1]
	if a := attrs(deny); a["extauthz.outcome"].AsString() != "over_limit" || a["http.response.status_code"].AsInt64() != 429 || a["extauthz.policy"].AsString() != "p" {
		t.Errorf("denial attributes %v", deny.Attributes)
	}
	if deny.Status.Code == otelcodes.Error {
		t.Error("a 429 is marked as an error")
	}

	failing, exp := tracedFixture(t, "policies:\n  - {name: p, limit: 1, window: 1m}\n",
		engine.Limiters{config.ModeLocal: failingLimiter{}})
	if _, err := failing.Check(context.Background(), NewRequest(RequestSpec{Method: "GET", Path: "/"})); err == nil {
		t.Fatal("no gRPC error from a failing limiter")
	}
	spans = exp.GetSpans()
	if len(spans) != 1 || spans[0].Status.Code != otelcodes.Error || len(spans[0].Events) == 0 {
		t.Fatalf("spans %+v, want one with status Error and the error recorded", spans)
	}
}

type failingLimiter struct{}

func (failingLimiter) Take(context.Context, string, quota.Limit, int64, time.Time) (quota.Decision, error) {
	return quota.Decision{}, errors.New("broken")
}

func (failingLimiter) Refund(context.Context, string, quota.Limit, int64, time.Time) error {
	return nil
}

// TestCheckSpanHasRedisChildren: a store call made inside a Check (here a
// limiter that records one as redisstore.Store does) is a child of the
// Check's span.
func TestCheckSpanHasRedisChildren(t *testing.T) {
	srv, exp := tracedFixture(t, "policies:\n  - {name: p, limit: 1, window: 1m}\n",
		engine.Limiters{config.ModeLocal: callingLimiter{}})
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", "00-"+envoyTrace+"-"+envoySpan+"-01"))
	if _, err := srv.Check(ctx, NewRequest(RequestSpec{Method: "GET", Path: "/"})); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want the Redis call's and the Check's", len(spans))
	}
	redis, check := spans[0], spans[1]
	if redis.Name != "redis lease" || redis.Parent.SpanID() != check.SpanContext.SpanID() || redis.SpanContext.TraceID().String() != envoyTrace {
		t.Fatalf("redis span %q parent %s trace %s; Check span %s", redis.Name, redis.Parent.SpanID(), redis.SpanContext.TraceID(), check.SpanContext.SpanID())
	}
}

type callingLimiter struct{}

func (callingLimiter) Take(ctx context.Context, _ string, _ quota.Limit, _ int64, now time.Time) (quota.Decision, error) {
	tracing.RedisCall(ctx, "lease", now, now.Add(time.Millisecond), nil)
	return quota.Decision{Allowed: true}, nil
}

func (callingLimiter) Refund(context.Context, string, quota.Limit, int64, time.Time) error {
	return nil
}

// BenchmarkCheckLocalTracing is BenchmarkCheckLocal with tracing: off (a
// nil Tracer, what the process runs without OTEL_*), on with an unsampled
// parent from Envoy, and on with a sampled one (spans batched to an
// exporter that drops them, so the cost is the span's, not an export's).
func BenchmarkCheckLocalTracing(b *testing.B) {
	cfg, err := config.Parse([]byte(`
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: orders, match: {path_prefix: /orders}, key: [client], limit: 1000000000, window: 1s}
`), "bench")
	if err != nil {
		b.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))
	defer tp.Shutdown(context.Background())
	req := NewRequest(RequestSpec{Method: "POST", Path: "/orders", Headers: map[string]string{"x-api-key": "key-ada"}, ID: "4a1c2e0d-8d63-4bb9-9d7f-7c1f1e0f5a9b"})
	for _, bc := range []struct {
		name   string
		tracer *tracing.Tracer
		flags  string
	}{{"off", nil, "01"}, {"unsampled", tracing.New(tp), "00"}, {"sampled", tracing.New(tp), "01"}} {
		b.Run(bc.name, func(b *testing.B) {
			srv := NewServer(enginetest.New(b, cfg).Running, WithTracer(bc.tracer))
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", "00-"+envoyTrace+"-"+envoySpan+"-"+bc.flags))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if r, err := srv.Check(ctx, req); err != nil || r.GetStatus().GetCode() != 0 || r.GetOkResponse() == nil {
					b.Fatalf("want an allow (status OK with an OkResponse): %v, %v", r, err)
				}
			}
		})
	}
}

type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// TestDecisionLogRequestID: the sampled decision log carries the
// x-request-id Envoy gave the request, the one its access log prints.
func TestDecisionLogRequestID(t *testing.T) {
	cfg, err := config.Parse([]byte("policies:\n  - {name: p, limit: 10, window: 1m}\n"), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := NewServer(enginetest.New(t, cfg).Running, WithDecisionLog(log, 1))
	if _, err := srv.Check(context.Background(), NewRequest(RequestSpec{Method: "GET", Path: "/", ID: "4a1c2e0d-req"})); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), `"msg":"decision"`) || !strings.Contains(logs.String(), `"request_id":"4a1c2e0d-req"`) {
		t.Fatalf("decision log lacks the request id:\n%s", logs.String())
	}
}

// TestDecisionLogSaysWhatTheResponseSays: the sampled decision log names
// the client, the policy and the remaining count the response's dynamic
// metadata gives (none for a 401), read from the Verdict.
func TestDecisionLogSaysWhatTheResponseSays(t *testing.T) {
	cfg, err := config.Parse([]byte(ordersYAML), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := NewServer(enginetest.New(t, cfg).Running, WithDecisionLog(log, 1))
	for i, c := range []struct {
		key              string
		outcome          string
		client, policy   string
		remaining        float64
		metadataOmitsAll bool
	}{
		{"key-ada", "ok", "ada", "orders", 2, false},
		{"key-ada", "ok", "ada", "orders", 1, false},
		{"key-ada", "ok", "ada", "orders", 0, false},
		{"key-ada", "over_limit", "ada", "orders", 0, false},
		{"key-nobody", "unauthorized", "", "", 0, true},
	} {
		logs.Reset()
		resp, err := srv.Check(context.Background(), NewRequest(RequestSpec{Method: "POST", Path: "/orders", Headers: map[string]string{"x-api-key": c.key}}))
		if err != nil {
			t.Fatal(err)
		}
		var line struct {
			Outcome, Client, Policy string
			Remaining               float64
		}
		if err := json.Unmarshal([]byte(logs.String()), &line); err != nil {
			t.Fatalf("request %d: %v in %q", i, err, logs.String())
		}
		md := resp.GetDynamicMetadata().AsMap()
		if c.metadataOmitsAll != (md["client"] == nil && md["policy"] == nil) {
			t.Fatalf("request %d: metadata %v", i, md)
		}
		if line.Outcome != c.outcome || line.Client != c.client || line.Policy != c.policy || line.Remaining != c.remaining {
			t.Errorf("request %d: logged %+v, want outcome %s, client %q, policy %q, remaining %v (metadata %v)",
				i, line, c.outcome, c.client, c.policy, c.remaining, md)
		}
		if !c.metadataOmitsAll && (md["client"] != c.client || md["policy"] != c.policy || md["remaining"] != c.remaining) {
			t.Errorf("request %d: metadata %v, want client %q, policy %q, remaining %v", i, md, c.client, c.policy, c.remaining)
		}
	}
}
