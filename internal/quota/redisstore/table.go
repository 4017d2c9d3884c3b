package redisstore

import (
	"sync/atomic"
	"time"

	"github.com/extauthz/extauthz/internal/localcache"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// Table is the bounded per-key table of the Redis-backed limiters: what
// Redis last reported for each key (in both modes), and hybrid mode's
// leased slices. It is safe for concurrent use; each entry is guarded by
// its shard's lock.
type Table struct {
	*localcache.Cache[*keyState]
	onEvict atomic.Pointer[func(key string, e *keyState)]
}

// keyState is one key's entry in a Table.
type keyState struct {
	// The level Redis last reported: remaining units at remoteAt (unix
	// ns; zero when Redis never reported on the key to this replica).
	remote   int64
	remoteAt int64
	slice    // hybrid mode's lease
}

// NewTable returns a table of at most maxKeys keys.
func NewTable(maxKeys int) (*Table, error) {
	t := &Table{}
	c, err := localcache.New(maxKeys, func(key string, e *keyState) {
		if fn := t.onEvict.Load(); fn != nil {
			(*fn)(key, e)
		}
	})
	if err != nil {
		return nil, err
	}
	t.Cache = c
	return t, nil
}

// stateLocked returns key's entry in the locked shard, creating it.
func stateLocked(sh *localcache.Shard[*keyState], key string) *keyState {
	e, ok := sh.Get(key)
	if !ok {
		e = &keyState{}
		sh.Add(key, e)
	}
	return e
}

// record keeps what Redis reported for key at now.
func (t *Table) record(key string, remaining int64, now time.Time) {
	sh := t.Lock(key)
	e := stateLocked(sh, key)
	e.remote, e.remoteAt = remaining, now.UnixNano()
	sh.Unlock()
}

// Level returns what Redis last reported for key, if it did.
func (t *Table) Level(key string) (local.Level, bool) {
	sh := t.Lock(key)
	defer sh.Unlock()
	if e, ok := sh.Peek(key); ok && e.remoteAt != 0 {
		return local.Level{Remaining: e.remote, At: time.Unix(0, e.remoteAt)}, true
	}
	return local.Level{}, false
}
