package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// CPU per decision: what a server (its process, plus the redis-server it
// uses, if any) spent on the CPU over a measured round, divided by the
// decisions of the round. On a machine whose cores the load generator
// shares, throughput mostly measures the client; this measures the
// server, and does not depend on which client drove it.

// clockTick is USER_HZ, the unit of /proc/PID/stat's utime and stime: 100
// on every Linux architecture Go supports (sysconf(_SC_CLK_TCK) is a
// constant of the kernel's ABI, not of its configuration).
const clockTick = 100

// procCPU is the CPU time pid has used, user and system, all threads.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// count fields from after its closing one. utime and stime are fields
	// 14 and 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: /proc/%d/stat: %d fields after the name", pid, len(f))
	}
	var ticks int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bench: /proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTick, nil
}

// cpuMeter reads the CPU of a server's processes: the server's and, for a
// mode that uses Redis, its redis-server's.
type cpuMeter []*testredis.Proc

// read sums the processes' CPU time.
func (m cpuMeter) read() (time.Duration, error) {
	var total time.Duration
	for _, p := range m {
		d, err := procCPU(p.Cmd.Process.Pid)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", p.Name, err)
		}
		total += d
	}
	return total, nil
}

// measure runs f, which makes decisions decisions, and returns the CPU
// the processes spent per decision.
func (m cpuMeter) measure(f func() (decisions int, err error)) (time.Duration, error) {
	before, err := m.read()
	if err != nil {
		return 0, err
	}
	n, err := f()
	if err != nil {
		return 0, err
	}
	after, err := m.read()
	if err != nil {
		return 0, err
	}
	if n <= 0 {
		return 0, fmt.Errorf("bench: no decision measured")
	}
	return (after - before) / time.Duration(n), nil
}

// cpuText prints a CPU per decision in µs, "n/a" when unmeasured.
func cpuText(d time.Duration) string {
	if d <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
}
