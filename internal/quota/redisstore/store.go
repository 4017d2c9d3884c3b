package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/breaker"
	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/tracing"
)

// ErrStoreDown is returned without calling Redis while the store is marked
// down, and by calls abandoned when it was marked down while they waited.
var ErrStoreDown = errors.New("redisstore: redis is marked down")

// rediser is the part of a go-redis client the store uses, so a Client or
// a ClusterClient fits.
type rediser interface {
	redis.Scripter
	Exists(ctx context.Context, keys ...string) *redis.IntCmd
	ZRem(ctx context.Context, key string, members ...any) *redis.IntCmd
}

// DefaultTimeout is the per-call timeout when StoreOptions leaves it zero.
// Each call's timeout is also kept inside its caller's deadline (Envoy's
// ext_authz timeout arrives as the gRPC deadline), with a tenth of what
// remains left over to answer from the fallback.
const DefaultTimeout = 150 * time.Millisecond

// StoreOptions configures a Store.
type StoreOptions struct {
	Prefix  string        // key prefix, such as "rl:"
	Timeout time.Duration // per call (default DefaultTimeout)
	Metrics *Metrics      // nil: collectors of its own, registered nowhere
	Log     *slog.Logger
	// Probe is a client with its own connections, used only to confirm
	// that Redis is down and to learn that it is back, so a full decision
	// pool never delays the verdict. Nil: the decision client.
	Probe rediser
	// Clock, for tests only, makes scripts use this time instead of Redis
	// TIME. Production leaves it nil: every decision uses the Redis
	// server's clock, never a replica's. Redis still expires keys on its
	// own clock, so the algorithm scripts then keep keys a minute at least.
	Clock func() time.Time
	// StallAfter, ProbeTimeout, ProbeEvery and IdleProbe time the
	// breaker (see the design note in package breaker); zero means the
	// Default constants.
	StallAfter   time.Duration
	ProbeTimeout time.Duration
	ProbeEvery   time.Duration
	IdleProbe    time.Duration
	// Router, for a Redis Cluster, says which master serves a key: the
	// breaker then judges each master alone (package breaker). Nil: one
	// breaker for the whole store, as for a standalone server.
	Router Router
	// NodeProbe returns the client a Cluster master's probes use: one
	// that talks to that master alone, on a connection of its own. Nil:
	// Probe.
	NodeProbe func(addr string) rediser
	// LoadScript loads a script into every master of a Cluster, on the
	// masters' probe connections. Nil: on Probe's.
	LoadScript func(ctx context.Context, sc *redis.Script) error
	// WaitReplicas, above zero, follows every hybrid bucket lease call
	// with WAIT WaitReplicas WaitTimeout on the connection that ran it
	// (redis.wait_replicas): a lease fewer replicas acknowledge is not
	// spent past the request that took it (Hybrid.Take), so a failover
	// to a replica that missed it loses no more than redis mode loses of
	// one decision. Pipeline gives that connection (Clients.StoreOptions);
	// without it WaitReplicas does nothing.
	WaitReplicas int
	WaitTimeout  time.Duration
	Pipeline     func(ctx context.Context, key string) (redis.Pipeliner, error)
}

// Store runs the limiter scripts against Redis. Every call has a deadline.
// The breaker (package breaker) marks Redis down when it is unavailable (a
// Cluster: master by master); calls then fail at once with ErrStoreDown,
// so no decision waits on an unreachable Redis, while a probe tests
// whether it is back.
type Store struct {
	rdb     rediser
	opts    StoreOptions
	breaker *breaker.Breaker
	// answered is when Redis last answered a call, down when it was last
	// out of reach, downSince when it was first out of reach after that
	// answer (unix ns; DownAt, DownSince).
	answered, down, downSince atomic.Int64
	// warmed runs after Warm has loaded the scripts: Peers reads the
	// state's Identity there, so a Redis that comes back having lost what
	// was written is known as such before the breaker lets decisions
	// through.
	warmed atomic.Pointer[func(context.Context)]
	// debts are the fallback debts charged when a master comes back,
	// before decisions reach it (chargeDebts).
	debts atomic.Pointer[Table]
}

// NewStore returns a Store using rdb and starts its watch; Close stops it.
func NewStore(rdb rediser, opts StoreOptions) *Store {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.StallAfter <= 0 {
		opts.StallAfter = DefaultStallAfter
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = DefaultProbeTimeout
	}
	if opts.ProbeEvery <= 0 {
		opts.ProbeEvery = DefaultProbeEvery
	}
	if opts.IdleProbe <= 0 {
		opts.IdleProbe = DefaultIdleProbe
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Probe == nil {
		opts.Probe = rdb
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	s := &Store{rdb: rdb, opts: opts}
	s.breaker = breaker.New(newProber(opts), breaker.Options{
		StallAfter:   opts.StallAfter,
		ProbeTimeout: opts.ProbeTimeout,
		ProbeEvery:   opts.ProbeEvery,
		IdleProbe:    opts.IdleProbe,
		CallTimeout:  opts.Timeout,
		Cluster:      opts.Router != nil,
		WholeKey:     s.peersKey(),
		Warm:         s.Warm,
		Down:         s.markDown,
		Back:         s.back,
		Metrics:      opts.Metrics.breakerMetrics(),
		Log:          opts.Log,
	})
	s.breaker.Start()
	return s
}

// Warm loads every script into Redis (on every master of a Cluster), so
// the first decisions after start-up or a Redis restart do not pay for a
// NOSCRIPT round trip and a script upload inside their timeout. Then,
// before the breaker lets decisions reach a master that came back, it
// reads the Redis state (Peers.CheckState) and charges the fallback's
// debts (chargeDebts).
func (s *Store) Warm(ctx context.Context) error {
	// The scripts load on the probes' connections, which so are dialled
	// now, while Redis answers: a confirmation behind a slow link would
	// otherwise pay the dial's round trips (HELLO, CLIENT SETNAME) inside
	// its timeout, and its breaker open on a link that answers. Through
	// the decisions' autopipeliner SCRIPT LOAD would take a pooled
	// connection of its own, which then idles.
	load := s.opts.LoadScript
	if load == nil {
		load = func(ctx context.Context, sc *redis.Script) error { return sc.Load(ctx, s.opts.Probe).Err() }
	}
	for _, sc := range scripts {
		if err := load(ctx, sc); err != nil {
			return err
		}
	}
	if fn := s.warmed.Load(); fn != nil {
		(*fn)(ctx)
	}
	now := time.Now().UnixNano()
	if s.down.Load() != 0 {
		// The breaker lets Redis back after this: it was out of reach
		// until now (DownUntil).
		s.down.Store(now)
	}
	s.answered.Store(now) // it answered (DownSince)
	s.chargeDebts(ctx)
	return nil
}

// wantTurn tells the breaker when the window of a decision under l at ns
// (unix ns) turns (breaker.Breaker.Want), when l counts windows: before
// the turn it asks a Redis that has not answered lately, so that an
// outage begun before the turn is dated before it (Resilient.windowLevel
// gives the next window its full share). Hybrid's decisions served
// without a call need it (no call to fail or stall); redis mode's too,
// for an outage begun in a turn's last ticks, which its stalled calls
// would show only StallAfter later, past the turn. A token bucket's
// fallback does not depend on when an outage began.
func (s *Store) wantTurn(l quota.Limit, ns int64) {
	if l.Algorithm == quota.TokenBucket {
		return
	}
	w := max(int64(l.Window), 1)
	s.breaker.Want(ns - ns%w + w)
}

// Close stops the watch. It does not close the clients.
func (s *Store) Close() { s.breaker.Close() }

// AwaitVerdict waits, at most until ctx is done, for the confirmation
// probe that a failed call for partition started, and reports whether the
// node serving partition is down. A decision whose call failed asks it
// before falling back, so that a real outage is answered as one (a fresh
// share for keys Redis never reported on) and a failure while Redis is up
// is answered as what it may be: a call that ran. (If the slot map moved
// partition to another master meanwhile, that master's verdict answers.)
func (s *Store) AwaitVerdict(ctx context.Context, partition string) (down bool) {
	return s.breaker.AwaitVerdict(ctx, s.breaker.NodeFor(ctx, s.key(partition)))
}

// markDown records that Redis was out of reach at t: a call refused or
// abandoned because its node was marked down, or the start of the
// confirmation that marked it down (breaker.Options.Down), which a
// replica deciding without calls may reach before any call does: DownAt,
// DownSince.
func (s *Store) markDown(t time.Time) {
	ns := t.UnixNano()
	s.down.Store(ns)
	if s.downSince.Load() <= s.answered.Load() {
		s.downSince.Store(ns) // the first since Redis last answered
	}
}

// DownUntil is until when Redis may still be out of the other replicas'
// reach, as far as this one can tell: the last instant it was out of
// this store's reach (on a Cluster, any master's; a call refused or
// abandoned because it was marked down, or the moment the breaker let it
// back, Warm), plus the longest another replica's breaker may stay open
// after Redis is back for all (a probe round: ProbeEvery and
// ProbeTimeout). Zero: never down. Resilient.hold reads it.
func (s *Store) DownUntil() time.Time {
	if ns := s.down.Load(); ns != 0 {
		return time.Unix(0, ns).Add(s.opts.ProbeEvery + s.opts.ProbeTimeout)
	}
	return time.Time{}
}

// DownSince is when Redis went out of this store's reach, if it has not
// answered a call since (zero: it has, or it never was): a window that
// began after it is the fallback's alone, as far as this replica can
// tell (Resilient.windowLevel).
func (s *Store) DownSince() time.Time {
	since := s.downSince.Load()
	if since == 0 || since <= s.answered.Load() {
		return time.Time{}
	}
	return time.Unix(0, since)
}

// key returns the Redis key of a partition: the prefix, then the partition
// in a hash tag, so every key a script touches for it lands in one Cluster
// slot: "rl:{orders:client:ada}". Every policy key thus has '{' right after
// the prefix; the store's own keys never do (PeersKey), so no policy, by
// its name or its key, can land on them.
func (s *Store) key(partition string) string {
	return s.opts.Prefix + "{" + partition + "}"
}

// nowArg is the time argument of a script: empty (Redis TIME) unless a test
// clock is set. unit is the script's resolution.
func (s *Store) nowArg(unit time.Duration) string {
	if s.opts.Clock == nil {
		return ""
	}
	return strconv.FormatInt(s.opts.Clock().UnixNano()/int64(unit), 10)
}

// levelAt is the instant to stamp a level Redis reported to a decision
// at now, once its call has answered. The script ran at Redis TIME,
// after now by up to the call's duration (queued behind others, sent
// late by a starved process), and no later than the reply came. Stamped
// at now, the level is older than it is, and a fallback that refills
// from it (Resilient) credits the stretch between twice: Redis gave that
// refill out already. So it is stamped when Redis last answered
// (answered, set before the call's caller sees its reply: this call's
// answer or a later one), never earlier than now. (A call held 500ms,
// then Redis killed: the fallback admitted 7 where Redis had reported 3
// left.) With an injected Clock (tests) the scripts ran at now.
func (s *Store) levelAt(now time.Time) time.Time {
	if s.opts.Clock != nil {
		return now
	}
	if at := s.answered.Load(); at > now.UnixNano() {
		return time.Unix(0, at)
	}
	return now
}

// timeout is a call's deadline: the store's timeout, kept inside the
// caller's own deadline with a tenth of the remainder left to answer.
func (s *Store) timeout(ctx context.Context, now time.Time) time.Duration {
	t := s.opts.Timeout
	if dl, ok := ctx.Deadline(); ok {
		left := dl.Sub(now)
		t = min(t, left-left/10)
	}
	return t
}

// run calls a script with the store's deadline, breaker and metrics.
func (s *Store) run(ctx context.Context, op string, script *redis.Script, keys []string, args ...any) (any, error) {
	return s.runLate(ctx, op, script, keys, nil, args...)
}

// runLate is run, and when the caller stopped waiting (its deadline, its
// node marked down) but the script's reply arrives after all, late gets
// it: the call ran, and what it did is known (nil: dropped). An
// autopipelined command, once sent, finishes with its batch whatever its
// context says, so a reply slower than the call's timeout but within the
// connection's read timeout is read all the same: a slow link answers
// most abandoned calls this way.
func (s *Store) runLate(ctx context.Context, op string, script *redis.Script, keys []string, late lateFunc, args ...any) (any, error) {
	return s.runCall(ctx, op, keys[0], func(ctx context.Context) (any, error) {
		return script.Run(ctx, s.rdb, keys, args...).Result()
	}, late)
}

// runCall is runLate for any call on key's node: call runs with the
// call's deadline.
func (s *Store) runCall(ctx context.Context, op string, key string, call func(context.Context) (any, error), late lateFunc) (any, error) {
	n := s.breaker.NodeFor(ctx, key)
	o := n.Outage()
	if n.Down() {
		s.markDown(time.Now())
		return nil, ErrStoreDown
	}
	start := time.Now()
	t := s.timeout(ctx, start)
	if t <= 0 {
		return nil, context.DeadlineExceeded // the caller's budget is spent; Redis is not to blame
	}
	// The call runs on its own goroutine so that it can be abandoned when
	// its node is marked down, and ended at its deadline whatever the
	// client does with contexts (an autopipelined command, once sent,
	// finishes with its batch).
	callCtx, cancel := context.WithTimeout(ctx, t)
	defer cancel()
	res := make(chan result, 1)
	// fate settles who has the reply: the decision (callAnswered) or,
	// once it stopped waiting (callAbandoned), late.
	var fate atomic.Int32
	// lf is made when the decision stops waiting, before it says so
	// (fate), for the late reply and the decision's caller (lateFate).
	var lf *lateFate
	n.Begin(start.UnixNano())
	go func() {
		v, err := call(callCtx)
		at := time.Now().UnixNano()
		n.End(start.UnixNano(), at, err == nil)
		if err == nil {
			s.answered.Store(at)
		}
		if fate.CompareAndSwap(callPending, callAnswered) {
			res <- result{v, err}
			return
		}
		if err == nil && late != nil {
			late(v, lf)
		}
	}()
	var v any
	var err error
	answered := false
	select {
	case r := <-res:
		v, err, answered = r.v, r.err, true
	case <-o.Done():
		err = o.Err()
	case <-callCtx.Done():
		err = callCtx.Err()
	}
	if !answered {
		if late != nil {
			lf = newLateFate()
		}
		if !fate.CompareAndSwap(callPending, callAbandoned) {
			// The reply came as the wait ended: it is the decision's.
			r := <-res
			v, err, lf = r.v, r.err, nil
		}
	}
	done := time.Now()
	s.opts.Metrics.Duration.WithLabelValues(op).Observe(done.Sub(start).Seconds())
	switch {
	case err == nil:
		s.opts.Metrics.Calls.WithLabelValues(op, "ok").Inc()
	case o.Err() != nil:
		s.opts.Metrics.Calls.WithLabelValues(op, "abandoned").Inc()
		s.markDown(done)
		err = ErrStoreDown
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		// The caller went away; that says nothing about Redis.
		s.opts.Metrics.Calls.WithLabelValues(op, "canceled").Inc()
	case !unavailable(err):
		// Redis answered, with an error about this key or script.
		s.opts.Metrics.Calls.WithLabelValues(op, "error").Inc()
	default:
		s.opts.Metrics.Calls.WithLabelValues(op, resultOf(err)).Inc()
		s.breaker.Suspect(n, err)
	}
	tracing.RedisCall(ctx, op, start, done, err) // a child of the Check's span, when one records
	if lf != nil {
		err = &abandonedCall{err: err, fate: lf}
	}
	return v, err
}

// A call's fate: its reply goes to the decision waiting for it, or, when
// that stopped waiting first, to the call's late handler.
const (
	callPending int32 = iota
	callAnswered
	callAbandoned
)

// result is a script call's reply.
type result struct {
	v   any
	err error
}

// bucketGrant is the outcome of one bucket_lease call.
type bucketGrant struct {
	granted   int64
	remaining int64         // tokens left in the Redis bucket afterwards
	wait      time.Duration // until the tokens needed are there, when none was granted
	full      time.Duration // until the bucket is full again
	id        int64         // the lease's expiry in Redis (ms), its name when retired; 0: none
	// k and g are the key state the lease is counted under (its key's
	// incarnation and generation, bucket_state.lua): passed back when it
	// is retired, so a Redis that lost the grant can tell. 0: none.
	k, g int64
	// forgot is set when the lease retired by this call was one Redis had
	// forgotten: nothing was given back, and what was spent of it charged.
	forgot bool
	// unreplicated is set when the call's WAIT (StoreOptions.WaitReplicas)
	// found fewer replicas holding the lease than asked.
	unreplicated bool
}

// leaseAsk is what one lease call asks for.
type leaseAsk struct {
	want, need int64 // tokens wanted at most, needed at least
	debt       int64 // tokens admitted without Redis, charged first (Table.Owe)
	// life makes the grant a lease counted out in Redis until it ends
	// (bucket_state.lua); zero: an exact take. peers caps it at half of
	// what is available over the replicas.
	life   time.Duration
	peers  int64
	spent  int64 // of the grant, spent at once by the request in hand: never counted out
	retire held  // the replica's previous lease of the key, ended by this call
	// charge grants exactly want whatever is left (charge: always), spent
	// at once: the level may go below empty.
	charge bool
}

// held is a lease a replica ends: its name in Redis, the tokens Redis
// counts out for it and what of them was not spent; for a token bucket's
// lease still live on the replica, the key state it was granted under (k,
// g) and what to charge if Redis no longer holds the grant (owed: what
// the replica spent of it that such a Redis never counted). k 0: nothing
// to check (plain tokens, or a lease that has ended).
type held struct {
	id, granted, unspent int64
	k, g, owed           int64
	// owedSince is what of owed was spent since the last heartbeat that
	// found the store's state unchanged, epoch that state's epoch: when
	// Redis no longer holds the grant and its epoch is another (the whole
	// store was lost after that heartbeat, so every unit spent before it
	// was counted in what was lost), only owedSince is charged.
	owedSince int64
	epoch     string
}

// retireKeys are the keys of a script that retires h on partition: the
// bucket, and the epoch key when h names an epoch to compare (never on a
// Cluster, where the epoch key lives in a slot of its own: there the
// whole of owed is charged).
func (s *Store) retireKeys(partition string, h held) []string {
	if h.k > 0 && h.epoch != "" && s.opts.Router == nil {
		return []string{s.key(partition), EpochKey(s.opts.Prefix)}
	}
	return []string{s.key(partition)}
}

// lease takes between a.need and a.want tokens of partition's bucket
// under l, or none when fewer than need remain (want 0, need 1 asks
// without taking), after charging a.debt and retiring a.retire.
func (s *Store) lease(ctx context.Context, partition string, l quota.Limit, a leaseAsk) (bucketGrant, error) {
	var late lateFunc
	if !a.charge {
		late = func(v any, _ *lateFate) { s.undoLate(partition, a, v) }
	}
	keys := s.retireKeys(partition, a.retire)
	args := []any{intervalMicros(l), l.Capacity(), a.want, a.need, s.nowArg(time.Microsecond), a.debt,
		a.life.Milliseconds(), a.peers, a.retire.id, a.retire.granted, a.retire.unspent, a.spent, chargeFlag(a.charge), blockMicros(l),
		a.retire.k, a.retire.g, a.retire.owed, a.retire.owedSince, a.retire.epoch}
	if s.opts.WaitReplicas <= 0 || s.opts.Pipeline == nil || a.charge || a.life <= 0 || a.want <= a.spent {
		// No lease held past the request in hand: nothing to wait for.
		v, err := s.runLate(ctx, "lease", bucketLease, keys, late, args...)
		if err != nil {
			return bucketGrant{}, err
		}
		return leaseOf(v)
	}
	var acked atomic.Int64
	v, err := s.runCall(ctx, "lease", keys[0], func(ctx context.Context) (any, error) {
		v, n, err := s.leaseAndWait(ctx, keys, args)
		acked.Store(n)
		return v, err
	}, late)
	if err != nil {
		return bucketGrant{}, err
	}
	ls, err := leaseOf(v)
	ls.unreplicated = acked.Load() < int64(s.opts.WaitReplicas)
	return ls, err
}

// leaseAndWait runs bucket_lease and then WAIT on one connection, in one
// round trip: WAIT waits for the replicas to acknowledge the stream up to
// the connection's last write, so it must follow the lease where the lease
// ran (an autopipelined call may leave on any connection of the pool).
// It returns the script's reply and the replicas that acknowledged it.
func (s *Store) leaseAndWait(ctx context.Context, keys []string, args []any) (any, int64, error) {
	run := func(eval func(p redis.Pipeliner) *redis.Cmd) (any, int64, error) {
		p, err := s.opts.Pipeline(ctx, keys[0])
		if err != nil {
			return nil, 0, err
		}
		cmd := eval(p)
		w := p.Do(ctx, "WAIT", s.opts.WaitReplicas, max(s.opts.WaitTimeout.Milliseconds(), 1))
		p.Exec(ctx) // each command's error is its own
		if err := cmd.Err(); err != nil {
			return nil, 0, err
		}
		n, _ := w.Int64() // a WAIT that failed counts as no replica
		return cmd.Val(), n, nil
	}
	v, n, err := run(func(p redis.Pipeliner) *redis.Cmd { return bucketLease.EvalSha(ctx, p, keys, args...) })
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// A server that lost its scripts (a restart, a failover to a
		// replica that never loaded them): send the script itself.
		return run(func(p redis.Pipeliner) *redis.Cmd { return bucketLease.Eval(ctx, p, keys, args...) })
	}
	return v, n, err
}

// leaseOf reads bucket_lease's reply.
func leaseOf(v any) (bucketGrant, error) {
	r, ok := v.([]any)
	if !ok || len(r) != 8 {
		return bucketGrant{}, fmt.Errorf("redisstore: bucket_lease returned %v", v)
	}
	n := func(i int) int64 { x, _ := r[i].(int64); return x }
	return bucketGrant{
		granted:   n(0),
		remaining: n(1),
		wait:      time.Duration(n(2)) * time.Microsecond,
		full:      time.Duration(n(3)) * time.Microsecond,
		id:        n(4),
		k:         n(5),
		g:         n(6),
		forgot:    n(7) == 1,
	}, nil
}

// undoLate gives back what a lease call took when its reply came after
// the decision stopped waiting for it (runLate). Its caller went on as if
// the call had failed: the request in hand was decided without it (by
// the fallback, or by another call), and the fallback debt the call
// charged was kept to be charged again. So Redis counted for nobody the
// tokens the call granted and the debt it charged: both go back, the
// lease retired, as one give-back. Without this a slow link makes every
// abandoned call that ran cost the bucket twice: its grant, never
// spent, and its debt, charged again by the next call. (A charge is
// left as it is: it records units already served.) A give-back that
// fails too is lost: the replicas then admit less, never more.
func (s *Store) undoLate(partition string, a leaseAsk, v any) {
	ls, err := leaseOf(v)
	if err != nil {
		return
	}
	back := ls.granted + a.debt
	if back <= 0 {
		return
	}
	// Of the grant, Redis counts all but the tokens the request in hand
	// was to spend at once as out on the lease: those are retired; every
	// granted token goes back, as nothing was spent.
	h := held{id: ls.id, granted: max(ls.granted-a.spent, 0)}
	if _, err := s.giveBack(context.Background(), partition, back, h); err == nil {
		s.opts.Metrics.TokensReturned.WithLabelValues(string(ReturnLate)).Add(float64(back))
	}
}

// blockMicros is the scripts' block_for argument: l's penalty box in
// whole µs, "" for none.
func blockMicros(l quota.Limit) string {
	if l.BlockFor <= 0 {
		return ""
	}
	return strconv.FormatInt(int64(l.BlockFor/time.Microsecond), 10)
}

func chargeFlag(charge bool) string {
	if charge {
		return "1"
	}
	return ""
}

// returned is what a give-back found.
type returned int

const (
	returnedKnown   returned = iota // the lease (or plain tokens) went back
	returnedForgot                  // Redis had forgotten the lease: nothing went back, what was spent of it was charged
	returnedKeyGone                 // the lease's whole key was gone: nothing went back, nothing charged
)

// giveBack returns n unspent tokens to partition's bucket, retiring the
// lease named in h (h.id 0: plain tokens, such as a refund), unless Redis
// no longer holds the lease's grant (h.k, h.g): then it charges h.owed
// instead and gives nothing back.
func (s *Store) giveBack(ctx context.Context, partition string, n int64, h held) (returned, error) {
	v, err := s.run(ctx, "return", bucketReturn, s.retireKeys(partition, h), n, s.nowArg(time.Microsecond), h.id, h.granted, h.k, h.g, h.owed, h.owedSince, h.epoch)
	if err != nil {
		return returnedKnown, err
	}
	r, _ := v.([]any)
	if len(r) != 2 {
		return returnedKnown, fmt.Errorf("redisstore: bucket_return returned %v", v)
	}
	f, _ := r[1].(int64)
	return returned(f), nil
}

// windowLease is the outcome of one window script call in hybrid mode.
type windowLease struct {
	quota.Decision
	granted int64
	id      int64         // the window's start (µs), the lease's name
	left    time.Duration // until the window ends, the lease's life
}

// leaseWindow takes between a.need and a.want units of the current window
// of partition under l (a fixed or sliding window), at most half of what
// fits over a.peers replicas, after giving back the unspent units of the
// lease in a.retire. A window's lease dies with its window: a.life, a.debt
// and a.spent are not sent (the request in hand spends its units from the
// grant on the replica).
func (s *Store) leaseWindow(ctx context.Context, partition string, l quota.Limit, a leaseAsk, hold windowHold) (windowLease, error) {
	key := []string{s.algorithmKey(partition, l.Algorithm)}
	script, name := fixedWindowScript, "fixed_window"
	if l.Algorithm == quota.SlidingWindow {
		script, name = slidingWindowScript, "sliding_window"
	}
	late := func(v any, fate *lateFate) { s.undoWindowLate(partition, l, v, fate) }
	v, err := s.runLate(ctx, "lease", script, key, late, windowMicros(l), l.Limit, s.nowArg(time.Microsecond), a.want, a.need, a.peers, a.retire.id, a.retire.unspent, "", blockMicros(l), hold.units, hold.start)
	if err != nil {
		return windowLease{}, err
	}
	d, err := decisionOf(name, l, v)
	if err != nil {
		return windowLease{}, err
	}
	r := v.([]any)
	if len(r) != 8 {
		return windowLease{}, fmt.Errorf("redisstore: %s returned %v", name, v)
	}
	n := func(i int) int64 { x, _ := r[i].(int64); return x }
	return windowLease{Decision: d, granted: n(5), id: n(6), left: time.Duration(n(7)) * time.Microsecond}, nil
}

// heartbeat records replica id and returns the number of replicas heard
// within ttl, whether id's entry was missing from the set, and, but on a
// Cluster (where the epoch key lives in a slot of its own), the Redis
// state's Identity, proposing propose as its epoch (see identity).
func (s *Store) heartbeat(ctx context.Context, id string, ttl time.Duration, propose string) (n int64, missing bool, state Identity, err error) {
	keys := []string{s.peersKey()}
	if s.opts.Router == nil {
		keys = append(keys, EpochKey(s.opts.Prefix))
	}
	v, err := s.run(ctx, "peers", peersScript, keys, id, ttl.Milliseconds(), s.nowArg(time.Microsecond), propose)
	if err != nil {
		return 0, false, Identity{}, err
	}
	r, _ := v.([]any)
	if len(r) != 2 && len(r) != 4 {
		return 0, false, Identity{}, fmt.Errorf("redisstore: peers script returned %v", v)
	}
	n, _ = r[0].(int64)
	a, _ := r[1].(int64)
	if len(r) == 4 {
		state.Epoch, _ = r[2].(string)
		state.RunID, _ = r[3].(string)
	}
	return n, a == 1, state, nil
}

// leave removes replica id from the heartbeat set at shutdown, so peers
// stop counting it at once rather than after the ttl.
func (s *Store) leave(ctx context.Context, id string) error {
	if s.breaker.NodeFor(ctx, s.peersKey()).Down() {
		return ErrStoreDown
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout*5)
	defer cancel()
	return s.rdb.ZRem(ctx, s.peersKey(), id).Err()
}

func (s *Store) peersKey() string { return PeersKey(s.opts.Prefix) }

// Identity is what tells one Redis state from another: the epoch key's
// value and the server's run_id (scripts/epoch.lua). Two reads that
// differ in either are two states, the later of which may lack what the
// replicas wrote to the earlier.
type Identity struct{ Epoch, RunID string }

// identity reads the Redis state's Identity, setting the epoch key to
// propose when it is missing. It bypasses the breaker: it runs while a
// master comes back (Warm), before the breaker lets decisions through,
// and a failure to read it says nothing the heartbeat does not.
func (s *Store) identity(ctx context.Context, propose string) (Identity, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	v, err := epochScript.Run(ctx, s.rdb, []string{EpochKey(s.opts.Prefix)}, propose).Result()
	result := "ok"
	if err != nil {
		result = resultOf(err)
	}
	s.opts.Metrics.Calls.WithLabelValues("epoch", result).Inc()
	if err != nil {
		return Identity{}, err
	}
	r, _ := v.([]any)
	if len(r) != 2 {
		return Identity{}, fmt.Errorf("redisstore: epoch script returned %v", v)
	}
	e, _ := r[0].(string)
	id, _ := r[1].(string)
	return Identity{Epoch: e, RunID: id}, nil
}

// EpochKey is the key whose value names the Redis state under key prefix:
// "rl:_epoch", outside the policies' key space as PeersKey is.
func EpochKey(prefix string) string { return prefix + "_epoch" }

// PeersKey is the replicas' heartbeat set under key prefix: "rl:_peers".
// It is outside the policies' key space: a policy key always has '{' right
// after the prefix (Store.key). ("rl:{peers}" would be the key of a
// policy named peers with no key parts: that policy's script would meet a
// sorted set and fail with WRONGTYPE, as would the heartbeat.)
func PeersKey(prefix string) string { return prefix + "_peers" }

// intervalMicros formats l's refill interval in microseconds, keeping the
// fraction (100 per second is 10000, 3 per second 333333.333).
func intervalMicros(l quota.Limit) string {
	return strconv.FormatFloat(float64(l.Window)/float64(l.Limit)/1e3, 'f', 3, 64)
}
