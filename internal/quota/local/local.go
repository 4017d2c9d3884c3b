// Package local keeps rate-limit counts in this process: a bounded table of
// per-key quota.States, the Limiter of local mode, and the fallback
// buckets the Redis modes decide with while Redis is unreachable.
//
// Each replica counts alone, so N replicas in local mode admit up to N
// times the limit. Memory is bounded by the table (localcache: keys seen
// once are evicted before keys in steady use). An evicted key that comes
// back while the table remembers its eviction starts empty from that
// instant (quota.State.StartEmpty): it never returns with more than it
// had, at the price of what it held then.
package local

import (
	"context"
	"time"

	"github.com/extauthz/extauthz/internal/localcache"
	"github.com/extauthz/extauthz/internal/quota"
)

// Table is the bounded per-key count table of this process, shared by the
// local limiter and the fallback buckets: one LRU bound for both. It is
// safe for concurrent use.
type Table struct {
	*localcache.Cache[*quota.State]
}

// NewTable returns a table of at most maxKeys keys.
func NewTable(maxKeys int) (*Table, error) {
	c, err := localcache.New[*quota.State](maxKeys, nil)
	if err != nil {
		return nil, err
	}
	return &Table{Cache: c}, nil
}

// stateLocked returns key's state in the locked shard, creating it for a
// decision under l at ns (addLocked).
func stateLocked(sh *localcache.Shard[*quota.State], key string, l *quota.Limit, ns int64) *quota.State {
	if s, ok := sh.Get(key); ok {
		return s
	}
	return addLocked(sh, key, l, ns)
}

// addLocked adds a state for key, which the locked shard does not hold: a
// key the table evicted not long ago starts empty from its eviction
// (quota.State.StartEmpty), a new one fresh.
func addLocked(sh *localcache.Shard[*quota.State], key string, l *quota.Limit, ns int64) *quota.State {
	s := &quota.State{}
	if at, evicted := sh.AddAt(key, s, ns); evicted {
		s.StartEmpty(*l, at, ns)
	}
	return s
}

// Limiter is local mode: every count in this process.
type Limiter struct {
	table *Table
}

var (
	_ quota.Limiter = (*Limiter)(nil)
	_ quota.Peeker  = (*Limiter)(nil)
)

// New returns the local-mode limiter keeping its counts in table.
func New(table *Table) *Limiter { return &Limiter{table: table} }

// Take implements quota.Limiter.
func (l *Limiter) Take(_ context.Context, key string, lim quota.Limit, n int64, now time.Time) (quota.Decision, error) {
	ns := now.UnixNano()
	sh := l.table.Lock(key)
	// stateLocked, written out: the hot path makes no call for it.
	s, ok := sh.Get(key)
	if !ok {
		s = addLocked(sh, key, &lim, ns)
	}
	d, err := s.Take(lim, n, ns)
	sh.Unlock()
	return d, err
}

// Peek implements quota.Peeker: what Take would decide, key's entry and
// the table's order left as they are. A key the table does not hold is
// judged as Take would create it (fresh, or empty from its eviction).
func (l *Limiter) Peek(_ context.Context, key string, lim quota.Limit, now time.Time) (quota.Decision, error) {
	ns := now.UnixNano()
	sh := l.table.Lock(key)
	defer sh.Unlock()
	if s, ok := sh.Peek(key); ok {
		return s.Peek(lim, 1, ns)
	}
	var s quota.State
	if at, evicted := sh.Evicted(key); evicted {
		s.StartEmpty(lim, at, ns)
	}
	return s.Take(lim, 1, ns)
}

// Refund implements quota.Limiter. It does not count as a use of the key:
// a key taken once and refunded is still a key seen once.
func (l *Limiter) Refund(_ context.Context, key string, lim quota.Limit, n int64, now time.Time) error {
	sh := l.table.Lock(key)
	if s, ok := sh.Peek(key); ok {
		s.Refund(lim, n, now.UnixNano())
	}
	sh.Unlock()
	return nil
}
