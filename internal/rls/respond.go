package rls

import (
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/rlsconfig"
)

// What Envoy gets back: the overall code, one status per descriptor, and,
// unless rls.response_headers is false, what every door tells a client:
// on OK the RateLimit-Policy and RateLimit headers of the most
// constrained limit (Envoy adds them to the upstream's response); over
// the limit, Retry-After, the RateLimit headers of the limit with the
// longest wait and the problem+json body (Envoy sends them in its 429,
// the body as raw_body, our content-type in place of its text/plain).

// respParts holds the messages of an answer of one descriptor (the
// usual call: one rate_limits entry per route), so that building one costs
// one allocation: an allowed call is the hot path, and small objects per
// call show up as garbage collection under load. Answers of more
// descriptors allocate their statuses apart. The messages are never
// copied: only pointers into this struct escape.
type respParts struct {
	resp  rlsv3.RateLimitResponse
	stBuf [1]*rlsv3.RateLimitResponse_DescriptorStatus
	st    [1]rlsv3.RateLimitResponse_DescriptorStatus
	dur   [1]durationpb.Duration
	hBuf  [2]*corev3.HeaderValue
	h     [2]corev3.HeaderValue
}

func (c *compiled) respond(req *rlsv3.RateLimitRequest, a *answer, o engine.Outcome, now time.Time) *rlsv3.RateLimitResponse {
	var violations []int // descriptors over a quota-mode limit
	n := len(a.slots)
	p := &respParts{}
	resp := &p.resp
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	sts, durs := p.st[:], p.dur[:]
	resp.Statuses = p.stBuf[:0]
	if n > len(p.st) {
		sts, durs = make([]rlsv3.RateLimitResponse_DescriptorStatus, n), make([]durationpb.Duration, n)
		resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, 0, n)
	}
	for i := range a.slots {
		sl, st, dur := &a.slots[i], &sts[i], &durs[i]
		resp.Statuses = append(resp.Statuses, st)
		st.Code = rlsv3.RateLimitResponse_OK
		switch {
		case sl.n == 0:
			if sl.rule != nil && sl.rule.unlimited {
				// envoyproxy/ratelimit's answer for an unlimited
				// descriptor: OK, and all the room there is.
				st.LimitRemaining = math.MaxUint32
			}
		case sl.take >= a.asked:
			// Not asked: an earlier descriptor denied the request, which
			// ends it before this one's count is read or created.
			st.CurrentLimit = a.current(sl, sl.take)
		default:
			j := a.reported(sl, o)
			t := &a.takes[j]
			if !t.OK {
				st.Code = c.overCode(a.limits[j], t)
				if st.Code == quotaViolation {
					st.Code = rlsv3.RateLimitResponse_OK
					violations = append(violations, i)
				}
			}
			if t.OK {
				st.LimitRemaining = uint32(min(max(a.remaining(t, o), 0), math.MaxUint32))
			}
			st.CurrentLimit = a.current(sl, j)
			reset := max(t.Decision.ResetAfter, 0)
			dur.Seconds, dur.Nanos = int64(reset/time.Second), int32(reset%time.Second)
			st.DurationUntilReset = dur
		}
	}
	if o != engine.OK {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if c.cfg.RLS.ResponseHeaders {
		c.headers(p, a, o)
	}
	if h := c.cfg.RLS.LimitHeaders; h != nil {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, limitHeaders(h, resp.Statuses, now)...)
	}
	// As the anchor, a quota-mode violation's status is OK with its limit
	// and remaining, and no reset (the headers above took it).
	for _, i := range violations {
		resp.Statuses[i].DurationUntilReset = nil
	}
	if c.cfg.RLS.DynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, violations, a)
	}
	return resp
}

// quotaViolation is overCode's answer for a quota-mode limit over: the
// status is OK and the descriptor is listed among the violations.
const quotaViolation = rlsv3.RateLimitResponse_Code(-1)

// overCode is the status of a descriptor whose reported take t, of
// limit l (nil: a limit Envoy sent), was over, as envoyproxy/ratelimit
// states it: a quota-mode limit is a violation; a shadow_mode descriptor
// is OK; under the global shadow mode the status stays OVER_LIMIT (only
// the overall code is OK); a shared policy in shadow is OK.
func (c *compiled) overCode(l *limit, t *engine.Taken) rlsv3.RateLimitResponse_Code {
	switch {
	case l != nil && l.quota, l == nil && c.cfg.RLS.QuotaMode:
		return quotaViolation
	case l != nil && l.ownShadow:
		return rlsv3.RateLimitResponse_OK
	case c.cfg.RLS.ShadowMode:
		return rlsv3.RateLimitResponse_OVER_LIMIT
	case t.Policy.Shadow:
		return rlsv3.RateLimitResponse_OK
	}
	return rlsv3.RateLimitResponse_OVER_LIMIT
}

// limitHeaders are envoyproxy/ratelimit's three headers for the status
// it picks: the last over the limit, else the first with the fewest
// remaining of those with a limit; none when no status has a limit. The
// reset is the status's time until reset in whole seconds, rounded up
// (the rest of the unit for a status without one, as the anchor counts).
func limitHeaders(h *config.LimitHeaders, sts []*rlsv3.RateLimitResponse_DescriptorStatus, now time.Time) []*corev3.HeaderValue {
	var pick *rlsv3.RateLimitResponse_DescriptorStatus
	least := uint32(math.MaxUint32)
	for _, st := range sts {
		if st.GetCurrentLimit() != nil && st.GetLimitRemaining() < least {
			pick, least = st, st.GetLimitRemaining()
		}
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			pick, least = st, 0
		}
	}
	if pick == nil || pick.GetCurrentLimit() == nil {
		return nil
	}
	var reset int64
	if d := pick.GetDurationUntilReset(); d != nil {
		reset = int64((d.AsDuration() + time.Second - 1) / time.Second)
	} else {
		unit := int64(unitLength[pick.GetCurrentLimit().GetUnit()] / time.Second)
		reset = unit - now.Unix()%unit
	}
	return []*corev3.HeaderValue{
		{Key: h.Limit, Value: strconv.FormatUint(uint64(pick.GetCurrentLimit().GetRequestsPerUnit()), 10)},
		{Key: h.Remaining, Value: strconv.FormatUint(uint64(pick.GetLimitRemaining()), 10)},
		{Key: h.Reset, Value: strconv.FormatInt(reset, 10)},
	}
}

// unitLength is each protocol unit's length.
var unitLength = map[rlsv3.RateLimitResponse_RateLimit_Unit]time.Duration{}

func init() {
	for name, u := range units {
		unitLength[u] = rlsconfig.Units[name]
	}
	unitLength[rlsv3.RateLimitResponse_RateLimit_UNKNOWN] = time.Second
}

// dynamicMetadata is envoyproxy/ratelimit's dynamic metadata of an
// answer (RESPONSE_DYNAMIC_METADATA), field for field: the domain, each
// descriptor's entries (key=value), its limit and hits_addend when Envoy
// sent them, the request's hits_addend when set, the descriptors over a
// quota-mode limit (quotaModeViolations, by index) and whether any rate
// limit the request matched has quota_mode (quotaModeEnabled).
func dynamicMetadata(req *rlsv3.RateLimitRequest, violations []int, a *answer) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}
	ds := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		entries := make([]*structpb.Value, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			entries = append(entries, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
		}
		df := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			df["limit"] = structpb.NewStringValue(prototext.Format(l))
		}
		if h := d.GetHitsAddend(); h != nil {
			df["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		ds = append(ds, structpb.NewStructValue(&structpb.Struct{Fields: df}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: ds})
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	if len(violations) > 0 {
		vs := make([]*structpb.Value, len(violations))
		for i, v := range violations {
			vs[i] = structpb.NewNumberValue(float64(v))
		}
		fields["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: vs})
	}
	enabled := false
	for _, l := range a.limits {
		enabled = enabled || (l != nil && l.quotaMode)
	}
	fields["quotaModeEnabled"] = structpb.NewBoolValue(enabled)
	return &structpb.Struct{Fields: fields}
}

// current is the limit take j counts for, as a status states it.
func (a *answer) current(sl *slot, j int) *rlsv3.RateLimitResponse_RateLimit {
	if l := a.limits[j]; l != nil {
		return l.current
	}
	return sl.current
}

// reported is the take whose decision a descriptor's status gives, of
// those it asked: the one that denied (TakeAll stops at it, so of an
// enforcing descriptor's limits at most one did), else the one closest to
// denying, with the fewest remaining and, of those, the longest until
// reset: the limit that the RateLimit headers would describe.
func (a *answer) reported(sl *slot, o engine.Outcome) int {
	best := sl.take
	for j := sl.take; j < min(sl.take+sl.n, a.asked); j++ {
		t, b := &a.takes[j], &a.takes[best]
		switch {
		case !t.OK:
			return j
		case a.remaining(t, o) < a.remaining(b, o),
			a.remaining(t, o) == a.remaining(b, o) && t.Decision.ResetAfter > b.Decision.ResetAfter:
			best = j
		}
	}
	return best
}

// remaining is what an allowed take leaves: when another take denied the
// request, its hits were given back (all or nothing), so they remain;
// counted each (rls.counting: each), they stay spent, and TakeEach
// reports what a take it refunded (each_stop_when_over) leaves.
func (a *answer) remaining(t *engine.Taken, o engine.Outcome) int64 {
	if o != engine.OK && !a.each {
		return min(t.Decision.Remaining+t.Units, t.Decision.Limit)
	}
	return t.Decision.Remaining
}

func (c *compiled) headers(p *respParts, a *answer, o engine.Outcome) {
	resp := &p.resp
	v := engine.VerdictOf(o, a.takes[:a.asked])
	legacy := c.cfg.Headers.Legacy
	if o == engine.OK {
		t := v.Tightest()
		if t == nil {
			return
		}
		d := &t.Decision
		p.h[0] = corev3.HeaderValue{Key: "ratelimit-policy", Value: t.Limit.Header}
		p.h[1] = corev3.HeaderValue{Key: "ratelimit", Value: engine.RateLimitHeader(t.Policy.Name, d.Remaining, d.ResetAfter)}
		h := append(p.hBuf[:0], &p.h[0], &p.h[1])
		if legacy {
			for _, kv := range engine.LegacyHeaders(d.Limit, d.Remaining, d.ResetAfter) {
				h = append(h, &corev3.HeaderValue{Key: kv[0], Value: kv[1]})
			}
		}
		resp.ResponseHeadersToAdd = h
		return
	}
	den := v.Deny(legacy)
	// Envoy answers OVER_LIMIT with its rate limit filter's status, 429
	// unless configured otherwise; an on_redis_error: deny keeps its
	// problem type (temporary reduced capacity) but not the 503 the
	// ext_authz door can send.
	den.Problem.Status, den.Problem.Title = 429, "Too Many Requests"
	h := make([]*corev3.HeaderValue, 0, len(den.Headers)+1)
	h = append(h, &corev3.HeaderValue{Key: "content-type", Value: engine.ProblemContentType})
	for _, kv := range den.Headers {
		h = append(h, &corev3.HeaderValue{Key: kv[0], Value: kv[1]})
	}
	resp.ResponseHeadersToAdd = h
	resp.RawBody = []byte(den.Problem.JSON())
}

// undecodableOverLimit and undecodableOK answer a request that did not
// decode (check.UndecodableRateLimitRequest), as rls.on_undecodable says:
// nothing of it can be read, so no descriptor status. Shared read-only.
var (
	undecodableOverLimit = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}
	undecodableOK        = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	undecodableAnswer    = map[rlsv3.RateLimitResponse_Code]string{
		rlsv3.RateLimitResponse_OVER_LIMIT: "over_limit", rlsv3.RateLimitResponse_OK: "ok"}
)

// noLimits is the answer for a domain no file defines: every descriptor
// OK, with no limit, as envoyproxy/ratelimit answers.
func noLimits(n int) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	sts := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	for i := range sts {
		sts[i].Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = &sts[i]
	}
	return resp
}
