package local

import (
	"context"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
)

// The counters API's operations on this process's counts.

var _ quota.Inspector = (*Limiter)(nil)

// Inspect implements quota.Inspector: the decision one unit would get,
// changing nothing (not even under another limit than the key's) and
// creating no entry for a key never counted.
func (l *Limiter) Inspect(_ context.Context, key string, lim quota.Limit, now time.Time) (quota.Inspection, error) {
	sh := l.table.Lock(key)
	s, ok := sh.Peek(key)
	if !ok {
		s = &quota.State{}
	}
	d, err := s.Peek(lim, 0, now.UnixNano())
	sh.Unlock()
	return quota.Inspection{Decision: d}, err
}

// Reset implements quota.Inspector: the key's count is this process's
// alone.
func (l *Limiter) Reset(_ context.Context, key string) error {
	l.table.Forget(key)
	return nil
}

// Forget implements quota.Inspector.
func (l *Limiter) Forget(key string) { l.table.Forget(key) }

// Forget empties key's count, if the table holds one: the key starts
// afresh (a full bucket, an empty window or log).
func (t *Table) Forget(key string) {
	sh := t.Lock(key)
	if s, ok := sh.Peek(key); ok {
		*s = quota.State{}
	}
	sh.Unlock()
}

// Forget empties key's fallback bucket.
func (f *Fallback) Forget(key string) { f.table.Forget(key) }
