package tests

import (
	"context"
	"net/http"
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
