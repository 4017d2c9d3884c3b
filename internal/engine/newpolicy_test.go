package engine

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// NewLimit keeps the policy's algorithm and names it in the header.
func TestNewPolicyLimits(t *testing.T) {
	m := NewMetrics(nil)
	table, _ := local.NewTable(10)
	p := standalone(t, m, table, config.Policy{Name: "d.k_v", Limit: 5, Window: time.Minute})
	if h := p.FixedLimit().Header; h != `"d.k_v";q=5;w=60` {
		t.Fatalf("header %s", h)
	}
	l := p.NewLimit(7, time.Hour)
	if l.Algorithm != quota.FixedWindow || l.Limit.Limit != 7 || l.Window != time.Hour || l.Header != `"d.k_v";q=7;w=3600` {
		t.Fatalf("override %+v", l)
	}
	c := p.CountedAs("d.k_x", m)
	if c.Name != "d.k_v" || c.FixedLimit() != p.FixedLimit() {
		t.Fatalf("copy %+v of %+v", c, p)
	}
	takes := []Taken{{Policy: c, Key: "x", Limit: c.FixedLimit(), Units: 1}}
	if o, _, err := TakeAll(context.Background(), takes, time.Unix(0, 0), nil); o != OK || err != nil {
		t.Fatalf("%v %v", o, err)
	}
	if got := testutil.ToFloat64(m.Decisions.WithLabelValues("d.k_x", "local", "allowed")); got != 1 {
		t.Fatalf("counted under the new name: %v", got)
	}
	if got := testutil.ToFloat64(m.Decisions.WithLabelValues("d.k_v", "local", "allowed")); got != 0 {
		t.Fatalf("counted under the old name: %v", got)
	}
	if _, err := NewPolicy(config.Policy{Name: "r", Mode: config.ModeRedis, Limit: 1, Window: time.Second}, Limiters{}, m); err == nil {
		t.Fatal("a mode without a limiter compiled")
	}
}
