package config

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// A limit is written in more than one language: a policy of this
// package's files, and a rate_limit of an envoyproxy/ratelimit descriptor
// file (internal/rlsconfig). ValidateLimit holds the rules of the settings
// they share, so that each rule exists once and neither language can
// configure what the other refuses; a language gives only its field
// names, its defaults and what a held request keeps open.

// LimitFields are a limit's shared settings as written: "" or nil where
// left out.
type LimitFields struct {
	Algorithm    string
	Burst        int64
	Queue        *int64
	MaxDelay     string
	Mode         string
	OnRedisError string
	Charge       string
	BlockFor     string
	// Counts are what the limit admits per window: its own, or for a
	// policy of limit: plan each plan's.
	Counts []LimitCount
}

// LimitCount is one count a limit may have.
type LimitCount struct {
	// Of names where the count comes from in messages, such as
	// plans.gold.limit; "" for the limit's own.
	Of     string
	N      int64
	Window time.Duration
}

// LimitPlace is what the language a limit is written in decides.
type LimitPlace struct {
	// CountField names the count's field: limit in a policy,
	// requests_per_unit in a descriptor file.
	CountField       string
	DefaultAlgorithm Algorithm
	DefaultMode      Mode
	// Redis says the configuration has a redis section, which the redis
	// and hybrid modes need; RedisSection names it in the message of a
	// limit that needs one ("a redis section in the main configuration").
	Redis        bool
	RedisSection string
	// DefaultMaxDelay is a leaky_bucket's max_delay when none is given.
	// ZeroMaxDelay allows max_delay 0 (no request is held). HeldCall says
	// what a held request keeps open: why max_delay is at most MaxMaxDelay.
	DefaultMaxDelay time.Duration
	ZeroMaxDelay    bool
	HeldCall        string
	// Local bounds this process's sliding logs (max_keys, max_log_bytes).
	Local Local
}

// LimitSettings are a limit's shared settings, checked, with the
// language's defaults applied.
type LimitSettings struct {
	Algorithm Algorithm
	// Queue and MaxDelay shape a leaky_bucket (Queue -1: as many as
	// MaxDelay allows); zero for other algorithms.
	Queue        int64
	MaxDelay     time.Duration
	Mode         Mode // "" when the mode given is not one
	OnRedisError OnRedisError
	Charge       Charge
	BlockFor     time.Duration // 0: no penalty box
}

// The bounds of block_for: a block shorter than a second is below what
// Retry-After can say (whole seconds); a day is longer than any limit's
// penalty should outlast a mistake, and keeps blocked keys' TTLs bounded.
const (
	minBlockFor = time.Second
	maxBlockFor = 24 * time.Hour
)

// modeChoices lists the modes in messages.
const modeChoices = "local, redis, hybrid"

// ValidateLimit checks the shared settings of the limit at path (such as
// policies[0] or descriptors[1].rate_limit), recording every problem in
// errs under its field's path.
func ValidateLimit(f *LimitFields, path string, place *LimitPlace, errs *Errors) LimitSettings {
	s := LimitSettings{Algorithm: place.DefaultAlgorithm, Mode: place.DefaultMode, OnRedisError: OnErrorFallback, Charge: ChargeRequest}
	if f.Algorithm != "" {
		s.Algorithm = Algorithm(f.Algorithm)
		if !slices.Contains(Algorithms, s.Algorithm) {
			errs.add(path+".algorithm", "%q is not an algorithm; choices are %s", f.Algorithm, algorithmChoices())
		}
	}

	if f.Burst < 0 || f.Burst > maxLimit {
		errs.add(path+".burst", "%d must be between 0 (the %s) and %d", f.Burst, place.CountField, int64(maxLimit))
	}
	if f.Burst != 0 && s.Algorithm != TokenBucket {
		errs.add(path+".burst", "applies to token_bucket only, not %s", s.Algorithm)
	}
	for _, n := range f.Counts {
		if n.Of == "" {
			refillField(n.N, n.Window, f.Burst, path+".burst", errs)
		}
	}

	s.Queue, s.MaxDelay = leakyBucket(f, path, s.Algorithm, place, errs)
	if s.Algorithm == SlidingLog {
		slidingLog(f.Counts, path+"."+place.CountField, place.Local, errs)
	}

	if f.Mode != "" {
		m, ok := parseMode(f.Mode)
		if !ok {
			errs.add(path+".mode", "%q is not a mode; choices are %s", f.Mode, modeChoices)
		}
		s.Mode = m
	}
	if s.Mode != ModeLocal && s.Mode != "" && !place.Redis {
		errs.add(path+".mode", "%q needs %s", s.Mode, place.RedisSection)
	}

	if f.OnRedisError != "" {
		switch v := OnRedisError(f.OnRedisError); v {
		case OnErrorFallback, OnErrorAllow, OnErrorDeny:
			s.OnRedisError = v
		default:
			errs.add(path+".on_redis_error", "%q is not a choice; choices are fallback, allow, deny", f.OnRedisError)
		}
	}
	s.Charge = validateCharge(f.Charge, s.Algorithm, path+".charge", errs)
	s.BlockFor = validateBlockFor(f.BlockFor, s.Algorithm, path+".block_for", errs)
	return s
}

// validateBlockFor checks block_for, the penalty box, which the algorithms
// whose state is one hash in Redis hold beside their count (the block's
// end is a field of it, set by the call that denies).
func validateBlockFor(v string, a Algorithm, path string, errs *Errors) time.Duration {
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		errs.add(path, "%q is not a duration (like 30s, 10m, 1h)", v)
		return 0
	case d < minBlockFor || d > maxBlockFor:
		errs.add(path, "%q must be between %s and %s", v, minBlockFor, maxBlockFor)
		return 0
	}
	switch a {
	case TokenBucket, FixedWindow, SlidingWindow:
		return d
	case SlidingLog:
		errs.add(path, "does not apply to sliding_log, whose Redis state is a log of instants with no place for a block; use token_bucket, fixed_window or sliding_window")
	case LeakyBucket:
		errs.add(path, "does not apply to leaky_bucket, which shapes traffic into slots rather than denying a key outright; use token_bucket, fixed_window or sliding_window")
	}
	return 0
}

// validateCharge checks charge, which only the algorithms that can hold a
// debt take: a token bucket's level goes below empty and refill pays it
// back; a window's count passes its limit (a fixed window's end forgives
// what went past it, a sliding window's estimate decays through it).
func validateCharge(v string, a Algorithm, path string, errs *Errors) Charge {
	switch Charge(v) {
	case "", ChargeRequest:
		return ChargeRequest
	case ChargeAlways:
	default:
		errs.add(path, "%q is not a choice; choices are request, always", v)
		return ChargeRequest
	}
	switch a {
	case TokenBucket, FixedWindow, SlidingWindow:
	case SlidingLog:
		errs.add(path, "always does not apply to sliding_log, which keeps an entry per unit admitted and cannot hold a debt; use token_bucket, fixed_window or sliding_window")
	case LeakyBucket:
		errs.add(path, "always does not apply to leaky_bucket, whose units are slots held in time, not a count that can go into debt; use token_bucket, fixed_window or sliding_window")
	}
	return ChargeAlways
}

func algorithmChoices() string {
	names := make([]string, len(Algorithms))
	for i, a := range Algorithms {
		names[i] = string(a)
	}
	return strings.Join(names, ", ")
}

// leakyBucket checks queue and max_delay, which shape a leaky_bucket and
// nothing else, and returns them with the place's defaults.
func leakyBucket(f *LimitFields, path string, a Algorithm, place *LimitPlace, errs *Errors) (queue int64, maxDelay time.Duration) {
	if a != LeakyBucket {
		if f.Queue != nil {
			errs.add(path+".queue", "applies to leaky_bucket only, not %s", a)
		}
		if f.MaxDelay != "" {
			errs.add(path+".max_delay", "applies to leaky_bucket only, not %s", a)
		}
		return 0, 0
	}
	queue, maxDelay = -1, place.DefaultMaxDelay
	if f.Queue != nil {
		queue = *f.Queue
		if queue < 0 || queue > maxQueue {
			errs.add(path+".queue", "%d must be between 0 and %d", queue, maxQueue)
		}
	}
	if f.MaxDelay == "" {
		return queue, maxDelay
	}
	d, err := time.ParseDuration(f.MaxDelay)
	within := "at most"
	if place.ZeroMaxDelay {
		within = "between 0 and"
	}
	switch {
	case err != nil:
		errs.add(path+".max_delay", "%q is not a duration (like 250ms, 1s, 1m)", f.MaxDelay)
	case d < 0 || d == 0 && !place.ZeroMaxDelay:
		if place.ZeroMaxDelay {
			errs.add(path+".max_delay", "%q must be %s %s: %s", f.MaxDelay, within, MaxMaxDelay, place.HeldCall)
		} else {
			errs.add(path+".max_delay", "%q must be positive", f.MaxDelay)
		}
	case d > MaxMaxDelay:
		errs.add(path+".max_delay", "%q must be %s %s: %s", f.MaxDelay, within, MaxMaxDelay, place.HeldCall)
	default:
		maxDelay = d
	}
	return queue, maxDelay
}

// slidingLog checks a sliding_log's counts against what its memory may
// be: one entry per admitted request and key, in Redis (at most
// MaxSlidingLogLimit per key) and in this process (local.max_log_bytes
// over local.max_keys keys). path is the count's field.
func slidingLog(counts []LimitCount, path string, local Local, errs *Errors) {
	const why = "is too large for sliding_log, which keeps one entry per admitted request and key; at most %d (or use sliding_window)"
	const tooBig = "needs up to %s of sliding logs in this process (%d entries × local.max_keys %d × %d B), over local.max_log_bytes (%s); lower the limit or local.max_keys, raise local.max_log_bytes, or use sliding_window"
	for _, c := range counts {
		what := fmt.Sprintf("%d ", c.N)
		if c.Of != "" {
			what = fmt.Sprintf("%s %d ", c.Of, c.N)
		}
		switch need := SlidingLogBytes(c.N, local.MaxKeys); {
		case c.N > MaxSlidingLogLimit:
			errs.add(path, "%s"+why, what, MaxSlidingLogLimit)
		case need > local.MaxLogBytes:
			errs.add(path, "%s"+tooBig, what, FormatBytes(need), c.N, local.MaxKeys, LogEntryBytes, FormatBytes(local.MaxLogBytes))
		}
	}
}

// WindowProblem says what is wrong with a limit's window, "" when
// nothing: every language bounds its windows alike (a policy's window, a
// descriptor's unit × unit_multiplier or window).
func WindowProblem(w time.Duration) string {
	if w < minWindow || w > maxWindow {
		return fmt.Sprintf("must be between %s and %s", minWindow, maxWindow)
	}
	return ""
}
