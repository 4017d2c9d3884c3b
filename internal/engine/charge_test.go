package engine

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// A charge (units under charge: always) is a fact: it is counted past the
// limit, never refunded when another take denies the request, and made
// even when a take before it denied; the other takes stay all or none.
func TestTakeAllChargesAreFacts(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	table, _ := local.NewTable(100)
	budget := standalone(t, m, table, config.Policy{Name: "budget", Limit: 10, Window: time.Minute, Algorithm: config.TokenBucket, Charge: config.ChargeAlways})
	narrow := standalone(t, m, table, config.Policy{Name: "narrow", Limit: 3, Window: time.Minute})
	now := time.Unix(1_700_000_040, 0)
	ctx := context.Background()
	take := func(order string, charge, units int64) Outcome {
		t.Helper()
		c := Taken{Policy: budget, Key: "b", Limit: budget.FixedLimit(), Units: charge}
		n := Taken{Policy: narrow, Key: "n", Limit: narrow.FixedLimit(), Units: units}
		takes := []Taken{c, n}
		if order == "narrow first" {
			takes = []Taken{n, c}
		}
		o, _, err := TakeAll(ctx, takes, now, nil)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	left := func(p *Policy, key string) int64 {
		t.Helper()
		d, err := p.limiter.Take(ctx, key, p.FixedLimit().Limit, 0, now)
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}

	if o := take("budget first", 8, 3); o != OK || left(budget, "b") != 2 || left(narrow, "n") != 0 {
		t.Fatalf("first: %v", o)
	}
	// narrow is spent: the request is denied, but the charge before the
	// denial stays (past the limit: 8 + 7 of 10).
	if o := take("budget first", 7, 1); o != OverLimit {
		t.Fatalf("second: %v", o)
	}
	// and the one after a denial is still made: 15 + 5 of 10, in debt.
	if o := take("narrow first", 5, 1); o != OverLimit {
		t.Fatalf("third: %v", o)
	}
	// 20 charged of 10, a token every 6s: a question waits for 11.
	d, _ := budget.limiter.Take(ctx, "b", budget.FixedLimit().Limit, 0, now)
	if d.Allowed || d.Remaining != 0 || d.RetryAfter != 66*time.Second {
		t.Fatalf("a question after 20 of 10 charged: %+v", d)
	}
}
