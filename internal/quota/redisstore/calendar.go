package redisstore

import (
	"context"
	_ "embed"
	"strconv"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
)

//go:embed scripts/calendar_window.lua
var calendarWindowSrc string

var calendarWindowScript = newScript("calendar_window", windowTakeSrc+calendarWindowSrc)

// calendarSuffix keeps calendar windows in a key of their own, apart from
// epoch-aligned fixed windows (":fw"): their starts may coincide (midnight
// UTC starts a minute too) while their counts mean different things.
const calendarSuffix = ":cal"

// calendarKey returns the Redis key of partition's calendar window count.
func (s *Store) calendarKey(partition string) string {
	return s.key(partition) + calendarSuffix
}

// calendarArgs are the script's window bounds: the windows before,
// holding and after this process's now (see internal/quota/calendar.go),
// in µs. The script picks the one holding Redis TIME.
func (s *Store) calendarArgs(l quota.Limit, args []any) []any {
	now := time.Now()
	if s.opts.Clock != nil {
		now = s.opts.Clock()
	}
	b := l.Calendar.At(now.UnixNano())
	for _, ns := range [...]int64{b.Prev, b.Start, b.End, b.Next} {
		args = append(args, strconv.FormatInt(ns/int64(time.Microsecond), 10))
	}
	return args
}

// decideCalendar is decide for a calendar window: one atomic call.
func (s *Store) decideCalendar(ctx context.Context, partition string, l quota.Limit, units int64) (quota.Decision, error) {
	op := "take"
	if l.Charges(units) {
		op = "charge"
	}
	args := s.calendarArgs(l, []any{op, l.Limit, s.nowArg(time.Microsecond), units, blockMicros(l)})
	v, err := s.run(ctx, "calendar_window", calendarWindowScript, []string{s.calendarKey(partition)}, args...)
	if err != nil {
		return quota.Decision{}, err
	}
	return decisionOf("calendar_window", l, v) // its delay is always 0
}

// refundCalendar gives units back to the calendar window holding Redis
// TIME; units counted in a window that has since ended are gone with it.
func (s *Store) refundCalendar(ctx context.Context, partition string, l quota.Limit, units int64) error {
	args := s.calendarArgs(l, []any{"refund", l.Limit, s.nowArg(time.Microsecond), units, ""})
	_, err := s.run(ctx, "refund", calendarWindowScript, []string{s.calendarKey(partition)}, args...)
	return err
}
