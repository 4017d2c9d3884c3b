package tests

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	rpbalpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"

	"github.com/extauthz/extauthz/internal/check"
)

// gRPC server reflection, which grpcurl and ghz read the services from:
// on at the shipped defaults, showing only the public APIs served, its
// stream exempt from the unary calls' deadline, in both of the protocol's
// versions (v1, and v1alpha, which older grpcurl and ghz builds speak);
// off with listen.reflection: false.

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
		"envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
		"envoy.service.ratelimit.v3.RateLimitService",
		"grpc.health.v1.Health",
		"grpc.reflection.v1.ServerReflection",
		"grpc.reflection.v1alpha.ServerReflection",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("services %v, want %v", names, want)
	}
	alpha, err := rpbalpha.NewServerReflectionClient(s.conn).ServerReflectionInfo(ctx)
	must(t, err)
	aresp, err := askAlpha(alpha, &rpbalpha.ServerReflectionRequest{MessageRequest: &rpbalpha.ServerReflectionRequest_ListServices{}})
	if err != nil {
		t.Fatalf("listing the services over v1alpha: %v", err)
	}
	if n := len(aresp.GetListServicesResponse().GetService()); n != len(want) {
		t.Fatalf("v1alpha lists %d services, want the %d v1 lists", n, len(want))
	}

	// Waiting on real time: a unary call is ended after RequestTimeout;
	// a reflection stream, of either version, lasts as long as its caller
	// (grpcurl's session, ghz's start-up) and still answers after it.
	time.Sleep(check.RequestTimeout + time.Second)
	const symbol = "envoy.service.ratelimit.v3.RateLimitService"
	resp, err = ask(stream, &rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: symbol}})
	if err != nil {
		t.Fatalf("the v1 reflection stream after %v: %v", check.RequestTimeout+time.Second, err)
	}
	if len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("no file descriptors for RateLimitService over v1: %v", resp)
	}
	aresp, err = askAlpha(alpha, &rpbalpha.ServerReflectionRequest{MessageRequest: &rpbalpha.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: symbol}})
	if err != nil {
		t.Fatalf("the v1alpha reflection stream after %v: %v", check.RequestTimeout+time.Second, err)
	}
	if len(aresp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("no file descriptors for RateLimitService over v1alpha: %v", aresp)
	}
	must(t, stream.CloseSend())
	must(t, alpha.CloseSend())
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

// askAlpha is ask over the v1alpha protocol.
func askAlpha(stream rpbalpha.ServerReflection_ServerReflectionInfoClient, req *rpbalpha.ServerReflectionRequest) (*rpbalpha.ServerReflectionResponse, error) {
	if err := stream.Send(req); err != nil {
		_, err = stream.Recv()
		return nil, err
	}
	return stream.Recv()
}
