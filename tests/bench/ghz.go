package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/extauthz/extauthz/tests/internal/loadgen"
)

// ghz (github.com/bojand/ghz) drives the Check and rate limit service rows
// a second time, so that no headline figure depends only on a client
// written here. It is pinned in tools/bench, a module of its own, so that
// its dependencies stay out of the product's go.mod; the bench builds it
// at start. The no-op ceilings serve no reflection, so ghz reads the
// services of every server it drives from one protoset, written from the
// descriptors compiled into this program (the same go-control-plane
// version the sidecar is built with), rather than from the sidecar's.

// The methods ghz calls.
const (
	checkMethod     = "envoy.service.auth.v3.Authorization/Check"
	rateLimitMethod = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
)

// ghz runs the pinned ghz binary with one request and one setting.
type ghz struct {
	bin, protoset, dir string
	c, conns           int
}

// newGhz builds ghz from tools/bench into dir and writes the protoset. It
// returns the reason when ghz cannot be built, and the bench goes on
// without its rows.
func newGhz(dir string, c int) (*ghz, error) {
	g := &ghz{bin: filepath.Join(dir, "ghz"), protoset: filepath.Join(dir, "services.protoset"), dir: dir, c: c, conns: 2}
	build := exec.Command("go", "build", "-o", g.bin, "github.com/bojand/ghz/cmd/ghz")
	build.Dir = "tools/bench"
	// The product's build tag (vtprotobuf) is not ghz's.
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building ghz in tools/bench: %v\n%s", err, out)
	}
	if err := writeProtoset(g.protoset, authv3.File_envoy_service_auth_v3_external_auth_proto, rlsv3.File_envoy_service_ratelimit_v3_rls_proto); err != nil {
		return nil, err
	}
	return g, nil
}

// writeProtoset writes a FileDescriptorSet holding files and everything
// they import, each file after its imports.
func writeProtoset(path string, files ...protoreflect.FileDescriptor) error {
	set := &descriptorpb.FileDescriptorSet{}
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := 0; i < imports.Len(); i++ {
			add(imports.Get(i).FileDescriptor)
		}
		set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
	}
	for _, fd := range files {
		add(fd)
	}
	b, err := proto.Marshal(set)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// ghzReport is the part of ghz's JSON report the bench reads.
type ghzReport struct {
	Count               int            `json:"count"`
	Total               time.Duration  `json:"total"`
	Rps                 float64        `json:"rps"`
	StatusCodeDist      map[string]int `json:"statusCodeDistribution"`
	ErrorDist           map[string]int `json:"errorDistribution"`
	LatencyDistribution []struct {
		Percentage int           `json:"percentage"`
		Latency    time.Duration `json:"latency"`
	} `json:"latencyDistribution"`
}

// run sends n copies of req to addr's method and returns the run as a
// loadgen.Result (statuses are gRPC codes as ghz names them: a denied
// Check is an OK call too, which the bench's rows never expect).
func (g *ghz) run(addr, method string, req proto.Message, n int) (loadgen.Result, error) {
	data, err := proto.Marshal(req)
	if err != nil {
		return loadgen.Result{}, err
	}
	f, err := os.CreateTemp(g.dir, "ghz-*.bin")
	if err != nil {
		return loadgen.Result{}, err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return loadgen.Result{}, err
	}
	f.Close()
	cmd := exec.Command(g.bin, "--insecure", "--protoset", g.protoset, "--call", method,
		"--binary-file", f.Name(), "-n", fmt.Sprint(n), "-c", fmt.Sprint(g.c), "--connections", fmt.Sprint(g.conns),
		"--timeout", "10s", "--format", "json", addr)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return loadgen.Result{}, fmt.Errorf("ghz: %v: %s", err, errb.String())
	}
	var rep ghzReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		return loadgen.Result{}, fmt.Errorf("ghz report: %w", err)
	}
	res := loadgen.Result{Requests: rep.Count, Elapsed: rep.Total, Throughput: rep.Rps, Statuses: map[string]int{}}
	for code, k := range rep.StatusCodeDist {
		if code == "OK" {
			res.Statuses["200"] += k
		} else {
			res.GRPCErrors += k
		}
	}
	for e := range rep.ErrorDist {
		res.FirstError = e
		break
	}
	for _, l := range rep.LatencyDistribution {
		switch l.Percentage {
		case 50:
			res.P50 = l.Latency
		case 99:
			res.P99 = l.Latency
		}
	}
	return res, nil
}
