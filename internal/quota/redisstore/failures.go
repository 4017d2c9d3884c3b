package redisstore

import (
	"errors"
	"net"

	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/breaker"
)

// The breaker (package breaker) judges whether Redis is down; the store
// keeps its timings and Router under the names its options have always
// had.
const (
	DefaultStallAfter   = breaker.DefaultStallAfter
	DefaultProbeTimeout = breaker.DefaultProbeTimeout
	DefaultProbeEvery   = breaker.DefaultProbeEvery
	DefaultIdleProbe    = breaker.DefaultIdleProbe
)

// Router says which Redis Cluster master serves a key (breaker.Router).
type Router = breaker.Router

// unavailable reports whether err says Redis cannot serve
// (breaker.Unavailable).
func unavailable(err error) bool { return breaker.Unavailable(err) }

// resultOf names a failed call's result for extauthz_redis_calls_total
// (breaker.Result).
func resultOf(err error) string { return breaker.Result(err) }

// mayHaveRun reports whether a call that failed with err may nevertheless
// have run in Redis: it timed out or lost its connection after the command
// was sent. A refused dial, a full pool or an error reply (LOADING,
// CLUSTERDOWN, a script error) means the script did not run to the end.
func mayHaveRun(err error) bool {
	var rerr redis.Error
	if errors.As(err, &rerr) || errors.Is(err, ErrStoreDown) || errors.Is(err, redis.ErrPoolTimeout) {
		return false
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return false
	}
	return true
}

// neverSent reports whether a call that failed with err never reached
// Redis: refused because its node was marked down, a dial refused, or no
// connection free in time. (An error reply is not among them: a script
// that failed part way may have written.)
func neverSent(err error) bool {
	if errors.Is(err, ErrStoreDown) || errors.Is(err, redis.ErrPoolTimeout) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// newProber is the breaker's prober over the store's probe clients.
func newProber(opts StoreOptions) *breaker.RedisProber {
	p := &breaker.RedisProber{Client: opts.Probe, Router: opts.Router}
	if opts.NodeProbe != nil {
		p.NodeProbe = func(addr string) breaker.Exister { return opts.NodeProbe(addr) }
	}
	return p
}
