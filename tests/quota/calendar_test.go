package quota_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the zones below, whatever the machine has installed

	"github.com/extauthz/extauthz/internal/quota"
)

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// calendarCases are the boundaries calendars get wrong, each crossed by a run
// of requests: a DST change, a leap day, a month end; plus midnight
// skipped and repeated by a DST change (Havana), and a Monday.
var calendarCases = []struct {
	name     string
	zone     string
	period   quota.Period
	boundary time.Time // a window boundary, in UTC
	prev     time.Time // the boundary before it
}{
	// Paris, 23-hour day: March 29, 2026 ends at 22:00Z.
	{"after a 23-hour day", "Europe/Paris", quota.Day, time.Date(2026, 3, 29, 22, 0, 0, 0, time.UTC), time.Date(2026, 3, 28, 23, 0, 0, 0, time.UTC)},
	// Paris, 25-hour day: October 25, 2026 ends at 23:00Z.
	{"after a 25-hour day", "Europe/Paris", quota.Day, time.Date(2026, 10, 25, 23, 0, 0, 0, time.UTC), time.Date(2026, 10, 24, 22, 0, 0, 0, time.UTC)},
	// Havana skips midnight on March 8, 2026: the day starts at 05:00Z.
	{"midnight skipped", "America/Havana", quota.Day, time.Date(2026, 3, 8, 5, 0, 0, 0, time.UTC), time.Date(2026, 3, 7, 5, 0, 0, 0, time.UTC)},
	// Havana repeats midnight on November 2, 2025: the day starts at the first, 04:00Z.
	{"midnight repeated", "America/Havana", quota.Day, time.Date(2025, 11, 2, 4, 0, 0, 0, time.UTC), time.Date(2025, 11, 1, 4, 0, 0, 0, time.UTC)},
	// February 29, 2028 ends; March starts.
	{"leap day", "UTC", quota.Day, time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC)},
	{"end of a leap February", "Asia/Tokyo", quota.Month, time.Date(2028, 2, 29, 15, 0, 0, 0, time.UTC), time.Date(2028, 1, 31, 15, 0, 0, 0, time.UTC)},
	// January 31 ends in New York at 05:00Z.
	{"month end", "America/New_York", quota.Month, time.Date(2027, 2, 1, 5, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 5, 0, 0, 0, time.UTC)},
	{"year end", "Europe/Paris", quota.Year, time.Date(2026, 12, 31, 23, 0, 0, 0, time.UTC), time.Date(2025, 12, 31, 23, 0, 0, 0, time.UTC)},
	{"Monday", "Europe/Paris", quota.Week, time.Date(2026, 3, 29, 22, 0, 0, 0, time.UTC), time.Date(2026, 3, 22, 23, 0, 0, 0, time.UTC)},
}

// A calendar quota resets at the local boundary, in local mode (Go) and
// redis mode (the Lua script on a real redis-server, injected time
// standing in for Redis TIME): the quota spent just before the boundary
// is denied with a wait that points at it, and admits again at it.
func TestCalendarResetsAtTheLocalBoundary(t *testing.T) {
	bs := backends(t)
	for _, tc := range calendarCases {
		t.Run(tc.name, func(t *testing.T) {
			l := quota.Limit{Algorithm: quota.FixedWindow, Limit: 3, Window: 24 * time.Hour, Calendar: quota.NewCalendar(tc.period, zone(t, tc.zone))}
			for _, b := range bs {
				key := "cal:" + strings.ReplaceAll(tc.name, " ", "-")
				b.clk.Set(tc.prev) // the window's first instant
				if n, _ := b.burst(t, key, l, 2); n != 2 {
					t.Fatalf("%s: %d of 2 admitted at the window's start", b.name, n)
				}
				b.clk.Set(tc.boundary.Add(-1500 * time.Millisecond))
				n, first := b.burst(t, key, l, 3)
				if n != 1 || first.RetryAfter != 1500*time.Millisecond || first.ResetAfter != 1500*time.Millisecond {
					t.Fatalf("%s: 1.5s before the boundary, %d admitted and %+v; want 1 and a wait of 1.5s", b.name, n, first)
				}
				b.clk.Set(tc.boundary.Add(-time.Microsecond))
				if d := b.take(t, key, l); d.Allowed || d.RetryAfter != time.Microsecond {
					t.Fatalf("%s: a microsecond before the boundary: %+v", b.name, d)
				}
				b.clk.Set(tc.boundary)
				n, _ = b.burst(t, key, l, 4)
				if n != 3 {
					t.Fatalf("%s: at the boundary, %d of 4 admitted; want the new window's 3", b.name, n)
				}
			}
		})
	}
}

// Requests of several units, questions and refunds, at random instants
// across each boundary: the script and the Go algorithm agree.
func TestCalendarScriptMatchesLocal(t *testing.T) {
	bs := backends(t)
	loc, rds := bs[0], bs[1]
	ctx := context.Background()
	for ci, tc := range calendarCases {
		l := quota.Limit{Algorithm: quota.FixedWindow, Limit: 12, Window: 24 * time.Hour, Calendar: quota.NewCalendar(tc.period, zone(t, tc.zone))}
		rng := rand.New(rand.NewPCG(uint64(ci), 7))
		key := fmt.Sprintf("cal-agree:%d", ci)
		start := tc.boundary.Add(-5 * time.Minute)
		loc.clk.Set(start)
		rds.clk.Set(start)
		for i := 0; i < 200; i++ {
			step := time.Duration(rng.Int64N(3000)) * time.Millisecond
			loc.clk.Advance(step)
			rds.clk.Advance(step)
			units := []int64{0, 1, 1, 2, 3}[rng.IntN(5)]
			want, err := loc.lim.Take(ctx, key, l, units, loc.clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			got, err := rds.lim.Take(ctx, key, l, units, rds.clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			if got.Allowed != want.Allowed || got.Remaining != want.Remaining ||
				absDur(got.RetryAfter-want.RetryAfter) > time.Microsecond || absDur(got.ResetAfter-want.ResetAfter) > time.Microsecond {
				t.Fatalf("%s step %d (%d units) at %v: redis %+v, local %+v", tc.name, i, units, loc.clk.Now().UTC(), got, want)
			}
			if units > 0 && want.Allowed && rng.IntN(6) == 0 {
				loc.lim.Refund(ctx, key, l, units, loc.clk.Now())
				rds.lim.Refund(ctx, key, l, units, rds.clk.Now())
			}
		}
	}
}

// The script counts in the window holding its own time among those it is
// sent: a sidecar whose clock is still in yesterday counts today's request
// in today's window, and a Redis clock outside every window sent is an
// error, not a guess.
func TestCalendarScriptDecidesByRedisTime(t *testing.T) {
	_, rdb, _ := newTestStore(t, nil)
	cal := quota.NewCalendar(quota.Day, zone(t, "Europe/Paris"))
	// The sidecar's now: 23:59:59 on October 24 in Paris.
	b := cal.At(time.Date(2026, 10, 24, 21, 59, 59, 0, time.UTC).UnixNano())
	us := func(ns int64) int64 { return ns / 1000 }
	bounds := []any{us(b.Prev), us(b.Start), us(b.End), us(b.Next)}
	take := func(now time.Time) []int64 {
		args := append([]any{"take", 2, us(now.UnixNano()), 1, ""}, bounds...)
		return runScript(t, rdb, "calendar_window", []string{"rl:{cal}:cal"}, args...)
	}
	yesterday, today := time.Date(2026, 10, 24, 21, 59, 59, 0, time.UTC), time.Date(2026, 10, 24, 22, 0, 1, 0, time.UTC)
	take(yesterday)
	take(yesterday)
	if r := take(yesterday); r[0] != 0 {
		t.Fatalf("third of two yesterday: %v", r)
	}
	// Redis TIME already in October 25: its window, fresh, ending at
	// midnight after the 25-hour day.
	r := take(today)
	if wantReset := us(b.Next) - us(today.UnixNano()); r[0] != 1 || r[1] != 1 || r[3] != wantReset {
		t.Fatalf("today: %v, want allowed, 1 left, reset in %dµs", r, wantReset)
	}
	args := append([]any{"take", 2, us(time.Date(2026, 10, 27, 0, 0, 0, 0, time.UTC).UnixNano()), 1, ""}, bounds...)
	err := rdb.Eval(context.Background(), scriptSource(t, "calendar_window"), []string{"rl:{cal}:cal"}, args...).Err()
	if err == nil || !strings.Contains(err.Error(), "outside the windows sent") {
		t.Fatalf("Redis time two days on: %v, want an error", err)
	}
}
