package tracing

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// clearOTEL unsets, for the test, every variable FromEnv reads itself.
func clearOTEL(t *testing.T) {
	for _, k := range []string{envEndpoint, envTracesEndpoint, envProtocol, envTracesProtocol, envExporter, envDisabled} {
		t.Setenv(k, "") // empty is unset, as the specification says
	}
}

func TestFromEnvOffUnlessAsked(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		on   bool
		err  string
	}{
		{"nothing set", nil, false, ""},
		{"endpoint", map[string]string{envEndpoint: "http://127.0.0.1:4318"}, true, ""},
		{"traces endpoint, grpc", map[string]string{envTracesEndpoint: "http://127.0.0.1:4317", envProtocol: "grpc"}, true, ""},
		{"exporter otlp, default endpoint", map[string]string{envExporter: "otlp"}, true, ""},
		{"exporter none wins", map[string]string{envEndpoint: "http://127.0.0.1:4318", envExporter: "none"}, false, ""},
		{"SDK disabled wins", map[string]string{envEndpoint: "http://127.0.0.1:4318", envDisabled: "true"}, false, ""},
		{"unknown exporter", map[string]string{envExporter: "zipkin"}, false, `OTEL_TRACES_EXPORTER="zipkin": choices are otlp, none`},
		{"unknown protocol", map[string]string{envEndpoint: "http://127.0.0.1:4318", envTracesProtocol: "http/json"}, false, `"http/json": choices are http/protobuf, grpc`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearOTEL(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			tr, err := FromEnv(context.Background(), "test", quiet)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (tr != nil) != tc.on {
				t.Fatalf("tracer %v, want on=%v", tr, tc.on)
			}
			// Nothing is listening: Shutdown's export may fail, but it
			// must return within its deadline.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			tr.Shutdown(ctx)
		})
	}
}

// TestNilTracer: what FromEnv returns with tracing off starts no span and
// reads nothing.
func TestNilTracer(t *testing.T) {
	var tr *Tracer
	ctx := context.Background()
	got, span := tr.StartCheck(ctx, map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	if got != ctx || span != nil {
		t.Fatalf("a nil Tracer returned %v, %v", got, span)
	}
	EndCheck(span, Result{Outcome: "ok"}, nil) // no panic
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedisCall: a call is a client span under the recording span in ctx,
// with the call's own start and end; without one it is nothing.
func TestRedisCall(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	end := start.Add(3 * time.Millisecond)

	RedisCall(context.Background(), "lease", start, end, nil)
	unsampled := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1},
	}))
	RedisCall(unsampled, "lease", start, end, nil)
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("%d spans without a recording parent", n)
	}

	ctx, parent := tp.Tracer("t").Start(context.Background(), "check")
	RedisCall(ctx, "lease", start, end, nil)
	RedisCall(ctx, "sliding_window", start, end, errors.New("redis: timeout"))
	parent.End()
	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans", len(spans))
	}
	ok, failed := spans[0], spans[1]
	if ok.Name != "redis lease" || ok.SpanKind != trace.SpanKindClient || !ok.StartTime.Equal(start) || !ok.EndTime.Equal(end) ||
		ok.Parent.SpanID() != parent.SpanContext().SpanID() || ok.Status.Code == otelcodes.Error {
		t.Errorf("lease span %+v", ok)
	}
	if failed.Status.Code != otelcodes.Error || failed.Status.Description != "redis: timeout" {
		t.Errorf("failed call's status %+v", failed.Status)
	}
}
