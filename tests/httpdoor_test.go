package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SIGTERM with the HTTP door under load: /readyz fails while the drain
// delay passes and auth requests are still answered; requests in flight
// complete; the door stops with the gRPC server and the process exits 0.
func TestSIGTERMDrainsTheHTTPDoor(t *testing.T) {
	serial(t, "readiness must drop within 500ms of SIGTERM and requests be answered within the 700ms drain delay: wall-clock windows")
	// Not the defaults: a drain delay long enough to observe (the
	// default is none) and a grace shorter than the default 10s, so a
	// door that never stops fails the test quickly.
	s := startSidecar(t, listenHTTP+ordersFor("limit: 100000, window: 8000h"), "-drain-delay", "700ms", "-grace", "5s")

	type sample struct {
		start  time.Time
		status int
		err    error
	}
	var (
		mu      sync.Mutex
		samples []sample
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	c := httpClient(nil)
	url := "http://" + s.HTTP + "/nginx"
	for w := 0; w < 4; w++ {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				r, err := sendErr(context.Background(), c, "GET", url,
					"X-Original-Method", "POST", "X-Original-URI", "/orders/1", "X-Api-Key", "key-ada")
				mu.Lock()
				samples = append(samples, sample{start, r.status, err})
				mu.Unlock()
				if err != nil {
					time.Sleep(10 * time.Millisecond) // the door is closed: do not spin
				}
			}
		})
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(samples) }
	for deadline := time.Now().Add(30 * time.Second); count() < 300; {
		if time.Now().After(deadline) {
			t.Fatalf("only %d auth requests answered in 30s", count())
		}
		time.Sleep(10 * time.Millisecond) // waiting for traffic to build up
	}

	sent := time.Now()
	must(t, s.cmd.Process.Signal(syscall.SIGTERM))
	for deadline := time.Now().Add(500 * time.Millisecond); ; {
		resp, err := http.Get("http://" + s.Admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still ready 500ms after SIGTERM (%v)", err)
		}
		time.Sleep(10 * time.Millisecond) // polling the admin endpoint
	}
	var exitErr error
	select {
	case exitErr = <-s.done:
		s.done <- exitErr
	case <-time.After(15 * time.Second):
		t.Fatal("extauthz did not exit within 15s of SIGTERM")
	}
	close(stop)
	wg.Wait()
	if exitErr != nil {
		t.Fatalf("exit: %v", exitErr)
	}
	answered, refused, duringDrain := 0, 0, 0
	for i, smp := range samples {
		switch {
		case smp.err == nil && smp.status == 200:
			answered++
			if smp.start.After(sent.Add(100*time.Millisecond)) && smp.start.Before(sent.Add(600*time.Millisecond)) {
				duringDrain++
			}
		case smp.err != nil && smp.start.After(sent.Add(600*time.Millisecond)):
			refused++ // sent after the drain delay, to a closing door: the proxy fails it or retries
		default:
			t.Fatalf("request %d (sent %v after SIGTERM): status %d, error %v", i, smp.start.Sub(sent), smp.status, smp.err)
		}
	}
	t.Logf("%d answered (%d during the drain delay), %d refused after it", answered, duringDrain, refused)
	if duringDrain == 0 {
		t.Fatal("no auth request was answered during the drain delay")
	}
	if log := s.logs.String(); !strings.Contains(log, `"msg":"stopped"`) {
		t.Fatalf("no clean stop in the log:\n%s", tail(log, 10))
	}
}

// An auth request that announces a body and never sends it is answered at
// once and its connection closed: the door reads no body, and net/http
// would otherwise wait for the rest of it before writing the answer,
// pinning the connection (and a goroutine) for as long as the client
// likes. Two hundred such connections are each answered and closed.
func TestHTTPDoorAnswersWithoutWaitingForTheBody(t *testing.T) {
	parallel(t)
	s := startSidecar(t, listenHTTP+ordersFor("limit: 100000, window: 1h"))
	const conns = 200
	start := time.Now()
	for i := range conns {
		conn, err := net.Dial("tcp", s.HTTP)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		must(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
		_, err = io.WriteString(conn, "POST /envoy/orders HTTP/1.1\r\nHost: api.example.com\r\nX-Api-Key: key-ada\r\nContent-Length: 100000\r\n\r\n")
		must(t, err)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("connection %d: no answer without the body: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || !resp.Close {
			t.Fatalf("connection %d: %d, Connection %q; want 200 and close", i, resp.StatusCode, resp.Header.Get("Connection"))
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("connection %d: after the answer, %v; want the server to close it", i, err)
		}
	}
	t.Logf("%d requests announcing 100,000 bytes of body, none sent: answered and closed in %s", conns, time.Since(start).Round(time.Millisecond))
}

// The admin listener closes a keep-alive connection left idle, rather than
// holding its descriptor and goroutine for good.
func TestAdminClosesIdleConnections(t *testing.T) {
	parallel(t)
	s := startSidecar(t, ordersFor("limit: 100, window: 1m"))
	conn, err := net.Dial("tcp", s.Admin)
	must(t, err)
	defer conn.Close()
	const idle = 15 * time.Second // adminIdleTimeout in cmd/extauthz/serve.go
	must(t, conn.SetDeadline(time.Now().Add(idle+20*time.Second)))
	_, err = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n")
	must(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	must(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	answered := time.Now()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle admin connection: %v after %s; want it closed by the server", err, time.Since(answered).Round(time.Millisecond))
	}
	if waited := time.Since(answered); waited < idle-time.Second {
		t.Fatalf("idle admin connection closed after %s, before the idle timeout %s", waited, idle)
	}
}

// With its descriptors exhausted, the process's accept errors are logged as
// structured records like every other line, not as net/http's plain text.
func TestAcceptErrorsAreStructured(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	wrapper := filepath.Join(dir, "extauthz-nofile")
	must(t, os.WriteFile(wrapper, []byte("#!/bin/sh\nulimit -n 48 || exit 1\nexec "+fastBinary+" \"$@\"\n"), 0o755))
	s := startProcess(t, wrapper, writeConfig(t, ordersFor("limit: 100, window: 1m")), nil)
	// Connections held open until the process runs out of descriptors;
	// each is answered once, so the test knows it was accepted.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < 64 && !strings.Contains(s.logs.String(), "Accept error"); i++ {
		c, err := net.Dial("tcp", s.Admin)
		must(t, err)
		held = append(held, c)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(s.logs.String(), "Accept error"); {
		if time.Now().After(deadline) {
			t.Fatalf("no accept error logged with %d connections held under a 48-descriptor limit:\n%s", len(held), tail(s.logs.String(), 10))
		}
		time.Sleep(20 * time.Millisecond) // polling the log
	}
	for _, line := range strings.Split(strings.TrimSpace(s.logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("a log line that is not a JSON record: %q", line)
		}
	}
}
