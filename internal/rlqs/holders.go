package rlqs

import (
	"math"
	"sync"
)

// holders is every bucket of every stream holding a share of a partition
// key in this process, with its demand (requests a second, allowed and
// denied, over its last reporting interval). Each stream's bucket is a
// holder, as each replica is one of hybrid's: a key's limit is divided
// among them by demand. Safe for concurrent use.
type holders struct {
	mu   sync.Mutex // guards keys
	keys map[string]map[*held]float64
}

func newHolders() *holders { return &holders{keys: map[string]map[*held]float64{}} }

// set records h's demand on key and returns the other holders whose
// share moved by more than a fifth (h joining counts as a move), so they
// are told their new share without waiting for their next report.
func (hs *holders) set(key string, h *held, demand float64) []*held {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	m := hs.keys[key]
	if m == nil {
		m = map[*held]float64{}
		hs.keys[key] = m
	}
	before := weights(m)
	m[h] = demand
	return movedLocked(before, m, h)
}

// remove drops h from key and returns the holders whose share moved.
func (hs *holders) remove(key string, h *held) []*held {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	m := hs.keys[key]
	if _, ok := m[h]; !ok {
		return nil
	}
	before := weights(m)
	delete(m, h)
	if len(m) == 0 {
		delete(hs.keys, key)
		return nil
	}
	return movedLocked(before, m, h)
}

// weight is h's part of key's limit: its demand over the holders' (an
// equal part when none has any), and how many holders there are.
func (hs *holders) weight(key string, h *held) (float64, int) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	m := hs.keys[key]
	if len(m) == 0 {
		return 1, 1
	}
	return weights(m)[h], len(m)
}

// count is how many holders key has.
func (hs *holders) count(key string) int {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return len(hs.keys[key])
}

func weights(m map[*held]float64) map[*held]float64 {
	total := 0.0
	for _, d := range m {
		total += d
	}
	w := make(map[*held]float64, len(m))
	for h, d := range m {
		if total > 0 {
			w[h] = d / total
		} else {
			w[h] = 1 / float64(len(m))
		}
	}
	return w
}

// movedLocked lists the holders of m, but self, whose weight moved by
// more than a fifth between before and now.
func movedLocked(before, m map[*held]float64, self *held) []*held {
	after := weights(m)
	var moved []*held
	for h, w := range after {
		if h == self {
			continue
		}
		b := before[h]
		if math.Abs(w-b) > 0.2*math.Max(w, b) {
			moved = append(moved, h)
		}
	}
	return moved
}
