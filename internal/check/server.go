// Package check is the gRPC door: Envoy's envoy.service.auth.v3
// Authorization service. A Check is read into an engine.Request
// (request.go), decided by the engine (internal/engine), and answered as
// the CheckResponse Envoy turns into an HTTP answer (respond.go). Every
// mapping between Envoy's ext_authz protocol and the decision lives here.
package check

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/tracing"
)

// Door is this door's name in the metrics: extauthz_checks_total{door="grpc"}.
const Door = "grpc"

// Server is the Authorization service. It is safe for concurrent use;
// Update swaps the configuration without blocking Checks in flight.
type Server struct {
	authv3.UnimplementedAuthorizationServer

	door *engine.DoorMetrics
	now  func() time.Time
	// rendered holds the response parts this door renders once per
	// configuration.
	rendered *engine.PerEngine[prerendered]

	log         *slog.Logger // sampled decision log, at debug level
	sampleEvery uint64       // log one decision in this many; 0: none
	sampled     atomic.Uint64

	tracer *tracing.Tracer // nil: no spans
}

// Option configures a Server.
type Option func(*Server)

// WithClock sets the source of decision instants (by default the instant
// the Check arrived). Each Check reads it once.
func WithClock(now func() time.Time) Option { return func(s *Server) { s.now = now } }

// WithDecisionLog logs one decision in every `every` at debug level, when
// log is enabled for debug: the outcome, client id, policy, remaining count
// and latency. Never the API key or the partition key. (The warning of a
// request matching more than engine.MaxPoliciesPerRequest policies is the
// Running's: engine.WithWarnings.)
func WithDecisionLog(log *slog.Logger, every int) Option {
	return func(s *Server) {
		// The level is fixed at start-up: without debug, Check does not
		// even count decisions (a shared atomic on every call).
		if every > 0 && log != nil && log.Enabled(context.Background(), slog.LevelDebug) {
			s.log, s.sampleEvery = log, uint64(every)
		}
	}
}

// WithTracer makes a span of every Check (and of its Redis calls). A nil
// Tracer, what tracing.FromEnv returns when tracing is off, makes none.
func WithTracer(t *tracing.Tracer) Option { return func(s *Server) { s.tracer = t } }

// NewServer returns a Server deciding with running, the configuration the
// process's doors share: a reload compiles it once for all of them.
func NewServer(running *engine.Running, opts ...Option) *Server {
	s := &Server{door: running.Metrics().Door(Door), rendered: engine.NewPerEngine(running, prerender)}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Check implements envoy.service.auth.v3.Authorization.
func (s *Server) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	start := time.Now()
	now := start
	if s.now != nil {
		now = s.now()
	}
	if req.GetAttributes() == undecodable {
		s.door.Observe(engine.Failed, time.Since(start).Seconds())
		return undecodableResponse, nil
	}
	eng, pre := s.rendered.Get()
	r := newRequest(req)
	ctx, span := s.tracer.StartCheck(ctx, r.Headers)
	var v engine.Verdict
	err := eng.Decide(ctx, &r, now, &v)
	var resp *authv3.CheckResponse
	switch {
	case err != nil:
		err = DecisionError(err, v.Outcome, "")
	case v.Outcome == engine.OK:
		resp = pre.allow(&v, eng.Config())
	default:
		resp = pre.deny(&v, eng.Config())
	}
	took := time.Since(start)
	s.door.Observe(v.Outcome, took.Seconds())
	if span != nil {
		client, policy, _ := reported(&v)
		tracing.EndCheck(span, tracing.Result{Outcome: v.Outcome.String(), Status: decisionStatus(resp),
			Policy: policy, Client: client,
			RequestID: r.Headers[RequestIDHeader]}, err)
	}
	if s.sampleEvery > 0 && s.sampled.Add(1)%s.sampleEvery == 0 {
		client, policy, remaining := reported(&v)
		s.log.Debug("decision", "outcome", v.Outcome.String(), "client", client,
			"policy", policy, "remaining", float64(remaining),
			"latency", took, "request_id", r.Headers[RequestIDHeader], "sampled_one_in", s.sampleEvery)
	}
	return resp, err
}
