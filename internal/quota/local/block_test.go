package local

import (
	"context"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
)

// The penalty box at fixed instants, for every algorithm that takes
// block_for: the denial at the limit blocks the key for BlockFor, every
// take and question meanwhile is denied with the real time left (not
// extended by them), and once the block ends the count is what the
// algorithm made of it, untouched by the block.
func TestPenaltyBox(t *testing.T) {
	const block = 10 * time.Second
	for _, l := range []quota.Limit{
		{Algorithm: quota.TokenBucket, Limit: 2, Window: 2 * time.Second, BlockFor: block},
		{Algorithm: quota.FixedWindow, Limit: 2, Window: 2 * time.Second, BlockFor: block},
		{Algorithm: quota.SlidingWindow, Limit: 2, Window: 2 * time.Second, BlockFor: block},
	} {
		t.Run(l.Algorithm.String(), func(t *testing.T) {
			table, err := NewTable(100)
			if err != nil {
				t.Fatal(err)
			}
			lim := New(table)
			ctx := context.Background()
			start := at(time.Hour) // a window's start for every layout
			type step struct {
				after   time.Duration // since start
				n       int64
				allowed bool
				retry   time.Duration // for a denial: the block's time left
			}
			for i, s := range []step{
				{0, 1, true, 0},
				{0, 1, true, 0},
				{0, 1, false, block}, // the limit: the block starts
				{3 * time.Second, 1, false, 7 * time.Second}, // refilled by now, still blocked
				{5 * time.Second, 0, false, 5 * time.Second}, // a question too, and the block is not extended
				{9*time.Second + 500*time.Millisecond, 1, false, 500 * time.Millisecond},
				{block, 1, true, 0}, // over: counting resumes, full after the quiet
				{block, 1, true, 0},
			} {
				d, err := lim.Take(ctx, "k", l, s.n, start.Add(s.after))
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed != s.allowed {
					t.Fatalf("step %d at +%s: %+v, want allowed=%v", i, s.after, d, s.allowed)
				}
				if !s.allowed && (d.RetryAfter != s.retry || d.ResetAfter != s.retry || d.Remaining != 0) {
					t.Fatalf("step %d at +%s: %+v, want retry and reset %s, remaining 0", i, s.after, d, s.retry)
				}
			}
			// The third unit after the block is the algorithm's own
			// denial, which starts a block afresh.
			if d, _ := lim.Take(ctx, "k", l, 1, start.Add(block)); d.Allowed || d.RetryAfter != block {
				t.Fatalf("over the limit after the block: %+v, want a new block of %s", d, block)
			}
		})
	}
}

// A charge (charge: always) is counted through a block and never starts
// one; a limit without BlockFor never blocks.
func TestPenaltyBoxChargesAndNone(t *testing.T) {
	table, _ := NewTable(100)
	lim := New(table)
	ctx := context.Background()
	l := quota.Limit{Algorithm: quota.TokenBucket, Limit: 10, Window: 10 * time.Second, Overdraft: true, BlockFor: time.Minute}
	if d, _ := lim.Take(ctx, "c", l, 15, at(0)); !d.Allowed {
		t.Fatalf("a charge into debt: %+v, want counted", d)
	}
	// The question meets the debt: denied, and the key is blocked.
	if d, _ := lim.Take(ctx, "c", l, 0, at(0)); d.Allowed || d.RetryAfter != time.Minute {
		t.Fatalf("a question in debt: %+v, want a block of 1m", d)
	}
	if d, _ := lim.Take(ctx, "c", l, 3, at(time.Second)); !d.Allowed {
		t.Fatalf("a charge during the block: %+v, want counted", d)
	}
	// 18 units charged, refilled at one a second: by the block's end
	// the debt is paid.
	if d, _ := lim.Take(ctx, "c", l, 0, at(time.Minute)); !d.Allowed {
		t.Fatalf("a question after the block and the debt: %+v, want allowed", d)
	}

	plain := quota.Limit{Algorithm: quota.TokenBucket, Limit: 1, Window: 10 * time.Second}
	lim.Take(ctx, "p", plain, 1, at(0))
	if d, _ := lim.Take(ctx, "p", plain, 1, at(0)); d.Allowed || d.RetryAfter != 10*time.Second {
		t.Fatalf("without block_for: %+v, want the bucket's own wait", d)
	}
}

// While Redis is unreachable the fallback decides blocks locally, on the
// replica's share: the denial of the share's last unit blocks the key for
// the policy's whole BlockFor, and clients are told the policy's limit.
func TestPenaltyBoxInTheFallback(t *testing.T) {
	table, _ := NewTable(100)
	f := NewFallback(table)
	l := quota.Limit{Algorithm: quota.TokenBucket, Limit: 6, Window: 6 * time.Second, BlockFor: 30 * time.Second}
	var denied quota.Decision
	for i := 0; i < 4; i++ {
		d, err := f.Take("k", l, 1, 3, at(0), nil, StartFresh, at(0))
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			denied = d
			break
		}
	}
	if denied.RetryAfter != 30*time.Second || denied.Limit != 6 {
		t.Fatalf("the fallback's denial of a share of 2: %+v, want a block of 30s under the limit of 6", denied)
	}
	if d, _ := f.Take("k", l, 0, 3, at(20*time.Second), nil, StartFresh, at(0)); d.Allowed || d.RetryAfter != 10*time.Second {
		t.Fatalf("a question 20s into the block: %+v, want denied for 10s", d)
	}
}
