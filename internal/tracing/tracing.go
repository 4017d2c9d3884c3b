// Package tracing exports OpenTelemetry spans for decisions: one server span
// per Check, continuing the trace Envoy sends, and a client span per Redis
// call made inside it.
//
// Tracing is off unless the standard OTEL_* environment asks for it (see
// FromEnv). Off, the hooks cost a nil check: a Check makes no extra
// allocation and reads no header (BenchmarkCheckLocal, docs/benchmarks.md).
//
// The parent of a Check span is, in order:
//
//  1. the trace context in the gRPC request's metadata: Envoy's ext_authz
//     filter, when Envoy traces, starts a child span for the Check call and
//     sends its context there;
//  2. the trace context in the HTTP request's headers inside the
//     CheckRequest: what the client or an earlier proxy sent (Istio's
//     proxies propagate B3 and W3C headers even when they do not report).
//
// Both W3C Trace Context (traceparent, tracestate) and B3 (the single b3
// header and the multi-header x-b3-* form, as Zipkin-configured Envoys and
// Istio send) are read. Envoy's sampling decision is kept: with the default
// sampler (parentbased_always_on) an unsampled parent yields no span.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/propagators/b3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// ScopeName is the instrumentation scope of every span this package makes.
const ScopeName = "github.com/extauthz/extauthz"

// Tracer starts decision spans. A nil *Tracer is valid and traces nothing:
// it is what FromEnv returns when tracing is off.
type Tracer struct {
	tracer   trace.Tracer
	provider *sdktrace.TracerProvider // nil when built by New for tests
}

// New returns a Tracer that starts spans with tp. Tests and benchmarks use
// it with an in-memory exporter; the process uses FromEnv.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{tracer: tp.Tracer(ScopeName)}
}

// propagators read W3C Trace Context, then B3 (either encoding), in that
// order: the first valid context found wins.
var propagators = [...]propagation.TextMapPropagator{propagation.TraceContext{}, b3.New()}

// extract returns the first valid span context c carries, or an invalid
// one.
func extract(c propagation.TextMapCarrier) trace.SpanContext {
	for _, p := range propagators {
		if sc := trace.SpanContextFromContext(p.Extract(context.Background(), c)); sc.IsValid() {
			return sc
		}
	}
	return trace.SpanContext{}
}

// checkStart is every Check span's start options, built once: options
// built per call would cost allocations on every Check.
var checkStart = []trace.SpanStartOption{
	trace.WithSpanKind(trace.SpanKindServer),
	trace.WithAttributes(semconv.RPCSystemNameGRPC, semconv.RPCMethod(CheckSpanName)),
}

// Environment variables FromEnv reads itself; the SDK and the OTLP
// exporters read the rest (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
// OTEL_TRACES_SAMPLER[_ARG], OTEL_BSP_*, OTEL_EXPORTER_OTLP_[TRACES_]
// HEADERS, TIMEOUT, COMPRESSION, CERTIFICATE, INSECURE ...).
const (
	envEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	envExporter       = "OTEL_TRACES_EXPORTER"
	envDisabled       = "OTEL_SDK_DISABLED"
)

// FromEnv builds the process's Tracer from the standard OpenTelemetry
// environment. Tracing is on when an OTLP endpoint is set
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), or
// OTEL_TRACES_EXPORTER is otlp; it is off otherwise, and whenever
// OTEL_TRACES_EXPORTER is none or OTEL_SDK_DISABLED is true: then FromEnv
// returns a nil Tracer, which traces nothing. The protocol is
// OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL: http/protobuf (the specification's
// default, port 4318) or grpc (port 4317). version becomes
// service.version; the service name defaults to extauthz.
//
// A setting the SDK cannot use (an unknown exporter or protocol) is an
// error, so a typo does not silently leave tracing off.
func FromEnv(ctx context.Context, version string, log *slog.Logger) (*Tracer, error) {
	if strings.EqualFold(getenv(envDisabled), "true") {
		return nil, nil
	}
	exp := getenv(envExporter)
	ep, tep := getenv(envEndpoint) != "", getenv(envTracesEndpoint) != ""
	switch exp {
	case "none":
		return nil, nil
	case "otlp":
	case "":
		if !ep && !tep {
			return nil, nil
		}
	default:
		return nil, fmt.Errorf("tracing: %s=%q: choices are otlp, none", envExporter, exp)
	}
	proto := getenv(envTracesProtocol)
	if proto == "" {
		proto = getenv(envProtocol)
	}
	var (
		exporter sdktrace.SpanExporter
		err      error
	)
	switch proto {
	case "", "http/protobuf":
		proto = "http/protobuf"
		exporter, err = otlptracehttp.New(ctx)
	case "grpc":
		exporter, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("tracing: %s=%q: choices are http/protobuf, grpc", envProtocol, proto)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// Later detectors win: OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME
	// over the service name and version set here. host.name is the pod's
	// name in Kubernetes.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("extauthz"), semconv.ServiceVersion(version)),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	// Export failures (a collector that is down) go to the structured log,
	// not to the OpenTelemetry SDK's default unstructured one.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing", "error", err.Error())
	}))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	log.Info("tracing on", "protocol", proto, "endpoint", redactEndpoint(tep))
	t := New(tp)
	t.provider = tp
	return t, nil
}

// getenv returns an environment variable, trimmed. As the OpenTelemetry
// specification says, an empty value is the same as an unset one.
func getenv(name string) string { return strings.TrimSpace(os.Getenv(name)) }

// redactEndpoint returns the configured endpoint for the start-up log,
// without any user information in it.
func redactEndpoint(traces bool) string {
	v := getenv(envEndpoint)
	if traces {
		v = getenv(envTracesEndpoint)
	}
	if v == "" {
		return "(the exporter's default)"
	}
	if u, err := url.Parse(v); err == nil && u.User != nil {
		u.User = nil
		return u.String()
	}
	return v
}

// Shutdown exports the spans still buffered and stops the exporter. It is
// safe on a nil Tracer.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil || t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// CheckSpanName is the Check span's name, as the gRPC semantic conventions
// name a server span: the full method without its leading slash.
const CheckSpanName = "envoy.service.auth.v3.Authorization/Check"

// StartCheck starts the span of one Check: a server span whose parent is
// the trace context in the gRPC metadata, else the one in headers (the
// HTTP request's, as the CheckRequest carries them). On a nil Tracer it
// returns ctx and a nil span, and reads nothing.
func (t *Tracer) StartCheck(ctx context.Context, headers map[string]string) (context.Context, trace.Span) {
	// Small enough to inline: with tracing off, a Check pays this nil
	// check and nothing else.
	if t == nil {
		return ctx, nil
	}
	return t.startCheck(ctx, headers)
}

func (t *Tracer) startCheck(ctx context.Context, headers map[string]string) (context.Context, trace.Span) {
	sc := extract(incomingCarrier{ctx})
	if !sc.IsValid() && len(headers) > 0 {
		sc = extract(propagation.MapCarrier(headers))
	}
	if sc.IsValid() {
		// The parent is the extracted context; everything else (the
		// caller's deadline and cancellation, gRPC's values) comes from
		// ctx.
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	return t.tracer.Start(ctx, CheckSpanName, checkStart...)
}

// Result is what a Check span records of its decision.
type Result struct {
	Outcome   string // extauthz_checks_total's outcome: ok, over_limit, unauthorized, ...
	Status    int    // the HTTP status Envoy answers with: 200 when allowed
	Policy    string // the deciding policy; "" when none
	Client    string // the verified client id; "" when anonymous
	RequestID string // x-request-id, as Envoy logs it
}

// EndCheck records r on span and ends it. A gRPC error (a real internal
// failure: Envoy then applies failure_mode_allow) marks the span as an
// error; a denial is a decision, not an error. A nil span is ignored.
func EndCheck(span trace.Span, r Result, err error) {
	if span == nil {
		return
	}
	if !span.IsRecording() { // unsampled: nothing would be kept
		span.End()
		return
	}
	attrs := make([]attribute.KeyValue, 0, 5)
	attrs = append(attrs, attribute.String("extauthz.outcome", r.Outcome))
	if r.Status > 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(r.Status))
	}
	if r.Policy != "" {
		attrs = append(attrs, attribute.String("extauthz.policy", r.Policy))
	}
	if r.Client != "" {
		attrs = append(attrs, attribute.String("extauthz.client", r.Client))
	}
	if r.RequestID != "" {
		attrs = append(attrs, attribute.StringSlice("http.request.header.x-request-id", []string{r.RequestID}))
	}
	span.SetAttributes(attrs...)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// RedisCall records one Redis script call, made between start and end, as
// a client span under the span in ctx (a Check's). Without a recording
// span in ctx (tracing off, an unsampled trace, a background call such as
// a heartbeat) it does nothing. The span is recorded once the call is
// over, with its real start and end: the call's own context is never
// replaced, so tracing cannot change what the call does.
func RedisCall(ctx context.Context, op string, start, end time.Time, err error) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return
	}
	_, span := parent.TracerProvider().Tracer(ScopeName).Start(ctx, "redis "+op,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(start),
		trace.WithAttributes(
			semconv.DBSystemNameRedis,
			semconv.DBOperationName("EVALSHA"),
			attribute.String("extauthz.redis.op", op),
		))
	if err != nil {
		span.RecordError(err, trace.WithTimestamp(end))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// incomingCarrier reads a trace context from the gRPC request's metadata
// (lower-case keys, like the propagators' header names) one key at a time,
// without copying the whole metadata as metadata.FromIncomingContext does:
// the propagators ask for a handful of keys, usually absent.
type incomingCarrier struct{ ctx context.Context }

func (c incomingCarrier) Get(key string) string {
	if v := metadata.ValueFromIncomingContext(c.ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set is never called: the sidecar extracts, it does not inject.
func (c incomingCarrier) Set(string, string) {}

// Keys is not used by the W3C and B3 propagators' Extract.
func (c incomingCarrier) Keys() []string { return nil }
