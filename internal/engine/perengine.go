package engine

import "sync/atomic"

// PerEngine holds what a door derives from the Engine in force (the
// response parts it renders once per configuration, header names in the
// form it looks them up in), so that a door's hot path reads them with one
// atomic load and a reload needs no call into the door: the first request
// after a swap derives them from the new Engine. Concurrent first
// requests may each derive them; the last store wins, and a stale one is
// replaced at the next request. Safe for concurrent use.
type PerEngine[T any] struct {
	running *Running
	derive  func(*Engine) *T
	current atomic.Pointer[derived[T]]
}

type derived[T any] struct {
	eng *Engine
	v   *T
}

// NewPerEngine returns what derive makes of each Engine running swaps in.
func NewPerEngine[T any](running *Running, derive func(*Engine) *T) *PerEngine[T] {
	return &PerEngine[T]{running: running, derive: derive}
}

// Get returns the Engine in force and what was derived from it. Call it
// once per request: the pair belongs to one configuration.
func (p *PerEngine[T]) Get() (*Engine, *T) {
	eng := p.running.Engine()
	if d := p.current.Load(); d != nil && d.eng == eng {
		return eng, d.v
	}
	d := &derived[T]{eng: eng, v: p.derive(eng)}
	p.current.Store(d)
	return eng, d.v
}
