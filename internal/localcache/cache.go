// Package localcache holds per-key limiter state in a bounded, sharded
// cache that resists scans.
//
// Design note: every decision touches exactly one key, so on machines with
// many cores the cache is split into shards by a hash of the key (see
// shardsFor), each guarded by its own mutex. The mutex also guards the
// values, so a caller mutates an entry between Lock and Unlock without a
// second lock. The total number of entries never exceeds the configured
// bound: the shards' capacities add up to it, and a full shard evicts an
// entry (reported to the eviction callback) before a new one is added.
//
// Which entry goes is decided as in 2Q (Johnson and Shasha, VLDB 1994; the
// simplified form of hashicorp/golang-lru's TwoQueueCache): a key seen once
// waits in a "recent" LRU of a quarter of the shard; seen again, it moves
// to the "frequent" LRU that may fill the rest. A full shard evicts from
// recent while recent holds more than its quarter, so a scan of keys
// touched once (a caller sending a thousand distinct paths, say) only
// churns recent, and keys in steady use stay. Each eviction leaves a ghost:
// the key's 64-bit fingerprint and the instant given with the Add that
// evicted it, in a bounded LRU of half the shard's capacity. A key that
// comes back while its ghost is remembered goes straight to frequent (it
// was in use after all), and AddAt tells the caller when it was evicted,
// so a rate-limit count can restart from no better than it was then.
//
// TwoQueueCache itself is not used: it has no eviction callback (hybrid
// slices must be returned when their key is evicted), takes a lock of its
// own inside the shard's, and keeps whole keys as ghosts.
package localcache

import (
	"fmt"
	"hash/maphash"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// MaxShards caps the shard count; more shards than cores buys nothing.
const MaxShards = 64

// minPerShard keeps shards large enough that hash skew does not evict hot
// keys of one shard while others sit empty.
const minPerShard = 1024

// The 2Q proportions of a shard (see the design note).
const (
	recentRatio = 0.25 // of the capacity, for keys seen once
	ghostRatio  = 0.50 // of the capacity, ghosts of evicted keys
)

// Cache is a bounded map from string keys to values of type V.
// It is safe for concurrent use. The zero value is not usable; call New.
type Cache[V any] struct {
	seed      maphash.Seed
	mask      uint64
	shards    []Shard[V]
	bound     int
	onEvict   func(key string, value V)
	evictions atomic.Uint64
}

// Shard is one independently locked part of a Cache.
type Shard[V any] struct {
	mu sync.Mutex // guards everything below and every value stored
	c  *Cache[V]
	// recent holds keys seen once, frequent keys seen again; together at
	// most capacity. ghosts maps evicted keys' fingerprints to the
	// instant given with the Add that evicted them.
	recent, frequent *simplelru.LRU[string, V]
	ghosts           *simplelru.LRU[uint64, int64]
	capacity         int
	recentCap        int
	_                [72]byte // 128 bytes a shard: neighbouring mutexes never share a cache line
}

// New returns a cache holding at most maxKeys entries. onEvict, if not nil,
// is called with each entry pushed out to make room; it runs
// with the shard locked, so it must not call back into the cache.
func New[V any](maxKeys int, onEvict func(key string, value V)) (*Cache[V], error) {
	return newSharded(maxKeys, shardsFor(maxKeys), onEvict)
}

// newSharded is New with an explicit shard count, a power of two no larger
// than maxKeys. Benchmarks use it to compare layouts.
func newSharded[V any](maxKeys, shards int, onEvict func(key string, value V)) (*Cache[V], error) {
	if maxKeys < 1 {
		return nil, fmt.Errorf("localcache: max keys must be at least 1, got %d", maxKeys)
	}
	if shards < 1 || shards&(shards-1) != 0 || shards > maxKeys {
		return nil, fmt.Errorf("localcache: shard count %d must be a power of two between 1 and %d", shards, maxKeys)
	}
	c := &Cache[V]{
		seed:    maphash.MakeSeed(),
		mask:    uint64(shards - 1),
		shards:  make([]Shard[V], shards),
		bound:   maxKeys,
		onEvict: onEvict,
	}
	for i := range c.shards {
		// Spread the remainder so the shards add up to exactly maxKeys.
		per := maxKeys / shards
		if i < maxKeys%shards {
			per++
		}
		// Both LRUs may hold the whole capacity; ensureSpace keeps their
		// sum within it, so neither ever evicts on its own.
		recent, err := simplelru.NewLRU[string, V](per, nil)
		if err != nil {
			return nil, fmt.Errorf("localcache: %w", err)
		}
		frequent, _ := simplelru.NewLRU[string, V](per, nil)
		ghosts, _ := simplelru.NewLRU[uint64, int64](max(int(float64(per)*ghostRatio), 1), nil)
		c.shards[i] = Shard[V]{c: c, recent: recent, frequent: frequent, ghosts: ghosts,
			capacity: per, recentCap: int(float64(per) * recentRatio)}
	}
	return c, nil
}

// shardsFor picks the shard count: the largest power of two not above half
// the usable CPUs, so at least two cores share each lock, keeping at least
// minPerShard entries per shard and at most MaxShards.
//
// BenchmarkShards on a 2-core machine measured one lock fastest (about
// 50 ns an operation against 80-150 ns for 2 to 64 shards): with few cores
// a contended lock hands the work to one core with warm caches, while
// shards make both cores pull the same LRU nodes back and forth. Sharding
// pays where one lock would serialise many cores; this rule starts it at
// four, an extrapolation this project's 2-core machines cannot measure.
func shardsFor(maxKeys int) int {
	n := 1
	for n*2 <= MaxShards && n*2 <= runtime.GOMAXPROCS(0)/2 && maxKeys/(n*2) >= minPerShard {
		n *= 2
	}
	return n
}

// Lock locks the shard that holds key and returns it. The caller reads and
// writes the key's entry through the returned Shard, then calls Unlock. The
// shard lock also guards the stored values, so mutating a value between Lock
// and Unlock needs no further synchronisation. Lock allocates nothing.
func (c *Cache[V]) Lock(key string) *Shard[V] {
	s := &c.shards[maphash.String(c.seed, key)&c.mask]
	s.mu.Lock()
	return s
}

// Get returns key's value and marks it used: a key seen once before moves
// to the frequent part. The shard must be locked.
func (s *Shard[V]) Get(key string) (V, bool) {
	return s.get(key) // one call, so that Get itself inlines
}

func (s *Shard[V]) get(key string) (V, bool) {
	if v, ok := s.frequent.Get(key); ok {
		return v, true
	}
	// Seen once before: promote it.
	v, ok := s.recent.Peek(key)
	if ok {
		s.recent.Remove(key)
		s.frequent.Add(key, v)
	}
	return v, ok
}

// Peek returns key's value without marking it used, for maintenance
// passes and second looks that must not disturb the eviction order. The
// shard must be locked.
func (s *Shard[V]) Peek(key string) (V, bool) {
	if v, ok := s.frequent.Peek(key); ok {
		return v, true
	}
	return s.recent.Peek(key)
}

// Evicted returns the instant remembered with key's ghost, when key is not
// held and was evicted recently enough to be remembered (see AddAt). It
// changes nothing. The shard must be locked.
func (s *Shard[V]) Evicted(key string) (at int64, ok bool) {
	return s.ghosts.Peek(maphash.String(s.c.seed, key))
}

// Add stores value under key, evicting an entry when the shard is full.
// It is AddAt with no instant. The shard must be locked.
func (s *Shard[V]) Add(key string, value V) { s.AddAt(key, value, 0) }

// AddAt stores value under key, evicting an entry when the shard is full;
// now (any clock the caller keeps, such as unix nanoseconds) is remembered
// in the evicted entry's ghost. When key itself was evicted and its ghost
// is still remembered, AddAt returns the instant given then, and true. The
// shard must be locked.
func (s *Shard[V]) AddAt(key string, value V, now int64) (evictedAt int64, evicted bool) {
	if s.frequent.Contains(key) {
		s.frequent.Add(key, value)
		return 0, false
	}
	if s.recent.Remove(key) {
		s.frequent.Add(key, value)
		return 0, false
	}
	fp := maphash.String(s.c.seed, key)
	if evictedAt, evicted = s.ghosts.Peek(fp); evicted {
		// It was in use before it was pushed out: back to frequent.
		s.ghosts.Remove(fp)
		s.ensureSpace(now, true)
		s.frequent.Add(key, value)
		return evictedAt, true
	}
	s.ensureSpace(now, false)
	s.recent.Add(key, value)
	return 0, false
}

// ensureSpace evicts one entry when the shard is full: the oldest of
// recent while recent holds more than its share (or exactly its share and
// the newcomer is not a ghost's return), else the least recently used of
// frequent.
func (s *Shard[V]) ensureSpace(now int64, ghost bool) {
	r := s.recent.Len()
	if r+s.frequent.Len() < s.capacity {
		return
	}
	var k string
	var v V
	if r > 0 && (r > s.recentCap || (r == s.recentCap && !ghost)) {
		k, v, _ = s.recent.RemoveOldest()
	} else {
		k, v, _ = s.frequent.RemoveOldest()
	}
	s.ghosts.Add(maphash.String(s.c.seed, k), now)
	s.c.evictions.Add(1)
	if s.c.onEvict != nil {
		s.c.onEvict(k, v)
	}
}

// Unlock releases the shard.
func (s *Shard[V]) Unlock() { s.mu.Unlock() }

// Len returns the number of entries. It locks each shard in turn, so under
// concurrent writes it is a close estimate, never above the bound.
func (c *Cache[V]) Len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += s.recent.Len() + s.frequent.Len()
		s.mu.Unlock()
	}
	return n
}

// Bound returns the maximum number of entries the cache will hold.
func (c *Cache[V]) Bound() int { return c.bound }

// Evictions returns how many entries were pushed out to make room.
func (c *Cache[V]) Evictions() uint64 { return c.evictions.Load() }
