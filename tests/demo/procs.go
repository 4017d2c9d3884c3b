package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The processes of the demo: one redis-server and the extauthz replicas,
// on loopback ports the kernel picks, stopped when the demo ends (and
// killed by the kernel if the demo itself dies: Pdeathsig).

// proc is one child process and what it printed.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 1<<20 {
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func start(name string, env []string, bin string, args ...string) (*proc, io.Reader, error) {
	p := &proc{name: name, out: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	p.cmd.Stdout = p.out
	p.cmd.Stderr = io.MultiWriter(p.out, pw)
	if err := p.cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		p.cmd.Wait()
		pw.Close()
		close(p.done)
	}()
	return p, pr, nil
}

// stop sends SIGTERM and waits up to 10s, then kills.
func (p *proc) stop() {
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// startRedis runs redis-server on a free loopback port with no persistence.
func startRedis(dir string) (*proc, string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", fmt.Errorf("redis-server is not on PATH: `make redis-server` installs it (Debian), or apt-get install -y redis-server")
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	p, out, err := start("redis-server", nil, bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning")
	if err != nil {
		return nil, "", err
	}
	go io.Copy(io.Discard, out)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return nil, "", fmt.Errorf("redis-server exited: %s", p.out)
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return p, addr, nil
		}
		time.Sleep(20 * time.Millisecond) // polling a child process for readiness
	}
	p.stop()
	return nil, "", fmt.Errorf("redis-server did not listen on %s within 10s", addr)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// replica is one running extauthz.
type replica struct {
	*proc
	grpc, admin string
}

// startReplica runs `extauthz serve` on config and waits for its
// "serving" log line, which names the ports it got.
func startReplica(bin, dir string, i int, config string) (*replica, error) {
	path := filepath.Join(dir, fmt.Sprintf("replica-%d.yaml", i))
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		return nil, err
	}
	p, out, err := start(fmt.Sprintf("replica %d", i), []string{fmt.Sprintf("EXTAUTHZ_REPLICA_ID=demo-%d", i)},
		bin, "serve", "-config", path, "-log-format", "json")
	if err != nil {
		return nil, err
	}
	ready := make(chan *replica, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == "serving" {
				g, _ := rec["grpc"].(string)
				a, _ := rec["admin"].(string)
				ready <- &replica{proc: p, grpc: g, admin: a}
				break
			}
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case r := <-ready:
		return r, nil
	case <-p.done:
		return nil, fmt.Errorf("replica %d exited before serving:\n%s", i, p.out)
	case <-time.After(30 * time.Second):
		p.stop()
		return nil, fmt.Errorf("replica %d did not serve within 30s:\n%s", i, p.out)
	}
}

// peers reads the replica's extauthz_peers gauge from its admin endpoint.
func (r *replica) peers(ctx context.Context) float64 {
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+r.admin+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "extauthz_peers "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return n
		}
	}
	return 0
}
