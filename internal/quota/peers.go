package quota

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/extauthz/extauthz/internal/metrics"
)

// ReplicaID returns this process's heartbeat id: base (such as the pod
// name), or the hostname when base is empty, plus a random suffix so two
// processes never share an id.
func ReplicaID(base string) string {
	if base == "" {
		base, _ = os.Hostname()
	}
	if base == "" {
		base = "extauthz"
	}
	var b [4]byte
	rand.Read(b[:])
	return base + "-" + hex.EncodeToString(b[:])
}

// Peers counts the replicas that share Redis: each heartbeats its id into a
// sorted set and reads how many were heard within the ttl. The count
// survives an outage: while Redis is unreachable, Count keeps the last
// observation rather than assuming this replica is alone. It also survives
// Redis losing the set (a restart without persistence, a failover, a
// flush): the others re-register one by one over a heartbeat interval, so
// for one ttl Count keeps the last count if the rebuilt set is smaller.
// Replicas heard before the loss were heard within the ttl, after all.
type Peers struct {
	store *Store
	id    string
	ttl   time.Duration
	every time.Duration
	m     *metrics.Metrics
	log   *slog.Logger

	count atomic.Int64
	seen  atomic.Bool // a count was observed at least once
	now   func() time.Time

	// While the set is being rebuilt, until holdUntil, the count does not
	// fall below held.
	mu        sync.Mutex
	held      int64
	holdUntil time.Time

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// NewPeers starts heartbeating id every min(1s, ttl/3). Until the first
// heartbeat answers, Count returns minPeers.
func NewPeers(store *Store, id string, ttl time.Duration, minPeers int, m *metrics.Metrics, log *slog.Logger) *Peers {
	p := &Peers{store: store, id: id, ttl: ttl, every: min(time.Second, ttl/3), m: m, log: log, stop: make(chan struct{})}
	p.every = max(p.every, 10*time.Millisecond)
	p.now = time.Now
	if store.opts.Clock != nil {
		p.now = store.opts.Clock
	}
	p.count.Store(int64(max(minPeers, 1)))
	m.Peers.Set(float64(p.count.Load()))
	p.Beat(context.Background())
	p.wg.Add(1)
	go p.loop()
	return p
}

// ID returns this replica's heartbeat id.
func (p *Peers) ID() string { return p.id }

// Count returns the number of replicas last observed, at least 1.
func (p *Peers) Count() int64 { return p.count.Load() }

// Beat sends one heartbeat and updates the count.
func (p *Peers) Beat(ctx context.Context) {
	n, missing, err := p.store.heartbeat(ctx, p.id, p.ttl)
	if err != nil || n < 1 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if missing && p.seen.Load() {
		// This replica had registered, yet its entry was gone: the set
		// is being rebuilt. Hold the last count for one ttl.
		p.held, p.holdUntil = p.count.Load(), now.Add(p.ttl)
		p.log.Info("redis lost the heartbeat set; keeping the last replica count while peers re-register",
			"peers", p.held, "for", p.ttl.String(), "replica", p.id)
	}
	if now.Before(p.holdUntil) {
		n = max(n, p.held)
	}
	if old := p.count.Swap(n); old != n || !p.seen.Load() {
		p.log.Info("replicas observed through redis", "peers", n, "replica", p.id)
	}
	p.seen.Store(true)
	p.m.Peers.Set(float64(n))
}

func (p *Peers) loop() {
	defer p.wg.Done()
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.Beat(context.Background())
		}
	}
}

// Close stops heartbeating and removes this replica from the set, so the
// others stop counting it at once.
func (p *Peers) Close(ctx context.Context) {
	p.stopOnce.Do(func() { close(p.stop) })
	p.wg.Wait()
	p.store.leave(ctx, p.id)
}
