package config

import (
	"time"
	_ "time/tzdata" // time_zone works in a distroless image with no zoneinfo
)

// Period names a calendar window: `window: 1mo` with `calendar: true`.
type Period string

// The calendar windows.
const (
	PeriodDay   Period = "1d"  // from local midnight
	PeriodWeek  Period = "1w"  // from Monday's midnight
	PeriodMonth Period = "1mo" // from the 1st
	PeriodYear  Period = "1y"  // from January 1st
)

// Nominal lengths of the periods, for the RateLimit-Policy header's w and
// for windows 1d and 1w without calendar: true (a rolling 24h or 168h).
var periodLengths = map[Period]time.Duration{
	PeriodDay:   24 * time.Hour,
	PeriodWeek:  7 * 24 * time.Hour,
	PeriodMonth: 30 * 24 * time.Hour,
	PeriodYear:  365 * 24 * time.Hour,
}

// parseWindow reads a window: a Go duration, or a period name.
func parseWindow(s, path string, errs *Errors) (time.Duration, Period) {
	if d, ok := periodLengths[Period(s)]; ok {
		return d, Period(s)
	}
	var d time.Duration
	windowField(s, path, &d, errs)
	return d, ""
}

// validateCalendar checks calendar and time_zone, and the windows they
// apply to: a calendar policy's window (or every plan's, for limit: plan)
// must be a period, counted by fixed_window; a window of 1mo or 1y needs
// calendar: true.
func validateCalendar(r *rawPolicy, path string, p *Policy, c *Config, errs *Errors) {
	if r.TimeZone != "" && !r.Calendar {
		errs.add(path+".time_zone", "applies to calendar windows only; add calendar: true")
	}
	if !r.Calendar {
		if p.Period == PeriodMonth || p.Period == PeriodYear {
			errs.add(path+".window", "%q is a calendar window: add calendar: true (and a time_zone)", string(p.Period))
		}
		if p.UsePlan {
			for _, name := range sortedKeys(c.Plans) {
				if pp := c.Plans[name].Period; pp == PeriodMonth || pp == PeriodYear {
					errs.add(path+".limit", "plans.%s.window %q is a calendar window: add calendar: true to this policy", name, string(pp))
				}
			}
		}
		p.Period = "" // 1d and 1w are plain durations here
		return
	}
	p.Calendar = true
	p.TimeZone = time.UTC
	if r.TimeZone != "" {
		loc, err := time.LoadLocation(r.TimeZone)
		if err != nil {
			errs.add(path+".time_zone", "%q is not an IANA time zone (such as Europe/Paris, America/New_York, UTC)", r.TimeZone)
		} else {
			p.TimeZone = loc
		}
	}
	switch {
	case r.Algorithm == "":
		p.Algorithm = FixedWindow
	case p.Algorithm != FixedWindow:
		errs.add(path+".algorithm", "calendar windows are counted by fixed_window, not %s", p.Algorithm)
	}
	const periods = "1d, 1w, 1mo or 1y"
	if p.UsePlan {
		for _, name := range sortedKeys(c.Plans) {
			if plan := c.Plans[name]; !plan.Unlimited && plan.Period == "" {
				errs.add(path+".limit", "plans.%s.window %s is not a calendar window (%s), and this policy has calendar: true", name, plan.Window, periods)
			}
		}
		return
	}
	if p.Period == "" && r.Window != "" {
		errs.add(path+".window", "%q is not a calendar window; calendar: true takes %s", r.Window, periods)
	}
}
