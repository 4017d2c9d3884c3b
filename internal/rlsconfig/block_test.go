package rlsconfig

import (
	"strings"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/config"
)

// block_for on a descriptor's rate limit, and on each of its rate_limits,
// follows the policies' rule (config.ValidateLimit); with policy: set it
// comes from the policy.
func TestBlockFor(t *testing.T) {
	c, err := config.Parse([]byte("policies:\n  - {name: login, key: [header:x-user], limit: 5, window: 1m, block_for: 10m}\n"), "extauthz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := write(t, dir, "auth.yaml", `domain: auth
descriptors:
  - key: user
    rate_limit: {policy: login}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 10, block_for: 5m}
  - key: path
    rate_limits:
      - {unit: second, requests_per_unit: 2, block_for: 30s}
      - {unit: hour, requests_per_unit: 100}
`)
	rc, err := Load([]string{f}, OptionsFor(c))
	if err != nil {
		t.Fatal(err)
	}
	ds := rc.Domains["auth"].Descriptors
	if ds[0].Limit.BlockFor != 10*time.Minute || ds[1].Limit.BlockFor != 5*time.Minute ||
		ds[2].Limits[0].BlockFor != 30*time.Second || ds[2].Limits[1].BlockFor != 0 {
		t.Fatalf("block_for: %s, %s, %s, %s", ds[0].Limit.BlockFor, ds[1].Limit.BlockFor, ds[2].Limits[0].BlockFor, ds[2].Limits[1].BlockFor)
	}
	for _, tc := range []struct{ file, want string }{
		{"descriptors: [{key: t, rate_limit: {unit: minute, requests_per_unit: 5, block_for: forever}}]",
			`descriptors[0].rate_limit.block_for: "forever" is not a duration (like 30s, 10m, 1h)`},
		{"descriptors: [{key: t, rate_limits: [{unit: minute, requests_per_unit: 5}, {unit: hour, requests_per_unit: 50, block_for: 2d}]}]",
			`descriptors[0].rate_limits[1].block_for: "2d" is not a duration`},
		{"descriptors: [{key: t, rate_limit: {unit: minute, requests_per_unit: 5, block_for: 0s}}]",
			`descriptors[0].rate_limit.block_for: "0s" must be between 1s and 24h0m0s`},
		{"descriptors: [{key: t, rate_limit: {unit: minute, requests_per_unit: 5, block_for: 1m, algorithm: leaky_bucket}}]",
			"descriptors[0].rate_limit.block_for: does not apply to leaky_bucket"},
		{"descriptors: [{key: t, rate_limit: {unlimited: true, block_for: 1m}}]",
			"descriptors[0].rate_limit.block_for: has no meaning with unlimited: true"},
		{"descriptors: [{key: t, rate_limit: {policy: login, block_for: 1m}}]",
			"descriptors[0].rate_limit.block_for: comes from policy login with policy: set; remove it"},
	} {
		f := write(t, dir, "bad.yaml", "domain: bad\n"+tc.file+"\n")
		_, err := Load([]string{f}, OptionsFor(c))
		if err == nil || !strings.Contains(err.Error(), f+": "+tc.want) {
			t.Errorf("%s:\n got %v\nwant %s: %s", tc.file, err, f, tc.want)
		}
	}
}
