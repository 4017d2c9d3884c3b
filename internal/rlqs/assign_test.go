package rlqs

import (
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

// What an Envoy bucket may admit is what the door takes for it: its
// tokens, and its refill up to the end of its life, rounded down.
func TestAdmits(t *testing.T) {
	for _, c := range []struct {
		spec bucketSpec
		life time.Duration
		want int64
	}{
		{bucketSpec{MaxTokens: 10, TokensPerFill: 5, FillSeconds: 1}, 4 * time.Second, 30},
		{bucketSpec{MaxTokens: 10, TokensPerFill: 5, FillSeconds: 1}, 4500 * time.Millisecond, 32},
		{bucketSpec{MaxTokens: 10, TokensPerFill: 1, FillSeconds: noRefill}, 4 * time.Second, 10},
		{bucketSpec{MaxTokens: 10, TokensPerFill: 2, FillSeconds: noRefill}, 4 * time.Second, 10},
		{bucketSpec{MaxTokens: 1, TokensPerFill: 1, FillSeconds: noRefill}, 24 * time.Hour, 2},
		{bucketSpec{MaxTokens: 7, TokensPerFill: 3, FillSeconds: 1}, -time.Second, 7},
	} {
		if got := c.spec.admits(t0, t0.Add(c.life)); got != c.want {
			t.Errorf("%+v over %v admits %d; want %d", c.spec, c.life, got, c.want)
		}
	}
}

// A share spells as a refilling bucket at one token a second or more
// (the rate rounded down, never above the share), else as a slice.
func TestSpecFor(t *testing.T) {
	for _, c := range []struct {
		tokens int64
		rate   float64
		want   bucketSpec
	}{
		{20, 10, bucketSpec{20, 10, 1}},
		{20, 9.99, bucketSpec{20, 9, 1}},
		{0, 2.5, bucketSpec{1, 2, 1}},
		{5, 0.9, bucketSpec{5, 1, noRefill}},
		{5, 0, bucketSpec{5, 1, noRefill}},
	} {
		if got := specFor(c.tokens, c.rate); got != c.want {
			t.Errorf("specFor(%d, %v) = %+v; want %+v", c.tokens, c.rate, got, c.want)
		}
	}
}

// Envoy keeps a bucket when max_tokens, tokens_per_fill and the fill
// interval's nanoseconds match: the two kinds the door sends differ in
// the nanoseconds, and other always gives a spec Envoy tells apart,
// costing no more than one token above.
func TestEnvoyTellsSpecsApart(t *testing.T) {
	refill := bucketSpec{MaxTokens: 1, TokensPerFill: 1, FillSeconds: 1}
	slice := bucketSpec{MaxTokens: 1, TokensPerFill: 1, FillSeconds: noRefill}
	if envoySame(refill, slice) {
		t.Fatal("a refilling bucket and a slice of the same numbers look the same to Envoy")
	}
	for _, s := range []bucketSpec{refill, slice, {9, 3, 1}, {9, 1, noRefill}} {
		o := other(s)
		if envoySame(s, o) {
			t.Errorf("other(%+v) = %+v, which Envoy would keep as the same bucket", s, o)
		}
		life := 4 * time.Second
		if o.admits(t0, t0.Add(life)) > s.admits(t0, t0.Add(life))+1 {
			t.Errorf("other(%+v) = %+v admits more than one token above it", s, o)
		}
	}
}

// A bucket cut to what the count can pay costs at most that.
func TestScaleFitsWhatIsAvailable(t *testing.T) {
	life := 4 * time.Second
	for _, s := range []bucketSpec{{60, 9, 1}, {1, 1, 1}, {100, 1, noRefill}, {5, 50, 1}} {
		for avail := int64(1); avail <= 120; avail++ {
			got := scale(s, avail, life)
			if cost := got.admits(t0, t0.Add(life)); cost > avail {
				t.Fatalf("scale(%+v, %d) = %+v, which costs %d", s, avail, got, cost)
			}
		}
	}
}

// A share's first bucket and its refill for a whole life fit the
// holder's part of the capacity, and the refill is its part of the rate.
func TestShareOf(t *testing.T) {
	life := 4 * time.Second
	for _, c := range []struct {
		rate     float64
		capacity int64
		weight   float64
	}{
		{10, 100, 1}, {10, 100, 0.25}, {10, 600, 0.5}, {10, 10, 1}, {1.0 / 6, 10, 1},
	} {
		sh := shareOf(c.rate, c.capacity, c.weight, life)
		if sh.perSecond > c.rate*c.weight+1e-9 {
			t.Errorf("%+v: refill %v above the holder's part of the rate", c, sh.perSecond)
		}
		spec := specFor(sh.maxTokens, sh.perSecond)
		if cost := spec.admits(t0, t0.Add(life)); float64(cost) > float64(c.capacity)*c.weight+1 {
			t.Errorf("%+v: first bucket %+v costs %d, above the holder's part of the capacity", c, spec, cost)
		}
	}
}

func TestTTLSeconds(t *testing.T) {
	for _, c := range []struct {
		d, most time.Duration
		want    int64
	}{
		{0, 3 * time.Second, 1}, {200 * time.Millisecond, 3 * time.Second, 1}, {1100 * time.Millisecond, 3 * time.Second, 2}, {time.Minute, 3 * time.Second, 3},
	} {
		if got := ttlSeconds(c.d, c.most); got != c.want {
			t.Errorf("ttlSeconds(%v, %v) = %d; want %d", c.d, c.most, got, c.want)
		}
	}
}

// A bucket replaced by a new assignment is charged for as long as it can
// run. Envoy swaps the two when the assignment arrives, at some instant a
// between now and now + deliveryAllowance: the old one admits until a,
// the new one from a. Whatever a is, what the two can admit is paid (the
// old one's payment less its credit, plus the new one's cost from now to
// the end of its life). A bucket that refills no slower than the old one
// is not charged that second twice: with the swap at now, what is paid is
// exactly what the two can admit.
func TestCreditCoversTheSwap(t *testing.T) {
	now := t0.Add(10 * time.Second)
	until := now.Add(4 * time.Second)
	old := bucketSpec{MaxTokens: 6, TokensPerFill: 3, FillSeconds: 1}
	for _, c := range []struct {
		name string
		next bucketSpec
	}{
		{"grows", bucketSpec{MaxTokens: 20, TokensPerFill: 9, FillSeconds: 1}},
		{"same rate", bucketSpec{MaxTokens: 5, TokensPerFill: 3, FillSeconds: 1}},
		{"shrinks", bucketSpec{MaxTokens: 2, TokensPerFill: 1, FillSeconds: 1}},
		{"to a slice", bucketSpec{MaxTokens: 5, TokensPerFill: 1, FillSeconds: noRefill}},
	} {
		h := &held{last: actionTokens, spec: old, start: t0.Add(8 * time.Second), paidUntil: now.Add(2 * time.Second)}
		h.paid = old.admits(h.start, h.paidUntil)
		paid := h.paid - h.credit(now, c.next) + c.next.admits(now, until)
		for a := now; !a.After(now.Add(deliveryAllowance)); a = a.Add(100 * time.Millisecond) {
			if can := old.admits(h.start, a) + c.next.admits(a, until); can > paid {
				t.Errorf("%s: with the swap %v after the assignment was sent, the two buckets can admit %d; %d were paid", c.name, a.Sub(now), can, paid)
			}
		}
		if c.next.rate() >= old.rate() {
			if can := old.admits(h.start, now) + c.next.admits(now, until); paid != can {
				t.Errorf("%s: %d paid where the two buckets can admit %d with the swap on sending: a second of both rates charged", c.name, paid, can)
			}
		}
	}
}
