package local

import (
	"context"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func TestLocalLimiter(t *testing.T) {
	table, err := NewTable(1000)
	if err != nil {
		t.Fatal(err)
	}
	lim := New(table)
	ctx := context.Background()
	l := quota.Limit{Limit: 2, Window: time.Minute}
	for i, want := range []bool{true, true, false} {
		d, err := lim.Take(ctx, "k", l, 1, at(0))
		if err != nil || d.Allowed != want {
			t.Fatalf("take %d: %+v %v, want allowed=%v", i, d, err, want)
		}
	}
	if err := lim.Refund(ctx, "k", l, 1, at(0)); err != nil {
		t.Fatal(err)
	}
	if d, _ := lim.Take(ctx, "k", l, 1, at(0)); !d.Allowed {
		t.Fatalf("after refund: %+v", d)
	}
	if d, _ := lim.Take(ctx, "other", l, 1, at(0)); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("other key shares state: %+v", d)
	}
	if table.Len() != 2 {
		t.Fatalf("cache holds %d keys, want 2", table.Len())
	}
}

func BenchmarkLocalTake(b *testing.B) {
	table, _ := NewTable(100_000)
	lim := New(table)
	ctx := context.Background()
	l := quota.Limit{Limit: 1 << 40, Window: time.Second}
	now := time.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			// Far from its limit (2^40 a second), every take is allowed.
			if d, err := lim.Take(ctx, "orders:client:ada", l, 1, now); err != nil || !d.Allowed {
				b.Errorf("take far from the limit: %+v, %v; want allowed", d, err)
				return
			}
		}
	})
}

// One local decision per algorithm, on a busy key far from its limit.
func BenchmarkLocalAlgorithms(b *testing.B) {
	for _, a := range []quota.Algorithm{quota.TokenBucket, quota.SlidingWindow, quota.FixedWindow, quota.SlidingLog, quota.LeakyBucket} {
		b.Run(a.String(), func(b *testing.B) {
			table, _ := NewTable(1000)
			lim := New(table)
			ctx := context.Background()
			l := quota.Limit{Algorithm: a, Limit: 100_000, Window: time.Hour, Queue: -1, MaxDelay: 150 * time.Millisecond}
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			b.ReportAllocs()
			for b.Loop() {
				// 40ms apart: a sliding log holds at most 90,000 of
				// its 100,000 and a leaky bucket (a slot per 36ms)
				// keeps admitting.
				now = now.Add(40 * time.Millisecond)
				if d, err := lim.Take(ctx, "orders:client:ada", l, 1, now); err != nil || !d.Allowed {
					b.Fatalf("take 40ms after the last, far from the limit: %+v, %v; want allowed", d, err)
				}
			}
		})
	}
}

// Peek says what Take would decide and changes nothing: no entry for a new
// key, no unit from a known one.
func TestPeek(t *testing.T) {
	table, _ := NewTable(1000)
	lim := New(table)
	ctx := context.Background()
	for _, a := range []quota.Algorithm{quota.TokenBucket, quota.SlidingWindow, quota.FixedWindow, quota.SlidingLog, quota.LeakyBucket} {
		l := quota.Limit{Algorithm: a, Limit: 2, Window: time.Minute}
		key := "k:" + a.String()
		if d, _ := lim.Peek(ctx, key, l, at(0)); !d.Allowed || table.Len() != 0 {
			t.Fatalf("%s: peek at a new key: %+v, %d entries", a, d, table.Len())
		}
		for i := 0; i < 2; i++ {
			peeked, _ := lim.Peek(ctx, key, l, at(0))
			taken, _ := lim.Take(ctx, key, l, 1, at(0))
			if peeked != taken {
				t.Fatalf("%s, unit %d: peeked %+v, took %+v", a, i+1, peeked, taken)
			}
		}
		if d, _ := lim.Peek(ctx, key, l, at(0)); d.Allowed {
			t.Fatalf("%s: peek after the limit: %+v", a, d)
		}
		table, _ = NewTable(1000) // a fresh table for the next algorithm
		lim = New(table)
	}
}
