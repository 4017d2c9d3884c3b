// Package rlsconfig reads the rate limit configuration of
// envoyproxy/ratelimit, the language users of Envoy's rate limit service
// already write: one domain per file, nested descriptors of key and
// optional value (a value with '*' is a wildcard), each optionally with a
// rate_limit {unit, requests_per_unit, unlimited, name, replaces} and the
// flags shadow_mode, quota_mode, detailed_metric, value_to_metric and
// share_threshold.
// Each rate_limit may add extauthz's own settings: algorithm (default
// fixed_window, the windows aligned to the unit that envoyproxy/ratelimit
// counts in), mode, on_redis_error, burst, and for leaky_bucket queue and
// max_delay. These are checked by config.ValidateLimit, as a policy's are,
// and a sliding_log's memory is bounded by the main configuration's local
// section.
//
// Decoding is as strict as internal/config's: an unknown field, a value of
// the wrong shape or an impossible setting is an error naming the file and
// the field path, such as `ratelimit/edge.yaml: descriptors[1].rate_limit.unit:
// "fortnight" is not a unit; choices are second, minute, hour, day, week,
// month, year`. The package only reads and checks; internal/rls matches
// requests against what it returns.
package rlsconfig

import (
	"time"

	"github.com/extauthz/extauthz/internal/config"
)

// MaxDepth is the deepest a descriptor may nest: a request's descriptor
// matches a rate limit only with as many entries as the limit's depth,
// so no request descriptor of more entries can match.
const MaxDepth = 16

// MaxLimits is the most rate_limits one descriptor may carry: each is a
// decision per request that matches it (in redis mode, a Redis call), and
// a request's descriptors are bounded as a Check's policies are.
const MaxLimits = 8

// MaxRequestsPerUnit is the largest requests_per_unit: the protocol
// carries it as a uint32.
const MaxRequestsPerUnit = 1<<32 - 1

// Units are the lengths of envoyproxy/ratelimit's units. Windows are
// aligned to the unix epoch, so a minute starts on the minute; a month is
// 30 days and a year 365, as envoyproxy/ratelimit counts them.
var Units = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// unitNames lists the units in the order messages give them.
var unitNames = []string{"second", "minute", "hour", "day", "week", "month", "year"}

// Config is every domain of a set of files.
type Config struct {
	Domains map[string]*Domain
	Files   []string // the files read, in order
	// Digest is the SHA-256 of the files' names and contents, as Sum
	// computes it: the configuration watch compares it to what is on disk.
	Digest [32]byte
	// Warnings are accepted but inadvisable settings, each with its file
	// and field path.
	Warnings []string
}

// Domain is one file's descriptors.
type Domain struct {
	Name        string
	File        string
	Descriptors []*Descriptor
}

// Descriptor is one entry of a descriptor list.
type Descriptor struct {
	Key   string
	Value string // "" matches any value of Key (when no more specific entry does)
	// Wildcard is Value split at its '*'s when it has any: each '*'
	// matches any run of characters, in order. Nil for a plain value.
	Wildcard []string
	Path     string     // the field path in the file: descriptors[0].descriptors[2]
	Limit    *RateLimit // the first of Limits; nil: no rate limit at this level
	// Limits are the descriptor's rate_limit, or its rate_limits, every
	// one of which must allow a request (taken all or none); no two have
	// the same window. Empty: no rate limit at this level.
	Limits []*RateLimit
	Shadow bool // shadow_mode: decide and count, never deny
	// Quota is quota_mode, a soft limit: decide and count, never deny
	// the request, but list the descriptor among the answer's quota-mode
	// violations (its dynamic metadata) when it is over.
	Quota bool
	// DetailedMetric names the decisions' metrics by the request's
	// values, ValueToMetric by the value of this entry, ShareThreshold
	// counts every value matching a wildcard in one bucket.
	DetailedMetric, ValueToMetric, ShareThreshold bool
	Descriptors                                   []*Descriptor
}

// RateLimit is a descriptor's limit.
type RateLimit struct {
	Name            string        // "" when none; the target of other limits' replaces
	Unit            string        // second, minute, ... (lower case); "" when unlimited
	UnitMultiplier  int64         // units per window, 1 unless unit_multiplier (or a window) says otherwise
	Window          time.Duration // the unit's length times UnitMultiplier
	RequestsPerUnit int64         // 0: every request is over the limit
	Unlimited       bool          // never counted, never over the limit
	Replaces        []string      // names of the limits this one removes from a request
	// extauthz's own settings, with their defaults applied.
	Algorithm    config.Algorithm
	Mode         config.Mode
	OnRedisError config.OnRedisError
	Burst        int64 // token_bucket capacity; 0: RequestsPerUnit
	// Queue and MaxDelay shape a leaky_bucket limit as they shape a
	// policy; MaxDelay defaults to 0 (no request is held), since Envoy's
	// rate limit filter gives the call 20ms by default.
	Queue    int64
	MaxDelay time.Duration
	// Charge: always counts every descriptor's hits, even past the limit
	// (into debt), refusing none; hits 0 asks whether any is left.
	Charge config.Charge
	// BlockFor is the penalty box (block_for): after a denial the
	// descriptor's key is denied this long. Zero: none.
	BlockFor time.Duration
	// Policy, when set, names the main configuration's policy whose
	// bucket this rate limit counts in, whole: its limit, window,
	// algorithm, mode and charge (copied above), and its partition key,
	// which the descriptor's entries' values fill in order of the
	// policy's key parts. The Check of a request and the descriptors
	// Envoy sends for it then spend one count. The fields from Unit to
	// MaxDelay are then zero but for those copied.
	Policy string
}

// Options are what the main configuration says about the limits.
type Options struct {
	// DefaultMode applies to limits that give no mode.
	DefaultMode config.Mode
	// Redis says the main configuration has a redis section, which the
	// redis and hybrid modes need.
	Redis bool
	// Source names the main configuration file in errors about the
	// paths it lists (rls.domains).
	Source string
	// Local is the main configuration's bounds of this process's state:
	// a sliding_log limit's logs are bounded as a policy's are. A zero
	// field takes the main configuration's default.
	Local config.Local
	// Policies are the main configuration's policies by name, for the
	// rate limits that count in one (rate_limit.policy).
	Policies map[string]*config.Policy
}

// OptionsFor returns the options the main configuration c implies.
func OptionsFor(c *config.Config) Options {
	o := Options{DefaultMode: c.DefaultMode, Redis: c.Redis != nil, Source: c.Source, Local: c.Local, Policies: map[string]*config.Policy{}}
	for i := range c.Policies {
		o.Policies[c.Policies[i].Name] = &c.Policies[i]
	}
	return o
}
