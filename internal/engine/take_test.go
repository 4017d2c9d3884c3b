package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// standalone compiles a local-mode policy outside any configuration, as a
// door with its own configuration language does.
func standalone(t *testing.T, m *Metrics, table *local.Table, p config.Policy) *Policy {
	t.Helper()
	if p.Mode == "" {
		p.Mode = config.ModeLocal
	}
	if p.Algorithm == "" {
		p.Algorithm = config.FixedWindow
	}
	pol, err := NewPolicy(p, Limiters{config.ModeLocal: local.New(table)}, m)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// TakeAll spends every take's units or none: a take of 5 spends 5, a
// denial refunds what the others took, a shadow denial denies nothing, and
// every decision is counted under its policy.
func TestTakeAllIsAllOrNothing(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	table, _ := local.NewTable(100)
	wide := standalone(t, m, table, config.Policy{Name: "wide", Limit: 10, Window: time.Minute})
	narrow := standalone(t, m, table, config.Policy{Name: "narrow", Limit: 6, Window: time.Minute})
	shadow := standalone(t, m, table, config.Policy{Name: "shadow", Limit: 1, Window: time.Minute, Shadow: true})
	now := time.Unix(1_700_000_040, 0) // 40s into a minute
	ctx := context.Background()
	take := func(units ...int64) (Outcome, []Taken) {
		takes := []Taken{
			{Policy: wide, Key: "w", Limit: wide.FixedLimit(), Units: units[0]},
			{Policy: narrow, Key: "n", Limit: narrow.FixedLimit(), Units: units[1]},
			{Policy: shadow, Key: "s", Limit: shadow.FixedLimit(), Units: units[2]},
		}
		o, _, err := TakeAll(ctx, takes, now, nil)
		if err != nil {
			t.Fatal(err)
		}
		return o, takes
	}

	// 5 of wide and narrow; the shadow policy denies 5 of its 1 and
	// denies nothing.
	if o, takes := take(5, 5, 5); o != OK || takes[0].Decision.Remaining != 5 || takes[1].Decision.Remaining != 1 || takes[2].OK {
		t.Fatalf("first: %v %+v", o, takes)
	}
	// 2 more do not fit narrow (1 left): over the limit, and wide keeps
	// its 5 left (its 2 are refunded); the denial ends the request, so
	// the shadow policy after it is not asked.
	if o, takes := take(2, 2, 0); o != OverLimit || !takes[0].OK || takes[1].OK || takes[2].Decision != (quota.Decision{}) {
		t.Fatalf("second: %v %+v", o, takes)
	}
	// A question of 0 units spends nothing: wide still has 5, narrow 1.
	if o, takes := take(0, 0, 0); o != OK || takes[0].Decision.Remaining != 5 || takes[1].Decision.Remaining != 1 {
		t.Fatalf("peek: %v %+v", o, takes)
	}
	if o, takes := take(5, 1, 0); o != OK || takes[0].Decision.Remaining != 0 || takes[1].Decision.Remaining != 0 {
		t.Fatalf("last: %v %+v", o, takes)
	}
	for _, c := range []struct {
		policy, result string
		want           float64
	}{
		{"wide", "allowed", 4}, {"wide", "refunded", 1},
		{"narrow", "allowed", 3}, {"narrow", "denied", 1},
		{"shadow", "shadow_denied", 1}, {"shadow", "allowed", 2},
	} {
		if got := testutil.ToFloat64(m.Decisions.WithLabelValues(c.policy, "local", c.result)); got != c.want {
			t.Errorf("%s %s = %v, want %v", c.policy, c.result, got, c.want)
		}
	}
}

// A limiter that fails is an error, and what was taken before it is given
// back; a caller that gives up while held gets its units refunded.
func TestTakeAllFailureAndCancel(t *testing.T) {
	m := NewMetrics(nil)
	table, _ := local.NewTable(100)
	ok := standalone(t, m, table, config.Policy{Name: "ok", Limit: 3, Window: time.Minute})
	broken, err := NewPolicy(config.Policy{Name: "broken", Mode: config.ModeRedis, Limit: 3, Window: time.Minute},
		Limiters{config.ModeRedis: failing{}}, m)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	takes := []Taken{{Policy: ok, Key: "k", Limit: ok.FixedLimit(), Units: 2}, {Policy: broken, Key: "k", Limit: broken.FixedLimit(), Units: 1}}
	if o, _, err := TakeAll(context.Background(), takes, now, nil); o != Failed || !errors.Is(err, errBroken) {
		t.Fatalf("failing limiter: %v %v", o, err)
	}
	// Nothing stayed spent: 3 fit.
	if o, _, _ := TakeAll(context.Background(), []Taken{{Policy: ok, Key: "k", Limit: ok.FixedLimit(), Units: 3}}, now, nil); o != OK {
		t.Fatalf("after the failure: %v", o)
	}

	leaky := standalone(t, m, table, config.Policy{Name: "leaky", Limit: 10, Window: time.Second, Algorithm: config.LeakyBucket, Queue: -1, MaxDelay: time.Second})
	held := func(ctx context.Context, d time.Duration) error { return context.Canceled }
	takes = []Taken{{Policy: leaky, Key: "l", Limit: leaky.FixedLimit(), Units: 1}, {Policy: leaky, Key: "l", Limit: leaky.FixedLimit(), Units: 1}}
	if o, _, err := TakeAll(context.Background(), takes, now, held); o != Canceled || err == nil {
		t.Fatalf("canceled while held: %v %v", o, err)
	}
	// Both slots were given back: the next two pass without a delay
	// beyond one interval.
	takes = []Taken{{Policy: leaky, Key: "l", Limit: leaky.FixedLimit(), Units: 1}}
	if o, _, _ := TakeAll(context.Background(), takes, now, nil); o != OK || takes[0].Decision.Delay != 0 {
		t.Fatalf("after the refund: %v %+v", o, takes[0].Decision)
	}
}

var errBroken = errors.New("broken")

type failing struct{}

func (failing) Take(context.Context, string, quota.Limit, int64, time.Time) (quota.Decision, error) {
	return quota.Decision{}, errBroken
}
func (failing) Refund(context.Context, string, quota.Limit, int64, time.Time) error { return errBroken }

// unrefundable admits every take and fails every refund, as Redis does
// when it stops answering between a take and its refund.
type unrefundable struct{}

func (unrefundable) Take(_ context.Context, _ string, l quota.Limit, _ int64, _ time.Time) (quota.Decision, error) {
	return quota.Decision{Allowed: true, Limit: l.Limit}, nil
}
func (unrefundable) Refund(context.Context, string, quota.Limit, int64, time.Time) error {
	return errBroken
}

// The refunded count says what was given back: a refund that failed
// leaves it where it was, and one that was made moves it.
func TestTakeAllCountsOnlyRefundsMade(t *testing.T) {
	m := NewMetrics(nil)
	table, _ := local.NewTable(100)
	stuck, err := NewPolicy(config.Policy{Name: "stuck", Mode: config.ModeRedis, Limit: 3, Window: time.Minute},
		Limiters{config.ModeRedis: unrefundable{}}, m)
	if err != nil {
		t.Fatal(err)
	}
	given := standalone(t, m, table, config.Policy{Name: "given", Limit: 3, Window: time.Minute})
	none := standalone(t, m, table, config.Policy{Name: "none", Limit: 0, Window: time.Minute})
	now := time.Unix(1_700_000_000, 0)
	takes := []Taken{
		{Policy: stuck, Key: "k", Limit: stuck.FixedLimit(), Units: 1},
		{Policy: given, Key: "k", Limit: given.FixedLimit(), Units: 1},
		{Policy: none, Key: "k", Limit: none.FixedLimit(), Units: 1},
	}
	if o, _, err := TakeAll(context.Background(), takes, now, nil); o != OverLimit || err != nil {
		t.Fatalf("%v %v", o, err)
	}
	for policy, want := range map[string]float64{"stuck": 0, "given": 1} {
		mode := "local"
		if policy == "stuck" {
			mode = "redis"
		}
		if got := testutil.ToFloat64(m.Decisions.WithLabelValues(policy, mode, "refunded")); got != want {
			t.Errorf("%s refunded = %v, want %v", policy, got, want)
		}
	}
}
