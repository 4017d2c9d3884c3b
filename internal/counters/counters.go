// Package counters is the counters API of the admin listener: read a
// key's count under a policy, reset it on every replica, and list a
// policy's keys by recent use; and the client `extauthz counters` uses.
//
//	GET    /v1/counters/{policy}?key=KEY[&plan=PLAN]   the key's count
//	DELETE /v1/counters/{policy}?key=KEY               reset it, everywhere
//	GET    /v1/counters/{policy}/top[?n=N]             keys by recent use
//
// KEY is the partition key after the policy's name, as top lists it
// ("client:ada", "ip:10.0.0.7"); a policy without key parts has one count,
// KEY "". Every request needs `Authorization: Bearer TOKEN`, the token
// the sidecar read from $EXTAUTHZ_ADMIN_TOKEN at start-up; without one
// the API is off (403). Answers are JSON; errors are problem+json.
package counters

import (
	"time"

	"github.com/extauthz/extauthz/internal/engine"
)

// TokenEnv names the environment variable holding the admin API's bearer
// token, for the sidecar and for `extauthz counters`.
const TokenEnv = "EXTAUTHZ_ADMIN_TOKEN"

// Counter is one key's count, as the API reports it.
type Counter struct {
	Policy    string `json:"policy"`
	Key       string `json:"key"`
	Mode      string `json:"mode"`
	Algorithm string `json:"algorithm"`
	Plan      string `json:"plan,omitempty"`
	// Limit is units per window (0 when unlimited); WindowSeconds the
	// window (a calendar window's nominal length).
	Limit         int64 `json:"limit"`
	WindowSeconds int64 `json:"window_seconds"`
	Unlimited     bool  `json:"unlimited,omitempty"`
	// Allowed says whether one more unit would be admitted now;
	// Remaining how many; ResetSeconds when the quota is whole again.
	Allowed      bool    `json:"allowed"`
	Remaining    int64   `json:"remaining"`
	ResetSeconds float64 `json:"reset_seconds"`
	// Where the count lives: "local" (this replica's, local mode) or
	// "redis", with the keys holding it. Leased is hybrid mode's tokens
	// this replica holds and has not spent (not in Remaining).
	Where     string   `json:"where,omitempty"`
	RedisKeys []string `json:"redis_keys,omitempty"`
	Leased    int64    `json:"leased,omitempty"`
	// Rate is the key's recent use on this replica, requests per second
	// (exponentially weighted, 1-minute half-life).
	Rate float64 `json:"rate"`
	// Error says why the count could not be read (a top entry whose
	// count lives in an unreachable Redis).
	Error string `json:"error,omitempty"`
}

// Top is a policy's keys by recent use on the replica asked.
type Top struct {
	Policy string    `json:"policy"`
	Keys   []Counter `json:"keys"`
}

// Reset is the answer to a reset.
type Reset struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
	// Broadcast says the other replicas were told (through Redis); false
	// without Redis, where only this replica's count was reset.
	Broadcast bool `json:"broadcast"`
}

// Problem is an RFC 9457 problem detail.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

func fromEngine(c engine.Counter) Counter {
	out := Counter{
		Policy: c.Policy, Key: c.Key, Mode: string(c.Mode), Algorithm: string(c.Algorithm), Plan: c.Plan,
		Limit: c.Limit, WindowSeconds: int64(c.Window / time.Second), Unlimited: c.Unlimited,
		Rate: c.Rate,
	}
	if c.Unlimited {
		out.Allowed = true
		return out
	}
	d := c.Inspection.Decision
	out.Allowed, out.Remaining, out.ResetSeconds = d.Allowed, max(d.Remaining, 0), d.ResetAfter.Seconds()
	out.Where, out.RedisKeys, out.Leased = "local", c.Inspection.Keys, c.Inspection.Leased
	if len(c.Inspection.Keys) > 0 {
		out.Where = "redis"
	}
	return out
}
