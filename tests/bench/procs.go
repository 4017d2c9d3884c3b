package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// proc is a child process started by the benchmark.
type proc struct {
	name string
	cmd  *exec.Cmd
	addr string // gRPC (or Redis) address
	adm  string // admin address, for sidecars
}

func (p *proc) stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startRedis runs redis-server on a free loopback port, without persistence.
func startRedis(dir string) (*proc, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (make test installs it; or apt-get install -y redis-server)")
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p := &proc{name: "redis", addr: "127.0.0.1:" + strconv.Itoa(port)}
	p.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--loglevel", "warning")
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if c, err := net.DialTimeout("tcp", p.addr, 100*time.Millisecond); err == nil {
			c.Close()
			return p, nil
		}
		time.Sleep(20 * time.Millisecond) // polling a child for readiness
	}
	p.cmd.Process.Kill()
	return nil, fmt.Errorf("redis-server did not listen on %s", p.addr)
}

// startServer runs bin with args and waits for its JSON "serving" log line,
// which carries the gRPC and admin addresses.
func startServer(name, bin string, args ...string) (*proc, error) {
	p := &proc{name: name}
	p.cmd = exec.Command(bin, args...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			var rec map[string]any
			if !sent && json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == "serving" {
				ready <- rec
				sent = true
			}
		}
		io.Copy(io.Discard, stderr)
		close(ready)
	}()
	select {
	case rec, ok := <-ready:
		if !ok {
			return nil, fmt.Errorf("%s exited before serving", name)
		}
		p.addr, _ = rec["grpc"].(string)
		p.adm, _ = rec["admin"].(string)
		return p, nil
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		return nil, fmt.Errorf("%s did not start within 30s", name)
	}
}

// startSidecar writes cfg and runs `extauthz serve` on it.
func startSidecar(dir, name, bin, cfg string) (*proc, error) {
	path := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	return startServer(name, bin, "serve", "-config", path, "-log-format", "json", "-pprof")
}
