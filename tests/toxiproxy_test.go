package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// Toxiproxy (github.com/Shopify/toxiproxy/v2, pinned as a tool in
// tools/bench/go.mod, so it stays out of the product's go.mod) is the
// fault proxy the network-fault tests put between every sidecar and
// Redis: its server binary, built once per test run from the module
// proxy, driven through its HTTP API.

var toxiBuild struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// toxiproxyBinary builds toxiproxy's server once for the whole test run.
func toxiproxyBinary(t *testing.T) string {
	t.Helper()
	toxiBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "extauthz-toxiproxy-")
		if err != nil {
			toxiBuild.err = err
			return
		}
		toxiBuild.path = filepath.Join(dir, "toxiproxy-server")
		cmd := exec.Command("go", "build", "-o", toxiBuild.path, "github.com/Shopify/toxiproxy/v2/cmd/server")
		cmd.Dir = "../tools/bench"
		cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
		toxiBuild.out, toxiBuild.err = cmd.CombinedOutput()
	})
	if toxiBuild.err != nil {
		t.Fatalf("building toxiproxy in tools/bench: %v\n%s", toxiBuild.err, toxiBuild.out)
	}
	return toxiBuild.path
}

// toxiproxy is one running toxiproxy server.
type toxiproxy struct {
	t   *testing.T
	api string // http://127.0.0.1:port
}

// startToxiproxy runs a toxiproxy server on a reserved loopback port
// (testredis.ReservePort: nothing else binds it before the server does)
// until the test ends.
func startToxiproxy(t *testing.T) *toxiproxy {
	t.Helper()
	bin := toxiproxyBinary(t)
	port := testredis.ReservePort(t).N
	cmd := exec.Command(bin, "-host", "127.0.0.1", "-port", strconv.Itoa(port), "-seed", "1")
	logs := &testredis.LogBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Env = append(os.Environ(), "LOG_LEVEL=warn")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	x := &toxiproxy{t: t, api: "http://127.0.0.1:" + strconv.Itoa(port)}
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Get(x.api + "/version")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return x
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("toxiproxy did not answer within 10s: %v\n%s", err, logs)
		}
		time.Sleep(20 * time.Millisecond) // the server starting
	}
}

// call makes one API call and decodes the reply into out (when non-nil).
func (x *toxiproxy) call(method, path string, body, out any) {
	x.t.Helper()
	var rd bytes.Buffer
	if body != nil {
		if err := json.NewEncoder(&rd).Encode(body); err != nil {
			x.t.Fatal(err)
		}
	}
	req, err := http.NewRequest(method, x.api+path, &rd)
	if err != nil {
		x.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		x.t.Fatalf("toxiproxy %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var msg bytes.Buffer
		msg.ReadFrom(resp.Body)
		x.t.Fatalf("toxiproxy %s %s: %s: %s", method, path, resp.Status, msg.String())
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			x.t.Fatalf("toxiproxy %s %s: %v", method, path, err)
		}
	}
}

// proxy creates a proxy named name to upstream on a kernel-picked loopback
// port and returns the address it listens on.
func (x *toxiproxy) proxy(name, upstream string) string {
	x.t.Helper()
	var p struct {
		Listen string `json:"listen"`
	}
	x.call("POST", "/proxies", map[string]any{"name": name, "listen": "127.0.0.1:0", "upstream": upstream, "enabled": true}, &p)
	return p.Listen
}

// toxic is one toxiproxy toxic: its type, the direction it acts on
// ("upstream": towards Redis; "downstream": Redis's replies), the share of
// connections it affects and its attributes.
type toxic struct {
	Name       string           `json:"name"`
	Type       string           `json:"type"`
	Stream     string           `json:"stream"`
	Toxicity   float64          `json:"toxicity"`
	Attributes map[string]int64 `json:"attributes"`
}

// add puts toxics on proxy.
func (x *toxiproxy) add(proxy string, toxics ...toxic) {
	x.t.Helper()
	for _, tx := range toxics {
		x.call("POST", "/proxies/"+proxy+"/toxics", tx, nil)
	}
}

// clear removes toxics from proxy.
func (x *toxiproxy) clear(proxy string, toxics ...toxic) {
	x.t.Helper()
	for _, tx := range toxics {
		x.call("DELETE", fmt.Sprintf("/proxies/%s/toxics/%s", proxy, tx.Name), nil, nil)
	}
}
