package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// The protoset ghz reads must be complete on its own: every import
// present, so that ghz can resolve both methods it calls.
func TestProtosetResolvesTheMethods(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.protoset")
	if err := writeProtoset(path, authv3.File_envoy_service_auth_v3_external_auth_proto, rlsv3.File_envoy_service_ratelimit_v3_rls_proto); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &set); err != nil {
		t.Fatal(err)
	}
	files, err := protodesc.NewFiles(&set) // fails on a missing import
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []protoreflect.FullName{"envoy.service.auth.v3.Authorization.Check", "envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit"} {
		if _, err := files.FindDescriptorByName(m); err != nil {
			t.Errorf("%s: %v", m, err)
		}
	}
}

// procCPU reads this process's CPU time, which only grows.
func TestProcCPUOfThisProcess(t *testing.T) {
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		after, err := procCPU(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			return
		}
	}
	t.Fatal("no CPU time counted after 5s of spinning")
}
