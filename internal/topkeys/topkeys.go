// Package topkeys keeps, in bounded memory, the keys used most in the
// recent past: what the counters API lists as a policy's top keys without
// scanning any store.
//
// Design note: a Tracker is the Space-Saving summary (Metwally, Agrawal
// and El Abbadi, 2005) over exponentially decaying counts. It holds at
// most Capacity keys. A key already held has its count raised. A new key,
// when the summary is full, takes the place of the key with the smallest
// count c and inherits it as its possible overestimate, but only with
// probability 1/(c + 1): the randomized admission of Ben Basat,
// Einziger, Friedman and Kassner (2017), which keeps the heavy keys as
// Space-Saving does, estimates the others better on long-tailed traffic,
// and makes most new keys cost a map lookup instead of a replacement (a
// hundred thousand keys used once each would otherwise churn the summary
// on every request). A key whose share of the recent traffic is well
// above 1/Capacity is held, and the counts of the keys listed first are
// close to exact.
//
// Counts decay with a half-life, so the list follows what is used now,
// not what was used an hour ago. The decay is "forward" (Cormode, Shkapenyuk,
// Srivastava and Xu, 2009): an observation at t adds 2^((t − L)/halfLife)
// for a fixed landmark L, so every count decays by the same factor and
// their order never changes with time alone; the minimum stays at the root
// of a heap, and each observation costs O(log Capacity). Counts are scaled
// back (and L moved) before they could overflow.
package topkeys

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Entry is one tracked key.
type Entry struct {
	Key string
	// Rate is the key's recent use in observations per second, averaged
	// with exponentially decaying weights (the half-life's).
	Rate float64
	// Error bounds how much of Rate may come from keys this one replaced
	// (Space-Saving's overestimate), in the same unit.
	Error float64
	// Aux is the value given with the key's last observation (the engine
	// keeps the index of the limit that applied).
	Aux int32
}

// Tracker is a bounded summary of recent key use. It is safe for
// concurrent use. Create it with New.
type Tracker struct {
	halfLife float64 // ns
	capacity int

	mu       sync.Mutex // guards the fields below
	landmark int64      // ns: L of the forward decay
	index    map[string]*item
	heap     minHeap
	rng      *rand.Rand // the admission draws
	// The weight of an observation in the 2^20 ns (about 1ms) span wAt,
	// computed once per span: within it the weight changes by less than
	// 2^20/halfLife (for a minute, 0.002%).
	wAt int64
	w   float64
}

type item struct {
	key    string
	weight float64 // forward-decayed count
	err    float64 // the count inherited when it replaced another key
	aux    int32
	pos    int // in the heap
}

// New returns a tracker of at most capacity keys whose counts halve every
// halfLife.
func New(capacity int, halfLife time.Duration) *Tracker {
	return &Tracker{
		halfLife: float64(halfLife),
		capacity: max(capacity, 1),
		index:    make(map[string]*item, capacity),
		rng:      rand.New(rand.NewPCG(1, 2)), // fixed: the same stream, the same summary
	}
}

// rescaleAt is the growth of an observation's weight past which every
// weight is scaled back: far below float64's range, far above its
// precision's concerns.
const rescaleAt = 1 << 60

// Observe counts one use of key at ns (unix nanoseconds), with aux. It
// never waits: when another goroutine holds the tracker, this use goes
// uncounted, so a busy policy on many cores never queues its decisions
// behind the summary. Skipped uses are spread over keys as the traffic
// is, which keeps the order of the keys that matter.
func (t *Tracker) Observe(key string, ns int64, aux int32) {
	if !t.mu.TryLock() {
		return
	}
	t.observeLocked(key, ns, aux)
	t.mu.Unlock()
}

// observeLocked is Observe with t.mu held.
func (t *Tracker) observeLocked(key string, ns int64, aux int32) {
	if t.landmark == 0 {
		t.landmark = ns
	}
	if span := ns >> 20; span != t.wAt || t.w == 0 {
		t.wAt, t.w = span, math.Exp2(float64(ns-t.landmark)/t.halfLife)
		if t.w > rescaleAt {
			t.rescaleLocked(ns)
			t.w = 1
		}
	}
	w := t.w
	if it, ok := t.index[key]; ok {
		it.weight += w
		it.aux = aux
		t.heap.down(it.pos) // a weight only grows: it can only sink
		return
	}
	if len(t.heap) < t.capacity {
		it := &item{key: key, weight: w, aux: aux}
		t.index[key] = it
		heap.Push(&t.heap, it)
		return
	}
	// Full: the key with the smallest count gives its place and its
	// count to the new one, with probability w/(count + w).
	it := t.heap[0]
	if t.rng.Float64()*(it.weight+w) >= w {
		return
	}
	delete(t.index, it.key)
	it.key, it.err, it.aux = key, it.weight, aux
	it.weight += w
	t.index[key] = it
	t.heap.down(0)
}

// rescaleLocked moves the landmark to ns, scaling every weight to match.
func (t *Tracker) rescaleLocked(ns int64) {
	f := math.Exp2(-float64(ns-t.landmark) / t.halfLife)
	for _, it := range t.heap {
		it.weight *= f
		it.err *= f
	}
	t.landmark = ns
}

// Top returns up to n keys by recent use at ns, most used first.
func (t *Tracker) Top(n int, ns int64) []Entry {
	t.mu.Lock()
	out := make([]Entry, 0, len(t.heap))
	f := t.rateFactorLocked(ns)
	for _, it := range t.heap {
		out = append(out, Entry{Key: it.key, Rate: it.weight * f, Error: it.err * f, Aux: it.aux})
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int {
		switch {
		case a.Rate > b.Rate:
			return -1
		case a.Rate < b.Rate:
			return 1
		}
		return 0
	})
	return out[:min(n, len(out))]
}

// Lookup returns key's entry at ns, if it is held.
func (t *Tracker) Lookup(key string, ns int64) (Entry, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	it, ok := t.index[key]
	if !ok {
		return Entry{}, false
	}
	f := t.rateFactorLocked(ns)
	return Entry{Key: key, Rate: it.weight * f, Error: it.err * f, Aux: it.aux}, true
}

// rateFactorLocked converts a forward-decayed weight into a rate at ns.
// A weight is a count as of the landmark; as of ns it is
// weight × 2^(−(ns − L)/halfLife), and a count decaying with that
// half-life is the rate × halfLife / ln 2.
func (t *Tracker) rateFactorLocked(ns int64) float64 {
	return math.Exp2(-float64(ns-t.landmark)/t.halfLife) * math.Ln2 / (t.halfLife / float64(time.Second))
}

// Forget drops key, as after its counter was reset.
func (t *Tracker) Forget(key string) {
	t.mu.Lock()
	if it, ok := t.index[key]; ok {
		delete(t.index, key)
		heap.Remove(&t.heap, it.pos)
	}
	t.mu.Unlock()
}

// Len returns the number of keys held.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.heap)
}

// minHeap orders items by weight, smallest first.
type minHeap []*item

func (h minHeap) Len() int           { return len(h) }
func (h minHeap) Less(i, j int) bool { return h[i].weight < h[j].weight }
func (h minHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].pos, h[j].pos = i, j
}
func (h *minHeap) Push(x any) {
	it := x.(*item)
	it.pos = len(*h)
	*h = append(*h, it)
}

// down sinks the item at i to its place below, as container/heap does,
// without the interface calls: it runs on every observation.
func (h minHeap) down(i int) {
	n := len(h)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if r := c + 1; r < n && h[r].weight < h[c].weight {
			c = r
		}
		if h[i].weight <= h[c].weight {
			return
		}
		h.Swap(i, c)
		i = c
	}
}

func (h *minHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}
