package quota_test

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/breaker"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// resetProxy forwards connections on a loopback port to a Redis server,
// but resets (RST: SO_LINGER 0, then close) each connection reset(n)
// picks, n counting from 1 in the order they were accepted, as soon as
// its client sends: what a proxy or link that breaks some of the
// connections it carries does (toxiproxy's reset_peer in the fault
// matrix, docs/reliability.md), with the choice made deterministic.
type resetProxy struct {
	ln    net.Listener
	n     atomic.Int64
	reset func(n int64) bool
	wg    sync.WaitGroup
}

func startResetProxy(t *testing.T, to string, reset func(n int64) bool) *resetProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &resetProxy{ln: ln, reset: reset}
	p.wg.Add(1)
	go p.accept(to)
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *resetProxy) addr() string { return p.ln.Addr().String() }

func (p *resetProxy) accept(to string) {
	serveConns(p.ln, &p.wg, func(c net.Conn) {
		if p.reset(p.n.Add(1)) {
			c.Read(make([]byte, 1)) // the client's first bytes
			c.(*net.TCPConn).SetLinger(0)
			return
		}
		up, err := net.Dial("tcp", to)
		if err != nil {
			return
		}
		defer up.Close()
		go func() { io.Copy(up, c); up.Close() }()
		io.Copy(c, up)
	})
}

// serveConns accepts connections on ln until it closes, serving each on
// a goroutine of its own and closing it after; wg counts the loop (the
// caller added it) and each connection.
func serveConns(ln net.Listener, wg *sync.WaitGroup, serve func(net.Conn)) {
	defer wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			serve(c)
		}()
	}
}

// A connection that breaks (reset by the peer) says that connection is
// gone, not that Redis is: the breaker's confirmation asks again on a
// fresh one. Here the probe's first connection is reset and its second
// goes through, and the breaker stays closed (before, one reset probe
// opened it, and a replica fell back on its share while the others
// counted in Redis: docs/reliability.md, "reset_peer"). A server whose
// every connection is reset is marked down once the confirmation has
// run ProbeTimeout, as a frozen one is.
func TestBreakerConfirmsOnAFreshConnectionAfterAReset(t *testing.T) {
	t.Parallel() // its own Redis and proxies; its one bound is the breaker's own timing, far from the machine's
	for _, c := range []struct {
		name  string
		probe func(n int64) bool // which of the probe's connections are reset
		down  bool
	}{
		{"every other probe connection reset, the first among them", func(n int64) bool { return n%2 == 1 }, false},
		{"every probe connection reset", func(int64) bool { return true }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := testredis.Start(t)
			// The decisions' first connection is reset: the call fails
			// and the store suspects Redis.
			calls := startResetProxy(t, srv.Addr, func(n int64) bool { return n == 1 })
			probes := startResetProxy(t, srv.Addr, c.probe)
			via := func(p *resetProxy) func(*redis.Options) {
				return func(o *redis.Options) { sidecarClient(o); o.Addr = p.addr() }
			}
			m := redisstore.NewMetrics(nil)
			store := redisstore.NewStore(srv.Client(via(calls)), redisstore.StoreOptions{Prefix: "rl:", Probe: srv.Client(via(probes)), Metrics: m, Log: quiet})
			t.Cleanup(store.Close)
			lim := newRedis(t, store)
			ctx := context.Background()
			began := time.Now() // before the suspicion the failed call raises
			_, err := lim.Take(ctx, "k", tenPerSecond, 1, time.Now())
			if !breaker.Broken(err) {
				t.Fatalf("the first call on a reset connection: %v, want a broken connection's error", err)
			}
			vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			down := store.AwaitVerdict(vctx, "k")
			took := time.Since(began)
			broken := testutil.ToFloat64(m.Calls.WithLabelValues("confirm", "broken"))
			t.Logf("verdict down=%v after %v; %v probes broke, %d probe connections", down, took.Round(time.Millisecond), broken, probes.n.Load())
			if down != c.down {
				t.Fatalf("marked down %v, want %v", down, c.down)
			}
			if !c.down {
				if _, err := lim.Take(ctx, "k", tenPerSecond, 1, time.Now()); err != nil {
					t.Fatalf("the next call, on a fresh connection: %v", err)
				}
				return
			}
			// Every connection breaks: down once ProbeTimeout has
			// passed (and within openWithin, the outage guarantee).
			if took < breaker.DefaultProbeTimeout || took > openWithin {
				t.Fatalf("marked down %v after the suspicion; want after the probe timeout (%v) and within %v", took, breaker.DefaultProbeTimeout, openWithin)
			}
		})
	}
}
