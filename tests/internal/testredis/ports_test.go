package testredis

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// A reserved port and its bus port lie outside the kernel's ephemeral
// range, where no :0 listener can land; no two reservations share a port,
// counting bus ports; while held, the reservation's lock refuses every
// other taker (a lock of another process's is refused the same way: flock
// is per open file); once released, the port can be reserved again.
func TestReservedPortsAreHeldAndOutsideTheEphemeralRange(t *testing.T) {
	first, last := ephemeralRange()
	taken := map[int]bool{}
	var held []*Port
	for i := 0; i < 50; i++ {
		p := ReservePort(t)
		held = append(held, p)
		for _, n := range []int{p.N, p.N + busOffset} {
			if n >= first && n <= last {
				t.Errorf("port %d (of reservation %d) is inside the ephemeral range %d-%d", n, p.N, first, last)
			}
			if taken[n] {
				t.Fatalf("port %d reserved twice", n)
			}
			taken[n] = true
		}
	}
	dir := filepath.Join(os.TempDir(), "extauthz-test-ports")
	p := held[0]
	for _, n := range []int{p.N, p.N + busOffset} {
		if f, err := lockPort(dir, n); err == nil {
			f.Close()
			t.Fatalf("port %d is reserved, yet another taker locked it", n)
		}
	}
	// A server can bind the reserved port: the reservation holds a lock,
	// not the port.
	l, err := net.Listen("tcp", p.Addr())
	if err != nil {
		t.Fatalf("binding reserved port %d: %v", p.N, err)
	}
	l.Close()
	p.Release()
	f, err := lockPort(dir, p.N)
	if err != nil {
		t.Fatalf("port %d was released, yet cannot be locked: %v", p.N, err)
	}
	f.Close()
}

// Revive starts the killed server on the port it had, which stayed
// reserved: a kill followed by a revival finds the same address serving.
func TestRestartKeepsThePort(t *testing.T) {
	s := Start(t)
	addr := s.Addr
	s.Restart()
	if s.Addr != addr {
		t.Fatalf("restarted on %s, was %s", s.Addr, addr)
	}
	if err := s.Client().Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING after restart: %v", err)
	}
}
