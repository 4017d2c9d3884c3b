package main

import (
	"os"
	"path/filepath"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// startSidecar writes cfg and runs `extauthz serve` on it, with pprof on
// its admin address (memoryPerKey forces a collection through it).
func startSidecar(dir, name, bin, cfg string) (*testredis.Proc, error) {
	path := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	return testredis.Serve(name, nil, bin, "serve", "-config", path, "-log-format", "json", "-pprof")
}
