package engine

import (
	"testing"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// Update swaps in a newly compiled Engine; a configuration that does not
// compile leaves the running one in force.
func TestRunningUpdate(t *testing.T) {
	parse := func(yaml string) *config.Config { return parseConfig(t, yaml) }
	r := runningOf(t, "policies: [{name: a, limit: 1, window: 1s}]")
	first := r.Engine()
	if err := r.Update(parse("policies: [{name: b, limit: 1, window: 1s}]")); err != nil {
		t.Fatal(err)
	}
	second := r.Engine()
	if second == first || r.Config() != second.Config() || second.Policies()[0].Name != "b" {
		t.Fatalf("after Update: engine %p (was %p), policies %v", second, first, second.Policies()[0].Name)
	}
	// Redis mode without a Redis limiter does not compile.
	if err := r.Update(parse("redis: {addrs: [127.0.0.1:1]}\npolicies: [{name: c, limit: 1, window: 1s}]")); err == nil {
		t.Fatal("a configuration needing Redis compiled without it")
	}
	if r.Engine() != second {
		t.Fatal("a failed Update replaced the running Engine")
	}
}

// A door's derived parts are derived once per Engine: again after a
// reload, never per request, and always from the Engine returned with them.
func TestPerEngineDerivesOncePerConfiguration(t *testing.T) {
	parse := func(yaml string) *config.Config { return parseConfig(t, yaml) }
	r := runningOf(t, "policies: [{name: a, limit: 1, window: 1s}]")
	derivations := 0
	p := NewPerEngine(r, func(e *Engine) *string {
		derivations++
		name := e.Policies()[0].Name
		return &name
	})
	for range 3 {
		if e, name := p.Get(); *name != "a" || e != r.Engine() {
			t.Fatalf("derived %q from %p, running %p", *name, e, r.Engine())
		}
	}
	if derivations != 1 {
		t.Fatalf("derived %d times for one configuration, want 1", derivations)
	}
	if err := r.Update(parse("policies: [{name: b, limit: 1, window: 1s}]")); err != nil {
		t.Fatal(err)
	}
	if e, name := p.Get(); *name != "b" || e != r.Engine() || derivations != 2 {
		t.Fatalf("after the reload: derived %q (%d derivations)", *name, derivations)
	}
}

func parseConfig(t *testing.T, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// runningOf is a Running over local mode compiled from yaml.
func runningOf(t *testing.T, yaml string) *Running {
	t.Helper()
	cache, err := local.NewTable(100)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRunning(parseConfig(t, yaml), Limiters{config.ModeLocal: local.New(cache)}, NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	return r
}
