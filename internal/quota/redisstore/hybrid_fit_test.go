package redisstore

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota"
)

// peersOf is a fixed replica count.
type peersOf int64

func (p peersOf) Count() int64 { return int64(p) }

// Lease sizes worked by hand at the shipped lease life (60s), three
// replicas: a lease is capped at a quarter of the bucket over them (83
// of 1,000; 83,333 of 1,000,000).
func TestFitLease(t *testing.T) {
	small := quota.Limit{Limit: 1000, Window: time.Minute}
	large := quota.Limit{Limit: 1_000_000, Window: time.Minute}
	tiny := quota.Limit{Limit: 12, Window: time.Minute} // a lease of one token at most
	for _, c := range []struct {
		name    string
		rate    float64
		l       quota.Limit
		waiting int64
		life    time.Duration
		want    int64
	}{
		// Not known: a probe of half a life, sized as a busy key's
		// (the share of 30s of refill, 167, capped at 83).
		{"unknown", 0, small, 0, 30 * time.Second, 83},
		{"unknown, large", 0, large, 0, 30 * time.Second, 83_333},
		// Busy (2 a second: 120 in a life, over 64): lease_ttl, its
		// demand or share (333; 333,334), capped.
		{"busy", 2, small, 0, time.Minute, 83},
		{"busy, large", 2, large, 0, time.Minute, 83_333},
		// 0.9 a second (the uniform row's keys): 54 in 60s, 108 in
		// 120s: twice that is 216, capped at 83 for 1,000 a minute.
		{"uniform row", 0.9, small, 0, 2 * time.Minute, 83},
		{"uniform row, large", 0.9, large, 0, 2 * time.Minute, 216},
		// Once a minute: 10 in the longest life; a slice of 20.
		{"once a minute", 1.0 / 60, large, 0, 10 * time.Minute, 20},
		{"once a minute, waiters", 1.0 / 60, large, 30, 10 * time.Minute, 32},
		// Once an hour: the request's token and one for the next.
		{"once an hour", 1.0 / 3600, large, 0, 10 * time.Minute, 2},
		// Once every 10s: 6 in 60s, 96 in 960s: 480s holds 48, 600s 60.
		{"every 10s", 0.1, large, 0, 10 * time.Minute, 120},
		// Every 2s: 0.5 × 120 = 60, × 240 = 120: 240s, a slice of 240.
		{"every 2s", 0.5, large, 0, 4 * time.Minute, 240},
		// A bucket whose leases hold one token: nothing is ever held
		// out, so nothing is stretched.
		{"tiny bucket, cold", 1.0 / 60, tiny, 0, time.Minute, 1},
	} {
		f := fitLease(c.rate, time.Minute, c.l, 3, c.waiting)
		if f.life != c.life || f.want != c.want {
			t.Errorf("%s: rate %.4f/s: life %v, %d tokens; want %v, %d", c.name, c.rate, f.life, f.want, c.life, c.want)
		}
	}
}

// Whatever the rate: lives come from a handful of values (so Redis keeps
// a handful of expiry fields per key), none over maxLeaseLife; a lease
// longer than lease_ttl holds under 4 × fitUses tokens (twice its
// expected use, which is under 2 × fitUses) and never more than a
// lease's cap; one that lives lease_ttl or less is sized as before.
func TestFitLeaseBounds(t *testing.T) {
	base := time.Minute
	lives := map[time.Duration]bool{30 * time.Second: true, time.Minute: true, 2 * time.Minute: true,
		4 * time.Minute: true, 8 * time.Minute: true, 10 * time.Minute: true}
	for _, l := range []quota.Limit{{Limit: 1000, Window: time.Minute}, {Limit: 1_000_000, Window: time.Minute}, {Limit: 60, Window: time.Minute, Burst: 10}} {
		for peers := int64(1); peers <= 9; peers += 4 {
			most := maxSlice(l.Capacity(), peers)
			for e := -6.0; e <= 4; e += 0.05 {
				rate := math.Pow(10, e)
				f := fitLease(rate, base, l, peers, 0)
				name := fmt.Sprintf("%+v, %d replicas, %.6f/s", l, peers, rate)
				switch {
				case !lives[f.life]:
					t.Fatalf("%s: life %v is not one of the few", name, f.life)
				case f.want > most:
					t.Fatalf("%s: %d tokens, over a lease's cap %d", name, f.want, most)
				case f.life > base && f.want >= 4*fitUses:
					t.Fatalf("%s: a lease of %v holds %d tokens, 4 × fitUses or more", name, f.life, f.want)
				case f.life > base && f.life < maxLeaseLife && rate*f.life.Seconds() >= 2*float64(min(fitUses, most)):
					t.Fatalf("%s: a lease of %v sees %.0f decisions; half of it would have seen fitUses", name, f.life, rate*f.life.Seconds())
				}
			}
		}
	}
}

// A key's leases on one replica, on an injected clock, at a steady
// interval between its decisions, as Hybrid.Take leases them (a call when
// the slice is spent or its life, less the 1% a replica stops early, is
// over): calls per 1,000 decisions once the key's rate is known, against
// the fixed lease_ttl's 1 in 1 + rate × 59.4s. The replica has watched
// for an hour when the key first comes, so its first lease is fitted too.
func TestFitLeaseCallsOnAClock(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	l := quota.Limit{Limit: 1_000_000, Window: time.Minute}
	for _, c := range []struct {
		every time.Duration
		most  float64 // calls per 1,000 at most, over the measured hours
	}{
		// Fitted to see 64 decisions: at most 1 call in 64.
		{100 * time.Millisecond, 1000.0 / 64}, // busy: lease_ttl sees 594
		{time.Second, 1000.0 / 64},            // 59 in 59.4s; 118 in 118.8s
		{10 * time.Second, 1000.0 / 59},       // 594s: 59 or 60 decisions, the longest life
		// Colder than 64 in the longest life: one call per life
		// (594s): every 10th decision once a minute (every one at 60s).
		{time.Minute, 1000.0 / 9},
		{5 * time.Minute, 1000.0 / 2},
	} {
		h := &Hybrid{peers: peersOf(3), opts: HybridOptions{LeaseTTL: time.Minute}, started: t0.UnixNano()}
		e := &keyState{}
		var tokens int64
		var until time.Time
		var calls, decisions int
		warm := 2 * maxLeaseLife // the fitted lease in place: measured after
		now := t0.Add(time.Hour)
		end := now.Add(warm + 4*time.Hour)
		for ; now.Before(end); now = now.Add(c.every) {
			measured := now.After(t0.Add(time.Hour + warm))
			if measured {
				decisions++
			}
			e.count++
			if tokens >= 1 && now.Before(until) {
				tokens--
				continue
			}
			f := h.sliceSizeLocked(e, l, now.UnixNano())
			tokens, until = f.want-1, now.Add(f.life-f.life/leaseMargin)
			e.remoteAt, e.count = now.UnixNano(), 0
			if measured {
				calls++
			}
		}
		perK := 1000 * float64(calls) / float64(decisions)
		fixed := 1000 / (1 + math.Floor(59.4/c.every.Seconds()))
		t.Logf("every %v: %d calls in %d decisions, %.1f per 1,000 (a fixed 60s life: %.1f)", c.every, calls, decisions, perK, fixed)
		if perK > c.most {
			t.Errorf("every %v: %.1f calls per 1,000 decisions; a lease fitted to the key's rate makes at most %.1f", c.every, perK, c.most)
		}
	}
}

// The first lease of a key: a probe of half a lease life while the
// replica has watched for less than a lease life (it knows nothing of its
// keys' rates), fitted as a cold key's after (not seen for that long, it
// comes less than once a lease life).
func TestFitLeaseFirstSight(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	l := quota.Limit{Limit: 1_000_000, Window: time.Minute}
	h := &Hybrid{peers: peersOf(3), opts: HybridOptions{LeaseTTL: time.Minute}, started: t0.UnixNano()}
	for _, c := range []struct {
		at   time.Duration // since the replica started
		life time.Duration
		want int64
	}{
		{10 * time.Second, 30 * time.Second, 83_333},
		{59 * time.Second, 30 * time.Second, 83_333},
		// Seen once in 5 minutes: 2 in 600s, a slice of 4.
		{5 * time.Minute, 10 * time.Minute, 4},
		// Once in an hour: the token in hand and one more.
		{time.Hour, 10 * time.Minute, 2},
	} {
		e := &keyState{}
		e.count = 1
		f := h.sliceSizeLocked(e, l, t0.Add(c.at).UnixNano())
		if f.life != c.life || f.want != c.want {
			t.Errorf("first seen %v after the start: life %v, %d tokens; want %v, %d", c.at, f.life, f.want, c.life, c.want)
		}
	}
}

// A fitted lease lives at most what local.lease_ttl may be set to, no
// longer: what a dead replica strands is bounded by the same figure
// whether its key was busy or cold (docs/modes.md, lives fitted to
// keys). Config's own validation says where that maximum is.
func TestMaxLeaseLifeIsLeaseTTLMax(t *testing.T) {
	parse := func(d time.Duration) error {
		_, err := config.Parse([]byte(fmt.Sprintf("local: {lease_ttl: %s}\n", d)), "max-life")
		return err
	}
	if err := parse(maxLeaseLife); err != nil {
		t.Errorf("local.lease_ttl %v (maxLeaseLife) refused: %v; a fitted life must not exceed what lease_ttl may be", maxLeaseLife, err)
	}
	if err := parse(maxLeaseLife + time.Millisecond); err == nil {
		t.Errorf("local.lease_ttl %v accepted: lease_ttl's maximum is above maxLeaseLife; tie the two", maxLeaseLife+time.Millisecond)
	}
}
