package quota

import (
	"testing"
	"time"
	_ "time/tzdata" // the zones below, whatever the machine has installed
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func utc(s string) time.Time {
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return v
}

// Calendar windows at injected instants: across DST changes (23- and
// 25-hour days, midnight skipped and midnight repeated), a leap day, month
// and year ends, and Monday-aligned weeks. Each row gives an instant and
// the window holding it, in UTC.
func TestCalendarBounds(t *testing.T) {
	for _, tc := range []struct {
		name       string
		zone       string
		period     Period
		at         string
		start, end string
	}{
		// Paris springs forward at 02:00 on 2026-03-29: a 23-hour day.
		{"23-hour day", "Europe/Paris", Day, "2026-03-29T12:00:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z"},
		// ...and falls back at 03:00 on 2026-10-25: a 25-hour day.
		{"25-hour day", "Europe/Paris", Day, "2026-10-25T12:00:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"},
		{"the instant before midnight", "Europe/Paris", Day, "2026-10-25T22:59:59Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"},
		{"midnight itself", "Europe/Paris", Day, "2026-10-25T23:00:00Z", "2026-10-25T23:00:00Z", "2026-10-26T23:00:00Z"},
		// Havana skips midnight on 2026-03-08 (00:00 CST becomes 01:00
		// CDT): the day starts at the jump, 05:00Z.
		{"midnight skipped", "America/Havana", Day, "2026-03-08T12:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"},
		{"the day before a skipped midnight", "America/Havana", Day, "2026-03-08T04:59:59Z", "2026-03-07T05:00:00Z", "2026-03-08T05:00:00Z"},
		// Havana repeats midnight on 2025-11-02 (01:00 CDT becomes 00:00
		// CST): the day starts at the first midnight, 04:00Z, and the
		// repeated hour (shown as 00:xx again) stays in it.
		{"midnight repeated", "America/Havana", Day, "2025-11-02T04:30:00Z", "2025-11-02T04:00:00Z", "2025-11-03T05:00:00Z"},
		{"in the repeated hour", "America/Havana", Day, "2025-11-02T05:30:00Z", "2025-11-02T04:00:00Z", "2025-11-03T05:00:00Z"},
		{"before the first midnight", "America/Havana", Day, "2025-11-02T03:59:59Z", "2025-11-01T04:00:00Z", "2025-11-02T04:00:00Z"},
		// Santiago skips midnight on 2024-09-08.
		{"Santiago skips midnight", "America/Santiago", Day, "2024-09-08T10:00:00Z", "2024-09-08T04:00:00Z", "2024-09-09T03:00:00Z"},
		// Leap years: February 2028 has 29 days, 2028 has 366.
		{"leap day", "UTC", Day, "2028-02-29T18:00:00Z", "2028-02-29T00:00:00Z", "2028-03-01T00:00:00Z"},
		{"February of a leap year", "UTC", Month, "2028-02-29T23:59:59Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"},
		{"February of a common year", "Asia/Tokyo", Month, "2027-02-10T00:00:00Z", "2027-01-31T15:00:00Z", "2027-02-28T15:00:00Z"},
		{"a leap year", "Asia/Tokyo", Year, "2028-07-01T00:00:00Z", "2027-12-31T15:00:00Z", "2028-12-31T15:00:00Z"},
		// Month ends, local: 23:59:59 on January 31st in New York is
		// still January; a second later it is February.
		{"last second of January", "America/New_York", Month, "2027-02-01T04:59:59Z", "2027-01-01T05:00:00Z", "2027-02-01T05:00:00Z"},
		{"first second of February", "America/New_York", Month, "2027-02-01T05:00:00Z", "2027-02-01T05:00:00Z", "2027-03-01T05:00:00Z"},
		// A month holding a DST change is an hour shorter.
		{"March in Paris", "Europe/Paris", Month, "2026-03-15T00:00:00Z", "2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z"},
		{"year end", "Europe/Paris", Year, "2026-12-31T22:59:59Z", "2025-12-31T23:00:00Z", "2026-12-31T23:00:00Z"},
		// Weeks start on Monday; this one holds the spring change.
		{"week of a DST change", "Europe/Paris", Week, "2026-03-29T21:00:00Z", "2026-03-22T23:00:00Z", "2026-03-29T22:00:00Z"},
		{"Sunday ends the week", "UTC", Week, "2026-03-29T23:59:59Z", "2026-03-23T00:00:00Z", "2026-03-30T00:00:00Z"},
		{"week across a year end", "UTC", Week, "2027-01-01T00:00:00Z", "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCalendar(tc.period, mustZone(t, tc.zone))
			b := c.At(utc(tc.at).UnixNano())
			if got, want := time.Unix(0, b.Start).UTC(), utc(tc.start); !got.Equal(want) {
				t.Errorf("start %v, want %v", got, want)
			}
			if got, want := time.Unix(0, b.End).UTC(), utc(tc.end); !got.Equal(want) {
				t.Errorf("end %v, want %v", got, want)
			}
			// The neighbours are the windows before and after.
			if before := c.compute(b.Start - 1); before.Start != b.Prev || before.End != b.Start {
				t.Errorf("window before: %v, but Prev is %v", before, b.Prev)
			}
			if after := c.compute(b.End); after.Start != b.End || after.End != b.Next {
				t.Errorf("window after: %v, but Next is %v", after, b.Next)
			}
		})
	}
}

// Every instant of a year, an hour apart, lies in exactly one window of
// each period, in zones with DST changes at 02:00, at midnight and none:
// windows are contiguous and never overlap.
func TestCalendarWindowsTile(t *testing.T) {
	for _, zone := range []string{"Europe/Paris", "America/Havana", "America/Santiago", "Australia/Lord_Howe", "UTC"} {
		loc := mustZone(t, zone)
		for _, p := range []Period{Day, Week, Month, Year} {
			c := NewCalendar(p, loc)
			prev := c.At(utc("2025-12-20T00:00:00Z").UnixNano())
			for ns := prev.Start; ns < utc("2027-01-10T00:00:00Z").UnixNano(); ns += int64(time.Hour) {
				b := c.At(ns)
				if ns < b.Start || ns >= b.End {
					t.Fatalf("%s %s: %v not in its window [%v, %v)", zone, p, time.Unix(0, ns).In(loc), time.Unix(0, b.Start).In(loc), time.Unix(0, b.End).In(loc))
				}
				if b != prev && b.Start != prev.End {
					t.Fatalf("%s %s: window [%v, %v) does not follow [%v, %v)", zone, p, time.Unix(0, b.Start).In(loc), time.Unix(0, b.End).In(loc), time.Unix(0, prev.Start).In(loc), time.Unix(0, prev.End).In(loc))
				}
				prev = b
			}
		}
	}
}

// A calendar fixed window counts in the window holding now and resets at
// the local boundary: the last second of a Paris day is denied, the first
// of the next admits again, and the wait points at the boundary.
func TestCalendarFixedWindowTake(t *testing.T) {
	paris := mustZone(t, "Europe/Paris")
	l := Limit{Algorithm: FixedWindow, Limit: 3, Window: 24 * time.Hour, Calendar: NewCalendar(Day, paris)}
	var s State
	// The 25-hour day of 2026-10-25, from 2026-10-24T22:00Z.
	morning := utc("2026-10-25T08:00:00Z").UnixNano()
	for i := int64(0); i < 3; i++ {
		if d, _ := s.Take(l, 1, morning); !d.Allowed || d.Remaining != 2-i {
			t.Fatalf("take %d: %+v", i, d)
		}
	}
	last := utc("2026-10-25T22:59:59Z").UnixNano()
	d, _ := s.Take(l, 1, last)
	if d.Allowed || d.RetryAfter != time.Second || d.ResetAfter != time.Second {
		t.Fatalf("last second of the day: %+v, want denied for 1s", d)
	}
	d, _ = s.Take(l, 1, morning)
	if want := 15 * time.Hour; d.Allowed || d.RetryAfter != want {
		t.Fatalf("morning: %+v, want a wait of %v (until 00:00 local, 23:00Z)", d, want)
	}
	if d, _ := s.Take(l, 2, utc("2026-10-25T23:00:00Z").UnixNano()); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("first second of the next day: %+v", d)
	}
	// A refund goes to the window it was counted in, not to an ended one.
	s.Refund(l, 2, last)
	if d, _ := s.Take(l, 0, utc("2026-10-26T01:00:00Z").UnixNano()); d.Remaining != 1 {
		t.Fatalf("after a refund into an ended window: %d left, want 1", d.Remaining)
	}
	s.Refund(l, 2, utc("2026-10-26T01:00:00Z").UnixNano())
	if d, _ := s.Take(l, 0, utc("2026-10-26T01:00:00Z").UnixNano()); d.Remaining != 3 {
		t.Fatalf("after a refund: %d left, want 3", d.Remaining)
	}
}

// Deciding within a window reads the cached bounds: no allocation.
func TestCalendarCachedBoundsDoNotAllocate(t *testing.T) {
	c := NewCalendar(Month, mustZone(t, "Europe/Paris"))
	ns := utc("2026-03-15T00:00:00Z").UnixNano()
	c.At(ns)
	if n := testing.AllocsPerRun(100, func() { c.At(ns); ns += int64(time.Second) }); n != 0 {
		t.Fatalf("%v allocations per decision within a window", n)
	}
}

// tzif builds a time zone of fixed offsets (seconds east of UTC) changing
// at the given instants, in the TZif format (RFC 8536, version 1), for
// DST changes no real zone has.
func tzif(t *testing.T, offsets []int32, at []time.Time) *time.Location {
	t.Helper()
	be32 := func(b []byte, v uint32) []byte { return append(b, byte(v>>24), byte(v>>16), byte(v>>8), byte(v)) }
	b := append([]byte("TZif"), make([]byte, 16)...)
	for _, n := range []int{0, 0, 0, len(at), len(offsets), 2 * len(offsets)} {
		b = be32(b, uint32(n))
	}
	for _, tr := range at {
		b = be32(b, uint32(int32(tr.Unix())))
	}
	for i := range at {
		b = append(b, byte(i+1)) // transition i enters zone i+1
	}
	for i, off := range offsets {
		b = be32(b, uint32(off))
		b = append(b, 0, byte(2*i))
	}
	for i := range offsets {
		b = append(b, byte('A'+i), 0)
	}
	loc, err := time.LoadLocationFromTZData("Test/Zone", b)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// DST changes across midnight that real zones do not have today: east of
// UTC, where Go's time.Date picks the second of two midnights, and a
// fall-back from 00:30 to 23:30, after which the clock shows yesterday's
// date although today has begun.
func TestCalendarSyntheticChanges(t *testing.T) {
	// UTC+3 until 2026-05-10T22:00Z (01:00 local), then UTC+2: midnight
	// of May 11 happens at 21:00Z and again at 22:00Z.
	twice := tzif(t, []int32{3 * 3600, 2 * 3600}, []time.Time{utc("2026-05-10T22:00:00Z")})
	c := NewCalendar(Day, twice)
	b := c.At(utc("2026-05-11T12:00:00Z").UnixNano())
	if got := time.Unix(0, b.Start).UTC(); !got.Equal(utc("2026-05-10T21:00:00Z")) {
		t.Fatalf("midnight twice: day starts %v, want the first midnight, 21:00Z", got)
	}
	if b := c.At(utc("2026-05-10T21:30:00Z").UnixNano()); time.Unix(0, b.Start).UTC() != utc("2026-05-10T21:00:00Z") {
		t.Fatalf("between the midnights: start %v", time.Unix(0, b.Start).UTC())
	}

	// UTC+2 until 2026-05-10T22:30Z (00:30 local on May 11), then UTC+1:
	// the clock shows 23:30 on May 10 again for half an hour.
	back := tzif(t, []int32{2 * 3600, 3600}, []time.Time{utc("2026-05-10T22:30:00Z")})
	for _, at := range []string{"2026-05-10T22:10:00Z", "2026-05-10T22:40:00Z", "2026-05-11T12:00:00Z"} {
		b := NewCalendar(Day, back).At(utc(at).UnixNano()) // computed, not cached
		c = NewCalendar(Day, back)
		if start, end := time.Unix(0, b.Start).UTC(), time.Unix(0, b.End).UTC(); !start.Equal(utc("2026-05-10T22:00:00Z")) || !end.Equal(utc("2026-05-11T23:00:00Z")) {
			t.Fatalf("%s (%v local): window [%v, %v), want May 11 from its first midnight", at, utc(at).In(back), start, end)
		}
	}
	if b := c.At(utc("2026-05-10T21:59:59Z").UnixNano()); time.Unix(0, b.End).UTC() != utc("2026-05-10T22:00:00Z") {
		t.Fatalf("May 10 ends at %v, want 22:00Z", time.Unix(0, b.End).UTC())
	}
}

// While Redis is unreachable, a calendar quota falls back to this
// replica's share of what Redis last reported for the same window, and
// to a fresh share once the calendar window has turned.
func TestCalendarFallbackShare(t *testing.T) {
	l := Limit{Algorithm: FixedWindow, Limit: 100, Window: 24 * time.Hour, Calendar: NewCalendar(Day, mustZone(t, "Europe/Paris"))}
	fl := Share(l, 2)
	if fl.Calendar != l.Calendar || fl.Limit != 50 {
		t.Fatalf("share = %+v", fl)
	}
	evening := utc("2026-10-25T22:00:00Z").UnixNano() // 23:00 in Paris
	var s State
	// Redis said 10 remained an hour ago: this replica's share is 5.
	s.CapToShare(l, fl, evening, 2, 10, evening-int64(time.Hour))
	if d, _ := s.Take(fl, 0, evening); d.Remaining != 5 {
		t.Fatalf("in the window Redis reported on: %d left, want 5", d.Remaining)
	}
	// What Redis said yesterday (Paris time) says nothing about today.
	var fresh State
	fresh.CapToShare(l, fl, evening, 2, 0, utc("2026-10-24T21:59:00Z").UnixNano())
	if d, _ := fresh.Take(fl, 0, evening); d.Remaining != 50 {
		t.Fatalf("after the window turned: %d left, want the whole share, 50", d.Remaining)
	}
}
