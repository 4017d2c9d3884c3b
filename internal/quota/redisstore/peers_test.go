package redisstore

import (
	"testing"
	"time"
)

// The heartbeat interval stretches with the fleet so that the heartbeat
// set's key sees about HeartbeatBudget (200) beats a second in all, never
// fewer than three per ttl. Worked by hand for the default ttl of 15s.
func TestHeartbeatIntervalStretchesWithTheFleet(t *testing.T) {
	for _, c := range []struct {
		replicas int64
		lo, hi   time.Duration // the wait's range, jitter included
	}{
		{1, time.Second, time.Second},
		{200, time.Second, time.Second}, // 200 ÷ 200 a second: still a second
		{400, 2 * time.Second, 2400 * time.Millisecond},
		{1000, 5 * time.Second, 6 * time.Second},   // 1,000 ÷ 200 = 5s = ttl/3
		{10_000, 5 * time.Second, 6 * time.Second}, // capped at ttl/3: 2,000 beats a second
	} {
		p := &Peers{ttl: 15 * time.Second, every: time.Second}
		p.count.Store(c.replicas)
		for i := 0; i < 200; i++ {
			if iv := p.interval(); iv < c.lo || iv > c.hi {
				t.Fatalf("%d replicas: waits %v, want %v to %v", c.replicas, iv, c.lo, c.hi)
			}
		}
	}
}
