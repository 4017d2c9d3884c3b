package quota

import (
	"sync/atomic"
	"time"
)

// Design note: a calendar window is a fixed window whose boundaries are
// the calendar's in a time zone: local midnight, Monday's midnight, the
// 1st of the month, January 1st. Its length varies (a day has 23, 24 or 25
// hours around a DST change, February 28 or 29 days), so its bounds are
// computed from the zone's rules with Go's time package, never as a
// multiple of a fixed length.
//
// A day starts at the first instant whose local date is that day. That is
// local midnight, except where a DST change skips midnight (the day then
// starts when the clocks jump, at 01:00) or repeats it (the day starts at
// the first midnight).
//
// Redis decides by its own clock (TIME), but Lua has no time zones. The
// sidecar therefore sends the bounds of the window holding its own clock's
// now, of the window before and of the window after: four instants, three
// windows. The script counts in the one holding Redis TIME. The clocks
// would have to disagree by a whole window (a day at least) for Redis
// TIME to fall outside them; the script then refuses rather than guess.
//
// Bounds are computed once per window and cached: deciding within the
// window costs one atomic load and two comparisons.

// Period is the length of a calendar window.
type Period uint8

// The calendar periods.
const (
	Day   Period = iota + 1 // from local midnight to the next
	Week                    // from Monday's midnight to the next Monday's
	Month                   // from the 1st to the 1st of the next month
	Year                    // from January 1st to the next
)

var periodNames = [...]string{"", "day", "week", "month", "year"}

func (p Period) String() string {
	if int(p) < len(periodNames) {
		return periodNames[p]
	}
	return "Period(?)"
}

// Calendar aligns a limit's windows to the calendar of a time zone. It is
// safe for concurrent use; share one per policy and period, so the cached
// bounds serve every decision.
type Calendar struct {
	Period Period
	Loc    *time.Location
	cur    atomic.Pointer[Bounds] // the bounds last computed
}

// NewCalendar returns the calendar of period p in loc.
func NewCalendar(p Period, loc *time.Location) *Calendar {
	return &Calendar{Period: p, Loc: loc}
}

// Bounds are the calendar windows around an instant, in unix nanoseconds:
// the window holding it is [Start, End); the one before starts at Prev,
// the one after ends at Next.
type Bounds struct {
	Prev, Start, End, Next int64
}

// At returns the bounds of the window holding ns (unix nanoseconds).
func (c *Calendar) At(ns int64) Bounds {
	if b := c.cur.Load(); b != nil && b.Start <= ns && ns < b.End {
		return *b
	}
	b := c.compute(ns)
	c.cur.Store(&b)
	return b
}

func (c *Calendar) compute(ns int64) Bounds {
	t := time.Unix(0, ns).In(c.Loc)
	start := c.startOf(t)
	end := c.step(start, 1)
	if !t.Before(end) {
		// An instant of an hour repeated after clocks turned back
		// across midnight shows yesterday's date, yet follows today's
		// first midnight: it belongs to the window starting there.
		start, end = end, c.step(end, 1)
	}
	return Bounds{
		Prev:  c.step(start, -1).UnixNano(),
		Start: start.UnixNano(),
		End:   end.UnixNano(),
		Next:  c.step(end, 1).UnixNano(),
	}
}

// startOf returns the start of the window holding t (t in c.Loc).
func (c *Calendar) startOf(t time.Time) time.Time {
	y, m, d := t.Date()
	switch c.Period {
	case Week:
		d -= (int(t.Weekday()) + 6) % 7 // days since Monday
	case Month:
		d = 1
	case Year:
		m, d = time.January, 1
	}
	return dayStart(y, m, d, c.Loc)
}

// step returns the start of the window n windows from the one starting at
// start (n is 1 or -1).
func (c *Calendar) step(start time.Time, n int) time.Time {
	y, m, d := start.In(c.Loc).Date()
	switch c.Period {
	case Day:
		d += n
	case Week:
		d += 7 * n
	case Month:
		m, d = m+time.Month(n), 1
	case Year:
		y, m, d = y+n, time.January, 1
	}
	return dayStart(y, m, d, c.Loc)
}

// dayStart returns the first instant whose local date in loc is the
// (normalised) date y-m-d.
func dayStart(y int, m time.Month, d int, loc *time.Location) time.Time {
	want := time.Date(y, m, d, 0, 0, 0, 0, time.UTC) // normalised: d may be 0 or 32
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	if localDay(t) < localDay(want) {
		// Midnight does not exist: the clocks jumped over it, and Go
		// placed it before the jump. The day starts when they land.
		if _, end := t.ZoneBounds(); !end.IsZero() {
			return end
		}
		return t
	}
	// Midnight may exist twice (clocks turned back across it); Go picks
	// either. The day starts at the first: midnight in the zone before
	// the current one, if that instant is still in that zone.
	if zs, _ := t.ZoneBounds(); !zs.IsZero() && zs.After(t.Add(-48*time.Hour)) {
		_, off := zs.Add(-1).Zone()
		first := time.Unix(want.Unix()-int64(off), 0).In(loc)
		if first.Before(zs) && first.Before(t) && localDay(first) == localDay(want) {
			return first
		}
	}
	return t
}

// localDay numbers t's local date (its date in its own location).
func localDay(t time.Time) int64 {
	y, m, d := t.Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / 86400
}
