// Package breaker marks Redis servers down when they are unavailable and
// up when they answer again: the judge the Redis-backed store
// (quota/redisstore) asks before it calls Redis and after a call failed.
// It knows nothing of quotas, scripts or what a key means; what it needs
// of Redis is a Prober (RedisProber, over go-redis clients), and its unit
// tests run it under a fake clock with a fake Prober.
package breaker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Design note: the breaker marks Redis down only when Redis is unavailable
// (killed, frozen, unreachable, refusing), never because this process was
// slow for a moment. A burst that fills the connection pool, a GC pause or
// a CPU-throttled container makes calls slow or late; that is evidence
// about this process as much as about Redis, so it is never enough alone.
//
// A failed call (a timeout, a refused or broken connection, a reply such as
// LOADING or CLUSTERDOWN that says the server cannot serve) and a stalled
// call (in flight for StallAfter with no call finishing meanwhile) only make
// the store suspicious. Suspicion starts one confirmation probe on a
// connection of its own, outside the decision pool, with ProbeTimeout, or
// the call timeout where the server has shown itself slow (a call ran
// into its timeout, or one was answered after over half of ProbeTimeout
// in the last 10s). The breaker opens when the probe fails and no
// decision's call succeeded while it ran; a probe that answers clears
// the suspicion. So:
//
//   - a killed or refusing Redis fails calls and the probe at once: open
//     within milliseconds;
//   - a frozen Redis stalls calls; after StallAfter the probe starts and
//     gets no answer within ProbeTimeout: open within StallAfter + one watch
//     tick + ProbeTimeout (175ms at the defaults; 50ms more within 10s
//     of an answer that took over 50ms);
//   - a process frozen 40ms of every 100ms, a full pool or a slow Redis
//     (DEBUG SLEEP, CLIENT PAUSE of tens of milliseconds) may stall calls,
//     but the probe answers: no trip;
//   - a slow link (latency of 80ms ± 40) times some calls out, but the
//     probe waits as long as a call would: no trip.
//     (With ProbeTimeout alone, a probe whose answer took 100 to 120ms
//     opened one replica's breaker while the others counted on in Redis:
//     its fallback share on top.)
//
// Errors that concern one key or script (WRONGTYPE, OOM, a script error)
// are not Redis being down; a caller that went away (context.Canceled from
// its own context) says nothing about Redis at all.
//
// A probe whose connection broke (reset by the peer, closed, cut
// mid-reply) is asked again at once, on a fresh connection, for as long
// as the confirmation has run less than its timeout: a broken connection
// is gone, which says nothing of the server. A server that is down
// refuses the fresh one or lets it time out, which is conclusive; one
// that lets every connection through and breaks each (a proxy with no
// backend) is marked down once that timeout has passed, as a frozen one
// is. (A proxy or link that resets some of the connections it carries
// otherwise opened the breakers of the replicas whose probe drew a reset,
// while the others went on counting in Redis: each open replica's
// fallback share on top. Two retries were not enough: a replica
// suspects Redis at every failed call, and one confirmation in eight
// drew three resets in a row.)
//
// A probe whose timeout this process noticed late (it was not running when
// the deadline passed: a CPU limit, a starved machine, with Redis's answer
// perhaps waiting to be read) is inconclusive and is asked again with a
// shorter deadline; a confirmation can then take longer than ProbeTimeout,
// but a starved process does not open the breaker.
//
// A process that decides without calling Redis (hybrid mode spending a
// window's slice, or answering from a denial it cached until the window
// ends) makes no call to fail or stall, so an outage would be learnt at
// its next call only, in the next window: the fallback then starts that
// window as one Redis may have counted in (the limit's part left after
// the call), where redis mode, whose every decision calls, knew of the
// outage before the window began and gives it its full share. What
// matters is whether Redis was out of reach before the window turned, so
// the store says when the windows it serves without calls turn (Want;
// redis mode's too, for the second ask below),
// and IdleProbe before the nearest turn, a server with no call pending
// that has not answered since is asked, as a suspicion is, but with the
// call timeout (no call runs beside the probe to prove Redis answers,
// and a Redis that answers a call in time serves). A probe that fails
// opens the breaker, and the outage is dated from the probe's start,
// before the turn. It is asked again two watch ticks before the turn
// (50ms at the defaults) unless a call answered within them: an outage that
// began after the first probe was answered is still dated before the
// turn, and only one beginning in the turn's last ticks is learnt in the
// next window. Two probes per window turn at most (a second's window:
// two a second; a minute's: two a minute), none while calls answer.
//
// The store learns the instant an outage was first evidenced (Down: when
// the confirmation that failed began), not only when a call next finds
// the breaker open, for the same reason.
//
// Once open, calls fail at once with ErrStoreDown, calls in flight are
// abandoned (their decisions fall back immediately rather than wait out
// their timeouts), and a probe every ProbeEvery tests whether Redis is back.
//
// One breaker per master. A standalone Redis has one breaker, for the
// whole store. A Redis Cluster fails one master at a time: a master that
// dies takes its slots with it until a replica is promoted, while the
// other masters serve theirs as before. So with a Router the breaker keeps
// the evidence, the probe and the verdict above per master (a node,
// named by its address): a call counts for the master that serves its
// key's slot, a master's probe asks that master alone (on a connection of
// its own, for a key it served), and only keys on a master marked down
// fall back. While a master is down, each of its probe rounds also
// reloads the slot map, so that once a replica has taken the slots over,
// their keys route to the new master (a node of its own, with a closed
// breaker) within a probe round; the old master is forgotten when the map
// no longer names it for its slots. Keys never flap back to a dead master,
// and each master's breaker opens at most once per failure. Before any
// slot map is known (a cluster unreachable at start-up), the cluster as
// a whole has one breaker, probed as a standalone server's is.

// Breaker timing defaults (redisstore.StoreOptions overrides them for tests).
const (
	DefaultStallAfter   = 50 * time.Millisecond
	DefaultProbeTimeout = 100 * time.Millisecond
	DefaultProbeEvery   = 500 * time.Millisecond
	DefaultIdleProbe    = 100 * time.Millisecond // before a window's turn
)

// errStalled is the suspicion raised by the watch when calls stall. (Its
// text names redisstore, where the breaker was born: operators have
// seen it in "redis marked down" records.)
var errStalled = errors.New("redisstore: redis calls stalled")

// errIdle is the suspicion raised by the watch before a window turns when
// the window's decisions are served without calls (Want).
var errIdle = errors.New("no answer from redis before a window served without calls turned")

// Router says which Redis Cluster master serves a key, so that the
// breaker judges each master alone; *redis.ClusterClient satisfies it.
type Router interface {
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
	// ReloadState asks for the slot map again, in the background.
	ReloadState(ctx context.Context)
}

// Prober is what the breaker needs of Redis: to ask a server whether it
// serves, and, for a Cluster, which master serves a key. The store's is
// a RedisProber, over its probe clients and its Router.
type Prober interface {
	// Probe runs one key command (EXISTS key) on the probe connection of
	// the server at addr ("": the standalone server, or a Cluster whose
	// slot map is unknown), within timeout, and returns its error as the
	// client gives it: nil, an error reply, or no reply.
	Probe(addr, key string, timeout time.Duration) error
	// Master returns the address of the Cluster master serving key.
	Master(ctx context.Context, key string) (string, error)
	// ReloadSlots asks a Cluster for its slot map again, in the background.
	ReloadSlots()
}

// Metrics are the collectors the breaker writes to; the store declares
// them (redisstore.NewMetrics) under the names operators know.
type Metrics struct {
	// Calls counts the breaker's probes by op (confirm: a suspicion's
	// probe; probe: a down server's) and result (ok, error, timeout,
	// inconclusive, broken).
	Calls *prometheus.CounterVec
	// Up is 1 while no server is marked down.
	Up prometheus.Gauge
	// Opened counts the servers marked down.
	Opened prometheus.Counter
	// NodesDown is the number of servers marked down now.
	NodesDown prometheus.Gauge
}

// Options configure a Breaker; every field is required but Now.
type Options struct {
	// StallAfter, ProbeTimeout, ProbeEvery and IdleProbe time the
	// breaker (the design note above); IdleProbe zero asks nothing
	// before a window's turn.
	StallAfter, ProbeTimeout, ProbeEvery, IdleProbe time.Duration
	// CallTimeout is the store's per-call timeout: a down server's probe
	// waits as long as a decision's call would, ProbeTimeout at least.
	CallTimeout time.Duration
	// Cluster judges each master alone, as the prober routes keys.
	Cluster bool
	// WholeKey is the key the standalone server's probes ask for.
	WholeKey string
	// Warm loads the scripts into Redis: on a master that appears while
	// the breaker runs, and on a server that is back.
	Warm func(context.Context) error
	// Down, when set, is told that a server was marked down, with the
	// instant the confirmation that failed began: the outage was under
	// way then.
	Down func(since time.Time)
	// Back, when set, runs after a server was marked up again (its
	// calls go through from then on), on the watch's goroutine.
	Back    func()
	Metrics Metrics
	Log     *slog.Logger
	// Now is the breaker's clock; nil: time.Now. The calls' instants
	// (Node.Begin, Node.End) must come from the same clock.
	Now func() time.Time
}

// Breaker marks Redis servers down when they are unavailable and up when
// they answer again (the design note above). It is safe for concurrent
// use; watch runs on one goroutine. New returns one; Start runs its
// watch until Close.
type Breaker struct {
	p    Prober
	opts Options

	// whole is the breaker of a standalone server, and of a Cluster
	// whose slot map is unknown; nodes, a Cluster's masters by address.
	whole   *Node
	nodesMu sync.RWMutex
	nodes   map[string]*Node
	// listed is nodes as a slice, replaced (never changed) under nodesMu
	// whenever nodes changes, so the watch's tick walks it without
	// copying or locking: a fleet of many stores ticks 40 times a second.
	listed    atomic.Pointer[[]*Node]
	downNodes atomic.Int64
	// wantBy is the nearest turn (unix ns, Options.Now's clock) of a
	// window whose decisions were served without calls (Want); 0: none.
	wantBy    atomic.Int64
	askedTurn int64 // the turn the watch last asked for; the watch's alone
	askedLate int64 // the turn the watch last asked for again, nearer it; the watch's alone

	// closed: the store is closing; nothing is marked down from now on.
	closed   atomic.Bool
	stop     chan struct{} // closed by Close: the watch ends
	stopOnce sync.Once
	wg       sync.WaitGroup
}

func New(p Prober, o Options) *Breaker {
	if o.Now == nil {
		o.Now = time.Now
	}
	b := &Breaker{p: p, opts: o, nodes: map[string]*Node{}, stop: make(chan struct{})}
	b.whole = b.newNode("", o.WholeKey)
	o.Metrics.Up.Set(1)
	return b
}

func (b *Breaker) now() time.Time { return b.opts.Now() }

// Start runs the watch (watchAt every tick) until Close.
func (b *Breaker) Start() {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.watch()
	}()
}

// Close stops marking servers down (a probe that fails while the store
// closes says nothing about Redis) and stops the watch.
func (b *Breaker) Close() {
	b.closed.Store(true)
	b.stopOnce.Do(func() { close(b.stop) })
	b.wg.Wait()
}

// outage is closed (its context canceled) when a node is marked down;
// calls in flight watch it and give up at once.
type outage struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newOutage() *outage {
	ctx, cancel := context.WithCancel(context.Background())
	return &outage{ctx: ctx, cancel: cancel}
}

// Node is the breaker of one Redis server: the standalone server (or a
// Cluster whose slot map is unknown), addr empty; or one Cluster master.
type Node struct {
	addr string
	key  string // a key this server served when first seen, for its probes

	down   atomic.Bool
	outage atomic.Pointer[outage] // canceled when the node is marked down

	// The evidence: calls in flight, the last instant a call started with
	// none pending or finished (unix ns), the last success.
	inflight atomic.Int64
	progress atomic.Int64
	lastOK   atomic.Int64
	// slowAt is the last instant (unix ns) a call was answered after
	// over slowCall (ns: half of ProbeTimeout); 0: none yet.
	slowAt    atomic.Int64
	slowCall  int64
	redialing atomic.Bool // a redial runs

	// verdict is closed when the running confirmation probe has decided;
	// nil while none runs.
	verdictMu sync.Mutex
	verdict   chan struct{}

	lastProbe time.Time // the watch's last probe while down; the watch's alone
}

func (b *Breaker) newNode(addr, key string) *Node {
	n := &Node{addr: addr, key: key, slowCall: int64(b.opts.ProbeTimeout / 2)}
	n.outage.Store(newOutage())
	return n
}

// Down reports whether n is marked down: its calls fail at once.
func (n *Node) Down() bool { return n.down.Load() }

// Outage returns the context of n's current outage: canceled when n is
// marked down, so that a call in flight gives up at once. Read it before
// the call starts (and Down after), so that a marking in between is seen.
func (n *Node) Outage() context.Context { return n.outage.Load().ctx }

// NodeFor returns the breaker that judges calls for key.
func (b *Breaker) NodeFor(ctx context.Context, key string) *Node {
	if !b.opts.Cluster || b.whole.down.Load() {
		// Standalone; or a Cluster that has never answered (no slot
		// map): routing would only wait on it again.
		return b.whole
	}
	addr, err := b.p.Master(ctx, key)
	if err != nil {
		return b.whole
	}
	b.nodesMu.RLock()
	n := b.nodes[addr]
	b.nodesMu.RUnlock()
	if n != nil {
		return n
	}
	return b.addNode(addr, key)
}

// addNode starts judging the master at addr, first seen serving key.
func (b *Breaker) addNode(addr, key string) *Node {
	b.nodesMu.Lock()
	defer b.nodesMu.Unlock()
	if n := b.nodes[addr]; n != nil {
		return n
	}
	n := b.newNode(addr, key)
	b.nodes[addr] = n
	b.listLocked()
	if len(b.nodes) > 1 && !b.closed.Load() {
		// A master appearing while we run (a promoted replica, a new
		// shard) has no scripts loaded: load them before decisions pay a
		// NOSCRIPT round trip each.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			b.opts.Warm(ctx)
		}()
	}
	return n
}

// eachNode calls fn for every node: the whole store's, then each master's.
func (b *Breaker) eachNode(fn func(*Node)) {
	fn(b.whole)
	if !b.opts.Cluster {
		return
	}
	if nodes := b.listed.Load(); nodes != nil {
		for _, n := range *nodes {
			fn(n)
		}
	}
}

// listLocked replaces listed after a change to nodes; nodesMu is held.
func (b *Breaker) listLocked() {
	nodes := make([]*Node, 0, len(b.nodes))
	for _, n := range b.nodes {
		nodes = append(nodes, n)
	}
	b.listed.Store(&nodes)
}

// logAttrs names n in log records; the standalone server needs no name.
func (n *Node) logAttrs(args ...any) []any {
	if n.addr != "" {
		args = append(args, "node", n.addr)
	}
	return args
}

// Want records that a window the store decides in turns at by (unix ns):
// IdleProbe before the nearest such turn, and again two ticks before it,
// the watch asks a server that has not answered since (the design note;
// hybrid's decisions served without calls, and redis mode's, whose
// calls stalled in the turn's last ticks are judged only after it).
// A load, and a store once per turn, so that a decision served from
// memory pays next to nothing for it.
func (b *Breaker) Want(by int64) {
	for {
		cur := b.wantBy.Load()
		if cur != 0 && cur <= by {
			return
		}
		if b.wantBy.CompareAndSwap(cur, by) {
			return
		}
	}
}

// Begin records a call starting at ns (unix ns, on Options.Now's clock).
func (n *Node) Begin(ns int64) {
	if n.inflight.Add(1) == 1 {
		n.progress.Store(ns) // nothing was pending: the stall clock starts now
	}
}

// End records a call begun at began finishing at ns (unix ns),
// successfully or not.
func (n *Node) End(began, ns int64, ok bool) {
	n.inflight.Add(-1)
	n.progress.Store(ns)
	if ok {
		n.lastOK.Store(ns)
		if ns-began > n.slowCall {
			n.slowAt.Store(ns)
		}
	}
}

// slowFor is how long a slow answer (Node.slowAt) makes confirmations
// wait the call timeout.
const slowFor = 10 * time.Second

// callWait is as long as a decision's call waits (the call timeout),
// ProbeTimeout at least: the wait of a probe that must not judge Redis
// more harshly than a call would.
func (b *Breaker) callWait() time.Duration { return max(b.opts.ProbeTimeout, b.opts.CallTimeout) }

// confirmTimeout is how long a confirmation's probe of n waits when cause
// raised the suspicion: callWait for an idle ask (no decision's call runs
// beside it to prove Redis answers, and a Redis that answers a call in
// time serves), and when the server has shown itself slow, because cause
// is a call that ran into its timeout or because a call was answered
// after over half of ProbeTimeout within slowFor; else ProbeTimeout. A
// frozen server behind a fast link is
// judged within ProbeTimeout (its stalled calls raise the suspicion
// before any call times out); a slow link that answers within the call
// timeout (a WAN hop, a congested network, latency of 80ms ± 40) is not
// marked down because the probe's answer took as long as the calls' do.
func (b *Breaker) confirmTimeout(n *Node, cause error) time.Duration {
	slow := cause == errIdle || IsTimeout(cause)
	if at := n.slowAt.Load(); at != 0 && b.now().UnixNano()-at < int64(slowFor) {
		slow = true
	}
	if slow {
		return b.callWait()
	}
	return b.opts.ProbeTimeout
}

// Suspect starts a confirmation probe of n unless one is running or n is
// already down.
func (b *Breaker) Suspect(n *Node, cause error) {
	n.verdictMu.Lock()
	if n.down.Load() || n.verdict != nil {
		n.verdictMu.Unlock()
		return
	}
	done := make(chan struct{})
	n.verdict = done
	n.verdictMu.Unlock()
	go b.confirm(n, cause, done)
}

// confirm probes n on its own connection and opens its breaker if the
// probe fails and no call succeeded while it ran. It closes done when the
// verdict is in.
func (b *Breaker) confirm(n *Node, cause error, done chan struct{}) {
	defer func() {
		n.verdictMu.Lock()
		n.verdict = nil
		n.verdictMu.Unlock()
		close(done)
	}()
	timeout := b.confirmTimeout(n, cause)
	start := b.now()
	op := "confirm"
	if cause == errIdle {
		op = "idle"
	}
	budget := timeout // for connections that break (below)
	for {
		began := b.now()
		err := b.probeOnce(n, timeout)
		if err == nil {
			b.opts.Metrics.Calls.WithLabelValues(op, "ok").Inc()
			return
		}
		if n.lastOK.Load() >= began.UnixNano() {
			b.opts.Metrics.Calls.WithLabelValues(op, Result(err)).Inc()
			if IsTimeout(err) {
				b.redial(n)
			}
			return // a decision's call got through meanwhile: Redis answers
		}
		if Broken(err) && b.now().Sub(start) < budget && !b.closed.Load() {
			// The probe's connection broke (reset, closed): that
			// connection is gone, which says nothing of the server
			// behind it. The client dials afresh for the next: a
			// server that is down refuses or times out that one.
			b.opts.Metrics.Calls.WithLabelValues(op, "broken").Inc()
			continue
		}
		if late := b.now().Sub(began) - timeout; IsTimeout(err) && late > timeout/5 && !b.closed.Load() {
			// The timeout was noticed late: this process was not running
			// when the probe's deadline passed (a CPU limit, a starved
			// machine), and Redis's answer may have been waiting to be
			// read. That says nothing about Redis: ask again, with a
			// shorter deadline so that a periodic freeze does not land
			// on it again.
			b.opts.Metrics.Calls.WithLabelValues(op, "inconclusive").Inc()
			timeout = max(timeout*7/10, b.opts.ProbeTimeout/2)
			continue
		}
		b.opts.Metrics.Calls.WithLabelValues(op, Result(err)).Inc()
		b.markDown(n, cause, err, start, timeout)
		return
	}
}

// redialTimeout bounds redial's probe: the handshake of a fresh
// connection (HELLO, CLIENT SETNAME) and the probe's own round trip,
// behind a link as slow as the call timeout allows: five times it, as
// the clients' dial timeout is (750ms at the defaults).
func (b *Breaker) redialTimeout() time.Duration {
	return 5 * b.callWait()
}

// redial gives n's probe a connection again, in the background, after a
// probe timed out while a decision's call proved the server answers. The
// client dropped the connection the late answer was due on, so the next
// probe would dial, and pay the handshake's round trips inside its own
// timeout: behind a slow link (80ms ± 40), every later probe of that
// replica timed out so (18 of 19 in a run), until a confirmation that no
// call happened to answer beside opened its breaker. A server just shown
// to answer is worth dialling now, with time for the handshake; one that
// froze meanwhile keeps the dial waiting, and the next confirmation's
// probe, waiting its turn for the connection, times out as it should.
// (So does one that comes while a slow link's handshake runs, a few
// hundred milliseconds: it is cleared only by a decision's call answering
// beside it, as every confirmation was before.)
func (b *Breaker) redial(n *Node) {
	if b.closed.Load() || !n.redialing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer n.redialing.Store(false)
		b.p.Probe(n.addr, n.key, b.redialTimeout())
	}()
}

// tick is the watch's period.
func (b *Breaker) tick() time.Duration { return max(b.opts.StallAfter/2, time.Millisecond) }

// lateAsk is how long before a window's turn the watch asks a server a
// second time: two ticks, so that a tick a little late still falls
// before the turn.
func (b *Breaker) lateAsk() time.Duration { return 2 * b.tick() }

// AwaitVerdict waits, at most until ctx is done, for the confirmation
// probe running for n, and reports whether n is down
// (redisstore.Store.AwaitVerdict).
func (b *Breaker) AwaitVerdict(ctx context.Context, n *Node) (down bool) {
	n.verdictMu.Lock()
	done := n.verdict
	n.verdictMu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	return n.down.Load()
}

// probeOnce asks n whether it serves, with a key command: not PING, since
// a Redis Cluster that has lost a master still answers PING but refuses
// keys with CLUSTERDOWN. A master asked for a key whose slot it no longer
// serves answers MOVED: it is up, and the slot map is stale.
func (b *Breaker) probeOnce(n *Node, timeout time.Duration) error {
	err := b.p.Probe(n.addr, n.key, timeout)
	if n.addr == "" {
		return err
	}
	if err != nil && !Unavailable(err) {
		if redirected(err) {
			b.p.ReloadSlots()
		}
		return nil // the master answered
	}
	return err
}

// redirected reports whether err is a MOVED or ASK redirection.
func redirected(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ")
}

// markDown opens n's breaker: its calls fail at once, those in flight
// give up.
func (b *Breaker) markDown(n *Node, cause, probeErr error, since time.Time, waited time.Duration) {
	if b.closed.Load() || !n.down.CompareAndSwap(false, true) {
		return
	}
	if b.opts.Down != nil {
		b.opts.Down(since)
	}
	b.nodeDown(1)
	b.opts.Metrics.Opened.Inc()
	n.outage.Load().cancel()
	b.opts.Log.Warn("redis marked down; policies follow on_redis_error",
		n.logAttrs("error", cause.Error(), "probe", probeErr.Error(), "probe_timeout", waited.String())...)
}

// markUp closes n's breaker after a probe answered.
func (b *Breaker) markUp(n *Node) {
	wctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if err := b.opts.Warm(wctx); err != nil { // a restarted Redis has an empty script cache
		b.opts.Log.Debug("loading scripts after redis came back", "error", err.Error())
	}
	cancel()
	n.outage.Store(newOutage())
	n.down.Store(false)
	b.opts.Log.Info("redis is back; policies return to their mode", n.logAttrs()...)
	b.nodeDown(-1)
	if b.opts.Back != nil {
		b.opts.Back()
	}
}

// nodeDown counts a node marked down (+1) or back (-1): the store is up
// (extauthz_redis_up 1) while no node is down.
func (b *Breaker) nodeDown(delta int64) {
	down := b.downNodes.Add(delta)
	b.opts.Metrics.NodesDown.Set(float64(down))
	if down == 0 {
		b.opts.Metrics.Up.Set(1)
	} else {
		b.opts.Metrics.Up.Set(0)
	}
}

// watch runs watchAt every tick until Close.
func (b *Breaker) watch() {
	tick := time.NewTicker(b.tick())
	defer tick.Stop()
	for {
		var now time.Time
		select {
		case <-b.stop:
			return
		case now = <-tick.C:
		}
		b.watchAt(now)
	}
}

// watchAt raises suspicion when a node's calls are pending and none has
// finished for StallAfter (a frozen Redis fails nothing: it only stops
// answering), or, IdleProbe before a window served without calls turns
// (Want), when a node with nothing pending has not answered since; and it
// probes each down node every ProbeEvery.
func (b *Breaker) watchAt(now time.Time) {
	ns := now.UnixNano()
	ask := int64(0)  // the instant since which an idle node has to have answered
	pending := false // the ask is made beside calls pending too
	if by := b.wantBy.Load(); by != 0 && ns >= by-int64(b.opts.IdleProbe) {
		switch {
		case ns >= by:
			b.wantBy.CompareAndSwap(by, 0) // a turn missed: the next Want sets the next
		case by != b.askedTurn:
			ask, b.askedTurn = by-int64(b.opts.IdleProbe), by
		case by != b.askedLate && b.opts.IdleProbe > b.lateAsk() && ns >= by-int64(b.lateAsk()):
			// Asked again at the turn's last ticks: an outage that
			// began after the first ask was answered is then dated
			// before the turn all the same, where it was learnt at
			// the next window's first call and that window lost
			// (the blackhole beginning within IdleProbe of a turn,
			// about one fault run in six, docs/reliability.md). Only
			// an answer within those ticks excuses it: one just
			// before (a heartbeat) says nothing of them. And it is
			// asked beside a call pending (a heartbeat sent into the
			// outage), which the stall rule would judge only
			// StallAfter after the call began, past the turn.
			ask, pending, b.askedLate = by-int64(b.lateAsk()), true, by
			b.wantBy.CompareAndSwap(by, 0) // this turn's asks are made: the next Want sets the next
		}
	}
	b.eachNode(func(n *Node) { b.watchNode(n, now, ask, pending) })
}

// watchNode is watchAt for n; ask, when not zero, asks n if it has not
// answered since then and nothing is pending (pending: or even so).
func (b *Breaker) watchNode(n *Node, now time.Time, ask int64, pending bool) {
	if !n.down.Load() {
		asking := ask != 0 && n.lastOK.Load() < ask
		switch {
		case n.inflight.Load() > 0:
			if now.UnixNano()-n.progress.Load() >= int64(b.opts.StallAfter) {
				b.Suspect(n, errStalled)
			} else if asking && pending {
				b.Suspect(n, errIdle)
			}
		case asking:
			b.Suspect(n, errIdle)
		}
		return
	}
	if now.Sub(n.lastProbe) < b.opts.ProbeEvery {
		return
	}
	n.lastProbe = now
	if n.addr != "" {
		// A replica may have taken this master's slots: ask for the
		// map again, and stop judging a master it no longer names.
		b.p.ReloadSlots()
		if b.forget(n) {
			return
		}
	}
	if err := b.probeOnce(n, b.callWait()); err != nil {
		b.opts.Metrics.Calls.WithLabelValues("probe", Result(err)).Inc()
		return
	}
	b.opts.Metrics.Calls.WithLabelValues("probe", "ok").Inc()
	b.markUp(n)
}

// forget drops down master n once the slot map sends its probe key to
// another master: its slots were taken over, and keys route there.
func (b *Breaker) forget(n *Node) bool {
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.ProbeTimeout)
	defer cancel()
	addr, err := b.p.Master(ctx, n.key)
	if err != nil || addr == n.addr {
		return false
	}
	b.nodesMu.Lock()
	if b.nodes[n.addr] == n {
		delete(b.nodes, n.addr)
		b.listLocked()
	}
	b.nodesMu.Unlock()
	if n.down.CompareAndSwap(true, false) {
		b.nodeDown(-1)
	}
	b.opts.Log.Info("redis cluster master replaced; its keys return to their mode",
		slog.String("node", n.addr), slog.String("now", addr))
	return true
}

// Unavailable reports whether err says Redis cannot serve (as opposed to
// an error about one key or script, which it answered).
func Unavailable(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return true // no reply: timeouts, refused or broken connections, a full pool
	}
	msg := rerr.Error()
	for _, prefix := range []string{"LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "READONLY", "BUSY", "NOAUTH", "ERR max number of clients"} {
		if strings.HasPrefix(msg, prefix) {
			return true
		}
	}
	return false
}

// Broken reports whether err says that the connection it came on broke
// (reset by the peer, closed under the call, cut mid-reply) rather than
// that the server refused a connection, gave no reply in time or replied
// with an error: a connection's fault, not yet the server's.
func Broken(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// Result names a failed call's result for extauthz_redis_calls_total.
func Result(err error) string {
	if IsTimeout(err) {
		return "timeout"
	}
	return "error"
}

// IsTimeout reports whether err is a deadline passed or a network timeout.
func IsTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Exister is the one command a probe sends: EXISTS, a key command (a
// go-redis Client or ClusterClient fits).
type Exister interface {
	Exists(ctx context.Context, keys ...string) *redis.IntCmd
}

// RedisProber is the store's Prober: EXISTS on the probe clients (one
// per Cluster master when NodeProbe is set), routed by the Router.
type RedisProber struct {
	Client    Exister                   // the standalone server's, or the Cluster's as a whole
	NodeProbe func(addr string) Exister // nil: Client for every master
	Router    Router                    // nil: standalone
}

// Probe implements Prober.
func (p *RedisProber) Probe(addr, key string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := p.Client
	if addr != "" && p.NodeProbe != nil {
		c = p.NodeProbe(addr)
	}
	return c.Exists(ctx, key).Err()
}

// Master implements Prober.
func (p *RedisProber) Master(ctx context.Context, key string) (string, error) {
	m, err := p.Router.MasterForKey(ctx, key)
	if err != nil {
		return "", err
	}
	return m.Options().Addr, nil
}

// ReloadSlots implements Prober.
func (p *RedisProber) ReloadSlots() { p.Router.ReloadState(context.Background()) }
