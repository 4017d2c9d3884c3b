package testredis

// Ports for servers that are told their port rather than asked for one
// (redis-server, redis-sentinel, nginx, a flag a test passes): the port is
// chosen before the server binds it, and a killed server is started again
// on the same port, so in between nothing else may take it. Tests run in
// parallel, in this process and in others (`go test ./...` runs packages
// side by side; several people test on one machine), and each binds
// 127.0.0.1:0 listeners all the time. So a reserved port is:
//
//   - outside the kernel's ephemeral range (ip_local_port_range), where a
//     :0 listener and the source port of an outgoing connection come from:
//     those never land on it, and neither does a port the demo fixes
//     (9001, 9090: below the range this file picks from);
//   - held by an exclusive flock(2) on a file named after it, in a
//     directory every test process shares, from the reservation until
//     Release: another process using this file skips it, and the kernel
//     drops the lock when the process dies, however it dies;
//   - checked free by binding it once (something that is not a test may
//     listen there);
//   - reserved with port+10000, where a Redis Cluster node listens for
//     its bus, so any server may be a cluster node.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// busOffset is where Redis Cluster puts a node's bus: its port + 10000.
const busOffset = 10000

// Port is a loopback port reserved for one server until Release.
type Port struct {
	N     int // the port
	locks []*os.File
	once  sync.Once
}

// Addr returns 127.0.0.1:N.
func (p *Port) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.N)) }

// Release gives the port (and its bus port) back. Call it once the server
// on it has exited; calling it again does nothing.
func (p *Port) Release() {
	if p == nil {
		return
	}
	p.once.Do(func() {
		for _, f := range p.locks {
			f.Close() // closing the only descriptor drops the flock
		}
	})
}

// ReservePort reserves a loopback port and its bus port for the test,
// released when the test ends (after the cleanups registered later, such
// as the kill of the server on it).
func ReservePort(t testing.TB) *Port {
	t.Helper()
	p, err := Reserve()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Release)
	return p
}

// Reserve reserves a loopback port and its bus port, for callers without
// a *testing.T (the benchmark, the demo): Release gives them back.
func Reserve() (*Port, error) {
	dir := filepath.Join(os.TempDir(), "extauthz-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, fmt.Errorf("port reservations: %w", err)
	}
	lo, hi := reservableRange()
	n := hi - lo
	start := rand.IntN(n) // processes started together spread out
	for i := 0; i < n; i++ {
		port := lo + (start+i)%n
		if p := tryReserve(dir, port); p != nil {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no free port pair (p, p+%d) in [%d, %d): all reserved or in use", busOffset, lo, hi)
}

// tryReserve locks port and its bus port and checks that both are free,
// or returns nil.
func tryReserve(dir string, port int) *Port {
	p := &Port{N: port}
	for _, n := range []int{port, port + busOffset} {
		f, err := lockPort(dir, n)
		if err != nil {
			p.Release()
			return nil
		}
		p.locks = append(p.locks, f)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(n)))
		if err != nil {
			p.Release() // in use by something that does not reserve
			return nil
		}
		l.Close()
	}
	return p
}

// lockPort takes the exclusive, non-blocking flock on the port's file.
func lockPort(dir string, port int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_RDONLY|os.O_CREATE, 0o666)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// reservableRange is [lo, hi): base ports p with p and p+10000 both above
// the well-known and fixed ports (10000 on) and below the kernel's
// ephemeral range. Linux's default range, 32768-60999, leaves
// 10000-22767. Where the range starts too low for that, ports above it
// are used.
func reservableRange() (lo, hi int) {
	first, last := ephemeralRange()
	const floor = 10000
	if first-busOffset-floor >= 1000 {
		return floor, first - busOffset
	}
	if 65536-busOffset-(last+1) >= 1000 {
		return last + 1, 65536 - busOffset
	}
	// No room outside the range: reservations still keep test processes
	// apart, and the bind check keeps what is in use out.
	return floor, 65536 - busOffset
}

// ephemeralRange reads ip_local_port_range (Linux's default where it
// cannot be read).
func ephemeralRange() (first, last int) {
	first, last = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return first, last
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return first, last
	}
	a, err1 := strconv.Atoi(f[0])
	z, err2 := strconv.Atoi(f[1])
	if err := errors.Join(err1, err2); err != nil || a > z {
		return 32768, 60999
	}
	return a, z
}
