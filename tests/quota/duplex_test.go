package quota_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// heldReplies forwards connections on a loopback port to a Redis server
// and, while held, keeps what the server sends from reaching the client:
// a link whose replies are slow, with the test deciding when they arrive.
// Commands reach the server at once.
type heldReplies struct {
	ln   net.Listener
	mu   sync.Mutex
	open chan struct{} // closed while replies flow
	wg   sync.WaitGroup
}

func startHeldReplies(t *testing.T, to string) *heldReplies {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &heldReplies{ln: ln, open: make(chan struct{})}
	close(p.open)
	p.wg.Add(1)
	go p.accept(to)
	t.Cleanup(func() { p.release(); ln.Close(); p.wg.Wait() })
	return p
}

func (p *heldReplies) addr() string { return p.ln.Addr().String() }

// hold keeps replies from the client until release.
func (p *heldReplies) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default:
	}
}

func (p *heldReplies) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

func (p *heldReplies) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

func (p *heldReplies) accept(to string) {
	serveConns(p.ln, &p.wg, func(c net.Conn) {
		up, err := net.Dial("tcp", to)
		if err != nil {
			return
		}
		defer up.Close()
		go func() { io.Copy(up, c); up.Close() }()
		buf := make([]byte, 32<<10)
		for {
			n, err := up.Read(buf)
			if n > 0 {
				<-p.gate() // while held, the server's bytes wait here
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
}

// Behind a slow link, a decision's call goes out while another call's
// reply is still on its way: the decision connection is full duplex. On
// the half-duplex autopipeliner (one batch per round trip, the client
// before 2026-12-05) a call made while a batch was in flight waited for
// that batch's reply before it was even sent, so under 80 ms ± 40 of
// reply latency calls took two round trips, a fifth of them ran into the
// 150 ms call timeout, and each such call cost an admission (both modes
// admitted 0.89 of one exact window; docs/reliability.md).
//
// Here the link holds A's reply; B, made after Redis ran A, must reach
// Redis while A's reply is still held.
func TestACallIsSentWhileAnotherReplyIsOnItsWay(t *testing.T) {
	srv := testredis.Start(t)
	link := startHeldReplies(t, srv.Addr)
	// The call timeout is raised from 150ms to 5s: the link holds A's
	// reply for as long as this test takes to see B arrive at Redis, on
	// a machine as loaded as it may be; what is checked is when B is
	// sent, not how long anyone waits. The fault suites
	// (tests/faults_test.go) run the same link at the defaults.
	clients, err := redisstore.NewClients(redisstore.ClientOptions{Addrs: []string{link.addr()}, Name: "test", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { clients.Close() })
	opts := clients.StoreOptions(redisstore.StoreOptions{Prefix: "rl:", Log: quiet, Timeout: 5 * time.Second})
	// The breaker's probe reaches Redis directly, so that held replies
	// never mark it down: the test judges when calls are sent.
	probe := srv.Client()
	t.Cleanup(func() { probe.Close() })
	opts.Probe = probe
	store := redisstore.NewStore(clients.Pipe, opts)
	t.Cleanup(store.Close)
	ctx := context.Background()
	if err := store.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	lim := newRedis(t, store)
	l := quota.Limit{Algorithm: quota.TokenBucket, Limit: 10, Window: time.Minute}
	if _, err := lim.Take(ctx, "warm", l, 1, time.Now()); err != nil {
		t.Fatal(err) // the decision connection dialled, its handshake answered
	}

	admin := srv.Client()
	defer admin.Close()
	// reached polls Redis for key's bucket (3s at most): the call for
	// key ran there.
	reached := func(key string) bool {
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
			if n, err := admin.Exists(ctx, "rl:{"+key+"}").Result(); err == nil && n == 1 {
				return true
			}
			time.Sleep(time.Millisecond) // polling Redis for the call's key
		}
		return false
	}

	link.hold()
	defer link.release()
	done := make(chan error, 2)
	go func() { _, err := lim.Take(ctx, "a", l, 1, time.Now()); done <- err }()
	if !reached("a") {
		t.Fatal("A, made with the link holding replies, never reached Redis")
	}
	go func() { _, err := lim.Take(ctx, "b", l, 1, time.Now()); done <- err }()
	if !reached("b") {
		t.Fatal("B was made after Redis ran A, and had not reached Redis 3s later, A's reply still held: B waited for A's round trip before it was sent")
	}
	select {
	case err := <-done:
		t.Fatalf("a decision returned while its reply was held: %v", err)
	default:
	}
	link.release()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("once the replies came: %v", err)
		}
	}
}
