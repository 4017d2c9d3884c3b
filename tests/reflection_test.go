package tests

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/extauthz/extauthz/internal/check"
)

// gRPC server reflection, which grpcurl and ghz read the services from:
// on at the shipped defaults, showing only the public APIs served, its
// stream exempt from the unary calls' deadline; off with
// listen.reflection: false.

func TestReflectionListsThePublicServices(t *testing.T) {
	parallel(t)
	s := startSidecar(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), check.RequestTimeout+30*time.Second)
	defer cancel()
	stream, err := rpb.NewServerReflectionClient(s.conn).ServerReflectionInfo(ctx)
	must(t, err)
	resp, err := ask(stream, &rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}})
	if err != nil {
		t.Fatalf("listing the services: %v", err)
	}
	var names []string
	for _, svc := range resp.GetListServicesResponse().GetService() {
		names = append(names, svc.GetName())
	}
	slices.Sort(names)
	want := []string{
		"envoy.service.auth.v3.Authorization",
		"envoy.service.ratelimit.v3.RateLimitService",
		"grpc.health.v1.Health",
		"grpc.reflection.v1.ServerReflection",
		"grpc.reflection.v1alpha.ServerReflection",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("services %v, want %v", names, want)
	}

	// Waiting on real time: a unary call is ended after RequestTimeout;
	// a reflection stream lasts as long as its caller (grpcurl's
	// session, ghz's start-up) and still answers after it.
	time.Sleep(check.RequestTimeout + time.Second)
	resp, err = ask(stream, &rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: "envoy.service.ratelimit.v3.RateLimitService"}})
	if err != nil {
		t.Fatalf("the reflection stream after %v: %v", check.RequestTimeout+time.Second, err)
	}
	if len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("no file descriptors for RateLimitService: %v", resp)
	}
	must(t, stream.CloseSend())
}

func TestReflectionTurnedOff(t *testing.T) {
	parallel(t)
	// The knob under test: reflection off.
	s := startSidecar(t, "listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0, reflection: false}\n")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := rpb.NewServerReflectionClient(s.conn).ServerReflectionInfo(ctx)
	must(t, err)
	if _, err := ask(stream, &rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("reflection with listen.reflection: false: %v, want Unimplemented", err)
	}
}

// ask sends one request on a reflection stream and reads its answer; a
// stream the server has ended gives its status (Send only says EOF).
func ask(stream rpb.ServerReflection_ServerReflectionInfoClient, req *rpb.ServerReflectionRequest) (*rpb.ServerReflectionResponse, error) {
	if err := stream.Send(req); err != nil {
		_, err = stream.Recv()
		return nil, err
	}
	return stream.Recv()
}
