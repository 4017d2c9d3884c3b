package breaker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The breaker under a clock the test moves and a prober whose every
// answer the test writes: no Redis, no sleeping. Timings are the shipped
// defaults; the store's call timeout is config's default, 150ms.
const (
	stallAfter   = DefaultStallAfter   // 50ms
	probeTimeout = DefaultProbeTimeout // 100ms
	probeEvery   = DefaultProbeEvery   // 500ms
	callTimeout  = 150 * time.Millisecond
)

// t0 is where the fake clock starts.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newMetrics returns the breaker's collectors under the names the store
// registers them by (redisstore.NewMetrics), registered nowhere.
func newMetrics() Metrics {
	return Metrics{
		Calls:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "extauthz_redis_calls_total"}, []string{"op", "result"}),
		Up:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "extauthz_redis_up"}),
		Opened:    prometheus.NewCounter(prometheus.CounterOpts{Name: "extauthz_redis_breaker_opened_total"}),
		NodesDown: prometheus.NewGauge(prometheus.GaugeOpts{Name: "extauthz_redis_nodes_down"}),
	}
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// probeCall is one probe the breaker asked for.
type probeCall struct {
	addr, key string
	timeout   time.Duration
}

// fakeProber answers each probe with reply (nil: the server answered)
// and routes keys by masters.
type fakeProber struct {
	mu      sync.Mutex
	reply   func(c probeCall) error
	masters map[string]string // key → master address; a key not in it: no route
	probes  []probeCall
	lookups int
	reloads int
}

func (p *fakeProber) Probe(addr, key string, timeout time.Duration) error {
	c := probeCall{addr, key, timeout}
	p.mu.Lock()
	p.probes = append(p.probes, c)
	reply := p.reply
	p.mu.Unlock()
	if reply == nil {
		return nil
	}
	return reply(c)
}

func (p *fakeProber) Master(_ context.Context, key string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lookups++
	if addr, ok := p.masters[key]; ok {
		return addr, nil
	}
	return "", errors.New("no slot map")
}

func (p *fakeProber) ReloadSlots() {
	p.mu.Lock()
	p.reloads++
	p.mu.Unlock()
}

func (p *fakeProber) set(reply func(probeCall) error) {
	p.mu.Lock()
	p.reply = reply
	p.mu.Unlock()
}

func (p *fakeProber) route(key, addr string) {
	p.mu.Lock()
	p.masters[key] = addr
	p.mu.Unlock()
}

func (p *fakeProber) reloaded() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reloads
}

func (p *fakeProber) looked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lookups
}

func (p *fakeProber) calls() []probeCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.probes)
}

// lockedBuffer is a log sink the breaker's goroutines may write to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

type breakerRig struct {
	b     *Breaker
	clock *fakeClock
	p     *fakeProber
	m     Metrics
	log   *lockedBuffer
	warms chan struct{} // one value per Warm
	downs []time.Time   // what Options.Down was told; written by the confirmation, read after its verdict
}

func newBreakerRig(cluster bool) *breakerRig {
	r := &breakerRig{
		clock: &fakeClock{t: t0},
		p:     &fakeProber{masters: map[string]string{}},
		m:     newMetrics(),
		log:   &lockedBuffer{},
		warms: make(chan struct{}, 16),
	}
	r.b = New(r.p, Options{
		StallAfter:   stallAfter,
		ProbeTimeout: probeTimeout,
		ProbeEvery:   probeEvery,
		IdleProbe:    DefaultIdleProbe,
		CallTimeout:  callTimeout,
		Cluster:      cluster,
		WholeKey:     "rl:_peers",
		Warm:         func(context.Context) error { r.warms <- struct{}{}; return nil },
		Down:         func(since time.Time) { r.downs = append(r.downs, since) },
		Metrics:      r.m,
		Log:          slog.New(slog.NewTextHandler(r.log, nil)),
		Now:          r.clock.Now,
	})
	return r
}

// idleAskTimesOut has every probe of n time out from now on, sets the
// rig's clock to w (a confirmation reads it: it begins then) and reports
// whether the watch at w asked n and, if it did, whether n is then down.
func (r *breakerRig) idleAskTimesOut(t *testing.T, n *Node, w time.Time) (asked, down bool) {
	t.Helper()
	hold := make(chan struct{}) // the probe waits, so that the confirmation is seen running
	r.p.set(func(probeCall) error { <-hold; r.clock.Advance(callTimeout); return context.DeadlineExceeded })
	r.clock.Advance(w.Sub(r.clock.Now()))
	r.b.watchAt(w)
	asked = r.confirming(n)
	close(hold)
	return asked, asked && r.verdict(t, n)
}

// verdict waits for n's running confirmation, if any, and reports
// whether n is down.
func (r *breakerRig) verdict(t *testing.T, n *Node) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	down := r.b.AwaitVerdict(ctx, n)
	if ctx.Err() != nil {
		t.Fatal("no verdict")
	}
	return down
}

// running returns the verdict of n's running confirmation, nil when none
// runs: suspect starts one before it returns.
func (r *breakerRig) running(n *Node) chan struct{} {
	n.verdictMu.Lock()
	defer n.verdictMu.Unlock()
	return n.verdict
}

func (r *breakerRig) confirming(n *Node) bool { return r.running(n) != nil }

func (r *breakerRig) calls(op, result string) int {
	return int(testutil.ToFloat64(r.m.Calls.WithLabelValues(op, result)))
}

// state is what the metrics say of the store: up, nodes down, breakers opened.
func (r *breakerRig) state() string {
	return fmt.Sprintf("up %v, down %v, opened %v", testutil.ToFloat64(r.m.Up), testutil.ToFloat64(r.m.NodesDown), testutil.ToFloat64(r.m.Opened))
}

var (
	errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	errIO      = errors.New("i/o timeout")
)

// answerAfter is a probe that takes d, then answers with err.
func (r *breakerRig) answerAfter(d time.Duration, err error) func(probeCall) error {
	return func(probeCall) error { r.clock.Advance(d); return err }
}

// A failed call makes the store suspicious: one probe, on the standalone
// server's key, with ProbeTimeout. A probe that answers keeps the breaker
// closed; one that fails opens it, cancels the calls in flight, and
// starts no more confirmations while it is open.
func TestBreakerSuspicionAndConfirmation(t *testing.T) {
	r := newBreakerRig(false)
	n := r.b.NodeFor(context.Background(), "rl:{k}")
	if n != r.b.whole {
		t.Fatal("a standalone server is judged by one breaker")
	}
	r.b.Suspect(n, errIO)
	if r.verdict(t, n) {
		t.Fatal("opened although the probe answered")
	}
	if got, want := r.p.calls(), []probeCall{{"", "rl:_peers", probeTimeout}}; !slices.Equal(got, want) {
		t.Fatalf("probes %v, want %v", got, want)
	}
	if r.calls("confirm", "ok") != 1 || r.state() != "up 1, down 0, opened 0" {
		t.Fatalf("confirm ok %d, %s", r.calls("confirm", "ok"), r.state())
	}

	inFlight := n.outage.Load()
	r.p.set(r.answerAfter(time.Millisecond, errRefused))
	r.b.Suspect(n, errIO)
	if !r.verdict(t, n) {
		t.Fatal("a refused probe did not open the breaker")
	}
	if inFlight.ctx.Err() == nil {
		t.Fatal("the calls in flight were not abandoned")
	}
	if r.calls("confirm", "error") != 1 || r.state() != "up 0, down 1, opened 1" {
		t.Fatalf("confirm error %d, %s", r.calls("confirm", "error"), r.state())
	}
	if log := r.log.String(); !strings.Contains(log, `msg="redis marked down; policies follow on_redis_error" error="i/o timeout" probe="dial tcp: connection refused"`) || strings.Contains(log, "node=") {
		t.Fatalf("log:\n%s", log)
	}
	r.b.Suspect(n, errIO)
	if r.verdict(t, n); len(r.p.calls()) != 2 {
		t.Fatalf("a down server was confirmed again: %v", r.p.calls())
	}
}

// However many calls fail while a confirmation runs, it is the only one;
// AwaitVerdict waits for it, or for its caller's context.
func TestBreakerConfirmsOnceAtATime(t *testing.T) {
	r := newBreakerRig(false)
	n := r.b.whole
	release := make(chan struct{})
	r.p.set(func(probeCall) error { <-release; r.clock.Advance(probeTimeout); return context.DeadlineExceeded })
	r.b.Suspect(n, errIO)
	running := r.running(n)
	for range 2 {
		if r.b.Suspect(n, errIO); r.running(n) != running {
			t.Fatal("a second confirmation started while one runs")
		}
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if r.b.AwaitVerdict(gone, n) {
		t.Fatal("down before the probe decided")
	}
	close(release)
	if !r.verdict(t, n) {
		t.Fatal("the verdict was not awaited")
	}
	if got := len(r.p.calls()); got != 1 {
		t.Fatalf("%d probes for one suspicion", got)
	}
}

// A probe that fails while a decision's call succeeds says Redis answers:
// the breaker stays closed. A success from before the probe began proves
// nothing.
func TestBreakerSuccessDuringProbeKeepsItClosed(t *testing.T) {
	r := newBreakerRig(false)
	n := r.b.whole
	r.p.set(func(probeCall) error {
		began := r.clock.Now().UnixNano()
		n.Begin(began)
		r.clock.Advance(probeTimeout)
		n.End(began, r.clock.Now().UnixNano(), true)
		return context.DeadlineExceeded
	})
	r.b.Suspect(n, errIO)
	if r.verdict(t, n) || r.calls("confirm", "timeout") != 1 || r.state() != "up 1, down 0, opened 0" {
		t.Fatalf("confirm timeout %d, %s", r.calls("confirm", "timeout"), r.state())
	}

	n.Begin(r.clock.Now().UnixNano())
	n.End(r.clock.Now().UnixNano(), r.clock.Now().UnixNano(), true)
	r.clock.Advance(time.Nanosecond)
	r.p.set(r.answerAfter(probeTimeout, context.DeadlineExceeded))
	r.b.Suspect(n, errIO)
	if !r.verdict(t, n) {
		t.Fatal("a success before the probe kept the breaker closed")
	}
}

// A confirmation's probe waits the call timeout, not ProbeTimeout, where
// the server has shown itself slow: a call ran into its timeout, or one
// was answered after over half of ProbeTimeout within the last 10s. A
// link of 80ms ± 40 is not marked down for a probe answered in 120ms
// (with ProbeTimeout alone, one replica's breaker opened so under make
// test-faults, and its fallback share came on top of the others' count
// in Redis); a frozen server behind a fast link is still judged within
// ProbeTimeout.
func TestBreakerConfirmationWaitsLongerAfterSlowAnswers(t *testing.T) {
	ms := time.Millisecond
	// link answers a probe after took, or times it out at its deadline.
	link := func(r *breakerRig, took time.Duration) func(probeCall) error {
		return func(c probeCall) error {
			if c.timeout < took {
				r.clock.Advance(c.timeout)
				return context.DeadlineExceeded
			}
			r.clock.Advance(took)
			return nil
		}
	}
	// calls records decisions' calls that succeeded, one after another.
	calls := func(r *breakerRig, n *Node, took ...time.Duration) {
		for _, d := range took {
			began := r.clock.Now().UnixNano()
			n.Begin(began)
			r.clock.Advance(d)
			n.End(began, r.clock.Now().UnixNano(), true)
		}
		r.clock.Advance(time.Nanosecond) // the probe begins after the last answer: it proves nothing
	}
	// confirm raises a suspicion of cause with the server's probes
	// answered after took, and returns how long the probe waited and
	// whether the server is then down.
	confirm := func(r *breakerRig, n *Node, cause error, took time.Duration) (time.Duration, bool) {
		t.Helper()
		r.p.set(link(r, took))
		r.b.Suspect(n, cause)
		down := r.verdict(t, n)
		got := r.p.calls()
		if len(got) != 1 {
			t.Fatalf("probes %v, want one", got)
		}
		return got[0].timeout, down
	}
	frozen := time.Hour

	r := newBreakerRig(false)
	calls(r, r.b.whole, 80*ms, 120*ms, 45*ms, 110*ms, 70*ms)
	if waited, down := confirm(r, r.b.whole, errIO, 120*ms); down || waited != callTimeout {
		t.Fatalf("calls answered in 45 to 120ms, a probe answered in 120ms: waited %v, down %v; want the call timeout (%v), up", waited, down, callTimeout)
	}

	r = newBreakerRig(false)
	calls(r, r.b.whole, 300*time.Microsecond, 51*ms)
	r.clock.Advance(slowFor - time.Millisecond)
	if waited, down := confirm(r, r.b.whole, errStalled, frozen); !down || waited != callTimeout {
		t.Fatalf("an answer of 51ms 10s ago less 1ms, a frozen server: waited %v, down %v; want the call timeout (%v), down", waited, down, callTimeout)
	}
	r = newBreakerRig(false)
	calls(r, r.b.whole, 300*time.Microsecond, 51*ms)
	r.clock.Advance(slowFor)
	if waited, down := confirm(r, r.b.whole, errStalled, frozen); !down || waited != probeTimeout {
		t.Fatalf("an answer of 51ms 10s ago, a frozen server: waited %v, down %v; want ProbeTimeout (%v), down", waited, down, probeTimeout)
	}

	for _, c := range []struct {
		name  string
		calls []time.Duration
		cause error
		want  time.Duration
	}{
		{"fast calls, a stall", []time.Duration{300 * time.Microsecond, 200 * time.Microsecond, 500 * time.Microsecond}, errStalled, probeTimeout},
		{"no call answered yet, a broken call", nil, errIO, probeTimeout},
		{"calls of 15 to 50ms, a stall", []time.Duration{20 * ms, 15 * ms, 50 * ms}, errStalled, probeTimeout},
		{"fast calls, a call ran into its timeout", []time.Duration{300 * time.Microsecond}, context.DeadlineExceeded, callTimeout},
	} {
		r := newBreakerRig(false)
		calls(r, r.b.whole, c.calls...)
		if waited, down := confirm(r, r.b.whole, c.cause, frozen); !down || waited != c.want {
			t.Fatalf("%s, a frozen server: waited %v, down %v; want %v, down", c.name, waited, down, c.want)
		}
	}
}

// A probe that timed out while a decision's call answered (the
// confirmation clears) has its connection dialled again at once, in the
// background, with time for the handshake (redialTimeout, 750ms): the client
// dropped the connection, and a probe that dials behind a slow link
// pays the handshake's round trips inside its own timeout. A probe that
// answered, or failed otherwise, is not followed by a dial.
func TestBreakerRedialsAfterAProbeTimedOutBesideAnAnswer(t *testing.T) {
	for _, c := range []struct {
		name   string
		probe  error
		redial bool
	}{
		{"timed out", context.DeadlineExceeded, true},
		{"answered", nil, false},
		{"refused", errRefused, false},
	} {
		r := newBreakerRig(false)
		n := r.b.whole
		redialed := make(chan struct{}, 1)
		r.p.set(func(p probeCall) error {
			if p.timeout == r.b.redialTimeout() {
				redialed <- struct{}{}
				return nil
			}
			began := r.clock.Now().UnixNano()
			n.Begin(began)
			r.clock.Advance(probeTimeout)
			n.End(began, r.clock.Now().UnixNano(), true) // a decision's call answers meanwhile
			return c.probe
		})
		r.b.Suspect(n, errStalled)
		if r.verdict(t, n) {
			t.Fatalf("probe %s: down although a call answered during it", c.name)
		}
		if !c.redial {
			// redial marks itself running before it returns
			if n.redialing.Load() || len(r.p.calls()) != 1 {
				t.Fatalf("probe %s: redialed (probes %v)", c.name, r.p.calls())
			}
			continue
		}
		select {
		case <-redialed:
		case <-time.After(10 * time.Second):
			t.Fatalf("probe %s beside an answer: not redialed (probes %v)", c.name, r.p.calls())
		}
	}
}

// Calls pending with none finishing for StallAfter raise suspicion; a
// call finishing restarts that clock; nothing pending is no stall, however
// long. The cause is named when the breaker opens.
func TestBreakerStallRaisesSuspicion(t *testing.T) {
	ms := time.Millisecond
	r := newBreakerRig(false)
	n := r.b.whole
	if r.b.watchAt(t0.Add(time.Hour)); r.confirming(n) {
		t.Fatal("suspicion with nothing pending")
	}
	hold := make(chan struct{})
	r.p.set(func(probeCall) error { <-hold; r.clock.Advance(probeTimeout); return context.DeadlineExceeded })
	n.Begin(t0.UnixNano())
	n.Begin(t0.Add(10 * ms).UnixNano()) // a second call: the stall clock runs from the first
	for _, step := range []struct {
		at      time.Duration
		suspect bool
	}{
		{49 * ms, false},
		{50 * ms, true},
	} {
		if r.b.watchAt(t0.Add(step.at)); r.confirming(n) != step.suspect {
			t.Fatalf("at %v: suspicion %v, want %v", step.at, !step.suspect, step.suspect)
		}
	}
	close(hold)
	if !r.verdict(t, n) {
		t.Fatal("a stalled server whose probe timed out is not down")
	}
	if log := r.log.String(); !strings.Contains(log, `error="redisstore: redis calls stalled" probe="context deadline exceeded"`) {
		t.Fatalf("log:\n%s", log)
	}

	r = newBreakerRig(false)
	n = r.b.whole
	hold = make(chan struct{})
	r.p.set(func(probeCall) error { <-hold; return nil })
	n.Begin(t0.UnixNano())
	n.Begin(t0.UnixNano())
	n.End(t0.UnixNano(), t0.Add(30*ms).UnixNano(), false) // one finishes: progress, even failed
	for _, at := range []time.Duration{50 * ms, 79 * ms} {
		if r.b.watchAt(t0.Add(at)); r.confirming(n) {
			t.Fatalf("at %v: suspicion 30ms after a call finished", at)
		}
	}
	if r.b.watchAt(t0.Add(80 * ms)); !r.confirming(n) {
		t.Fatal("no suspicion 50ms after the last call finished")
	}
	close(hold)
	r.verdict(t, n)
}

// A process that serves a window's decisions without calling Redis
// (Want, with the window's turn) still learns of an outage before the
// window turns: IdleProbe (100ms) before the turn, a server with nothing
// pending that has not answered since is asked, with the call timeout
// (150ms: no call runs beside it to prove Redis answers), and marked down
// when that probe fails; the store is told the instant the probe began,
// before the turn. Nothing wanted, a call pending (the stall rule's), a
// call answered since, or the turn passed, nothing is asked; one probe
// per turn at most, the nearest turn first.
func TestBreakerAsksAnIdleServerBeforeAWindowTurns(t *testing.T) {
	ms := time.Millisecond
	turn := t0.Add(time.Second)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	r := newBreakerRig(false)
	n := r.b.whole
	n.Begin(t0.UnixNano())
	n.End(t0.UnixNano(), at(ms).UnixNano(), true) // the last answer: t0+1ms

	r.b.watchAt(at(950 * ms))
	if r.confirming(n) {
		t.Fatal("an idle server asked with no window served without calls")
	}
	r.b.Want(turn.UnixNano())
	if r.b.watchAt(at(899 * ms)); r.confirming(n) {
		t.Fatal("asked 101ms before the turn")
	}
	n.Begin(at(890 * ms).UnixNano()) // a call pending: the stall rule judges it
	if r.b.watchAt(at(900 * ms)); r.confirming(n) {
		t.Fatal("an idle probe beside a pending call")
	}
	n.End(at(890*ms).UnixNano(), at(1905*ms).UnixNano(), true) // it answered within IdleProbe of the next turn
	r.b.Want(at(2 * time.Second).UnixNano())
	if r.b.watchAt(at(1910 * ms)); r.confirming(n) {
		t.Fatal("asked although Redis answered within IdleProbe of the turn")
	}
	r.b.Want(at(3 * time.Second).UnixNano())
	if r.b.watchAt(at(3001 * ms)); r.confirming(n) {
		t.Fatal("asked after the turn it was wanted for")
	}

	r.b.Want(at(time.Hour).UnixNano())
	r.b.Want(at(4 * time.Second).UnixNano()) // the nearest turn is the one asked for
	r.b.Want(at(time.Minute).UnixNano())
	asked, down := r.idleAskTimesOut(t, n, at(3900*ms))
	if !asked {
		t.Fatal("not asked 100ms before the turn of a window served without calls")
	}
	if !down {
		t.Fatal("an idle server whose probe timed out is not down")
	}
	if got, want := r.p.calls(), []probeCall{{"", "rl:_peers", callTimeout}}; !slices.Equal(got, want) {
		t.Fatalf("probes %v, want %v (one, with the call timeout)", got, want)
	}
	if !slices.Equal(r.downs, []time.Time{at(3900 * ms)}) {
		t.Fatalf("store told %v, want the probe's start, before the turn", r.downs)
	}
	if r.calls("idle", "timeout") != 1 || r.calls("confirm", "timeout") != 0 {
		t.Fatalf("idle timeouts %d, confirm timeouts %d", r.calls("idle", "timeout"), r.calls("confirm", "timeout"))
	}
	if log := r.log.String(); !strings.Contains(log, `error="no answer from redis before a window served without calls turned"`) {
		t.Fatalf("log:\n%s", log)
	}

	// A server that answers: one probe per turn, and none for a turn
	// nothing was served without calls in.
	r = newBreakerRig(false)
	n = r.b.whole
	for range 3 {
		r.b.Want(turn.UnixNano())
		r.b.watchAt(at(900 * ms))
		r.verdict(t, n)
	}
	r.b.watchAt(at(1900 * ms))
	r.verdict(t, n)
	if len(r.p.calls()) != 1 || r.calls("idle", "ok") != 1 || r.state() != "up 1, down 0, opened 0" {
		t.Fatalf("probes %v, idle ok %d, %s; want one probe, answered", r.p.calls(), r.calls("idle", "ok"), r.state())
	}
}

// An outage that begins after the idle probe IdleProbe (100ms) before a
// turn was answered is asked about again two watch ticks (50ms) before
// the turn, and dated from that probe's start, before the turn: learnt at
// the next window's first call, that window would start as one Redis may
// have counted in, and hybrid admitted nothing in it where redis mode
// admitted its limit (docs/reliability.md). A call answered within
// those 50ms, nothing is asked again (one answered before them does not
// excuse the ask); and two asks per turn at most.
func TestBreakerAsksAnIdleServerAgainNearTheTurn(t *testing.T) {
	ms := time.Millisecond
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	r := newBreakerRig(false)
	n := r.b.whole
	n.Begin(t0.UnixNano())
	n.End(t0.UnixNano(), at(ms).UnixNano(), true) // the last answer: t0+1ms
	turn := at(time.Second)
	r.b.Want(turn.UnixNano())
	if r.b.watchAt(at(900 * ms)); !r.confirming(n) {
		t.Fatal("not asked 100ms before the turn")
	}
	if r.verdict(t, n) {
		t.Fatal("down after a probe that answered")
	}
	r.b.Want(turn.UnixNano()) // served from memory since
	if r.b.watchAt(at(925 * ms)); r.confirming(n) {
		t.Fatal("asked again 75ms before the turn")
	}
	// The outage begins: every probe from now on times out.
	asked, down := r.idleAskTimesOut(t, n, at(950*ms))
	if !asked {
		t.Fatal("not asked again 50ms before the turn, after the first probe was answered")
	}
	if !down {
		t.Fatal("an idle server whose second probe timed out is not down")
	}
	if !slices.Equal(r.downs, []time.Time{at(950 * ms)}) {
		t.Fatalf("store told %v, want the second probe's start, before the turn", r.downs)
	}
	if r.calls("idle", "ok") != 1 || r.calls("idle", "timeout") != 1 || len(r.p.calls()) != 2 {
		t.Fatalf("probes %v, idle ok %d, idle timeouts %d; want two, the first answered", r.p.calls(), r.calls("idle", "ok"), r.calls("idle", "timeout"))
	}

	// firstAskAnswered is a rig whose server was asked 100ms before the
	// turn and answered.
	firstAskAnswered := func() (*breakerRig, *Node) {
		r := newBreakerRig(false)
		r.b.Want(turn.UnixNano())
		r.b.watchAt(at(900 * ms))
		r.verdict(t, r.b.whole)
		return r, r.b.whole
	}

	// A call answered after the first ask but before the turn's last
	// 50ms (a heartbeat): asked again all the same, and the outage after
	// it dated before the turn. (Excused by it, one replica of three lost
	// the window in a run of TestWindowFaultJustBeforeATurn.)
	r, n = firstAskAnswered()
	n.Begin(at(910 * ms).UnixNano())
	n.End(at(910*ms).UnixNano(), at(920*ms).UnixNano(), true)
	r.b.Want(turn.UnixNano())
	if asked, down := r.idleAskTimesOut(t, n, at(950*ms)); !asked || !down {
		t.Fatalf("a call answered 80ms before the turn: asked again %v, down %v; want both", asked, down)
	}
	// A call pending since after the first ask (a heartbeat sent into the
	// outage), younger than StallAfter: asked again all the same, dated
	// before the turn. (Left to the stall rule, which judges it 50ms after
	// it began, past the turn, a replica of three lost the window in a run
	// of TestWindowFaultJustBeforeATurn.)
	r, n = firstAskAnswered()
	n.Begin(at(930 * ms).UnixNano())
	r.b.Want(turn.UnixNano())
	if asked, down := r.idleAskTimesOut(t, n, at(950*ms)); !asked || !down {
		t.Fatalf("a call pending since 70ms before the turn: asked again %v, down %v; want both", asked, down)
	}
	if !slices.Equal(r.downs, []time.Time{at(950 * ms)}) {
		t.Fatalf("store told %v, want the second probe's start, before the turn", r.downs)
	}
	// A call answered within the turn's last 50ms: not asked again. An
	// answering server: two asks a turn, no third.
	r, n = firstAskAnswered()
	n.Begin(at(950 * ms).UnixNano())
	n.End(at(950*ms).UnixNano(), at(951*ms).UnixNano(), true)
	r.b.Want(turn.UnixNano())
	if r.b.watchAt(at(955 * ms)); r.confirming(n) {
		t.Fatal("asked again although a call answered 49ms before the turn")
	}
	r = newBreakerRig(false)
	n = r.b.whole
	for _, tick := range []time.Duration{900, 950, 975} {
		r.b.Want(turn.UnixNano())
		r.b.watchAt(at(tick * ms))
		r.verdict(t, n)
	}
	if len(r.p.calls()) != 2 || r.calls("idle", "ok") != 2 {
		t.Fatalf("probes %v, idle ok %d; want two a turn, answered", r.p.calls(), r.calls("idle", "ok"))
	}
}

// A probe's timeout that this process noticed late (more than a fifth of
// the timeout after its deadline) is inconclusive: it is asked again with
// 7/10 of the timeout, never less than half ProbeTimeout. Only a timeout
// is excused, and not while the store closes.
func TestBreakerTimeoutNoticedLate(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		name string
		// took is how long each probe took, and err what it returned;
		// the last is repeated.
		took         []time.Duration
		errs         []error
		closing      bool
		down         bool
		timeouts     []time.Duration
		inconclusive int
	}{
		{
			name:     "on time: down",
			took:     []time.Duration{probeTimeout},
			errs:     []error{context.DeadlineExceeded},
			down:     true,
			timeouts: []time.Duration{probeTimeout},
		},
		{
			name:     "a fifth late is on time",
			took:     []time.Duration{probeTimeout + probeTimeout/5},
			errs:     []error{context.DeadlineExceeded},
			down:     true,
			timeouts: []time.Duration{probeTimeout},
		},
		{
			name:         "late twice, then answered",
			took:         []time.Duration{probeTimeout + 21*ms, 70*ms + 15*ms, ms},
			errs:         []error{context.DeadlineExceeded, context.DeadlineExceeded, nil},
			timeouts:     []time.Duration{100 * ms, 70 * ms, 50 * ms},
			inconclusive: 2,
		},
		{
			name:         "late, then timed out on time",
			took:         []time.Duration{probeTimeout + 21*ms, 70 * ms},
			errs:         []error{context.DeadlineExceeded, context.DeadlineExceeded},
			down:         true,
			timeouts:     []time.Duration{100 * ms, 70 * ms},
			inconclusive: 1,
		},
		{
			name:     "a refusal noticed late still counts",
			took:     []time.Duration{2 * probeTimeout},
			errs:     []error{errRefused},
			down:     true,
			timeouts: []time.Duration{probeTimeout},
		},
		{
			name:     "closing: not asked again, not marked down",
			took:     []time.Duration{2 * probeTimeout},
			errs:     []error{context.DeadlineExceeded},
			closing:  true,
			timeouts: []time.Duration{probeTimeout},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, down := scriptedConfirmation(t, c.took, c.errs, c.closing)
			if down != c.down {
				t.Errorf("down %v, want %v", down, c.down)
			}
			var timeouts []time.Duration
			for _, p := range r.p.calls() {
				timeouts = append(timeouts, p.timeout)
			}
			if !slices.Equal(timeouts, c.timeouts) {
				t.Errorf("probe timeouts %v, want %v", timeouts, c.timeouts)
			}
			if got := r.calls("confirm", "inconclusive"); got != c.inconclusive {
				t.Errorf("%d inconclusive, want %d", got, c.inconclusive)
			}
		})
	}
}

// scriptedConfirmation runs one confirmation of the whole server whose
// probes take took[i] of the fake clock and answer errs[i] (the last of
// each repeated), with the store closed first when closing, and returns
// the rig and the verdict.
func scriptedConfirmation(t *testing.T, took []time.Duration, errs []error, closing bool) (*breakerRig, bool) {
	t.Helper()
	r := newBreakerRig(false)
	i := 0
	r.p.set(func(probeCall) error {
		j := i
		i++
		r.clock.Advance(took[min(j, len(took)-1)])
		return errs[min(j, len(errs)-1)]
	})
	if closing {
		r.b.Close()
	}
	r.b.Suspect(r.b.whole, errIO)
	return r, r.verdict(t, r.b.whole)
}

// A probe whose connection broke (reset, closed, cut mid-reply) is asked
// again at once on a fresh one while the confirmation has run less than
// ProbeTimeout: a network that resets some of the connections it carries
// opened the breakers of the replicas whose probe drew a reset, while
// Redis served the others. A refusal or a timeout is conclusive, as
// before; a server whose every connection breaks is down once
// ProbeTimeout has passed. Each probe here takes a millisecond.
func TestBreakerBrokenConnectionAskedAgain(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	for _, c := range []struct {
		name    string
		errs    []error // each probe's answer; the last is repeated
		closing bool
		down    bool
		probes  int
		broken  int
	}{
		{name: "reset, then answered", errs: []error{reset, nil}, probes: 2, broken: 1},
		{name: "cut mid-reply, then answered", errs: []error{io.EOF, nil}, probes: 2, broken: 1},
		{name: "reset twice, then answered", errs: []error{reset, reset, nil}, probes: 3, broken: 2},
		{name: "reset twenty times, then answered", errs: append(slices.Repeat([]error{reset}, 20), nil), probes: 21, broken: 20},
		// The probe that ends at ProbeTimeout is conclusive.
		{name: "reset until the probe timeout: down", errs: []error{reset}, down: true, probes: int(probeTimeout / time.Millisecond), broken: int(probeTimeout/time.Millisecond) - 1},
		{name: "reset, then refused: down", errs: []error{reset, errRefused}, down: true, probes: 2, broken: 1},
		{name: "reset, then timed out: down", errs: []error{reset, context.DeadlineExceeded}, down: true, probes: 2, broken: 1},
		{name: "refused: down at once", errs: []error{errRefused}, down: true, probes: 1},
		{name: "closing: not asked again, not marked down", errs: []error{reset}, closing: true, probes: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, down := scriptedConfirmation(t, []time.Duration{time.Millisecond}, c.errs, c.closing)
			if down != c.down {
				t.Errorf("down %v, want %v", down, c.down)
			}
			if got := len(r.p.calls()); got != c.probes {
				t.Errorf("%d probes, want %d", got, c.probes)
			}
			if got := r.calls("confirm", "broken"); got != c.broken {
				t.Errorf("%d broken, want %d", got, c.broken)
			}
		})
	}
}

// While open, a probe every ProbeEvery (with the call timeout, at least
// ProbeTimeout) asks whether Redis is back; the first that answers loads
// the scripts and closes the breaker, with a fresh outage for the calls
// to come.
func TestBreakerProbesWhileOpen(t *testing.T) {
	r := newBreakerRig(false)
	n := r.b.whole
	r.p.set(r.answerAfter(time.Millisecond, errRefused))
	r.b.Suspect(n, errIO)
	if !r.verdict(t, n) {
		t.Fatal("not down")
	}
	opened := r.clock.Now()
	n.Begin(opened.UnixNano()) // abandoned calls are no stall while down
	ms := time.Millisecond
	for _, step := range []struct {
		at     time.Duration
		probes int
	}{
		{0, 2},
		{499 * ms, 2},
		{500 * ms, 3},
		{999 * ms, 3},
	} {
		r.b.watchAt(opened.Add(step.at))
		if got := len(r.p.calls()); got != step.probes {
			t.Fatalf("at %v: %d probes, want %d", step.at, got, step.probes)
		}
	}
	if last := r.p.calls()[2]; last.timeout != callTimeout || !n.down.Load() || r.calls("probe", "error") != 2 || len(r.warms) != 0 {
		t.Fatalf("probe %+v, down %v, probe errors %d, warms %d", last, n.down.Load(), r.calls("probe", "error"), len(r.warms))
	}

	r.p.set(nil)
	r.b.watchAt(opened.Add(time.Second))
	if n.down.Load() || r.calls("probe", "ok") != 1 || len(r.warms) != 1 || r.state() != "up 1, down 0, opened 1" {
		t.Fatalf("down %v, probe ok %d, warms %d, %s", n.down.Load(), r.calls("probe", "ok"), len(r.warms), r.state())
	}
	if n.outage.Load().ctx.Err() != nil {
		t.Fatal("the calls after the outage start abandoned")
	}
	if !strings.Contains(r.log.String(), `msg="redis is back; policies return to their mode"`) {
		t.Fatalf("log:\n%s", r.log.String())
	}
}

// A Cluster's masters are judged one by one: a key's calls count for the
// master serving it, a master's probe asks that master for a key it
// served, and one master down leaves the others up. A master that answers
// a probe with an error about the key, or a redirection (then the slot map
// is reloaded), is up. A down master whose key the slot map sends
// elsewhere is forgotten; its keys go to the new master, up. Before any
// slot map, or while the cluster as a whole is down, every key has the
// whole cluster's breaker.
func TestBreakerJudgesEachMasterAlone(t *testing.T) {
	const a, b, c = "10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"
	r := newBreakerRig(true)
	ctx := context.Background()
	if r.b.NodeFor(ctx, "rl:{x}") != r.b.whole {
		t.Fatal("a key with no route is not judged by the whole cluster's breaker")
	}
	r.p.route("rl:{x}", a)
	r.p.route("rl:{y}", b)
	na, nb := r.b.NodeFor(ctx, "rl:{x}"), r.b.NodeFor(ctx, "rl:{y}")
	if na == nb || na.addr != a || nb.addr != b || r.b.NodeFor(ctx, "rl:{x}") != na {
		t.Fatalf("nodes %q %q", na.addr, nb.addr)
	}
	select {
	case <-r.warms: // the second master may be new: its scripts are loaded
	case <-time.After(10 * time.Second):
		t.Fatal("a master that appeared got no scripts")
	}

	r.p.set(func(p probeCall) error {
		switch p.addr {
		case a:
			return errRefused
		case b:
			return redisError("WRONGTYPE Operation against a key holding the wrong kind of value")
		}
		return nil
	})
	r.b.Suspect(na, errIO)
	r.b.Suspect(nb, errIO)
	if !r.verdict(t, na) || r.verdict(t, nb) || r.state() != "up 0, down 1, opened 1" {
		t.Fatalf("a down %v, b down %v, %s", na.down.Load(), nb.down.Load(), r.state())
	}
	probes := r.p.calls()
	slices.SortFunc(probes, func(x, y probeCall) int { return strings.Compare(x.addr, y.addr) })
	if want := []probeCall{{a, "rl:{x}", probeTimeout}, {b, "rl:{y}", probeTimeout}}; !slices.Equal(probes, want) {
		t.Fatalf("probes %v, want %v", probes, want)
	}
	if !strings.Contains(r.log.String(), "node="+a) {
		t.Fatalf("log does not name the master:\n%s", r.log.String())
	}

	r.p.set(func(probeCall) error { return redisError("MOVED 3999 " + c) })
	r.b.Suspect(nb, errIO)
	if r.verdict(t, nb) || r.p.reloaded() != 1 {
		t.Fatalf("a redirected probe: down %v, %d slot map reloads", nb.down.Load(), r.p.reloaded())
	}

	// a's slots move to c: the next probe round forgets a, without
	// probing it, and x's calls go to c.
	r.p.set(func(probeCall) error { return errRefused })
	before := len(r.p.calls())
	r.p.route("rl:{x}", c)
	r.b.watchAt(t0.Add(time.Hour))
	if r.p.reloaded() != 2 || len(r.p.calls()) != before || r.state() != "up 1, down 0, opened 1" {
		t.Fatalf("reloads %d, probes %v, %s", r.p.reloaded(), r.p.calls()[before:], r.state())
	}
	if nc := r.b.NodeFor(ctx, "rl:{x}"); nc.addr != c || nc.down.Load() {
		t.Fatalf("x is judged by %q (down %v)", nc.addr, nc.down.Load())
	}
	if !strings.Contains(r.log.String(), `msg="redis cluster master replaced; its keys return to their mode" node=`+a+" now="+c) {
		t.Fatalf("log:\n%s", r.log.String())
	}

	// The whole cluster down: keys are not routed, every key has its
	// breaker.
	r.b.Suspect(r.b.whole, errIO)
	if !r.verdict(t, r.b.whole) {
		t.Fatal("the whole cluster is not down")
	}
	lookups := r.p.looked()
	if r.b.NodeFor(ctx, "rl:{y}") != r.b.whole || r.p.looked() != lookups {
		t.Fatal("a key was routed while the whole cluster is down")
	}
}

// redisError is an error reply, as go-redis gives one.
type redisError string

func (e redisError) Error() string { return string(e) }
func (redisError) RedisError()     {}
