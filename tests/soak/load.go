package main

import (
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/tests/internal/loadgen"
)

// load sends Check calls at a fixed rate, open loop: a scheduler emits
// the calls due every few milliseconds into a queue of Workers slots and
// skips (and counts) a call when every slot is taken, so a slow server
// never makes the load pile up and the rate never adapts to the machine.
// Two classes share the rate: the hot keys (the oracle's) and the churn,
// keys that arrive continuously, each used for KeyLife and then never
// again.
type load struct {
	replicas   []*replica
	hotKeys    int
	hotRate    float64 // calls per second, all hot keys together
	churnRate  float64 // calls per second
	keysPerSec float64 // new churn keys per second
	keyLife    time.Duration
	workers    int
	timeout    time.Duration // per call, as Envoy's ext_authz timeout

	start time.Time
	hot   []hotCount

	churnSent, churnAdmitted  atomic.Int64
	errors, unexpected        atomic.Int64
	skipped, noReplica        atomic.Int64
	slow                      atomic.Int64 // answered after envoyTimeout
	firstError                atomic.Pointer[string]
	hotFirstSend, hotLastDone atomic.Int64 // unix nanoseconds
	rr                        atomic.Uint64
	lat                       latencies
}

// hotCount is one hot key's calls and admissions over the run.
// envoyTimeout is Envoy's default ext_authz timeout: calls answered later
// are counted, as Envoy would have given up on them.
const envoyTimeout = 200 * time.Millisecond

type hotCount struct {
	sent, admitted, denied atomic.Int64
}

type job struct {
	hot int // the hot key's index, or -1 for a churn call
}

// run sends until ctx ends or until the deadline, then waits for the
// calls in flight.
func (l *load) run(ctx context.Context, deadline time.Time) {
	l.start = time.Now()
	l.hot = make([]hotCount, l.hotKeys)
	jobs := make(chan job, l.workers)
	var wg sync.WaitGroup
	for w := 0; w < l.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for j := range jobs {
				l.call(ctx, j, rng)
			}
		}()
	}
	var sched sync.WaitGroup
	sched.Add(2)
	go func() {
		defer sched.Done()
		var n int
		l.schedule(ctx, deadline, l.hotRate, jobs, func() job { n++; return job{hot: n % l.hotKeys} })
	}()
	go func() {
		defer sched.Done()
		l.schedule(ctx, deadline, l.churnRate, jobs, func() job { return job{hot: -1} })
	}()
	sched.Wait()
	close(jobs)
	wg.Wait()
}

// schedule emits rate calls a second until the deadline: every 5 ms the
// calls due since the start, each to a free slot or skipped.
func (l *load) schedule(ctx context.Context, deadline time.Time, rate float64, jobs chan<- job, next func() job) {
	if rate <= 0 {
		return
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var emitted int64
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if !now.Before(deadline) {
				return
			}
			due := int64(now.Sub(l.start).Seconds() * rate)
			for ; emitted < due; emitted++ {
				select {
				case jobs <- next():
				default:
					l.skipped.Add(1)
				}
			}
		}
	}
}

// churnKey picks a live churn key: key n is born at n/keysPerSec seconds
// into the run and used for keyLife, uniformly among the live ones.
func (l *load) churnKey(rng *rand.Rand) string {
	newest := int64(time.Since(l.start).Seconds() * l.keysPerSec)
	live := min(int64(l.keyLife.Seconds()*l.keysPerSec), newest+1)
	return "c" + strconv.FormatInt(newest-rng.Int64N(max(live, 1)), 10)
}

// call sends one Check to the next replica open to the load.
func (l *load) call(ctx context.Context, j job, rng *rand.Rand) {
	r := l.pick()
	if r == nil {
		l.noReplica.Add(1)
		return
	}
	defer r.inFlight.Add(-1)
	path, key := "/churn/x", ""
	if j.hot >= 0 {
		path, key = "/hot/x", "h"+strconv.Itoa(j.hot)
		l.hot[j.hot].sent.Add(1)
		l.hotFirstSend.CompareAndSwap(0, time.Now().UnixNano())
	} else {
		key = l.churnKey(rng)
		l.churnSent.Add(1)
	}
	req := check.NewRequest(check.RequestSpec{Method: "GET", Path: path, Headers: map[string]string{"x-soak-key": key}})
	cctx, cancel := context.WithTimeout(ctx, l.timeout)
	t0 := time.Now()
	resp, err := authv3.NewAuthorizationClient(r.connection()).Check(cctx, req)
	cancel()
	took := time.Since(t0)
	if j.hot >= 0 {
		for done := time.Now().UnixNano(); ; {
			last := l.hotLastDone.Load()
			if done <= last || l.hotLastDone.CompareAndSwap(last, done) {
				break
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return // the run was interrupted
		}
		l.errors.Add(1)
		msg := "replica " + strconv.Itoa(r.index) + ": " + err.Error()
		l.firstError.CompareAndSwap(nil, &msg)
		return
	}
	l.lat.add(took)
	if took > envoyTimeout {
		l.slow.Add(1)
	}
	switch loadgen.HTTPStatus(resp) {
	case 200:
		if j.hot >= 0 {
			l.hot[j.hot].admitted.Add(1)
		} else {
			l.churnAdmitted.Add(1)
		}
	case 429:
		if j.hot >= 0 {
			l.hot[j.hot].denied.Add(1)
		}
	default:
		l.unexpected.Add(1)
	}
}

// pick returns the next replica open to the load, round robin, with its
// in-flight count raised (counted before the check, so that a replica's
// drain, which closes it and then waits for the count to reach zero,
// never stops a process a call is about to reach).
func (l *load) pick() *replica {
	for range l.replicas {
		r := l.replicas[l.rr.Add(1)%uint64(len(l.replicas))]
		r.inFlight.Add(1)
		if r.serving.Load() {
			return r
		}
		r.inFlight.Add(-1)
	}
	return nil
}

// latencies is a histogram of answered calls' latencies in buckets 10%
// apart, from 1 µs to about 20 minutes.
type latencies struct{ counts [220]atomic.Int64 }

const latStep = 1.1

func (h *latencies) add(d time.Duration) {
	us := max(float64(d.Microseconds()), 1)
	h.counts[min(int(math.Log(us)/math.Log(latStep)), len(h.counts)-1)].Add(1)
}

// quantile is the upper bound of the bucket holding quantile q.
func (h *latencies) quantile(q float64) time.Duration {
	var total int64
	for i := range h.counts {
		total += h.counts[i].Load()
	}
	var seen int64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if total > 0 && float64(seen) >= q*float64(total) {
			return time.Duration(math.Pow(latStep, float64(i+1)) * float64(time.Microsecond))
		}
	}
	return 0
}

// hotSpan is how long the hot keys were under load: from the first call
// sent to the last answer.
func (l *load) hotSpan() time.Duration {
	first, last := l.hotFirstSend.Load(), l.hotLastDone.Load()
	if first == 0 || last < first {
		return 0
	}
	return time.Duration(last - first)
}
