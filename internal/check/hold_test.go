package check

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/engine/enginetest"
)

// holdRecorder stands in for the timer that holds a shaped request: it
// records each hold and returns err (nil: the hold ran its course).
type holdRecorder struct {
	holds []time.Duration
	err   error
}

func (h *holdRecorder) hold(_ context.Context, d time.Duration) error {
	h.holds = append(h.holds, d)
	return h.err
}

func newHoldFixture(t *testing.T, yaml string) (*fixture, *holdRecorder) {
	t.Helper()
	rec := &holdRecorder{}
	e := enginetest.New(t, enginetest.Parse(t, yaml), engine.WithHold(rec.hold))
	f := &fixture{t: t, now: t0, m: e.Metrics(), cache: e.Counts}
	f.srv = NewServer(e.Running, WithClock(func() time.Time { return f.now }))
	return f, rec
}

// 10 per second: a slot every 100ms, held at most 150ms.
const shapedYAML = `
policies:
  - {name: shaped, limit: 10, window: 1s, algorithm: leaky_bucket, max_delay: 150ms}
`

// A shaped request's OK waits for its slot; past max_delay it is a 429.
func TestLeakyBucketHoldsTheOK(t *testing.T) {
	f, rec := newHoldFixture(t, shapedYAML)
	if r := f.check(RequestSpec{}); !allowed(r) || len(rec.holds) != 0 {
		t.Fatalf("first request: allowed=%v holds=%v", allowed(r), rec.holds)
	}
	if r := f.check(RequestSpec{}); !allowed(r) || len(rec.holds) != 1 || rec.holds[0] != 100*time.Millisecond {
		t.Fatalf("second request: allowed=%v holds=%v, want one hold of 100ms", allowed(r), rec.holds)
	}
	r := f.check(RequestSpec{})
	if allowed(r) || httpStatus(r) != 429 || len(rec.holds) != 1 {
		t.Fatalf("third request (200ms away): %v, holds %v", r, rec.holds)
	}
	if h := headerMap(r.GetDeniedResponse().GetHeaders()); h["retry-after"] != "1" {
		t.Fatalf("429 headers = %v", h)
	}
}

// A caller that gives up while held never reaches the upstream: its slot
// is given back and the Check ends with the context's status.
func TestHeldRequestCanceledGivesTheSlotBack(t *testing.T) {
	f, rec := newHoldFixture(t, shapedYAML)
	f.check(RequestSpec{})
	rec.err = context.DeadlineExceeded
	_, err := f.srv.Check(context.Background(), NewRequest(RequestSpec{Method: "GET", Path: "/"}))
	if grpcstatus.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("canceled hold: err = %v, want DeadlineExceeded", err)
	}
	rec.err = nil
	// The slot at +100ms is free again: the next request waits 100ms, not 200ms (a 429).
	if r := f.check(RequestSpec{}); !allowed(r) || rec.holds[len(rec.holds)-1] != 100*time.Millisecond {
		t.Fatalf("after the cancellation: allowed=%v holds=%v", allowed(r), rec.holds)
	}
	if got := testutil.ToFloat64(f.m.Checks.WithLabelValues(Door, engine.Canceled.String())); got != 1 {
		t.Fatalf("canceled checks = %v, want 1", got)
	}
	if got := testutil.ToFloat64(f.m.Decisions.WithLabelValues("shaped", "local", "refunded")); got != 1 {
		t.Fatalf("refunded decisions = %v, want 1", got)
	}
}

// A request another policy denies is answered at once (no hold), and the
// leaky bucket's slot is given back.
func TestDeniedShapedRequestIsNotHeld(t *testing.T) {
	f, rec := newHoldFixture(t, shapedYAML+"  - {name: narrow, match: {path_prefix: /narrow}, limit: 1, window: 1m}\n")
	f.check(RequestSpec{Path: "/narrow"}) // shaped: slot now; narrow: its one unit
	r := f.check(RequestSpec{Path: "/narrow"})
	if allowed(r) || len(rec.holds) != 0 {
		t.Fatalf("narrow should deny without holding: %v, holds %v", r, rec.holds)
	}
	// shaped gave its +100ms slot back: another request takes it.
	if r := f.check(RequestSpec{Path: "/other"}); !allowed(r) || len(rec.holds) != 1 || rec.holds[0] != 100*time.Millisecond {
		t.Fatalf("after the refund: allowed=%v holds=%v", allowed(r), rec.holds)
	}
}

// Shadow policies never delay traffic.
func TestShadowLeakyBucketDoesNotHold(t *testing.T) {
	f, rec := newHoldFixture(t, `
policies:
  - {name: shaped, limit: 10, window: 1s, algorithm: leaky_bucket, max_delay: 150ms, shadow: true}
`)
	for i := 0; i < 3; i++ {
		if r := f.check(RequestSpec{}); !allowed(r) {
			t.Fatalf("shadow policy denied request %d", i)
		}
	}
	if len(rec.holds) != 0 {
		t.Fatalf("shadow policy held requests: %v", rec.holds)
	}
}
