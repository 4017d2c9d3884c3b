// Package enginetest builds the engine a door's tests decide with, the
// way the sidecar builds it: a configuration compiled into an
// engine.Running over local mode's limiter. Only tests import it.
package enginetest

import (
	"testing"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// Parse parses yaml as the configuration file test.yaml, failing tb on
// an error.
func Parse(tb testing.TB, yaml string) *config.Config {
	tb.Helper()
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	return cfg
}

// Local is a running configuration deciding in local mode, and the table
// it counts in.
type Local struct {
	*engine.Running
	Counts *local.Table
}

// New compiles cfg over local mode's limiter, counting in a table of
// cfg's local.max_keys and in metrics registered nowhere, with opts (a
// hold recorder, a warnings log).
func New(tb testing.TB, cfg *config.Config, opts ...engine.Option) *Local {
	tb.Helper()
	counts, err := local.NewTable(cfg.Local.MaxKeys)
	if err != nil {
		tb.Fatal(err)
	}
	return &Local{Running: NewWith(tb, cfg, engine.Limiters{config.ModeLocal: local.New(counts)}, opts...), Counts: counts}
}

// NewWith compiles cfg over the given limiters, counting in metrics
// registered nowhere, with opts.
func NewWith(tb testing.TB, cfg *config.Config, limiters engine.Limiters, opts ...engine.Option) *engine.Running {
	tb.Helper()
	running, err := engine.NewRunning(cfg, limiters, engine.NewMetrics(nil), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return running
}
