// Package check implements Envoy's envoy.service.auth.v3.Authorization
// service: CheckRequest → caller identity → matching policies → quota →
// CheckResponse. Every mapping between Envoy's protocol and the sidecar's
// decisions lives here.
package check

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/identity"
	"github.com/extauthz/extauthz/internal/metrics"
	"github.com/extauthz/extauthz/internal/quota"
)

// ClientIDHeader carries the verified client id to the upstream. It is
// removed from requests with no verified client, so a caller cannot forge it.
const ClientIDHeader = "x-client-id"

// Outcomes of a Check, as counted in extauthz_checks_total.
const (
	OutcomeOK           = "ok"
	OutcomeOverLimit    = "over_limit"
	OutcomeUnauthorized = "unauthorized"
	OutcomeUnavailable  = "unavailable"
	OutcomeError        = "error"
	OutcomeCanceled     = "canceled" // the caller gave up while its request was held
)

// Server is the Authorization service. It is safe for concurrent use; Update
// swaps the configuration without blocking Checks in flight.
type Server struct {
	authv3.UnimplementedAuthorizationServer

	limiters Limiters
	metrics  *metrics.Metrics
	now      func() time.Time
	hold     holdFunc
	engine   atomic.Pointer[engine]
	outcomes map[string]prometheus.Counter

	log         *slog.Logger // sampled decision log, at debug level
	sampleEvery uint64       // log one decision in this many; 0: none
	sampled     atomic.Uint64
	warn        *slog.Logger // requests refused by a cap; nil: not logged
}

// Option configures a Server.
type Option func(*Server)

// WithClock sets the source of decision instants (by default the instant
// the Check arrived). Each Check reads it once.
func WithClock(now func() time.Time) Option { return func(s *Server) { s.now = now } }

// WithDecisionLog logs one decision in every `every` at debug level, when
// log is enabled for debug: the outcome, client id, policy, remaining count
// and latency. Never the API key or the partition key. Whatever `every` is, log also receives a
// warning, once per configuration, when a request matches more than
// MaxPoliciesPerRequest policies.
func WithDecisionLog(log *slog.Logger, every int) Option {
	return func(s *Server) {
		s.warn = log
		// The level is fixed at start-up: without debug, Check does not
		// even count decisions (a shared atomic on every call).
		if every > 0 && log != nil && log.Enabled(context.Background(), slog.LevelDebug) {
			s.log, s.sampleEvery = log, uint64(every)
		}
	}
}

// New returns a Server enforcing cfg with the given limiters, one per mode
// the configuration uses.
func New(cfg *config.Config, limiters Limiters, m *metrics.Metrics, opts ...Option) (*Server, error) {
	s := &Server{limiters: limiters, metrics: m, hold: sleepCtx, outcomes: map[string]prometheus.Counter{}}
	for _, o := range []string{OutcomeOK, OutcomeOverLimit, OutcomeUnauthorized, OutcomeUnavailable, OutcomeError, OutcomeCanceled} {
		s.outcomes[o] = m.Checks.WithLabelValues(o)
	}
	for _, o := range opts {
		o(s)
	}
	if err := s.Update(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// Update compiles cfg and makes it the running configuration. On error the
// running configuration stays.
func (s *Server) Update(cfg *config.Config) error {
	e, err := compile(cfg, s.limiters, s.metrics)
	if err != nil {
		return err
	}
	e.warn = s.warn
	e.hold = s.hold
	s.engine.Store(e)
	s.metrics.ConfigPolicies.Set(float64(len(e.policies)))
	return nil
}

// Config returns the running configuration.
func (s *Server) Config() *config.Config { return s.engine.Load().cfg }

// Check implements envoy.service.auth.v3.Authorization.
func (s *Server) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	start := time.Now()
	now := start
	if s.now != nil {
		now = s.now()
	}
	resp, outcome, err := s.engine.Load().decide(ctx, req, now)
	s.outcomes[outcome].Inc()
	took := time.Since(start)
	s.metrics.CheckDuration.Observe(took.Seconds())
	if s.sampleEvery > 0 && s.sampled.Add(1)%s.sampleEvery == 0 {
		f := resp.GetDynamicMetadata().GetFields()
		s.log.Debug("decision", "outcome", outcome, "client", f["client"].GetStringValue(),
			"policy", f["policy"].GetStringValue(), "remaining", f["remaining"].GetNumberValue(),
			"latency", took, "sampled_one_in", s.sampleEvery)
	}
	return resp, err
}

// statusOK is the gRPC status of every allowed Check, shared read-only.
var statusOK = &status.Status{Code: int32(codes.OK)}

// taken is one policy's decision for the request in hand.
type taken struct {
	p   *policy
	key string
	lim limit
	ok  bool // allowed (for a shadow policy: would have been)
	d   quota.Decision
}

func (e *engine) decide(ctx context.Context, req *authv3.CheckRequest, now time.Time) (*authv3.CheckResponse, string, error) {
	a := newAttrs(req)

	// 1. Identify the caller. A presented key that is not known is a 401
	// before any policy runs, and leaves no state behind.
	caller, credHeader, keyLen := e.identify(&a)
	if credHeader != "" && caller == nil {
		if keyLen > identity.MaxKeyLen {
			return unauthorized(keyTooLong), OutcomeUnauthorized, nil
		}
		return unauthorized("Unknown API key."), OutcomeUnauthorized, nil
	}

	// 2. Find the policies that apply and their partition keys. Keys are
	// built before any quota is taken, so a rejection needs no refunds.
	var buf [8]taken
	takes := buf[:0]
	for _, p := range e.policies {
		if !p.matches(&a) {
			continue
		}
		if len(takes) == MaxPoliciesPerRequest {
			return e.tooManyPolicies(ctx), OutcomeError, nil
		}
		key, missing := p.partition(&a, caller, e.cfg.IPTrustedHops)
		if missing && p.OnMissingKey == config.MissingReject {
			return unauthorized(missingDetail(p)), OutcomeUnauthorized, nil
		}
		takes = append(takes, taken{p: p, key: key, lim: p.limitFor(caller)})
	}

	// 3. Ask every policy for one unit.
	denied := false
	for i := range takes {
		t := &takes[i]
		d, err := t.p.limiter.Take(ctx, t.key, t.lim.Limit, now)
		if err != nil {
			e.refund(ctx, takes[:i], now)
			return nil, OutcomeError, grpcstatus.Errorf(codes.Internal, "policy %s: %v", t.p.Name, err)
		}
		t.d = d
		t.ok = d.Allowed
		if d.Degraded != quota.NotDegraded {
			t.p.degraded[d.Degraded].Inc()
		}
		switch {
		case d.Allowed:
			t.p.allowed.Inc()
		case t.p.Shadow:
			t.p.shadowDenied.Inc()
		default:
			t.p.denied.Inc()
			denied = true
		}
	}

	// 4. A request denied by one policy consumes nothing from the others.
	if denied {
		e.refund(ctx, takes, now)
		if unavailable(takes) {
			return e.reducedCapacity(takes, caller), OutcomeUnavailable, nil
		}
		return e.overLimit(takes, caller), OutcomeOverLimit, nil
	}
	if err := e.holdAllowed(ctx, takes, now); err != nil {
		return nil, OutcomeCanceled, err
	}
	return e.allow(&a, takes, caller, credHeader), OutcomeOK, nil
}

// refund gives back the units that allowed policies took.
func (e *engine) refund(ctx context.Context, takes []taken, now time.Time) {
	for i := range takes {
		t := &takes[i]
		if t.ok {
			_ = t.p.limiter.Refund(ctx, t.key, t.lim.Limit, now)
			t.p.refunded.Inc()
		}
	}
}

// identify returns the client holding the presented API key, the header it
// came in and its length. A key that is presented but unknown (or longer
// than identity.MaxKeyLen, which is never hashed) yields (nil, header, n).
// With no keys configured, API keys are not in use and nothing is read.
func (e *engine) identify(a *attrs) (*client, string, int) {
	if e.keyring.Len() == 0 {
		return nil, "", 0
	}
	if v := strings.TrimSpace(a.headers[e.keyHeader]); v != "" {
		return e.keyring.Lookup(v), e.keyHeader, len(v)
	}
	if e.cfg.Clients.Bearer {
		if v, ok := identity.Bearer(a.headers["authorization"]); ok {
			return e.keyring.Lookup(v), "authorization", len(v)
		}
	}
	return nil, "", 0
}

// keyTooLong is the 401 detail for a presented key over identity.MaxKeyLen.
var keyTooLong = "API key longer than " + strconv.Itoa(identity.MaxKeyLen) + " bytes."

// MaxPoliciesPerRequest is the most policies one request may match. Each
// matched policy is one quota decision (in redis mode, one Redis round
// trip), taken one after another inside Envoy's ext_authz timeout. A
// request that matches more is refused with a 500 before any quota is
// taken: the configuration is at fault, not the caller, and an answer that
// enforced only some of the policies would be wrong.
const MaxPoliciesPerRequest = 32

// tooManyPolicies is the 500 for a request matching more than
// MaxPoliciesPerRequest policies. The first one under a configuration is
// logged as a warning; all are counted as outcome "error".
func (e *engine) tooManyPolicies(ctx context.Context) *authv3.CheckResponse {
	if e.warn != nil && e.warnedTooMany.CompareAndSwap(false, true) {
		e.warn.LogAttrs(ctx, slog.LevelWarn, "request matches too many policies; answering 500 (logged once per configuration)",
			slog.Int("max", MaxPoliciesPerRequest), slog.Int("policies", len(e.policies)), slog.String("config", e.cfg.Source))
	}
	return denied(codes.Internal, typev3.StatusCode_InternalServerError, nil, problem{
		Type:   problemBlank,
		Title:  "Internal Server Error",
		Status: 500,
		Detail: tooManyDetail,
	}, nil)
}

var tooManyDetail = "The request matches more than " + strconv.Itoa(MaxPoliciesPerRequest) +
	" rate limit policies; the sidecar's configuration must be fixed."

func missingDetail(p *policy) string {
	parts := make([]string, len(p.Key))
	for i, k := range p.Key {
		parts[i] = k.String()
	}
	return fmt.Sprintf("Policy %s needs %s to identify the caller.", p.Name, strings.Join(parts, ", "))
}

// unavailable reports whether every enforcing denial came from
// on_redis_error: deny, not from a count. A real over-limit answer wins.
func unavailable(takes []taken) bool {
	for i := range takes {
		t := &takes[i]
		if !t.ok && !t.p.Shadow && t.d.Degraded != quota.DegradedDeny {
			return false
		}
	}
	return true
}

// reducedCapacity is the 503 of on_redis_error: deny while Redis is
// unreachable.
func (e *engine) reducedCapacity(takes []taken, c *client) *authv3.CheckResponse {
	var wait time.Duration
	var names []string
	var first *policy
	for i := range takes {
		t := &takes[i]
		if !t.ok && !t.p.Shadow {
			wait = max(wait, t.d.RetryAfter)
			names = append(names, t.p.Name)
			if first == nil {
				first = t.p
			}
		}
	}
	retry := strconv.FormatInt(ceilSeconds(wait), 10)
	body := problem{
		Type:             ProblemReducedCapacity,
		Title:            "Service Unavailable",
		Status:           503,
		Detail:           "The rate limit store is unavailable. Retry after " + retry + " s.",
		ViolatedPolicies: names,
	}
	return denied(codes.Unavailable, typev3.StatusCode_ServiceUnavailable,
		[]*corev3.HeaderValueOption{header("retry-after", retry)}, body,
		metadata(c, first, resultUnavailable, nil))
}

// overLimit builds the 429. Retry-After is the longest wait among denying
// policies, and the RateLimit headers describe that policy, so the client is
// told one consistent time.
func (e *engine) overLimit(takes []taken, c *client) *authv3.CheckResponse {
	var worst *taken
	var violated []string
	for i := range takes {
		t := &takes[i]
		if t.ok || t.p.Shadow {
			continue
		}
		violated = append(violated, t.p.Name)
		if worst == nil || t.d.RetryAfter > worst.d.RetryAfter {
			worst = t
		}
	}
	wait := ceilSeconds(worst.d.RetryAfter)
	retry := strconv.FormatInt(wait, 10)
	headers := []*corev3.HeaderValueOption{
		header("retry-after", retry),
		header("ratelimit-policy", worst.lim.header),
		header("ratelimit", rateLimitHeader(worst.p.Name, worst.d.Remaining, time.Duration(wait)*time.Second)),
	}
	if e.cfg.Headers.Legacy {
		headers = append(headers, legacyHeaders(worst.d.Limit, worst.d.Remaining, time.Duration(wait)*time.Second)...)
	}
	body := problem{
		Type:             ProblemQuotaExceeded,
		Title:            "Too Many Requests",
		Status:           429,
		Detail:           "Retry after " + retry + " s.",
		ViolatedPolicies: violated,
	}
	return denied(codes.ResourceExhausted, typev3.StatusCode_TooManyRequests, headers, body,
		metadata(c, worst.p, resultOverLimit, &worst.d))
}

// allow builds the OK: RateLimit headers for the most constrained enforcing
// policy, the client id for the upstream, the credential stripped.
func (e *engine) allow(a *attrs, takes []taken, c *client, credHeader string) *authv3.CheckResponse {
	// Every part of the answer lives in one allocation: an allowed Check
	// is the hot path, and a dozen small objects per call showed up as
	// garbage-collection time under load.
	r := &okParts{}
	ok := &r.ok
	var tightest *taken
	for i := range takes {
		t := &takes[i]
		if t.p.Shadow {
			continue // shadow policies observe; clients never see them
		}
		if tightest == nil || t.d.Remaining < tightest.d.Remaining ||
			(t.d.Remaining == tightest.d.Remaining && t.d.ResetAfter > tightest.d.ResetAfter) {
			tightest = t
		}
	}
	var p *policy
	var d *quota.Decision
	if tightest != nil {
		p, d = tightest.p, &tightest.d
		r.rlValue = corev3.HeaderValue{Key: "ratelimit", Value: rateLimitHeader(p.Name, d.Remaining, d.ResetAfter)}
		r.rl = corev3.HeaderValueOption{Header: &r.rlValue, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
		ok.ResponseHeadersToAdd = append(r.addBuf[:0], tightest.lim.policyOpt, &r.rl)
		if e.cfg.Headers.Legacy {
			ok.ResponseHeadersToAdd = append(ok.ResponseHeadersToAdd, legacyHeaders(d.Limit, d.Remaining, d.ResetAfter)...)
		}
	}
	if c != nil {
		ok.Headers = append(r.setBuf[:0], c.idHeader)
	} else if _, forged := a.headers[ClientIDHeader]; forged {
		ok.HeadersToRemove = append(r.rmBuf[:0], ClientIDHeader)
	}
	if credHeader != "" && e.cfg.Clients.Strip {
		if ok.HeadersToRemove == nil {
			ok.HeadersToRemove = r.rmBuf[:0]
		}
		ok.HeadersToRemove = append(ok.HeadersToRemove, credHeader)
	}
	r.http.OkResponse = ok
	r.resp.Status = statusOK
	r.resp.HttpResponse = &r.http
	r.resp.DynamicMetadata = r.metadata(c, p, resultOK, d)
	return &r.resp
}

// okParts holds every message of an allowed CheckResponse, so building one
// costs one allocation (and the metadata map). The messages are never
// copied: only pointers into this struct escape.
type okParts struct {
	resp    authv3.CheckResponse
	http    authv3.CheckResponse_OkResponse
	ok      authv3.OkHttpResponse
	addBuf  [2]*corev3.HeaderValueOption
	setBuf  [1]*corev3.HeaderValueOption
	rmBuf   [2]string
	rl      corev3.HeaderValueOption
	rlValue corev3.HeaderValue
	md      structpb.Struct
	rem     structpb.Value
	remNum  structpb.Value_NumberValue
}

// metadata fills the dynamic metadata inside r; see metadata.
func (r *okParts) metadata(c *client, p *policy, result *structpb.Value, d *quota.Decision) *structpb.Struct {
	r.md.Fields = metadataFields(c, p, result)
	if d != nil {
		r.remNum.NumberValue = float64(max(d.Remaining, 0))
		r.rem.Kind = &r.remNum
		r.md.Fields["remaining"] = &r.rem
	}
	return &r.md
}

func legacyHeaders(limit, remaining int64, reset time.Duration) []*corev3.HeaderValueOption {
	return []*corev3.HeaderValueOption{
		header("x-ratelimit-limit", strconv.FormatInt(limit, 10)),
		header("x-ratelimit-remaining", strconv.FormatInt(max(remaining, 0), 10)),
		header("x-ratelimit-reset", strconv.FormatInt(ceilSecondsMin0(reset), 10)),
	}
}
