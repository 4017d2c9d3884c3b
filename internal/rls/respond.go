package rls

import (
	"math"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/extauthz/extauthz/internal/engine"
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

func (c *compiled) respond(a *answer, o engine.Outcome) *rlsv3.RateLimitResponse {
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
			if !t.OK && !t.Policy.Shadow {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if t.OK {
				st.LimitRemaining = uint32(min(max(remaining(t, o), 0), math.MaxUint32))
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
	return resp
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
		case remaining(t, o) < remaining(b, o),
			remaining(t, o) == remaining(b, o) && t.Decision.ResetAfter > b.Decision.ResetAfter:
			best = j
		}
	}
	return best
}

// remaining is what an allowed take leaves: when another take denied the
// request, its hits were given back, so they remain.
func remaining(t *engine.Taken, o engine.Outcome) int64 {
	if o != engine.OK {
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
