package tests

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// otlpCollector receives OTLP traces on 127.0.0.1, over gRPC (the
// collector's TraceService) or HTTP (POST /v1/traces, protobuf), as an
// OpenTelemetry Collector would. It keeps every span with its resource's
// service name.
type otlpCollector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []receivedSpan
}

type receivedSpan struct {
	service, version string
	span             *tracepb.Span
}

func (c *otlpCollector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		var service, version string
		for _, kv := range rs.GetResource().GetAttributes() {
			switch kv.GetKey() {
			case "service.name":
				service = kv.GetValue().GetStringValue()
			case "service.version":
				version = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, receivedSpan{service, version, s})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (c *otlpCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	if r.URL.Path != "/v1/traces" || err != nil {
		http.Error(w, fmt.Sprintf("%s: %v", r.URL.Path, err), http.StatusBadRequest)
		return
	}
	resp, _ := c.Export(r.Context(), &req)
	out, _ := proto.Marshal(resp)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// startCollector serves c over protocol ("grpc" or "http/protobuf") and
// returns the endpoint URL for OTEL_EXPORTER_OTLP_ENDPOINT.
func startCollector(t *testing.T, c *otlpCollector, protocol string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if protocol == "grpc" {
		srv := grpc.NewServer()
		collectortrace.RegisterTraceServiceServer(srv, c)
		go srv.Serve(l)
		t.Cleanup(srv.Stop)
	} else {
		srv := &http.Server{Handler: c, ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	return "http://" + l.Addr().String()
}

func (c *otlpCollector) byTrace(traceID string) []receivedSpan {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []receivedSpan
	for _, s := range c.spans {
		if hex.EncodeToString(s.span.GetTraceId()) == traceID {
			out = append(out, s)
		}
	}
	return out
}

// TestTracingContinuesEnvoysTrace runs the real binary with tracing turned
// on by the standard environment (OTEL_EXPORTER_OTLP_ENDPOINT and
// _PROTOCOL), in redis mode against a real redis-server, and sends Checks
// as Envoy does when it traces: the context of its ext_authz span in the
// gRPC metadata (W3C traceparent), or the client's B3 headers in the HTTP
// request. The spans the collector receives must continue those traces:
// the Check span's parent is Envoy's span, the Redis call's parent is the
// Check span. An unsampled traceparent yields no span. Nothing is polled:
// the spans are read after the process has exited, which proves they are
// exported at shutdown.
func TestTracingContinuesEnvoysTrace(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	cfg := fmt.Sprintf("redis: {addrs: [%s]}\n", srv.Addr) + ordersFor("limit: 100, window: 1m, mode: redis, algorithm: sliding_window")
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		t.Run(protocol, func(t *testing.T) {
			c := &otlpCollector{}
			endpoint := startCollector(t, c, protocol)
			s := startSidecarFile(t, writeConfig(t, cfg), []string{
				"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint,
				"OTEL_EXPORTER_OTLP_PROTOCOL=" + protocol,
				"OTEL_SERVICE_NAME=", "OTEL_TRACES_EXPORTER=", "OTEL_SDK_DISABLED=", "OTEL_TRACES_SAMPLER=",
			})
			const (
				w3cTrace, envoySpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
				b3Trace, clientSpan = "80f198ee56343ba864fe8b2a57d3eff7", "e457b5a2e4d86bd1"
				offTrace            = "0af7651916cd43dd8448eb211c80319c"
			)
			send := func(md metadata.MD, headers map[string]string, id string) {
				t.Helper()
				h := map[string]string{"x-api-key": "key-ada"}
				for k, v := range headers {
					h[k] = v
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if md != nil {
					ctx = metadata.NewOutgoingContext(ctx, md)
				}
				resp, err := s.Client.Check(ctx, check.NewRequest(check.RequestSpec{Method: "GET", Path: "/orders", Headers: h, ID: id}))
				if err != nil || resp.GetOkResponse() == nil {
					t.Fatalf("Check: %v %v", resp, err)
				}
			}
			send(metadata.Pairs("traceparent", "00-"+w3cTrace+"-"+envoySpan+"-01"), nil, "req-w3c")
			send(nil, map[string]string{"x-b3-traceid": b3Trace, "x-b3-spanid": clientSpan, "x-b3-sampled": "1"}, "req-b3")
			send(metadata.Pairs("traceparent", "00-"+offTrace+"-"+envoySpan+"-00"), nil, "req-off")
			if err := s.stop(); err != nil {
				t.Fatalf("stopping extauthz: %v", err)
			}

			for _, tc := range []struct{ trace, parent, requestID string }{
				{w3cTrace, envoySpan, "req-w3c"},
				{b3Trace, clientSpan, "req-b3"},
			} {
				spans := c.byTrace(tc.trace)
				var checkSpan, redisSpan *tracepb.Span
				for _, rs := range spans {
					if rs.service != "extauthz" || rs.version == "" {
						t.Errorf("span %q from service %q version %q, want extauthz and its version", rs.span.GetName(), rs.service, rs.version)
					}
					switch rs.span.GetName() {
					case "envoy.service.auth.v3.Authorization/Check":
						checkSpan = rs.span
					case "redis sliding_window":
						redisSpan = rs.span
					}
				}
				if checkSpan == nil || redisSpan == nil || len(spans) != 2 {
					t.Fatalf("trace %s: %d spans %v, want the Check's and its Redis call's", tc.trace, len(spans), spans)
				}
				if got := hex.EncodeToString(checkSpan.GetParentSpanId()); got != tc.parent {
					t.Errorf("trace %s: Check span's parent %s, want Envoy's span %s", tc.trace, got, tc.parent)
				}
				if checkSpan.GetKind() != tracepb.Span_SPAN_KIND_SERVER || redisSpan.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
					t.Errorf("kinds: Check %v, Redis %v", checkSpan.GetKind(), redisSpan.GetKind())
				}
				if !proto.Equal(wrapID(redisSpan.GetParentSpanId()), wrapID(checkSpan.GetSpanId())) {
					t.Errorf("trace %s: the Redis span's parent %x is not the Check span %x", tc.trace, redisSpan.GetParentSpanId(), checkSpan.GetSpanId())
				}
				if redisSpan.GetStartTimeUnixNano() < checkSpan.GetStartTimeUnixNano() || redisSpan.GetEndTimeUnixNano() > checkSpan.GetEndTimeUnixNano() {
					t.Errorf("trace %s: the Redis call does not lie within the Check", tc.trace)
				}
				if got := spanAttr(checkSpan, "http.request.header.x-request-id"); got != tc.requestID {
					t.Errorf("trace %s: x-request-id %q, want %q", tc.trace, got, tc.requestID)
				}
			}
			if spans := c.byTrace(offTrace); len(spans) != 0 {
				t.Errorf("an unsampled traceparent produced %d spans", len(spans))
			}
		})
	}
}

// wrapID makes a span id comparable with proto.Equal, which tells an empty
// id from a missing one as bytes.Equal would not.
func wrapID(id []byte) *tracepb.Span { return &tracepb.Span{SpanId: id} }

// spanAttr returns a string (or the first of a string array) attribute.
func spanAttr(s *tracepb.Span, key string) string {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() != key {
			continue
		}
		if a := kv.GetValue().GetArrayValue(); a != nil && len(a.GetValues()) > 0 {
			return a.GetValues()[0].GetStringValue()
		}
		return kv.GetValue().GetStringValue()
	}
	return ""
}
