package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/extauthz/extauthz/internal/config"
)

// listen.max_connections end to end: each door's listener (gRPC, HTTP)
// holds at most that many connections open; one past it is reset as soon
// as it is accepted, counted in extauthz_connections_refused_total and
// logged at most once a second; once a connection closes, the listener
// takes a new one.

// refusedLine is the log message of a listener's refusals.
const refusedLine = "connlimit: refused connections: the listener holds listen.max_connections open"

func TestListenerConnectionCap(t *testing.T) {
	parallel(t)
	// The knob under test: a cap of 4, reached with a handful of
	// connections (TestListenerConnectionCapDefault is its twin at the
	// shipped 4,096).
	const max, extra = 4, 30
	s := startSidecar(t, fmt.Sprintf("listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0, http: 127.0.0.1:0, max_connections: %d}\n", max)+
		ordersFor("limit: 100000, window: 1m"))
	// The harness's own gRPC client holds one of the gRPC listener's.
	if r := s.check(envoyRequest{headers: [][2]string{{"x-api-key", "key-ada"}}}.build()); httpStatus(r) != 200 {
		t.Fatalf("a Check: %d", httpStatus(r))
	}
	for _, l := range []struct {
		name, addr string
		held       int // the harness's connections
		served     func(t *testing.T) error
	}{
		{"grpc", s.GRPC, 1, func(t *testing.T) error { return checkOnNewConnection(s.GRPC) }},
		{"http", s.HTTP, 0, func(t *testing.T) error { return httpOnNewConnection(s.HTTP) }},
	} {
		t.Run(l.name, func(t *testing.T) {
			var held []net.Conn
			for len(held)+l.held < max {
				held = append(held, dialTCP(t, l.addr))
			}
			waitMetric(t, s, 10*time.Second, max, "extauthz_connections_open", "listener", l.name)
			logsBefore := countLogged(s, refusedLine, l.name)
			start := time.Now()
			for i := 0; i < extra; i++ {
				if err := refused(l.addr); err != nil {
					t.Fatalf("connection %d past the cap of %d: %v", i+1, max, err)
				}
			}
			elapsed := time.Since(start)
			if got := s.metric("extauthz_connections_refused_total", "listener", l.name); got != extra {
				t.Fatalf("extauthz_connections_refused_total{listener=%q} = %v, want %d", l.name, got, extra)
			}
			if got := s.metric("extauthz_connections_open", "listener", l.name); got != max {
				t.Fatalf("extauthz_connections_open{listener=%q} = %v after the refusals, want %d", l.name, got, max)
			}
			// At most one line a second (the first refusal logs at once).
			lines := countLogged(s, refusedLine, l.name) - logsBefore
			if most := 1 + int(elapsed/time.Second); lines < 1 || lines > most {
				t.Fatalf("%d refusal lines for %d refusals in %v; want 1 to %d", lines, extra, elapsed, most)
			}
			// A place freed is taken again.
			held[len(held)-1].Close()
			waitMetric(t, s, 10*time.Second, max-1, "extauthz_connections_open", "listener", l.name)
			if err := l.served(t); err != nil {
				t.Fatalf("a new connection after one closed: %v", err)
			}
			for _, c := range held[:len(held)-1] {
				c.Close()
			}
		})
	}
	// The harness's connection was never refused.
	if r := s.check(envoyRequest{headers: [][2]string{{"x-api-key", "key-ada"}}}.build()); httpStatus(r) != 200 {
		t.Fatalf("a Check on the first connection: %d", httpStatus(r))
	}
}

// At the shipped defaults the gRPC listener holds config.DefaultMaxConnections
// open and refuses the next.
func TestListenerConnectionCapDefault(t *testing.T) {
	parallel(t)
	s := startVolumeSidecar(t, ordersFor("limit: 100, window: 1m"))
	heap0, rss0 := s.liveMemory()
	before := s.metric("extauthz_connections_open", "listener", "grpc") // the harness's client, if it connected
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for len(held)+int(before) < config.DefaultMaxConnections {
		held = append(held, dialTCP(t, s.GRPC))
	}
	waitMetric(t, s, 30*time.Second, config.DefaultMaxConnections, "extauthz_connections_open", "listener", "grpc")
	heap1, rss1 := s.liveMemory()
	t.Logf("%d connections held before a preface: heap %s → %s, RSS %s → %s (%.1f KiB of RSS each)",
		len(held), mib(heap0), mib(heap1), mib(rss0), mib(rss1), (rss1-rss0)/1024/float64(len(held)))
	if err := refused(s.GRPC); err != nil {
		t.Fatalf("connection %d: %v", config.DefaultMaxConnections+1, err)
	}
	if got := s.metric("extauthz_connections_refused_total", "listener", "grpc"); got != 1 {
		t.Fatalf("extauthz_connections_refused_total{listener=grpc} = %v, want 1", got)
	}
}

// dialTCP opens a TCP connection to addr, closed when the test ends.
func dialTCP(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// refused reports nil when a connection to addr is closed by the server
// before it sends anything, within 10 s: a reset so prompt that it ends
// the dial, or EOF or a reset on the first read.
func refused(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	if err != nil {
		return err
	}
	defer c.Close()
	return closedByServer(c)
}

// closedByServer reports nil when the server closes c (EOF or a reset)
// before it sends anything, within 10 s.
func closedByServer(c net.Conn) error {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [1]byte
	n, err := c.Read(b[:])
	switch {
	case n > 0:
		return fmt.Errorf("the server sent %q, want the connection closed", b[:n])
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errors.New("still open after 10 s, want it closed at accept")
	case err == nil:
		return errors.New("read nothing and no error")
	}
	return nil
}

// checkOnNewConnection makes a Check on a connection of its own.
func checkOnNewConnection(addr string) error {
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := authv3.NewAuthorizationClient(conn).Check(ctx, envoyRequest{headers: [][2]string{{"x-api-key", "key-ada"}}}.build())
	if err != nil {
		return err
	}
	if got := httpStatus(resp); got != 200 {
		return fmt.Errorf("status %d", got)
	}
	return nil
}

// httpOnNewConnection asks the HTTP door once, on a connection of its own.
func httpOnNewConnection(addr string) error {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	req, err := http.NewRequest("GET", "http://"+addr+"/envoy/", nil)
	if err != nil {
		return err
	}
	req.Header.Set("x-api-key", "key-ada")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// countLogged counts the JSON log records with message msg whose
// listener attribute is listener.
func countLogged(s *sidecar, msg, listener string) int {
	n := 0
	for _, line := range strings.Split(s.logs.String(), "\n") {
		var rec struct {
			Msg      string `json:"msg"`
			Listener string `json:"listener"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == msg && rec.Listener == listener {
			n++
		}
	}
	return n
}
