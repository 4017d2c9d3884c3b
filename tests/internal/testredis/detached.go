package testredis

// The child processes of the benchmark and the demo, which run without a
// *testing.T: a redis-server on a reserved loopback port (StartDetached), and
// servers (extauthz, the no-op ceiling) that announce their addresses in a
// JSON "serving" log line (Serve). Children are killed by the kernel if
// the parent dies (Pdeathsig).

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
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is one child process and what it printed.
type Proc struct {
	Name  string
	Cmd   *exec.Cmd
	Addr  string // Redis's address, or the gRPC address a server announced
	HTTP  string // the HTTP door's address a server announced ("" when none)
	Admin string // the admin address a server announced
	out   *LogBuffer
	done  chan struct{}
}

// Output returns what the process wrote (the first MiB).
func (p *Proc) Output() string { return p.out.String() }

// Stop sends SIGTERM, waits up to 10s, then kills.
func (p *Proc) Stop() {
	if p == nil {
		return
	}
	p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.Cmd.Process.Kill()
		<-p.done
	}
}

// start runs bin, keeping its output and handing its stderr to the
// returned reader as well (for the "serving" line).
func start(name string, env []string, bin string, args ...string) (*Proc, io.Reader, error) {
	p := &Proc{Name: name, out: &LogBuffer{}, done: make(chan struct{})}
	p.Cmd = exec.Command(bin, args...)
	p.Cmd.Env = append(os.Environ(), env...)
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	p.Cmd.Stdout = p.out
	p.Cmd.Stderr = io.MultiWriter(p.out, pw)
	if err := p.Cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		p.Cmd.Wait()
		pw.Close()
		close(p.done)
	}()
	return p, pr, nil
}

// StartDetached runs redis-server on a free loopback port with no
// persistence, its working directory dir, tied to no test: Stop ends it.
// extra are further redis-server arguments.
func StartDetached(dir string, extra ...string) (*Proc, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is not on PATH: `make redis-server` installs it (Debian), or apt-get install -y redis-server")
	}
	port, err := Reserve() // held until the server exits (ports.go)
	if err != nil {
		return nil, err
	}
	args := append([]string{"--port", strconv.Itoa(port.N), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning"}, extra...)
	p, out, err := start("redis-server", nil, bin, args...)
	if err != nil {
		port.Release()
		return nil, err
	}
	go func() { <-p.done; port.Release() }()
	go io.Copy(io.Discard, out)
	p.Addr = port.Addr()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-p.done:
			return nil, fmt.Errorf("redis-server exited: %s", p.Output())
		default:
		}
		if c, err := net.DialTimeout("tcp", p.Addr, 100*time.Millisecond); err == nil {
			c.Close()
			return p, nil
		}
		time.Sleep(20 * time.Millisecond) // polling a child process for readiness
	}
	p.Stop()
	return nil, fmt.Errorf("redis-server did not listen on %s within 10s", p.Addr)
}

// StartClusterDetached starts a Redis Cluster of n masters (no replicas)
// tied to no test, each node working in a directory of its own under dir,
// and waits until every node says the cluster is ok. Stop each Proc to
// end it. (Its nodes.conf stays on disk: a cluster that never changes
// shape writes it only at start-up.)
func StartClusterDetached(dir string, n int, extra ...string) ([]*Proc, error) {
	var procs []*Proc
	stopAll := func() {
		for _, p := range procs {
			p.Stop()
		}
	}
	for i := 0; i < n; i++ {
		nodeDir := filepath.Join(dir, "node"+strconv.Itoa(i))
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			stopAll()
			return nil, err
		}
		args := append([]string{"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(nodeDir, "nodes.conf")}, extra...)
		p, err := StartDetached(nodeDir, args...)
		if err != nil {
			stopAll()
			return nil, err
		}
		procs = append(procs, p)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		stopAll()
		return nil, fmt.Errorf("redis-cli is not on PATH (it comes with redis-server)")
	}
	args := []string{"--cluster", "create"}
	for _, p := range procs {
		args = append(args, p.Addr)
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		stopAll()
		return nil, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, p := range procs {
		for deadline := time.Now().Add(20 * time.Second); ; {
			out, _ := exec.Command(cli, "-h", "127.0.0.1", "-p", strings.TrimPrefix(p.Addr, "127.0.0.1:"), "cluster", "info").Output()
			if strings.Contains(string(out), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				stopAll()
				return nil, fmt.Errorf("cluster node %s not ok within 20s:\n%s", p.Addr, out)
			}
			time.Sleep(50 * time.Millisecond) // polling cluster convergence
		}
	}
	return procs, nil
}

// Serve runs bin with args (and env added to the environment) and waits
// for its JSON "serving" log line, which names the gRPC, HTTP and admin
// addresses it got.
func Serve(name string, env []string, bin string, args ...string) (*Proc, error) {
	p, out, err := start(name, env, bin, args...)
	if err != nil {
		return nil, err
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == "serving" {
				p.Addr, _ = rec["grpc"].(string)
				p.HTTP, _ = rec["http"].(string)
				p.Admin, _ = rec["admin"].(string)
				close(ready)
				break
			}
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case <-ready:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before serving:\n%s", name, p.Output())
	case <-time.After(30 * time.Second):
		p.Stop()
		return nil, fmt.Errorf("%s did not serve within 30s:\n%s", name, p.Output())
	}
}

// FreePort returns a loopback TCP port that was free a moment ago, from
// the kernel's ephemeral range, where any :0 listener may take it before
// the caller binds it: for a process that runs nothing else meanwhile
// (the benchmark). Tests reserve ports with ReservePort (ports.go).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// LogBuffer keeps the first MiB a child process writes, for failure
// reports; safe for concurrent use.
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 1<<20 {
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
