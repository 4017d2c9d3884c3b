package tests

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/extauthz/extauthz/tests/internal/testcerts"
)

// currentLimit is the requests per unit of the limit a descriptor has in
// the running configuration (0: none), asked with hits_addend 0, which
// spends nothing.
func currentLimit(p *ratelimitProc, domain string, d *ratelimitv3.RateLimitDescriptor) uint32 {
	q := proto.Clone(d).(*ratelimitv3.RateLimitDescriptor)
	q.HitsAddend = wrapperspb.UInt64(0)
	resp := p.shouldRateLimit(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{q}})
	return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
}

// Updates pushed over xDS while load runs (four workers, three
// descriptors a round: a steady rule, a rule whose limit changes, a rule
// added then removed): each update is applied within a second of its
// push; no call errs; the steady rule (40 an hour, asked more than twice
// that) admits exactly 40 across the updates, so no swap lost or reset
// its count; the changed rule (1000 an hour, then 5) keeps its count
// across the change: every answer decided under the limit of 5 is over
// it, the count being past 5 already.
func TestRatelimitXDSUpdatesUnderLoad(t *testing.T) {
	serial(t, "each update pushed under load must be applied within a second of wall time")
	certs := testcerts.Write(t, "xds")
	x := newXDSServer(t, certs, "127.0.0.1:0")
	const dom = "default/eg/http"
	// The steady rule's limit: a third of the calls ask it, so a run of a
	// few hundred calls asks it past its limit.
	const steadyLimit = 40
	config := func(changing uint32, added bool) *rlsconfv3.RateLimitConfig {
		extra := []*rlsconfv3.RateLimitDescriptor{
			routeChain("steady", 0, hourLimit(steadyLimit), false),
			routeChain("changing", 0, hourLimit(changing), false),
		}
		if added {
			extra = append(extra, routeChain("added", 0, hourLimit(1), false))
		}
		return listenerDomain(extra...)
	}
	x.push("1", config(1000, false))
	p := startRatelimit(t, ratelimitBinary(t), nil, xdsEnv(certs, x.addr)...)
	client := rlsv3.NewRateLimitServiceClient(p.conn)

	// The load: at most 3,000 calls (1,000 rounds) and 30 s, whichever
	// comes first; it runs until the updates are done.
	const maxRounds = 1000
	var (
		rounds, errs, steadyOK, changingOKUnder5, calls atomic.Int64
		firstErr                                        atomic.Value
		done                                            = make(chan struct{})
		wg                                              sync.WaitGroup
	)
	deadline := time.Now().Add(30 * time.Second)
	ask := func(route string) *rlsv3.RateLimitResponse {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: dom, Descriptors: []*ratelimitv3.RateLimitDescriptor{chainRequest(route)}})
		calls.Add(1)
		if err != nil {
			errs.Add(1)
			firstErr.CompareAndSwap(nil, err.Error())
		}
		return resp
	}
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rounds.Add(1) <= maxRounds && time.Now().Before(deadline) {
				select {
				case <-done:
					return
				default:
				}
				if ask("steady").GetOverallCode() == rlsv3.RateLimitResponse_OK {
					steadyOK.Add(1)
				}
				resp := ask("changing")
				if st := resp.GetStatuses(); len(st) == 1 && st[0].GetCurrentLimit().GetRequestsPerUnit() == 5 && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					changingOKUnder5.Add(1)
				}
				ask("added")
			}
		}()
	}
	// Let the load get going before the first update.
	if !within(10*time.Second, func() bool { return calls.Load() >= 150 }) {
		t.Fatal("fewer than 150 calls in 10s")
	}
	applied := func(version string, cond func() bool) {
		t.Helper()
		start := time.Now()
		if !within(time.Second, cond) {
			t.Errorf("version %s not applied within 1s of its push, under load", version)
			return
		}
		t.Logf("version %s applied %v after its push, %d calls so far", version, time.Since(start).Round(time.Millisecond), calls.Load())
	}
	x.push("2", config(1000, true))
	applied("2 (a rule added)", func() bool { return currentLimit(p, dom, chainRequest("added")) == 1 })
	x.push("3", config(5, true))
	applied("3 (a limit changed, 1000 to 5 an hour)", func() bool { return currentLimit(p, dom, chainRequest("changing")) == 5 })
	x.push("4", config(5, false))
	applied("4 (a rule removed)", func() bool { return currentLimit(p, dom, chainRequest("added")) == 0 })
	// Some load after the last update too, and the steady rule asked
	// past twice its limit.
	after := calls.Load()
	if !within(20*time.Second, func() bool { n := calls.Load(); return n >= after+150 && n >= 3*2*steadyLimit }) {
		t.Fatal("fewer than 150 calls in 20s after the last update")
	}
	close(done)
	wg.Wait()

	steadyAsked := calls.Load() / 3
	t.Logf("%d calls, %d errors; steady rule admitted %d of about %d", calls.Load(), errs.Load(), steadyOK.Load(), steadyAsked)
	if n := errs.Load(); n != 0 {
		t.Errorf("%d calls erred during the updates; the first: %v", n, firstErr.Load())
	}
	if steadyAsked <= steadyLimit {
		t.Fatalf("the steady rule was asked %d times, not more than its %d: the test proves nothing", steadyAsked, steadyLimit)
	}
	if got := steadyOK.Load(); got != steadyLimit {
		t.Errorf("the steady rule of %d an hour admitted %d across three updates, want exactly %d", steadyLimit, got, steadyLimit)
	}
	if got := changingOKUnder5.Load(); got != 0 {
		t.Errorf("%d answers under the changed limit of 5 were OK; the count (past 5 under the limit of 1000) was lost at the change", got)
	}
}
