// Package envoyrlqs is an Envoy rate_limit_quota filter in Go, for tests
// and the benchmark: it builds bucket ids, reports usage and enforces the
// assignments an RLQS server sends the way Envoy's filter does, as read
// from its source (source/extensions/filters/http/rate_limit_quota,
// filter.cc and global_client_impl.cc), and counts what it admits:
//
//   - A request's bucket id is the map its bucket_id_builder builds; a
//     bucket seen for the first time is decided by no_assignment_behavior
//     (only a blanket DENY_ALL denies it) and reported at once, alone,
//     with that request counted.
//   - Every reporting interval, every bucket's usage since its last report
//     is sent on the stream (allowed, denied, time_elapsed in whole
//     seconds), and the counts reset; without a stream, the filter tries
//     to open one, and drops the reports when it cannot.
//   - An assignment for an unknown bucket is ignored; abandon_action drops
//     the bucket; a blanket rule replaces what the bucket held; a
//     token_bucket keeps the bucket's limiter when max_tokens,
//     tokens_per_fill and fill_interval's nanoseconds equal the previous
//     token bucket's, else starts a new one, full, refilling
//     tokens_per_fill ÷ (fill_interval in whole seconds) tokens a second.
//   - An assignment lives for its time to live's whole seconds from its
//     arrival; then the bucket falls back to expired_assignment_behavior
//     (not modelled: the shipped configuration has none) or to
//     no_assignment_behavior.
//   - When the server closes the stream, the filter keeps its buckets and
//     assignments and reopens the stream at its next report.
//
// Time is the wall clock: the server's assignments run on it too.
package envoyrlqs

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Filter is one Envoy's rate_limit_quota filter with its global client.
// Safe for concurrent use.
type Filter struct {
	domain   string
	interval time.Duration
	denyNew  bool // no_assignment_behavior: DENY_ALL
	client   rlqsv3.RateLimitQuotaServiceClient

	mu      sync.Mutex // guards buckets, stream, cancel
	buckets map[string]*bucket
	stream  rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel  context.CancelFunc

	// Admitted and Refused count every request decided, over the
	// filter's life.
	Admitted, Refused atomic.Int64
	// Responses counts the responses applied; Closes the streams the
	// server ended.
	Responses, Closes atomic.Int64
	// LastStatus is the error the server last ended a stream with.
	lastStatus atomic.Value

	stop chan struct{}
	done chan struct{}
}

type bucket struct {
	id              map[string]string
	allowed, denied uint64
	lastReport      time.Time
	// action: nil is no_assignment_behavior.
	blanket *typev3.RateLimitStrategy_BlanketRule
	tb      *tokenBucket
	tbSpec  *typev3.TokenBucket
	expires time.Time
	// admitted counts the bucket's admitted requests over its life.
	admitted int64
}

// Options configure a Filter as the filter's configuration does.
type Options struct {
	Domain string
	// ReportingInterval is bucket_settings.reporting_interval.
	ReportingInterval time.Duration
	// NoAssignmentDeny is no_assignment_behavior: {fallback_rate_limit:
	// {blanket_rule: DENY_ALL}}; false is the filter's default, ALLOW_ALL.
	NoAssignmentDeny bool
}

// New starts a filter talking to the RLQS server on conn.
func New(conn grpc.ClientConnInterface, o Options) *Filter {
	f := &Filter{
		domain: o.Domain, interval: o.ReportingInterval, denyNew: o.NoAssignmentDeny,
		client:  rlqsv3.NewRateLimitQuotaServiceClient(conn),
		buckets: map[string]*bucket{},
		stop:    make(chan struct{}), done: make(chan struct{}),
	}
	go f.reportLoop()
	return f
}

// Close stops reporting and closes the stream.
func (f *Filter) Close() {
	close(f.stop)
	<-f.done
	f.Drop()
}

// Drop closes the stream as a broken connection would; the filter keeps
// its buckets and reopens a stream at its next report.
func (f *Filter) Drop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cancel != nil {
		f.cancel()
	}
	f.stream, f.cancel = nil, nil
}

// LastStatus is the error the server last ended a stream with (nil: none).
func (f *Filter) LastStatus() error {
	if e, ok := f.lastStatus.Load().(error); ok {
		return e
	}
	return nil
}

// Request decides one request whose bucket_id_builder built id.
func (f *Filter) Request(id map[string]string) bool {
	now := time.Now()
	k := key(id)
	f.mu.Lock()
	b := f.buckets[k]
	if b == nil {
		allow := !f.denyNew
		b = &bucket{id: id, lastReport: now}
		f.buckets[k] = b
		f.count(b, allow)
		report := f.reportLocked([]*bucket{b}, now)
		f.sendLocked(report)
		f.mu.Unlock()
		return allow
	}
	if !b.expires.IsZero() && !now.Before(b.expires) {
		// The assignment's timer fired: back to no_assignment_behavior.
		b.blanket, b.tb, b.tbSpec, b.expires = nil, nil, nil, time.Time{}
	}
	var allow bool
	switch {
	case b.blanket != nil:
		allow = *b.blanket == typev3.RateLimitStrategy_ALLOW_ALL
	case b.tb != nil:
		allow = b.tb.consume(now)
	default:
		allow = !f.denyNew
	}
	f.count(b, allow)
	f.mu.Unlock()
	return allow
}

// BucketAdmitted is how many requests of bucket id were admitted.
func (f *Filter) BucketAdmitted(id map[string]string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b := f.buckets[key(id)]; b != nil {
		return b.admitted
	}
	return 0
}

// Holds reports what the filter holds for bucket id: "none", "deny",
// "allow" or "tokens".
func (f *Filter) Holds(id map[string]string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.buckets[key(id)]
	switch {
	case b == nil:
		return "none"
	case !b.expires.IsZero() && !time.Now().Before(b.expires):
		return "none"
	case b.blanket != nil && *b.blanket == typev3.RateLimitStrategy_ALLOW_ALL:
		return "allow"
	case b.blanket != nil:
		return "deny"
	case b.tb != nil:
		return "tokens"
	}
	return "none"
}

func (f *Filter) count(b *bucket, allow bool) {
	if allow {
		b.allowed++
		b.admitted++
		f.Admitted.Add(1)
	} else {
		b.denied++
		f.Refused.Add(1)
	}
}

func (f *Filter) reportLoop() {
	defer close(f.done)
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case now := <-t.C:
			f.mu.Lock()
			all := make([]*bucket, 0, len(f.buckets))
			for _, b := range f.buckets {
				all = append(all, b)
			}
			report := f.reportLocked(all, now)
			f.sendLocked(report)
			f.mu.Unlock()
		}
	}
}

// reportLocked builds a report of bs, resetting their counts.
func (f *Filter) reportLocked(bs []*bucket, now time.Time) *rlqsv3.RateLimitQuotaUsageReports {
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: f.domain}
	for _, b := range bs {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: b.id},
			TimeElapsed:        &durationpb.Duration{Seconds: int64(now.Sub(b.lastReport) / time.Second)},
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	return r
}

// sendLocked sends r, opening the stream first when there is none; a
// report that cannot be sent is dropped, as Envoy drops it.
func (f *Filter) sendLocked(r *rlqsv3.RateLimitQuotaUsageReports) {
	if f.stream == nil {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := f.client.StreamRateLimitQuotas(ctx)
		if err != nil {
			cancel()
			return
		}
		f.stream, f.cancel = s, cancel
		go f.receive(s)
	}
	if err := f.stream.Send(r); err != nil {
		f.cancel()
		f.stream, f.cancel = nil, nil
	}
}

func (f *Filter) receive(s rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient) {
	for {
		resp, err := s.Recv()
		if err != nil {
			f.lastStatus.Store(err)
			f.Closes.Add(1)
			f.mu.Lock()
			if f.stream == s {
				f.cancel()
				f.stream, f.cancel = nil, nil
			}
			f.mu.Unlock()
			return
		}
		f.apply(resp, time.Now())
		f.Responses.Add(1)
	}
}

func (f *Filter) apply(resp *rlqsv3.RateLimitQuotaResponse, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range resp.GetBucketAction() {
		if len(a.GetBucketId().GetBucket()) == 0 {
			continue
		}
		k := key(a.GetBucketId().GetBucket())
		b := f.buckets[k]
		if b == nil {
			continue // not a bucket this filter has
		}
		if a.GetAbandonAction() != nil {
			delete(f.buckets, k)
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		if qa == nil {
			continue
		}
		st := qa.GetRateLimitStrategy()
		switch {
		case st.GetTokenBucket() != nil:
			spec := st.GetTokenBucket()
			if b.tb == nil || b.tbSpec == nil || !sameBucket(b.tbSpec, spec) {
				b.tb = newTokenBucket(spec, now)
			}
			b.tbSpec, b.blanket = spec, nil
		case st.GetStrategy() != nil:
			if _, ok := st.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_); ok {
				rule := st.GetBlanketRule()
				b.blanket, b.tb, b.tbSpec = &rule, nil, nil
			} else {
				continue // requests_per_time_unit: not supported by Envoy
			}
		default:
			continue
		}
		b.expires = now.Add(time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second)
	}
}

// sameBucket is Envoy's comparison of two token buckets: fill_interval's
// nanoseconds only, not its seconds.
func sameBucket(a, b *typev3.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() &&
		a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}

// tokenBucket is Envoy's atomic token bucket: starts full, refills
// continuously, never above its maximum.
type tokenBucket struct {
	max, tokens, rate float64
	last              time.Time
}

func newTokenBucket(spec *typev3.TokenBucket, now time.Time) *tokenBucket {
	perFill := float64(1)
	if spec.GetTokensPerFill() != nil {
		perFill = float64(spec.GetTokensPerFill().GetValue())
	}
	sec := spec.GetFillInterval().GetSeconds() // whole seconds, as Envoy reads it
	rate := math.Inf(1)
	if sec > 0 {
		rate = perFill / float64(sec)
	}
	return &tokenBucket{max: float64(spec.GetMaxTokens()), tokens: float64(spec.GetMaxTokens()), rate: rate, last: now}
}

func (t *tokenBucket) consume(now time.Time) bool {
	if el := now.Sub(t.last).Seconds(); el > 0 {
		t.tokens = math.Min(t.max, t.tokens+el*t.rate)
		t.last = now
	}
	if t.tokens < 1 {
		return false
	}
	t.tokens--
	return true
}

func key(id map[string]string) string {
	names := make([]string, 0, len(id))
	for k := range id {
		names = append(names, k)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, k := range names {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(id[k])
		b.WriteByte(0)
	}
	return b.String()
}
