package config

import (
	"strings"
	"testing"
	"time"
)

// block_for is a duration within its range, on the algorithms that keep
// a block beside their count; every mistake names file, path and choices.
func TestBlockFor(t *testing.T) {
	c, err := Parse([]byte("policies:\n  - {name: login, key: [ip], limit: 5, window: 1m, block_for: 10m}\n  - {name: plain, limit: 5, window: 1m}\n  - {name: watch, limit: 5, window: 1m, block_for: 1m, shadow: true}\n  - {name: daily, limit: 500, window: 1d, calendar: true, block_for: 1h}\n"), "extauthz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Policies[0].BlockFor != 10*time.Minute || c.Policies[1].BlockFor != 0 || c.Policies[3].BlockFor != time.Hour {
		t.Fatalf("block_for: %s, %s", c.Policies[0].BlockFor, c.Policies[1].BlockFor)
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "policies[2].block_for: has no effect with shadow: true") {
		t.Fatalf("warnings: %q", c.Warnings)
	}
	for _, tc := range []struct{ policy, want string }{
		{"{name: p, limit: 5, window: 1m, block_for: soon}",
			`policies[0].block_for: "soon" is not a duration (like 30s, 10m, 1h)`},
		{"{name: p, limit: 5, window: 1m, block_for: 500ms}",
			`policies[0].block_for: "500ms" must be between 1s and 24h0m0s`},
		{"{name: p, limit: 5, window: 1m, block_for: 25h}",
			`policies[0].block_for: "25h" must be between 1s and 24h0m0s`},
		{"{name: p, limit: 5, window: 1m, block_for: 1m, algorithm: sliding_log}",
			"policies[0].block_for: does not apply to sliding_log, whose Redis state is a log of instants with no place for a block; use token_bucket, fixed_window or sliding_window"},
		{"{name: p, limit: 5, window: 1m, block_for: 1m, algorithm: leaky_bucket}",
			"policies[0].block_for: does not apply to leaky_bucket"},
		{"{name: p, unlimited: true, block_for: 1m}",
			"policies[0].block_for: an unlimited policy never denies"},
	} {
		_, err := Parse([]byte("policies:\n  - "+tc.policy+"\n"), "extauthz.yaml")
		if err == nil || !strings.Contains(err.Error(), "extauthz.yaml: "+tc.want) {
			t.Errorf("%s:\n got %v\nwant %s", tc.policy, err, tc.want)
		}
	}
}
