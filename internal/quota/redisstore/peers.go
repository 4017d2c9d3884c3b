package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"
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
// sorted set and reads how many were heard within the ttl.
//
// Count is what hybrid slices and the fallback divide by, so it errs high:
// it is the highest count observed within the last ttl, not only the
// latest. That keeps it through an outage (while Redis is unreachable the
// last observation stands), through Redis losing the set (a restart without
// persistence, a failover, a flush: the others re-register one by one over
// a heartbeat interval), and through a replica leaving, for one ttl, which
// is how long a replica that vanished without leaving is counted anyway.
//
// A replica's first heartbeat sees only the replicas that started before
// it; in a rollout the others register within one heartbeat interval. Until
// its second heartbeat, and before any heartbeat answered, Count is at
// least minPeers.
//
// Every replica writes the one set, so the set's key (one Cluster slot,
// one master) sees the whole fleet's heartbeats. Up to HeartbeatBudget
// replicas heartbeat once a second; a larger fleet stretches the interval
// so that together they send about HeartbeatBudget a second, up to a
// third of the ttl (a replica stays counted while it is heard at least
// twice within the ttl). A stale count matters less the larger the
// fleet: a replica joining a fleet of 1,000 changes each share by a
// thousandth. Stretched intervals carry up to a fifth of random jitter,
// so replicas started together do not beat together.
type Peers struct {
	store    *Store
	id       string
	ttl      time.Duration
	every    time.Duration
	minPeers int64
	m        *Metrics
	log      *slog.Logger

	count atomic.Int64
	now   func() time.Time

	mu     sync.Mutex // guards the fields below
	beats  int        // heartbeats answered
	high   int64      // the highest count observed since highAt
	highAt time.Time

	stateMu  sync.Mutex // guards the fields below; held across the read
	known    Identity   // the Redis state last read ("": none yet)
	watchers []StateWatcher

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// HeartbeatBudget is the heartbeats per second a fleet sends to its
// heartbeat set once it is larger than this many replicas (see Peers).
const HeartbeatBudget = 200

// NewPeers starts heartbeating id every min(1s, ttl/3), less often in a
// fleet of more than HeartbeatBudget replicas. Until the first heartbeat
// answers, Count returns minPeers.
func NewPeers(store *Store, id string, ttl time.Duration, minPeers int, log *slog.Logger) *Peers {
	m := store.opts.Metrics
	p := &Peers{store: store, id: id, ttl: ttl, every: min(time.Second, ttl/3), minPeers: int64(max(minPeers, 1)), m: m, log: log, stop: make(chan struct{})}
	p.every = max(p.every, 10*time.Millisecond)
	p.now = time.Now
	if store.opts.Clock != nil {
		p.now = store.opts.Clock
	}
	p.count.Store(p.minPeers)
	m.Peers.Set(float64(p.minPeers))
	check := p.CheckState
	store.warmed.Store(&check)
	p.Beat(context.Background())
	p.wg.Add(1)
	go p.loop()
	return p
}

// ID returns this replica's heartbeat id.
func (p *Peers) ID() string { return p.id }

// Count returns the number of replicas to assume (see Peers), at least 1.
func (p *Peers) Count() int64 { return p.count.Load() }

// StateWatcher learns, with every heartbeat, whether Redis still holds
// what the replicas wrote (see CheckState).
type StateWatcher interface {
	// Confirmed: the state read is the one read before (or the first,
	// or the one after a change), whose epoch key holds epoch.
	Confirmed(epoch string)
	// Forgot: it is another, which may lack what was written to the one
	// before; why says how it was told (epoch: the epoch key was lost;
	// run_id: another server, or the same restarted).
	Forgot(why string)
}

// Watch makes w learn of every state CheckState reads.
func (p *Peers) Watch(w StateWatcher) {
	p.stateMu.Lock()
	p.watchers = append(p.watchers, w)
	p.stateMu.Unlock()
}

// CheckState reads the Redis state's Identity (Store.identity) and tells
// the watchers whether it is the one read before. It runs with every
// heartbeat and whenever the store warms a Redis that came back, before
// decisions reach it.
func (p *Peers) CheckState(ctx context.Context) {
	id, err := p.store.identity(ctx, randomHex(8)) // a value never proposed before: a state that lost the key gets a new one
	if err != nil {
		return
	}
	p.observe(id)
}

// observe tells the watchers whether id is the state read before.
func (p *Peers) observe(id Identity) {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	if id.Epoch == "" {
		return
	}
	if p.known != (Identity{}) && id != p.known {
		why := "run_id"
		if id.Epoch != p.known.Epoch {
			why = "epoch"
		}
		p.log.Warn("redis no longer holds what the replicas wrote; leases held stop and are settled with their keys' next calls",
			"how", why, "run_id", id.RunID, "was", p.known.RunID, "replica", p.id)
		p.m.StateLost.WithLabelValues(why).Inc()
		for _, w := range p.watchers {
			w.Forgot(why)
		}
	}
	p.known = id
	for _, w := range p.watchers {
		w.Confirmed(id.Epoch)
	}
}

// Beat sends one heartbeat, updates the count and checks the Redis state
// (CheckState: in the heartbeat's own call but on a Cluster).
func (p *Peers) Beat(ctx context.Context) {
	n, missing, state, err := p.store.heartbeat(ctx, p.id, p.ttl, randomHex(8))
	if err != nil || n < 1 {
		return
	}
	if state.Epoch != "" {
		p.observe(state)
	} else {
		p.CheckState(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	p.beats++
	if missing && p.beats > 1 {
		p.log.Info("redis lost the heartbeat set; keeping the highest replica count of the last peer_ttl while peers re-register",
			"peers", p.high, "for", p.ttl.String(), "replica", p.id)
	}
	if n >= p.high || now.Sub(p.highAt) >= p.ttl {
		p.high, p.highAt = n, now
	}
	count := p.high
	if p.beats < 2 {
		count = max(count, p.minPeers)
	}
	if old := p.count.Swap(count); old != count || p.beats == 1 {
		p.log.Info("replicas observed through redis", "peers", count, "heard", n, "replica", p.id)
	}
	p.m.Peers.Set(float64(count))
}

func (p *Peers) loop() {
	defer p.wg.Done()
	t := time.NewTimer(p.interval())
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.Beat(context.Background())
			t.Reset(p.interval())
		}
	}
}

// interval is the wait before the next heartbeat: every (a second) while
// the fleet counts at most HeartbeatBudget replicas; beyond, count ÷
// HeartbeatBudget seconds, at most a third of the ttl, plus up to a fifth
// of jitter.
func (p *Peers) interval() time.Duration {
	iv := time.Duration(p.count.Load()) * time.Second / HeartbeatBudget
	if iv <= p.every {
		return p.every
	}
	iv = min(iv, max(p.ttl/3, p.every))
	return iv + mrand.N(iv/5+1)
}

// Close stops heartbeating and removes this replica from the set, so the
// others stop counting it at once.
func (p *Peers) Close(ctx context.Context) {
	p.stopOnce.Do(func() { close(p.stop) })
	p.wg.Wait()
	p.store.leave(ctx, p.id)
}
