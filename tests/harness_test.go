package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/tests/internal/loadgen"
	"github.com/extauthz/extauthz/tests/internal/testredis"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// binary is the extauthz executable built once for the whole package, with
// the race detector when the tests run with it. fastBinary is built without
// it, for the volume tests whose point is memory and bounds, not races.
var binary, fastBinary string

// loadgenBinary is tests/loadgen, always built without the race detector:
// it measures rate-dependent behaviour at a realistic rate.
var loadgenBinary string

func TestMain(m *testing.M) {
	if g := os.Getenv(GroupEnv); g != "" && g != "serial" && g != "parallel" {
		fmt.Fprintf(os.Stderr, "%s=%q: want serial, parallel or nothing (both)\n", GroupEnv, g)
		os.Exit(2)
	}
	setParallel()
	// A binary built with the race detector sleeps a second before it
	// exits, so that other goroutines may finish reporting a race: every
	// replica a test stops cost it that second (about 40s of the serial
	// group's 350s). A report is written when the race is found, and
	// spawn's cleanup fails the test on one; the sleep only lets a race in
	// a goroutine still running at exit be reported. The processes the
	// tests start inherit this.
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	dir, err := os.MkdirTemp("", "extauthz-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "extauthz")
	fastBinary = binary
	loadgenBinary = filepath.Join(dir, "loadgen")
	builds := [][]string{{"build", "-o", binary, "../cmd/extauthz"}, {"build", "-o", loadgenBinary, "./loadgen"}}
	if raceEnabled {
		builds[0] = []string{"build", "-race", "-o", binary, "../cmd/extauthz"}
		fastBinary = filepath.Join(dir, "extauthz-norace")
		builds = append(builds, []string{"build", "-o", fastBinary, "../cmd/extauthz"})
	}
	var wg sync.WaitGroup
	errs := make([]error, len(builds))
	for i, args := range builds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command("go", args...)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			errs[i] = cmd.Run()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			fmt.Fprintln(os.Stderr, "building extauthz:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if err := timings.write(); err != nil {
		fmt.Fprintln(os.Stderr, "writing the tests' times:", err)
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// Every test in this package chooses its group with its first statement,
// parallel(t), parallelLong(t, why) or serial(t, why);
// TestEveryTestChoosesItsGroup checks that each does (docs/architecture.md,
// "Test lanes").
//
// Go runs a package's tests that do not call t.Parallel one after another
// first, with every parallel test paused, and then the parallel tests
// together. So a serial test has the package to itself: nothing else this
// suite starts runs beside it. The Makefile runs this package in a go test
// of its own, so no other package's tests run beside it either. The
// parallel tests then run through slots (slots below), a few at a time.

// parallel marks a test that shares the machine with the other parallel
// tests: it starts its own processes on kernel-picked or reserved ports
// (testredis.ReservePort), writes only under t.TempDir, and its bounds
// hold on a loaded machine (each is computed from what the test measured,
// or from the shipped defaults' margins, not from the machine being
// quiet). That is most tests. Call it first.
func parallel(t *testing.T) {
	t.Helper()
	onlyGroup(t, "parallel")
	t.Parallel()
	slots.take(t, false)
}

// parallelLong is parallel for a test that runs far longer than most (it
// waits out a lease's life, or sends a million requests), and why: it
// takes a slot before the tests that did not say so, so that it does not
// start last and hold up the end of the run.
func parallelLong(t *testing.T, why string) {
	t.Helper()
	if strings.TrimSpace(why) == "" {
		t.Fatal("parallelLong(t, why): say why the test runs long")
	}
	onlyGroup(t, "parallel")
	t.Parallel()
	slots.take(t, true)
}

// serial marks a test that must have the machine to itself, and why: it
// loads the machine on purpose (a busy core, a replica throttled with
// SIGSTOP), or it asserts a wall-clock bound (milliseconds, at the
// breaker's defaults) that other tests' load would break, not the code.
// Serial tests run one at a time before the parallel ones. Call it first.
func serial(t *testing.T, why string) {
	t.Helper()
	if strings.TrimSpace(why) == "" {
		t.Fatal("serial(t, why): say why the test needs the machine to itself")
	}
	onlyGroup(t, "serial")
	began := time.Now()
	t.Cleanup(func() { timings.add(t.Name(), "serial", time.Since(began)) })
}

// serialQuiet is serial for a test that spends its run waiting on wall
// clock time (a reporting interval, a block, a failover) with little of a
// core busy, and why it needs a quiet machine: the quiet tests run
// together, after the other serial tests and with nothing but each other
// beside them, so their waits overlap where the serial lane would add
// them up. Each says, beside why, what share of a core it was measured
// to keep busy alone (docs/architecture.md, "Test lanes"); a test that
// loads the machine is serial, not quiet. Outside the serial group
// (GroupEnv unset: go test ./tests/ runs both groups) it runs as serial
// does, one at a time, since Go would run it beside the parallel group.
func serialQuiet(t *testing.T, why string) {
	t.Helper()
	if strings.TrimSpace(why) == "" {
		t.Fatal("serialQuiet(t, why): say why the test needs a quiet machine and how little of a core it uses")
	}
	onlyGroup(t, "serial")
	if os.Getenv(GroupEnv) == "serial" {
		t.Parallel()
	}
	began := time.Now()
	t.Cleanup(func() { timings.add(t.Name(), "serial-quiet", time.Since(began)) })
}

// GroupEnv, when set to "serial" or "parallel", runs only that group's
// tests and skips the others: `make test` runs the serial group alone on
// the machine, then the parallel group beside the rest of the suite.
// Unset, both run (serial first).
const GroupEnv = "EXTAUTHZ_E2E_GROUP"

// onlyGroup skips t when GroupEnv names the other group.
func onlyGroup(t *testing.T, group string) {
	t.Helper()
	if g := os.Getenv(GroupEnv); g != "" && g != group {
		t.Skipf("a %s test; %s=%s runs the %s group only", group, GroupEnv, g, g)
	}
}

// e2eParallel is how many parallel tests run at once when -test.parallel
// is not given (Go's default is GOMAXPROCS, 2 on the machine the suite is
// sized for): the end-to-end tests spend most of their time waiting on
// real time (a lease's life, a failover, a window) and on processes
// other than this one, so more of them than there are cores keep the
// cores busy. Measured on 2 cores: see docs/architecture.md, "Test lanes".
const e2eParallel = 6

// slots admits the parallel tests: -test.parallel at a time (e2eParallel
// when it is not given), long ones first. Go's own limit is lifted
// (TestMain) so that every parallel test reaches this queue when the
// serial ones are done, and it picks who starts: Go starts them in the
// order they were written, and a long test written last would end the
// run alone.
var slots = &testSlots{}

type testSlots struct {
	mu       sync.Mutex
	free     int
	long     []chan struct{} // waiting, in arrival order
	ordinary []chan struct{}
}

// take waits for a slot, held until t ends, and logs how long it waited
// (go test -v counts that wait in the test's time).
func (s *testSlots) take(t *testing.T, long bool) {
	t.Helper()
	asked := time.Now()
	<-s.queue(long)
	started := time.Now()
	if waited := started.Sub(asked); waited > time.Second {
		t.Logf("waited %v for a slot", waited.Round(time.Millisecond))
	}
	t.Cleanup(func() {
		ran := time.Since(started)
		t.Logf("ran %v in its slot", ran.Round(time.Millisecond))
		timings.add(t.Name(), "parallel", ran)
		s.give()
	})
}

// TimesEnv names a file to which each end-to-end test's time is appended
// when the group ends, a line each: name, seconds, group (a parallel
// test's time in its slot, after any wait for one). make test prints the
// slowest from it.
const TimesEnv = "EXTAUTHZ_E2E_TIMES"

// timings are the times of this process's tests, for TimesEnv.
var timings testTimes

type testTimes struct {
	mu    sync.Mutex
	lines []string
}

func (r *testTimes) add(name, group string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, fmt.Sprintf("%s %.1f %s\n", name, d.Seconds(), group))
}

// write appends the times to TimesEnv's file, when it names one.
func (r *testTimes) write() error {
	path := os.Getenv(TimesEnv)
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strings.Join(r.lines, ""))
	return errors.Join(err, f.Close())
}

// queue returns a channel closed when the caller has a slot: at once when
// one is free, else in its turn, long ones first.
func (s *testSlots) queue(long bool) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ready := make(chan struct{})
	switch {
	case s.free > 0:
		s.free--
		close(ready)
	case long:
		s.long = append(s.long, ready)
	default:
		s.ordinary = append(s.ordinary, ready)
	}
	return ready
}

// give hands a finished test's slot to the next one waiting.
func (s *testSlots) give() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range []*[]chan struct{}{&s.long, &s.ordinary} {
		if len(*q) > 0 {
			next := (*q)[0]
			*q = (*q)[1:]
			close(next)
			return
		}
	}
	s.free++
}

// setParallel sizes the slots from -test.parallel (e2eParallel when it is
// not given) and lifts Go's own limit.
func setParallel() {
	flag.Parse()
	n := e2eParallel
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "test.parallel" {
			if v, err := strconv.Atoi(f.Value.String()); err == nil && v > 0 {
				n = v
			}
		}
	})
	slots.free = n
	flag.Set("test.parallel", "1000")
}

// sidecar is one running extauthz process.
type sidecar struct {
	t      *testing.T
	cmd    *exec.Cmd
	GRPC   string // host:port
	HTTP   string // host:port of the HTTP door; "" when listen.http is off
	Admin  string // host:port
	Client authv3.AuthorizationClient
	conn   *grpc.ClientConn
	config string // path of its configuration file
	name   string // what the process is, in failure messages: extauthz, ratelimit
	logs   *testredis.LogBuffer
	done   chan error
	term   sync.Once // SIGTERM is sent once (terminate)
}

// startSidecar writes cfg to a file and runs `extauthz serve` on it. The
// listen section is added: gRPC and admin on 127.0.0.1 with ports the
// kernel picks, read back from the start-up log.
func startSidecar(t *testing.T, cfg string, extraArgs ...string) *sidecar {
	t.Helper()
	path := filepath.Join(t.TempDir(), "extauthz.yaml")
	if !strings.Contains(cfg, "listen:") {
		cfg = "listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}\n" + cfg
	}
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return startSidecarFile(t, path, nil, extraArgs...)
}

func startSidecarFile(t *testing.T, path string, env []string, extraArgs ...string) *sidecar {
	t.Helper()
	return startProcess(t, binary, path, env, extraArgs...)
}

// startFastSidecar is startSidecar with the binary built without the race
// detector, for volume tests.
func startFastSidecar(t *testing.T, cfg string) *sidecar {
	t.Helper()
	return startProcess(t, fastBinary, writeConfig(t, cfg), nil)
}

// writeConfig writes cfg, after a listen section on kernel-picked ports, to
// a file of the test's own and returns its path, for tests that start the
// process themselves rather than through startSidecar.
func writeConfig(t *testing.T, cfg string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "extauthz.yaml")
	must(t, os.WriteFile(path, []byte("listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}\n"+cfg), 0o600))
	return path
}

func startProcess(t *testing.T, bin, path string, env []string, extraArgs ...string) *sidecar {
	t.Helper()
	args := append([]string{"serve", "-config", path, "-log-format", "json"}, extraArgs...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	s, ready := spawn(t, cmd, "extauthz")
	s.config = path
	s.await(ready, nil)
	return s
}

// spawn starts cmd, a process that logs JSON to stderr, copying its log
// to s.logs; ready receives its "serving" record, or is closed when the
// process exits first. The process is stopped at the test's end (its log
// tail shown if the test failed), served or not.
func spawn(t *testing.T, cmd *exec.Cmd, name string) (*sidecar, <-chan map[string]any) {
	t.Helper()
	s := &sidecar{t: t, name: name, cmd: cmd, logs: &testredis.LogBuffer{}, done: make(chan error, 1)}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Bytes()
			s.logs.Write(append(line, '\n'))
			if !sent {
				var rec map[string]any
				if json.Unmarshal(line, &rec) == nil && rec["msg"] == "serving" {
					ready <- rec
					sent = true
				}
			}
		}
		io.Copy(io.Discard, stderr)
		s.done <- cmd.Wait()
		close(ready)
	}()
	running.add(t, s)
	t.Cleanup(func() {
		if s.conn != nil {
			s.conn.Close()
		}
		running.terminate(t)
		s.stop()
		// The binary is built with the race detector: a race it found is
		// this test's failure, whatever the test asserted.
		if log := s.logs.String(); strings.Contains(log, "WARNING: DATA RACE") {
			t.Errorf("%s (%s) reported a data race:\n%s", s.name, s.GRPC, raceReport(log))
		}
		if t.Failed() {
			t.Logf("%s log (%s):\n%s", s.name, s.GRPC, tail(s.logs.String(), 40))
		}
	})
	return s, ready
}

// await waits up to 30s for a spawned process to serve, reads its
// addresses from the serving record (returned) and dials its gRPC door
// with creds (nil: plaintext).
func (s *sidecar) await(ready <-chan map[string]any, creds credentials.TransportCredentials) map[string]any {
	t := s.t
	t.Helper()
	var rec map[string]any
	select {
	case r, ok := <-ready:
		if !ok {
			t.Fatalf("%s exited before serving:\n%s", s.name, s.logs)
		}
		rec = r
		s.GRPC, _ = rec["grpc"].(string)
		s.HTTP, _ = rec["http"].(string)
		s.Admin, _ = rec["admin"].(string)
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		t.Fatalf("%s did not start within 30s:\n%s", s.name, s.logs)
	}
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient("passthrough:///"+s.GRPC, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	s.conn = conn
	s.Client = authv3.NewAuthorizationClient(conn)
	return rec
}

// running holds the sidecars each test started, so that the first of
// their cleanups sends every one of them SIGTERM at once and they stop
// side by side: stopped one after another, as the cleanups run, each
// stop waits for the last one's (a graceful stop, and before GORACE's
// atexit_sleep_ms was set in TestMain, the race detector's second).
var running = &testSidecars{m: map[*testing.T][]*sidecar{}}

type testSidecars struct {
	mu sync.Mutex
	m  map[*testing.T][]*sidecar
}

func (r *testSidecars) add(t *testing.T, s *sidecar) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[t] = append(r.m[t], s)
}

// terminate sends SIGTERM to every sidecar t started (once each; one
// that has exited ignores it) and forgets them; their cleanups wait.
func (r *testSidecars) terminate(t *testing.T) {
	r.mu.Lock()
	all := r.m[t]
	delete(r.m, t)
	r.mu.Unlock()
	for _, s := range all {
		s.terminate()
	}
}

// terminate sends the process SIGTERM, the first time it is called.
func (s *sidecar) terminate() {
	s.term.Do(func() { s.cmd.Process.Signal(syscall.SIGTERM) })
}

// stop sends SIGTERM (unless terminate has) and waits for the process; it
// kills it after 15s. It returns how the process exited (and so does
// every later call). It reads the exit from done, never
// cmd.ProcessState, which the log reader's cmd.Wait writes.
func (s *sidecar) stop() error {
	s.terminate()
	select {
	case err := <-s.done:
		s.done <- err
		return err
	case <-time.After(15 * time.Second):
		s.cmd.Process.Kill()
		return fmt.Errorf("%s did not stop within 15s", s.name)
	}
}

// raceReport returns the race detector's first report in a process's log.
func raceReport(log string) string {
	i := strings.Index(log, "WARNING: DATA RACE")
	r := log[i:]
	if j := strings.Index(r, "=================="); j >= 0 {
		r = r[:j]
	}
	return r
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// metrics scrapes the admin endpoint.
func (s *sidecar) metrics() map[string]*dto.MetricFamily {
	s.t.Helper()
	resp, err := http.Get("http://" + s.Admin + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return mf
}

// metric returns the value of the sample of family name whose labels
// include every given name=value pair, summed over matching samples.
func (s *sidecar) metric(name string, labels ...string) float64 {
	s.t.Helper()
	return sumMetric(s.metrics(), name, labels...)
}

func sumMetric(mfs map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	mf, ok := mfs[name]
	if !ok {
		return 0
	}
	var total float64
outer:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue outer
			}
		}
		switch {
		case m.GetCounter() != nil:
			total += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			total += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			total += m.GetUntyped().GetValue()
		case m.GetHistogram() != nil:
			total += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return total
}

// runLoadgen drives the replicas with tests/loadgen (built without the race
// detector) and returns its summary. args are further loadgen flags.
func runLoadgen(t *testing.T, replicas []*sidecar, n, workers int, args ...string) loadgen.Result {
	t.Helper()
	targets := make([]string, len(replicas))
	for i, r := range replicas {
		targets[i] = r.GRPC
	}
	all := append([]string{"-targets", strings.Join(targets, ","), "-n", fmt.Sprint(n), "-c", fmt.Sprint(workers)}, args...)
	out, err := exec.Command(loadgenBinary, all...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("loadgen %v: %v\n%s", all, err, stderr)
	}
	var res loadgen.Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("loadgen output %q: %v", out, err)
	}
	if res.GRPCErrors > 0 {
		t.Fatalf("loadgen saw %d gRPC errors; first: %s", res.GRPCErrors, res.FirstError)
	}
	return res
}

// check sends one request and fails the test on a gRPC error.
func (s *sidecar) check(req *authv3.CheckRequest) *authv3.CheckResponse {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := s.Client.Check(ctx, req)
	if err != nil {
		s.t.Fatalf("Check: %v", err)
	}
	return resp
}

// ordersFor is the one-client configuration many tests share: ada's key,
// and a single policy "orders" counting per client, which is what adaOrder's
// requests fall under. rest carries what differs between tests: the limit,
// the window and, where a test needs it, a match.
func ordersFor(rest string) string {
	return `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: orders, key: [client], ` + rest + `}
`
}

// redisOptions is go-redis's client options, for tests that tweak them.
type redisOptions = redis.Options
