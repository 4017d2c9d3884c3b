package engine

import (
	"sync/atomic"

	"github.com/extauthz/extauthz/internal/config"
)

// Running is the configuration in force, shared by every door: one Engine
// compiled per configuration. Update compiles the next one and swaps it
// in; a decision in flight keeps the Engine it loaded, so it sees one
// configuration throughout. Safe for concurrent use; the zero value is not
// usable (see NewRunning).
type Running struct {
	limiters Limiters
	metrics  *Metrics
	opts     []Option
	current  atomic.Pointer[Engine]
}

// NewRunning compiles cfg with the given limiters, metrics and options,
// which every later Update reuses. Keys' recent use (for the counters
// API) outlives reloads: every Engine it compiles shares one Usage,
// unless an option gives another.
func NewRunning(cfg *config.Config, limiters Limiters, m *Metrics, opts ...Option) (*Running, error) {
	opts = append([]Option{WithUsage(NewUsage())}, opts...)
	r := &Running{limiters: limiters, metrics: m, opts: opts}
	if err := r.Update(cfg); err != nil {
		return nil, err
	}
	return r, nil
}

// Update compiles cfg and makes it the configuration in force. On error
// the running configuration stays.
func (r *Running) Update(cfg *config.Config) error {
	commit, err := r.Prepare(cfg)
	if err != nil {
		return err
	}
	commit()
	return nil
}

// Prepare compiles cfg; commit makes it the configuration in force. A
// reload prepares every door before committing any, so the doors change
// configuration together or not at all.
func (r *Running) Prepare(cfg *config.Config) (commit func(), err error) {
	e, err := Compile(cfg, r.limiters, r.metrics, r.opts...)
	if err != nil {
		return nil, err
	}
	return func() { r.current.Store(e) }, nil
}

// Engine returns the Engine in force. Load it once per request.
func (r *Running) Engine() *Engine { return r.current.Load() }

// Config returns the configuration in force.
func (r *Running) Config() *config.Config { return r.current.Load().cfg }

// Limiters returns the limiters every configuration is compiled with,
// one per mode: a door compiling policies of its own takes with them.
func (r *Running) Limiters() Limiters { return r.limiters }

// Metrics returns the collectors every door counts its requests in.
func (r *Running) Metrics() *Metrics { return r.metrics }
