// Package testnginx runs a real nginx on loopback with a configuration the
// repository ships (proxies/nginx/extauthz.conf), changing only its
// ports, and stops it when the test ends. `make test` installs nginx where
// it is missing.
package testnginx

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// authRequestFlag is how `nginx -V` says the auth_request module is built in.
const authRequestFlag = "--with-http_auth_request_module"

// Binary returns the path of an nginx with the auth_request module, or
// fails the test with how to get one.
func Binary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		// Debian puts it in /usr/sbin, which a non-root PATH may lack.
		if _, serr := os.Stat("/usr/sbin/nginx"); serr != nil {
			t.Fatalf("nginx not found: run `make test` (it installs it) or `apt-get install -y nginx`")
		}
		bin = "/usr/sbin/nginx"
	}
	out, err := exec.Command(bin, "-V").CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte(authRequestFlag)) {
		t.Fatalf("%s lacks the auth_request module (nginx -V: %s): install Debian's nginx package", bin, out)
	}
	return bin
}

// Server is one nginx process.
type Server struct {
	Addr string // the listen address, 127.0.0.1:port
	cmd  *exec.Cmd
	out  *testredis.LogBuffer
	done chan struct{}
}

// Start runs nginx with the shipped server configuration at conf, included
// in a minimal main configuration (as Debian's nginx.conf includes
// conf.d/*.conf). ports maps each address the file names to the address
// it gets here; the file's listen address, from, becomes a reserved
// loopback port (testredis.ReservePort). Every address must occur in
// exactly one directive, so a change to the shipped file cannot slip past
// the test's substitutions.
func Start(t testing.TB, conf, from string, ports map[string]string) *Server {
	t.Helper()
	raw, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		addr := testredis.ReservePort(t).Addr() // held until the test ends
		text := string(raw)
		for old, repl := range mergeMaps(ports, map[string]string{from: addr}) {
			if n := strings.Count(directives(text), old); n != 1 {
				t.Fatalf("%s names %s in %d directives, want one", conf, old, n)
			}
			text = strings.ReplaceAll(text, old, repl) // comments too
		}
		s, err := launch(t, text, addr)
		if err == nil {
			return s
		}
		last = err
	}
	t.Fatalf("starting nginx: %v", last)
	return nil
}

// directives returns conf without its comments.
func directives(conf string) string {
	var b strings.Builder
	for _, line := range strings.Split(conf, "\n") {
		line, _, _ = strings.Cut(line, "#")
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}

func mergeMaps(a, b map[string]string) map[string]string {
	m := map[string]string{}
	for k, v := range a {
		m[k] = v
	}
	for k, v := range b {
		m[k] = v
	}
	return m
}

// mainConf is the part of nginx.conf a distribution ships, pointed at the
// test's directory: nothing here is about extauthz. One process, not a
// master and its worker: the kernel kills it if the test dies
// (Pdeathsig), where an orphaned worker would keep its port.
const mainConf = `daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log stderr warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    include %[1]s/extauthz.conf;
}
`

func launch(t testing.TB, serverConf, addr string) (*Server, error) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "extauthz.conf"), []byte(serverConf), 0o644); err != nil {
		return nil, err
	}
	main := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(main, []byte(fmt.Sprintf(mainConf, dir)), 0o644); err != nil {
		return nil, err
	}
	s := &Server{Addr: addr, out: &testredis.LogBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(Binary(t), "-p", dir, "-c", main, "-e", "stderr")
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-s.done:
			return nil, fmt.Errorf("nginx exited: %s", s.out)
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			t.Cleanup(func() {
				s.Stop()
				if t.Failed() {
					t.Logf("nginx %s log:\n%s", addr, s.out)
				}
			})
			return s, nil
		}
		time.Sleep(10 * time.Millisecond) // polling a child process for readiness
	}
	s.cmd.Process.Kill()
	<-s.done
	return nil, fmt.Errorf("nginx did not listen on %s within 10s: %s", addr, s.out)
}

// Stop asks nginx to stop at once (SIGTERM) and waits for it.
func (s *Server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// Log returns what nginx wrote (its error log).
func (s *Server) Log() string { return s.out.String() }
