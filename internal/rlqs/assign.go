package rlqs

import (
	"math"
	"time"
)

// An assignment is a lease. The tokens Envoy may admit under a token
// bucket assignment leave the policy's count (the same count Check and the
// rate limit service take from, in Redis for the Redis modes) before Envoy
// can spend them, as hybrid's slices do, so the Envoys together never
// admit more than one bucket.
//
// What Envoy's filter does with a token_bucket assignment (read from its
// source, source/extensions/filters/http/rate_limit_quota): it builds a
// token bucket of max_tokens that starts full and refills
// tokens_per_fill ÷ fill_interval tokens a second (the interval read in
// whole seconds), continuously, never above max_tokens; an assignment
// equal to the one it holds keeps the bucket's state and restarts the
// time to live (also whole seconds); a different one starts a fresh, full
// bucket; when the time to live ends without a new assignment, the bucket
// falls back to the filter's expired_assignment_behavior or
// no_assignment_behavior. So a bucket started at s, kept until u, admits
// at most floor(max_tokens + rate × (u − s)) requests: that is what the
// sidecar has taken for it (paid) before it tells Envoy it may keep it
// until u.

// deliveryAllowance is how much later than the sidecar sent it an
// assignment may start in Envoy (its time to live runs from its arrival):
// the sidecar counts every assignment alive this much longer.
const deliveryAllowance = time.Second

// noRefill is the fill interval, in seconds, of an assignment that should
// not refill: Envoy requires tokens_per_fill ≥ 1, and one token a day adds
// nothing within a time to live (what it could add is paid for anyway).
const noRefill = 86400

// Envoy's filter tells a new token bucket from the one it holds by
// max_tokens, tokens_per_fill and the nanoseconds of fill_interval only
// (not its seconds), and reads the rate from the whole seconds. So the
// sidecar uses two fill intervals, told apart by their nanoseconds: 1 s
// (nanos 0) for a refilling bucket, and noRefill s plus 1 ns (nanos 1)
// for one that does not. Two specs that differ at all then differ in
// something Envoy compares, and a bucket Envoy keeps is one the sidecar
// paid for at its own rate.
const noRefillNanos = 1

// bucketSpec is a token_bucket assignment's numbers.
type bucketSpec struct {
	MaxTokens     int64
	TokensPerFill int64
	FillSeconds   int64 // 1, or noRefill (sent with noRefillNanos)
}

// rate is the spec's refill in tokens per second.
func (b bucketSpec) rate() float64 { return float64(b.TokensPerFill) / float64(b.FillSeconds) }

// refills reports whether the spec is a refilling bucket (1 s interval).
func (b bucketSpec) refills() bool { return b.FillSeconds == 1 }

// admits is the most an Envoy bucket of spec b, started at start, admits
// by until: floor(max_tokens + rate × elapsed).
func (b bucketSpec) admits(start, until time.Time) int64 {
	el := until.Sub(start).Seconds()
	if el < 0 {
		el = 0
	}
	return int64(math.Floor(float64(b.MaxTokens) + b.rate()*el + 1e-9))
}

// specFor spells a share as a bucket of maxTokens (at least 1) refilling
// floor(perSecond) tokens a second, or, below one a second, a slice of
// maxTokens that does not refill (a fresh one follows when it is spent).
func specFor(maxTokens int64, perSecond float64) bucketSpec {
	maxTokens = max(maxTokens, 1)
	if perSecond < 1 {
		return bucketSpec{MaxTokens: maxTokens, TokensPerFill: 1, FillSeconds: noRefill}
	}
	return bucketSpec{MaxTokens: maxTokens, TokensPerFill: int64(math.Floor(perSecond + 1e-9)), FillSeconds: 1}
}

// share is one holder's part of a policy's limit: its refill rate and its
// bucket, from the holders' demand.
type share struct {
	perSecond float64
	maxTokens int64
}

// shareOf divides a limit of rate tokens a second and capacity tokens
// (what a full count can give at once) among holders by demand: weight is
// this holder's demand over every holder's (1/n when none has any). A
// holder's first assignment is paid for a whole assignment life (life)
// at once, its bucket and its refill, so the shares of a full count
// together take at most one bucket: where the capacity is short of a
// life's refill (a limit per second with a small burst), the refill is
// cut to half the capacity's worth and the under-use is the rest.
func shareOf(rate float64, capacity int64, weight float64, life time.Duration) share {
	perSecond := rate * weight
	if most := float64(capacity) * weight / 2 / life.Seconds(); perSecond > most {
		perSecond = most
	}
	tokens := float64(capacity)*weight - math.Floor(perSecond)*life.Seconds()
	return share{perSecond: perSecond, maxTokens: max(1, int64(math.Floor(tokens)))}
}

// differs reports whether a holder's refilling bucket is far enough from
// its share to start a fresh one: a fresh bucket strands what Envoy had
// left of the old one, so small moves keep the bucket.
func differs(cur bucketSpec, want bucketSpec) bool {
	if cur.refills() != want.refills() {
		return true
	}
	r0, r1 := float64(cur.TokensPerFill), float64(want.TokensPerFill)
	if math.Abs(r1-r0) > 0.2*math.Max(r0, r1) && math.Abs(r1-r0) >= 1 {
		return true
	}
	m0, m1 := float64(cur.MaxTokens), float64(want.MaxTokens)
	return math.Abs(m1-m0) > 0.5*math.Max(m0, m1) && math.Abs(m1-m0) >= 2
}

// envoySame reports whether Envoy's filter would keep a bucket of spec a
// when sent spec b: what it compares.
func envoySame(a, b bucketSpec) bool {
	return a.MaxTokens == b.MaxTokens && a.TokensPerFill == b.TokensPerFill && a.refills() == b.refills()
}

// ttlSeconds is a wait as an assignment's time to live: whole seconds,
// rounded up, between 1 and most.
func ttlSeconds(d, most time.Duration) int64 {
	s := int64(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	if m := int64(most / time.Second); s > m {
		s = m
	}
	return s
}
