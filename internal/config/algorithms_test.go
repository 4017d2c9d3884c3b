package config

import (
	"strings"
	"testing"
	"time"
)

// Every algorithm is accepted in every mode, and a leaky bucket's shaping
// settings get their defaults.
func TestAllAlgorithms(t *testing.T) {
	// max_keys 100: a sliding log of 100,000 for each of the default
	// 100,000 keys would be 80 GB, over local.max_log_bytes.
	c, err := Parse([]byte(`
redis: {addrs: [127.0.0.1:6379]}
local: {max_keys: 100}
policies:
  - {name: tb, limit: 100, window: 1m, burst: 20}
  - {name: sw, limit: 100, window: 1m, algorithm: sliding_window, mode: redis}
  - {name: fw, limit: 100, window: 1m, algorithm: fixed_window, mode: local}
  - {name: sl, limit: 100000, window: 1m, algorithm: sliding_log, mode: hybrid}
  - {name: lb, limit: 100, window: 1s, algorithm: leaky_bucket}
  - {name: lbq, limit: 100, window: 1s, algorithm: leaky_bucket, queue: 0, max_delay: 150ms}
`), "algorithms.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog, LeakyBucket, LeakyBucket}
	for i, p := range c.Policies {
		if p.Algorithm != want[i] {
			t.Errorf("%s: algorithm %s, want %s", p.Name, p.Algorithm, want[i])
		}
		if p.Algorithm != LeakyBucket && (p.Queue != 0 || p.MaxDelay != 0) {
			t.Errorf("%s: queue %d, max_delay %v outside a leaky bucket", p.Name, p.Queue, p.MaxDelay)
		}
	}
	if lb := c.Policies[4]; lb.Queue != -1 || lb.MaxDelay != DefaultMaxDelay {
		t.Errorf("leaky defaults: queue %d, max_delay %v; want -1 (bounded by max_delay), %v", lb.Queue, lb.MaxDelay, DefaultMaxDelay)
	}
	if lbq := c.Policies[5]; lbq.Queue != 0 || lbq.MaxDelay != 150*time.Millisecond {
		t.Errorf("leaky settings: queue %d, max_delay %v", lbq.Queue, lbq.MaxDelay)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings: %q", c.Warnings)
	}
}

// A leaky bucket slower than its max_delay never holds anything: allowed,
// but validate says so.
func TestLeakyBucketThatNeverHoldsWarns(t *testing.T) {
	c, err := Parse([]byte("policies:\n  - {name: slow, limit: 100, window: 1m, algorithm: leaky_bucket}\n"), "slow.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "policies[0]: leaky_bucket releases one request every 600ms, longer than max_delay 100ms") {
		t.Fatalf("warnings = %q", c.Warnings)
	}
}
