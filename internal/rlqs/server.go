// Package rlqs is the door of Envoy's rate limit quota service,
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService: Envoy's
// rate_limit_quota HTTP filter opens one stream, reports each bucket's
// usage every reporting interval, and enforces on its own the assignments
// the sidecar sends back (a token bucket, or ALLOW_ALL or DENY_ALL, each
// with a time to live), so no request waits on a call.
//
// A bucket id maps, by the rlqs section's rules (config.RLQS), to a policy
// of the configuration and a partition key; the policy is the Engine's
// own, so a token bucket assignment's tokens are taken (engine.TakeAll)
// from the count a Check and a rate limit descriptor on the same key
// take from, in the policy's mode: in Redis for redis and hybrid mode
// (through hybrid's leases), from the local fallback share while Redis is
// unreachable. Tokens leave the count before Envoy may spend them
// (assign.go), so the Envoys together never admit more than one bucket.
// Each stream's bucket is a holder of its key (holders.go); the key's
// limit is divided among its holders by their reported demand, and a
// holder whose share moves is sent its new assignment at once.
package rlqs

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/extauthz/extauthz/internal/engine"
)

// ServiceName is the gRPC service this door serves.
const ServiceName = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"

// Server is the rate limit quota service. It is safe for concurrent use;
// a reload (the Running's next Engine) takes effect at each stream's next
// report: a bucket whose rule is gone is abandoned.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	running *engine.Running
	own     *Metrics
	now     func() time.Time
	log     *slog.Logger
	holders *holders
	current atomic.Pointer[compiled] // the rlqs section against the Engine in force

	mu      sync.Mutex // guards streams
	streams int
	closing chan struct{} // closed by Close: every stream ends
	closed  sync.Once
}

// Option configures a Server.
type Option func(*Server)

// WithClock sets the source of instants (time.Now by default).
func WithClock(now func() time.Time) Option { return func(s *Server) { s.now = now } }

// WithLog receives the door's warnings (nothing by default).
func WithLog(log *slog.Logger) Option { return func(s *Server) { s.log = log } }

// WithMetrics counts the door's own events in m (by default in collectors
// registered nowhere).
func WithMetrics(m *Metrics) Option { return func(s *Server) { s.own = m } }

// New returns a Server assigning from running's policies with its
// limiters.
func New(running *engine.Running, opts ...Option) *Server {
	s := &Server{running: running, own: NewMetrics(nil), now: time.Now, log: slog.New(slog.DiscardHandler), holders: newHolders(), closing: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	return s
}

// rules returns the rlqs section resolved against the Engine in force,
// compiling it once per Engine.
func (s *Server) rules() *compiled {
	eng := s.running.Engine()
	if c := s.current.Load(); c != nil && c.eng == eng {
		return c
	}
	c := compile(eng)
	s.current.Store(c)
	return c
}

// Close ends every stream with UNAVAILABLE and refuses new ones, so the
// gRPC server's graceful stop is not held by streams that last as long as
// Envoy runs. Envoy reopens its stream (to another replica) at its next
// report; the assignments it holds stay in force until they end.
func (s *Server) Close() { s.closed.Do(func() { close(s.closing) }) }

// errClosing ends a stream when the process shuts down.
var errClosing = grpcstatus.Error(codes.Unavailable, "rlqs: shutting down; reconnect")

// StreamRateLimitQuotas serves one Envoy's stream.
func (s *Server) StreamRateLimitQuotas(ss rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	max := s.running.Config().RLQS.MaxStreams
	s.mu.Lock()
	if s.streams >= max {
		s.mu.Unlock()
		s.own.refused.WithLabelValues(reasonTooManyStream).Inc()
		return grpcstatus.Errorf(codes.ResourceExhausted, "rlqs: this process serves %d streams (rlqs.max_streams); retry later or on another replica", max)
	}
	s.streams++
	s.mu.Unlock()
	s.own.streams.Inc()
	defer func() {
		s.mu.Lock()
		s.streams--
		s.mu.Unlock()
		s.own.streams.Dec()
	}()
	select {
	case <-s.closing:
		return errClosing
	default:
	}

	st := newStream(s, ss)
	defer st.release()
	reports := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	recvErr := make(chan error, 1)
	ctx := ss.Context()
	go func() {
		for {
			r, err := ss.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reports <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case r := <-reports:
			resp, err := st.report(ctx, r, s.now())
			if err != nil {
				return err
			}
			if err := st.send(resp); err != nil {
				return err
			}
		case <-st.poke:
			if err := st.send(st.reshare(ctx, s.now())); err != nil {
				return err
			}
		case err := <-recvErr:
			if errors.Is(err, errEOF) || grpcstatus.Code(err) == codes.Canceled {
				return nil
			}
			return err
		case <-s.closing:
			return errClosing
		case <-ctx.Done():
			return nil
		}
	}
}
