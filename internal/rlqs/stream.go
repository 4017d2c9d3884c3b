package rlqs

import (
	"context"
	"io"
	"math"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	ratelimitstrategyv3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/extauthz/extauthz/internal/engine"
)

var errEOF = io.EOF

// The bounds of one report, besides rlqs.max_buckets_per_stream entries.
const (
	// maxElapsed is the longest time_elapsed a report may give: Envoy
	// reports every reporting interval (seconds), and counts from the
	// bucket's creation in its first report.
	maxElapsed = 24 * time.Hour
	// maxCount bounds num_requests_allowed and num_requests_denied: more
	// than 2^32 requests of one bucket in one report is not a report.
	maxCount = 1 << 32
	// maxBucketIDEntries and maxBucketIDBytes bound one bucket id.
	maxBucketIDEntries = 16
	maxBucketIDBytes   = 4096
	// minDemandInterval is the shortest interval a demand is measured
	// over, so two reports close together do not read as a surge.
	minDemandInterval = 250 * time.Millisecond
)

// action is what Envoy was last told for a bucket.
type action uint8

const (
	actionNone   action = iota
	actionTokens        // a token bucket, paid for until paidUntil
	actionDeny          // DENY_ALL
	actionAllow         // ALLOW_ALL
)

// held is one bucket of one stream: what Envoy holds for it and what the
// sidecar has taken from the count for it. Only its stream's goroutine
// touches it.
type held struct {
	id     *rlqsv3.BucketId
	policy *engine.Policy // nil: no rule maps it (unknown)
	key    string         // the partition key, when policy is set
	joined bool           // a holder of key in Server.holders
	st     *stream        // the stream it belongs to
	// stale: its share moved (another stream's goroutine sets it, then
	// pokes st): reassign at the next chance.
	stale atomic.Bool

	last      action
	spec      bucketSpec // the token bucket Envoy holds (actionTokens)
	start     time.Time  // when that bucket was sent: Envoy starts it no earlier
	sentAt    time.Time  // when Envoy was last sent it (or its renewal): its time to live runs from no earlier
	paidUntil time.Time  // the bucket may live until then: its tokens are paid up to it
	paid      int64      // tokens taken for the bucket since start
	used      int64      // requests Envoy reported admitted since start
	denied    int64      // requests Envoy reported denied since start

	lastReport time.Time
	every      time.Duration // between its last two reports
	demand     float64       // requests a second offered (allowed and denied), last interval
}

type stream struct {
	srv     *Server
	ss      rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer
	domain  string
	buckets map[string]*held
	poke    chan struct{} // one slot: some bucket's share moved
}

func newStream(s *Server, ss rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) *stream {
	return &stream{srv: s, ss: ss, buckets: map[string]*held{}, poke: make(chan struct{}, 1)}
}

// markStale tells h's stream that h's share moved: the flag is set
// before the poke is sent, and read by the stream after it is received.
func markStale(h *held) {
	h.stale.Store(true)
	select {
	case h.st.poke <- struct{}{}:
	default: // a poke is pending: it will see the flag
	}
}

// release leaves every key the stream held: the other holders' shares
// grow. What Envoy holds stays in force until it ends (it was paid for).
func (st *stream) release() {
	for _, h := range st.buckets {
		st.leave(h)
	}
}

func (st *stream) leave(h *held) {
	if !h.joined {
		return
	}
	h.joined = false
	for _, o := range st.srv.holders.remove(h.key, h) {
		markStale(o)
	}
}

func (st *stream) send(resp *rlqsv3.RateLimitQuotaResponse) error {
	if resp == nil || len(resp.BucketAction) == 0 {
		return nil
	}
	return st.ss.Send(resp)
}

// refuse ends the stream with a status naming what was wrong, counted;
// nothing of the report was charged or assigned.
func (st *stream) refuse(reason string, c codes.Code, format string, args ...any) error {
	st.srv.own.refused.WithLabelValues(reason).Inc()
	return grpcstatus.Errorf(c, "rlqs: "+format, args...)
}

// check validates a whole report before any of it is acted on.
func (st *stream) check(r *rlqsv3.RateLimitQuotaUsageReports) (*domain, error) {
	name := r.GetDomain()
	switch {
	case st.domain == "" && name == "":
		return nil, st.refuse(reasonNoDomain, codes.InvalidArgument, "the first report names no domain; set the rate_limit_quota filter's domain")
	case st.domain != "" && name != "" && name != st.domain:
		return nil, st.refuse(reasonDomainChanged, codes.InvalidArgument, "the stream's domain is %q; a report named %q (open a new stream for another domain)", st.domain, name)
	}
	if name == "" {
		name = st.domain
	}
	d := st.srv.rules().domains[name]
	if d == nil {
		return nil, st.refuse(reasonUnknownDomain, codes.NotFound, "domain %q is not served (rlqs.domains)", name)
	}
	most := st.srv.running.Config().RLQS.MaxBucketsPerStream
	if n := len(r.GetBucketQuotaUsages()); n > most {
		return nil, st.refuse(reasonTooManyUsages, codes.InvalidArgument, "a report of %d buckets; at most %d (rlqs.max_buckets_per_stream)", n, most)
	}
	for i, u := range r.GetBucketQuotaUsages() {
		id := u.GetBucketId().GetBucket()
		if len(id) == 0 {
			return nil, st.refuse(reasonBadBucketID, codes.InvalidArgument, "bucket_quota_usages[%d]: the bucket id is empty", i)
		}
		if len(id) > maxBucketIDEntries {
			return nil, st.refuse(reasonBadBucketID, codes.InvalidArgument, "bucket_quota_usages[%d]: the bucket id has %d entries; at most %d", i, len(id), maxBucketIDEntries)
		}
		size := 0
		for k, v := range id {
			size += len(k) + len(v)
		}
		if size > maxBucketIDBytes {
			return nil, st.refuse(reasonBadBucketID, codes.InvalidArgument, "bucket_quota_usages[%d]: the bucket id has %d bytes; at most %d", i, size, maxBucketIDBytes)
		}
		if te := u.GetTimeElapsed(); te != nil {
			if err := te.CheckValid(); err != nil || te.AsDuration() < 0 || te.AsDuration() > maxElapsed {
				return nil, st.refuse(reasonBadElapsed, codes.InvalidArgument, "bucket_quota_usages[%d]: time_elapsed %ds %dns is not between 0 and %s", i, te.GetSeconds(), te.GetNanos(), maxElapsed)
			}
		}
		if u.GetNumRequestsAllowed() > maxCount || u.GetNumRequestsDenied() > maxCount {
			return nil, st.refuse(reasonBadCount, codes.InvalidArgument, "bucket_quota_usages[%d]: %d allowed and %d denied in one report; at most %d each", i, u.GetNumRequestsAllowed(), u.GetNumRequestsDenied(), uint64(maxCount))
		}
	}
	st.domain = name
	return d, nil
}

// report acts on one usage report: every bucket in it is answered (its
// assignment renewed, resized or replaced).
func (st *stream) report(ctx context.Context, r *rlqsv3.RateLimitQuotaUsageReports, now time.Time) (*rlqsv3.RateLimitQuotaResponse, error) {
	d, err := st.check(r)
	if err != nil {
		return nil, err
	}
	st.srv.own.reports.Inc()
	cfg := st.srv.running.Config().RLQS
	resp := &rlqsv3.RateLimitQuotaResponse{}
	for _, u := range r.GetBucketQuotaUsages() {
		k := bucketKey(u.GetBucketId())
		h := st.buckets[k]
		if h == nil {
			if len(st.buckets) >= cfg.MaxBucketsPerStream {
				st.srv.own.refused.WithLabelValues(reasonTooManyBucket).Inc()
				resp.BucketAction = append(resp.BucketAction, st.blanket(u.GetBucketId(), d.unknownAllow, cfg.AssignmentTTL))
				continue
			}
			h = &held{id: u.GetBucketId(), st: st}
			st.buckets[k] = h
		}
		h.used += int64(u.GetNumRequestsAllowed())
		h.denied += int64(u.GetNumRequestsDenied())
		h.observe(u, now)
		t := d.resolve(u.GetBucketId().GetBucket())
		if h.policy != nil && (t.policy == nil || t.policy.Name != h.policy.Name || t.key != h.key) {
			// The rule it counted under is gone or changed: it leaves its
			// key. Gone from the configuration: Envoy abandons it.
			st.leave(h)
			if t.policy == nil {
				delete(st.buckets, k)
				st.srv.own.assignments.WithLabelValues("abandon").Inc()
				resp.BucketAction = append(resp.BucketAction, &rlqsv3.RateLimitQuotaResponse_BucketAction{
					BucketId: h.id,
					BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
						AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{},
					},
				})
				continue
			}
			h.last = actionNone
		}
		h.policy, h.key = t.policy, t.key
		if h.policy == nil {
			resp.BucketAction = append(resp.BucketAction, st.blanket(h.id, d.unknownAllow, cfg.AssignmentTTL))
			continue
		}
		if lim := h.policy.FixedLimit(); lim.Unlimited || h.policy.Shadow {
			if h.policy.Shadow && !lim.Unlimited {
				st.countShadow(ctx, h, u.GetNumRequestsAllowed(), now)
			}
			h.last = actionAllow
			resp.BucketAction = append(resp.BucketAction, st.blanket(h.id, true, cfg.AssignmentTTL))
			continue
		}
		h.joined = true
		moved := st.srv.holders.set(h.key, h, h.demand)
		h.stale.Store(false)
		if a := st.assign(ctx, h, now, cfg.AssignmentTTL); a != nil {
			resp.BucketAction = append(resp.BucketAction, a)
		}
		// The other holders whose share moved are pushed new assignments
		// once this one is decided: a bucket resized smaller gives its
		// paid credit back to the count first (fresh), for them to take.
		// (Pushed before, a holder whose demand rose found the count empty
		// and waited for its next report.)
		for _, o := range moved {
			markStale(o)
		}
	}
	return resp, nil
}

// observe reads a report's demand: requests offered a second since the
// bucket's last report (the first report counts from the bucket's
// creation, as Envoy's time_elapsed says).
func (h *held) observe(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, now time.Time) {
	el := u.GetTimeElapsed().AsDuration()
	if !h.lastReport.IsZero() {
		el = now.Sub(h.lastReport)
		h.every = el
	}
	el = max(el, minDemandInterval)
	h.lastReport = now
	h.demand = float64(u.GetNumRequestsAllowed()+u.GetNumRequestsDenied()) / el.Seconds()
}

// reshare reassigns the buckets whose share moved since they were last
// answered (another Envoy joined, left or moved its demand).
func (st *stream) reshare(ctx context.Context, now time.Time) *rlqsv3.RateLimitQuotaResponse {
	ttl := st.srv.running.Config().RLQS.AssignmentTTL
	resp := &rlqsv3.RateLimitQuotaResponse{}
	for _, h := range st.buckets {
		if !h.stale.Swap(false) {
			continue
		}
		if !h.joined || h.last != actionTokens {
			continue
		}
		want := st.want(h, ttl)
		if !differs(h.spec, want) {
			continue
		}
		if a := st.assign(ctx, h, now, ttl); a != nil {
			resp.BucketAction = append(resp.BucketAction, a)
		}
	}
	return resp
}

// want is the token bucket h's share calls for now: its part of the
// limit by demand, no more refill than its demand with a quarter more,
// and a bucket no larger than its demand over a reporting interval (two
// seconds at least, to carry it to the next report), so an Envoy that
// joins first does not take the whole count.
func (st *stream) want(h *held, ttl time.Duration) bucketSpec {
	lim := h.policy.FixedLimit()
	rate := float64(lim.Limit.Limit) / lim.Window.Seconds()
	w, _ := st.srv.holders.weight(h.key, h)
	sh := shareOf(rate, lim.MaxCost(), w, ttl+deliveryAllowance)
	perSecond := min(sh.perSecond, h.demand*1.25)
	tokens := min(sh.maxTokens, max(1, int64(math.Ceil(h.demand*h.interval().Seconds()))))
	return specFor(tokens, perSecond)
}

// interval is the time between h's last two reports, at least 2 s.
func (h *held) interval() time.Duration { return max(h.every, 2*time.Second) }

// assign decides h's assignment at now. A bucket Envoy holds is kept
// (its refill paid up to the new end of its life) unless it is far from
// the share or spent, when a fresh one is tried first; a fresh bucket is
// as large as the share, or what the count holds; when the count holds
// nothing and Envoy's bucket cannot be kept, DENY_ALL until the count
// would give the next token.
func (st *stream) assign(ctx context.Context, h *held, now time.Time, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	life := ttl + deliveryAllowance
	until := now.Add(life)
	want := st.want(h, ttl)
	// A renewal reaches Envoy by now + deliveryAllowance; Envoy keeps the
	// bucket's state only if its time to live (from its last
	// assignment's arrival, no earlier than sentAt) has not run out by
	// then: else it starts the same spec afresh, full, and the whole of
	// it is paid as a new bucket's.
	holding := h.last == actionTokens && !h.sentAt.Add(ttl).Before(now.Add(deliveryAllowance))
	var d engineDecision
	if holding {
		if differs(h.spec, want) || h.spent() {
			if a := st.fresh(ctx, h, want, now, until, ttl, true, &d); a != nil {
				return a
			}
		}
		need := h.spec.admits(h.start, until) - h.paid
		if need <= 0 || st.take(ctx, h, need, now).Allowed {
			h.paid += max(need, 0)
			h.paidUntil, h.sentAt = until, now
			st.srv.own.assignments.WithLabelValues("renew").Inc()
			return tokenBucket(h.id, h.spec, ttl)
		}
		// The count cannot pay for a longer life: Envoy spends the
		// bucket it holds until it ends (it is paid for), then falls
		// back to its no_assignment_behavior until the next report.
		return nil
	}
	if a := st.fresh(ctx, h, want, now, until, ttl, false, &d); a != nil {
		return a
	}
	h.last = actionDeny
	st.srv.own.assignments.WithLabelValues("deny_all").Inc()
	return blanket(h.id, ratelimitstrategyv3.RateLimitStrategy_DENY_ALL, ttlSeconds(d.RetryAfter, ttl))
}

// credit is what h's current bucket was paid for and Envoy can no longer
// spend once a new bucket of spec next replaces it. Envoy swaps the
// buckets when the assignment arrives, at some instant a between now and
// now + deliveryAllowance: the old one admits until a, the new one from
// a, so only one of them runs in that second. A new bucket is paid from
// now (fresh), so when it refills no slower than the old one, the old
// one's credit ends now: whatever the old one admits after now, the new
// one, paid for that time at a rate no lower, does not. When it refills
// slower, the old one is charged to now + deliveryAllowance, as if the
// new one came last. (Charging both for that second, as a first version
// did, cost a bucket growing at every report its whole old rate each
// time: TestRLQSDemandMoves.) If the new one never arrives (the stream
// broke), Envoy spends at most the old one, which stays paid: so the
// credit pays for the new bucket instead of being taken again.
func (h *held) credit(now time.Time, next bucketSpec) int64 {
	if h.last != actionTokens {
		return 0
	}
	end := now
	if next.rate() < h.spec.rate() {
		end = now.Add(deliveryAllowance)
	}
	if h.paidUntil.Before(end) {
		end = h.paidUntil
	}
	return max(0, h.paid-h.spec.admits(h.start, end))
}

// fresh replaces what Envoy holds for h with a new bucket of spec, paid
// from h's credit and the count; when the count cannot give it all, with
// the bucket what the count (h's weight of what it holds) and the credit
// can pay for (when keep, only if that is better than what Envoy has
// left, or h's share shrank). Credit beyond the new
// bucket's cost goes back to the count. It returns nil, with the count's
// answer in d, when nothing could be paid.
func (st *stream) fresh(ctx context.Context, h *held, spec bucketSpec, now, until time.Time, ttl time.Duration, keep bool, d *engineDecision) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	life := until.Sub(now)
	spec = st.fit(h, spec, now, until)
	cost, credit := spec.admits(now, until), h.credit(now, spec)
	if need := cost - credit; need > 0 {
		*d = st.take(ctx, h, need, now)
		if !d.Allowed {
			// What the count holds is shared by weight, as its refill
			// is: taken whole, the holder that reports first after each
			// refill takes it at every report, and one that reports just
			// after finds it empty at each of its own (the Envoy back
			// from a dropped stream in TestRLQSReconnect was denied for
			// the rest of the run).
			w, _ := st.srv.holders.weight(h.key, h)
			avail := int64(math.Ceil(float64(d.Remaining)*w)) + credit
			if avail < 1 {
				return nil
			}
			smaller := st.fit(h, scale(spec, avail, life), now, until)
			// A bucket no better than what Envoy has left of its own is
			// not worth stranding that, unless h's share shrank (another
			// Envoy joined or grew): then h keeps no more refill than
			// the count pays it, or its renewals go on taking its old
			// refill, the other holders' part with it.
			if keep && spec.rate() >= h.spec.rate() && smaller.rate() <= h.spec.rate() && smaller.MaxTokens <= h.left() {
				return nil
			}
			spec, cost, credit = smaller, smaller.admits(now, until), h.credit(now, smaller)
			if need := cost - credit; need > 0 {
				if *d = st.take(ctx, h, need, now); !d.Allowed {
					return nil
				}
			}
		}
	}
	if back := credit - cost; back > 0 {
		lim := h.policy.FixedLimit()
		t := engine.Taken{Policy: h.policy, Key: h.key, Limit: lim, Units: back, OK: true}
		if engine.GiveBack(ctx, &t, back, now) == nil {
			st.srv.own.returned.Add(float64(back))
		}
	}
	h.last, h.spec, h.start, h.sentAt, h.paidUntil, h.paid, h.used, h.denied = actionTokens, spec, now, now, until, cost, 0, 0
	st.srv.own.assignments.WithLabelValues("token_bucket").Inc()
	return tokenBucket(h.id, spec, ttl)
}

// fit makes spec one Envoy will start afresh (not the bucket it holds)
// and no larger than the limit can ever grant at once.
func (st *stream) fit(h *held, spec bucketSpec, now, until time.Time) bucketSpec {
	if h.last == actionTokens && envoySame(h.spec, spec) {
		spec = other(spec)
	}
	lim := h.policy.FixedLimit()
	if most := lim.MaxCost(); spec.admits(now, until) > most {
		spec = scale(spec, most, until.Sub(now))
	}
	return spec
}

// scale is spec cut to cost at most avail tokens over life: its refill
// first kept (less what the bucket needs), else a slice of avail.
func scale(s bucketSpec, avail int64, life time.Duration) bucketSpec {
	if s.refills() {
		per := min(s.TokensPerFill, int64(float64(avail-1)/life.Seconds()))
		if per >= 1 {
			tokens := avail - int64(math.Ceil(float64(per)*life.Seconds()))
			return bucketSpec{MaxTokens: max(1, min(s.MaxTokens, tokens)), TokensPerFill: per, FillSeconds: 1}
		}
		return specFor(avail, 0)
	}
	return specFor(min(avail, s.MaxTokens), 0)
}

// spent reports whether Envoy has run through its bucket: half of a
// slice that does not refill, or the whole of a refilling one's tokens
// with requests denied since (its demand outruns its refill). A fresh
// bucket is tried then, before Envoy runs dry.
func (h *held) spent() bool {
	if !h.spec.refills() {
		return h.used*2 >= h.spec.MaxTokens
	}
	return h.used >= h.spec.MaxTokens && h.denied > 0
}

// left is what Envoy has of its bucket's tokens, as far as its reports
// tell: a refilling bucket refills to its max_tokens, a slice that does
// not refill keeps what was not spent of it.
func (h *held) left() int64 {
	if h.spec.refills() {
		return h.spec.MaxTokens
	}
	return max(0, h.spec.MaxTokens-h.used)
}

// other is a spec Envoy tells from s, taking no more: one token fewer, or
// for a bucket of one, the refill spelled differently.
func other(s bucketSpec) bucketSpec {
	if s.MaxTokens > 1 {
		s.MaxTokens--
		return s
	}
	if !s.refills() {
		s.TokensPerFill = 2 // 2 a day: nothing within a life, and paid for if it were
		return s
	}
	s.MaxTokens++
	return s
}

// take asks h's policy for n tokens through the engine, as a Check's take.
func (st *stream) take(ctx context.Context, h *held, n int64, now time.Time) engineDecision {
	lim := h.policy.FixedLimit()
	takes := [1]engine.Taken{{Policy: h.policy, Key: h.key, Limit: lim, Units: n}}
	out, _, err := engine.TakeAll(ctx, takes[:], now, nil)
	if err != nil || out != engine.OK {
		d := takes[0].Decision
		if err != nil {
			st.srv.log.Warn("rlqs: a take failed", "policy", h.policy.Name, "error", err.Error())
			d.RetryAfter = time.Second
		}
		return engineDecision{Allowed: false, Remaining: d.Remaining, RetryAfter: d.RetryAfter}
	}
	st.srv.own.tokens.Add(float64(n))
	return engineDecision{Allowed: true}
}

// countShadow counts what Envoy admitted under a shadow policy's
// ALLOW_ALL, as a Check counts a shadow policy's requests; its denials
// only count.
func (st *stream) countShadow(ctx context.Context, h *held, n uint64, now time.Time) {
	lim := h.policy.FixedLimit()
	units := min(int64(n), lim.MaxCost())
	if units <= 0 {
		return
	}
	takes := [1]engine.Taken{{Policy: h.policy, Key: h.key, Limit: lim, Units: units}}
	engine.TakeAll(ctx, takes[:], now, nil)
}

type engineDecision struct {
	Allowed    bool
	Remaining  int64
	RetryAfter time.Duration
}

func (st *stream) blanket(id *rlqsv3.BucketId, allow bool, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	if allow {
		st.srv.own.assignments.WithLabelValues("allow_all").Inc()
		return blanket(id, ratelimitstrategyv3.RateLimitStrategy_ALLOW_ALL, int64(ttl/time.Second))
	}
	st.srv.own.assignments.WithLabelValues("deny_all").Inc()
	return blanket(id, ratelimitstrategyv3.RateLimitStrategy_DENY_ALL, int64(ttl/time.Second))
}

func blanket(id *rlqsv3.BucketId, rule ratelimitstrategyv3.RateLimitStrategy_BlanketRule, ttlSec int64) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return assignment(id, &ratelimitstrategyv3.RateLimitStrategy{
		Strategy: &ratelimitstrategyv3.RateLimitStrategy_BlanketRule_{BlanketRule: rule},
	}, ttlSec)
}

func tokenBucket(id *rlqsv3.BucketId, s bucketSpec, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	fill := &durationpb.Duration{Seconds: s.FillSeconds}
	if !s.refills() {
		fill.Nanos = noRefillNanos
	}
	return assignment(id, &ratelimitstrategyv3.RateLimitStrategy{
		Strategy: &ratelimitstrategyv3.RateLimitStrategy_TokenBucket{TokenBucket: &ratelimitstrategyv3.TokenBucket{
			MaxTokens:     uint32(min(s.MaxTokens, math.MaxUint32)),
			TokensPerFill: wrapperspb.UInt32(uint32(min(s.TokensPerFill, math.MaxUint32))),
			FillInterval:  fill,
		}},
	}, int64(ttl/time.Second))
}

func assignment(id *rlqsv3.BucketId, strategy *ratelimitstrategyv3.RateLimitStrategy, ttlSec int64) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: &durationpb.Duration{Seconds: ttlSec},
				RateLimitStrategy:    strategy,
			},
		},
	}
}
