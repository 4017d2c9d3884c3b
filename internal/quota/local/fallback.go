package local

import (
	"time"

	"github.com/extauthz/extauthz/internal/quota"
)

// Level is what Redis last said about a key: Remaining units at At.
type Level struct {
	Remaining int64
	At        time.Time
}

// Fallback decides Redis-backed keys in this process while Redis cannot: a
// bucket per key of the replica's share of the limit (quota.Share),
// counted in the table, never holding more than the replica's share of the
// last level Redis reported (quota.State.CapToShare). It is safe for
// concurrent use.
type Fallback struct {
	table *Table
}

// NewFallback returns fallback buckets kept in table.
func NewFallback(table *Table) *Fallback { return &Fallback{table: table} }

// Start says how a fallback decision begins for a key it has not counted.
type Start uint8

// The ways a fallback bucket starts.
const (
	// StartFresh hands a key nothing is known about a full share: Redis
	// is down, or the call that failed certainly did not run.
	StartFresh Start = iota
	// StartEmpty starts such a key from a share that was empty when the
	// failed call was sent (Take's sent) and has refilled at the policy's
	// rate since: the call may have run, and spent what a fresh share
	// would hand out again.
	StartEmpty
)

// Take decides n units of key under l's share among peers at now. level,
// when known, is what Redis last reported for the key; start says how a
// key with no level and no count of its own begins, and sent (StartEmpty)
// when the call that failed was sent.
func (f *Fallback) Take(key string, l quota.Limit, n, peers int64, now time.Time, level *Level, start Start, sent time.Time) (quota.Decision, error) {
	fl := quota.Share(l, peers)
	ns := now.UnixNano()
	sh := f.table.Lock(key)
	s := stateLocked(sh, key, &fl, ns)
	switch {
	case level != nil:
		s.CapToShare(l, fl, ns, peers, level.Remaining, level.At.UnixNano())
	case start == StartEmpty && !s.Counting(fl):
		s.CapToShare(l, fl, ns, peers, 0, min(sent.UnixNano(), ns))
	}
	d, err := s.Take(fl, n, ns)
	sh.Unlock()
	d.Limit = l.Limit // clients see the policy, not its share
	return d, err
}

// Refund gives n units back to key's share of l among peers.
func (f *Fallback) Refund(key string, l quota.Limit, n, peers int64, now time.Time) {
	sh := f.table.Lock(key)
	if s, ok := sh.Peek(key); ok {
		s.Refund(quota.Share(l, peers), n, now.UnixNano())
	}
	sh.Unlock()
}
