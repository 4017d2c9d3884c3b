package quota

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/metrics"
)

// The scripts, embedded and run by SHA (EVALSHA, falling back to EVAL on
// NOSCRIPT after a Redis restart or failover empties the script cache).
var (
	//go:embed scripts/bucket_lease.lua
	bucketLeaseSrc string
	//go:embed scripts/bucket_return.lua
	bucketReturnSrc string
	//go:embed scripts/peers.lua
	peersSrc string

	bucketLease  = newScript(bucketLeaseSrc)
	bucketReturn = newScript(bucketReturnSrc)
	peersScript  = newScript(peersSrc)
)

// clockSrc defines now_us, the time every script decides at.
//
//go:embed scripts/clock.lua
var clockSrc string

// scripts lists every script, for Warm.
var scripts []*redis.Script

// newScript prepends the clock to src and registers the script for Warm.
func newScript(src string) *redis.Script {
	s := redis.NewScript(clockSrc + src)
	scripts = append(scripts, s)
	return s
}

// ErrStoreDown is returned without calling Redis while the store is marked
// down after consecutive failures.
var ErrStoreDown = errors.New("quota: redis is marked down")

// rediser is the part of a go-redis client the store uses, so a Client or
// a ClusterClient fits.
type rediser interface {
	redis.Scripter
	Exists(ctx context.Context, keys ...string) *redis.IntCmd
	ZRem(ctx context.Context, key string, members ...any) *redis.IntCmd
}

// StoreOptions configures a Store.
type StoreOptions struct {
	Prefix  string        // key prefix, such as "rl:"
	Timeout time.Duration // per call
	Metrics *metrics.Metrics
	Log     *slog.Logger
	// Clock, for tests only, makes scripts use this time instead of Redis
	// TIME. Production leaves it nil: every decision uses the Redis
	// server's clock, never a replica's. Redis still expires keys on its
	// own clock, so the algorithm scripts then keep keys a minute at least.
	Clock func() time.Time
	// TripAfter consecutive failures mark the store down (default 3).
	TripAfter int
	// ProbeEvery is how often a down store is probed (default 1s).
	ProbeEvery time.Duration
}

// Store runs the limiter scripts against Redis. Every call has a deadline;
// after TripAfter consecutive failures the store is marked down and calls
// fail at once with ErrStoreDown, so no decision waits on an unreachable
// Redis, while one probe per ProbeEvery tests whether it is back.
type Store struct {
	rdb  rediser
	opts StoreOptions

	failures atomic.Int32
	down     atomic.Bool
	onChange atomic.Pointer[func(up bool)]

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// NewStore returns a Store using rdb and starts its probe loop; Close stops it.
func NewStore(rdb rediser, opts StoreOptions) *Store {
	if opts.TripAfter <= 0 {
		opts.TripAfter = 3
	}
	if opts.ProbeEvery <= 0 {
		opts.ProbeEvery = time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	s := &Store{rdb: rdb, opts: opts, stop: make(chan struct{})}
	opts.Metrics.RedisUp.Set(1)
	s.wg.Add(1)
	go s.probeLoop()
	return s
}

// Warm loads every script into Redis (on every master of a Cluster), so
// the first decisions after start-up or a Redis restart do not pay for a
// NOSCRIPT round trip and a script upload inside their timeout.
func (s *Store) Warm(ctx context.Context) error {
	for _, sc := range scripts {
		if err := sc.Load(ctx, s.rdb).Err(); err != nil {
			return err
		}
	}
	return nil
}

// Close stops the probe loop. It does not close the client.
func (s *Store) Close() {
	s.stopOnce.Do(func() { close(s.stop) })
	s.wg.Wait()
}

// Up reports whether the store is answering.
func (s *Store) Up() bool { return !s.down.Load() }

// OnChange registers fn to be called when the store goes down or comes
// back up. fn must not block.
func (s *Store) OnChange(fn func(up bool)) { s.onChange.Store(&fn) }

// Key returns the Redis key of a partition: the prefix, then the partition
// in a hash tag, so every key a script touches for it lands in one Cluster
// slot: "rl:{orders:client:ada}".
func (s *Store) Key(partition string) string {
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

// run calls a script with the store's deadline, breaker and metrics.
func (s *Store) run(ctx context.Context, op string, script *redis.Script, keys []string, args ...any) (any, error) {
	if s.down.Load() {
		return nil, ErrStoreDown
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	start := time.Now()
	v, err := script.Run(ctx, s.rdb, keys, args...).Result()
	cancel()
	s.opts.Metrics.RedisDuration.WithLabelValues(op).Observe(time.Since(start).Seconds())
	s.observe(op, err)
	return v, err
}

// observe counts a call's result and moves the breaker.
func (s *Store) observe(op string, err error) {
	switch {
	case err == nil:
		s.opts.Metrics.RedisCalls.WithLabelValues(op, "ok").Inc()
		s.failures.Store(0)
		return
	case isTimeout(err):
		s.opts.Metrics.RedisCalls.WithLabelValues(op, "timeout").Inc()
	default:
		s.opts.Metrics.RedisCalls.WithLabelValues(op, "error").Inc()
	}
	if int(s.failures.Add(1)) >= s.opts.TripAfter && s.down.CompareAndSwap(false, true) {
		s.opts.Log.Warn("redis marked down; policies follow on_redis_error", "after_failures", s.opts.TripAfter, "error", err.Error())
		s.opts.Metrics.RedisUp.Set(0)
		s.notify(false)
	}
}

func (s *Store) notify(up bool) {
	if fn := s.onChange.Load(); fn != nil {
		(*fn)(up)
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// probeLoop tests a down store once per ProbeEvery and marks it up when it
// answers. The probe is a key command, not PING: a Redis Cluster that has
// lost a master still answers PING but refuses keys with CLUSTERDOWN.
func (s *Store) probeLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.ProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if !s.down.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(s.opts.Timeout, 100*time.Millisecond))
		err := s.rdb.Exists(ctx, s.peersKey()).Err()
		cancel()
		if err != nil {
			s.opts.Metrics.RedisCalls.WithLabelValues("probe", "error").Inc()
			continue
		}
		s.opts.Metrics.RedisCalls.WithLabelValues("probe", "ok").Inc()
		s.failures.Store(0)
		if s.down.CompareAndSwap(true, false) {
			wctx, cancel := context.WithTimeout(context.Background(), time.Second)
			s.Warm(wctx) // a restarted Redis has an empty script cache
			cancel()
			s.opts.Log.Info("redis is back; policies return to their mode")
			s.opts.Metrics.RedisUp.Set(1)
			s.notify(true)
		}
	}
}

// lease is the outcome of one bucket_lease call.
type lease struct {
	granted   int64
	remaining int64         // tokens left in the Redis bucket afterwards
	wait      time.Duration // until the next token, when none was granted
	full      time.Duration // until the bucket is full again
}

// lease takes up to want tokens of partition's bucket under l.
func (s *Store) lease(ctx context.Context, partition string, l Limit, want int64) (lease, error) {
	v, err := s.run(ctx, "lease", bucketLease, []string{s.Key(partition)},
		intervalMicros(l), l.Capacity(), want, s.nowArg(time.Microsecond))
	if err != nil {
		return lease{}, err
	}
	r, ok := v.([]any)
	if !ok || len(r) != 4 {
		return lease{}, fmt.Errorf("quota: bucket_lease returned %v", v)
	}
	n := func(i int) int64 { x, _ := r[i].(int64); return x }
	return lease{
		granted:   n(0),
		remaining: n(1),
		wait:      time.Duration(n(2)) * time.Microsecond,
		full:      time.Duration(n(3)) * time.Microsecond,
	}, nil
}

// giveBack returns n unspent tokens to partition's bucket.
func (s *Store) giveBack(ctx context.Context, partition string, n int64) error {
	_, err := s.run(ctx, "return", bucketReturn, []string{s.Key(partition)}, n, s.nowArg(time.Microsecond))
	return err
}

// heartbeat records replica id and returns the number of replicas heard
// within ttl, and whether id's entry was missing from the set.
func (s *Store) heartbeat(ctx context.Context, id string, ttl time.Duration) (n int64, missing bool, err error) {
	v, err := s.run(ctx, "peers", peersScript, []string{s.peersKey()}, id, ttl.Milliseconds(), s.nowArg(time.Microsecond))
	if err != nil {
		return 0, false, err
	}
	r, _ := v.([]any)
	if len(r) != 2 {
		return 0, false, fmt.Errorf("quota: peers script returned %v", v)
	}
	n, _ = r[0].(int64)
	a, _ := r[1].(int64)
	return n, a == 1, nil
}

// leave removes replica id from the heartbeat set at shutdown, so peers
// stop counting it at once rather than after the ttl.
func (s *Store) leave(ctx context.Context, id string) error {
	if s.down.Load() {
		return ErrStoreDown
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout*5)
	defer cancel()
	return s.rdb.ZRem(ctx, s.peersKey(), id).Err()
}

func (s *Store) peersKey() string { return s.opts.Prefix + "{peers}" }

// intervalMicros formats l's refill interval in microseconds, keeping the
// fraction (100 per second is 10000, 3 per second 333333.333).
func intervalMicros(l Limit) string {
	return strconv.FormatFloat(float64(l.Window)/float64(l.Limit)/1e3, 'f', 3, 64)
}
