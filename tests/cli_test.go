package tests

import (
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// TestEnvironmentOverrides runs the real binary with the container-friendly
// environment variables: EXTAUTHZ_LISTEN_GRPC replaces the file's
// listen.grpc, a -listen-admin flag wins over EXTAUTHZ_LISTEN_ADMIN, the
// -log-format json the harness passes wins over EXTAUTHZ_LOG_FORMAT=text
// (the harness reads JSON lines), EXTAUTHZ_LOG_LEVEL=debug takes effect,
// and a reload does not take the file's address for a change of listen.
func TestEnvironmentOverrides(t *testing.T) {
	parallel(t)
	sock := filepath.Join(t.TempDir(), "g.sock")
	adminFlag := freeLoopbackPort(t)
	s := startSidecarFile(t, writeConfig(t, ordersFor("limit: 5, window: 1m")), []string{
		"EXTAUTHZ_LISTEN_GRPC=unix://" + sock,
		"EXTAUTHZ_LISTEN_ADMIN=127.0.0.1:1", // overridden by the flag below
		"EXTAUTHZ_LOG_FORMAT=text",
		"EXTAUTHZ_LOG_LEVEL=debug",
	}, "-listen-admin", adminFlag)
	if s.GRPC != sock {
		t.Errorf("serving gRPC on %q, want the socket from EXTAUTHZ_LISTEN_GRPC %q", s.GRPC, sock)
	}
	if s.Admin != adminFlag {
		t.Errorf("serving admin on %q, want %q from -listen-admin (the flag wins over the variable)", s.Admin, adminFlag)
	}
	if !s.logShows(`"level":"DEBUG"`, 10*time.Second) {
		t.Errorf("EXTAUTHZ_LOG_LEVEL=debug: no debug line in\n%s", s.logs.String())
	}
	s.cmd.Process.Signal(syscall.SIGHUP)
	waitMetric(t, s, 10*time.Second, 1, "extauthz_config_reloads_total", "result", "success")
	if log := s.logs.String(); strings.Contains(log, "take effect after a restart") {
		t.Errorf("a reload with listen overrides warned of a listen change:\n%s", tail(log, 5))
	}
}

// TestBadEnvironmentValue: a variable with a bad value stops start-up with
// a message that names the variable.
func TestBadEnvironmentValue(t *testing.T) {
	parallel(t)
	cmd := exec.Command(binary, "serve", "-config", writeConfig(t, ordersFor("limit: 5, window: 1m")))
	cmd.Env = append(cmd.Environ(), "EXTAUTHZ_GRACE=soon")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), `$EXTAUTHZ_GRACE="soon"`) {
		t.Fatalf("EXTAUTHZ_GRACE=soon: %v\n%s", err, out)
	}
}

// freeLoopbackPort returns a 127.0.0.1 address with a port reserved for
// the test (testredis.ReservePort): nothing else binds it until the test
// ends, so the process the test starts on it finds it free.
func freeLoopbackPort(t *testing.T) string {
	t.Helper()
	return testredis.ReservePort(t).Addr()
}
