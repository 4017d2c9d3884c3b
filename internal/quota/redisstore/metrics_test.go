package redisstore

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Every reason hybrid gives tokens back for (and expired, those it never
// gives back) is a series of extauthz_hybrid_tokens_returned_total at 0
// from the start, so that a dashboard or an alert on one sees 0 before
// the first give-back rather than nothing. The list is written out here,
// apart from giveBackReasons: a reason missing from the pre-registration
// fails the test.
func TestEveryGiveBackReasonIsExportedFromTheStart(t *testing.T) {
	want := []string{"renewed", "idle", "evicted", "shutdown", "refund", "reload", "late", "expired"}
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		if mf.GetName() != "extauthz_hybrid_tokens_returned_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				t.Errorf("%v: %v at start, want 0", m.GetLabel(), v)
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					got = append(got, l.GetValue())
				}
			}
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("extauthz_hybrid_tokens_returned_total at start has reasons %v, want every reason hybrid uses: %v", got, want)
	}
}
