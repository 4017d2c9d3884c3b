package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"

	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/internal/gctune"
)

// noop is the ceiling: an Authorization server that answers OK to every
// Check without looking at it, with the same gRPC server options as the
// sidecar (check.ServerOptions). Whatever it cannot exceed, extauthz cannot either.
type noop struct {
	authv3.UnimplementedAuthorizationServer
}

var okResponse = &authv3.CheckResponse{
	Status:       &status.Status{Code: 0},
	HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}},
}

func (noop) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return okResponse, nil
}

// noopRLS is the ceiling of the rate limit service rows: it answers OK to
// every ShouldRateLimit without looking at it (no statuses, no headers),
// in the same process and with the same settings as noop.
type noopRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

var rlsOK = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}

func (noopRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return rlsOK, nil
}

// serveNoop runs the no-op server on 127.0.0.1 with a kernel-chosen port and
// logs "serving" like the sidecar, until SIGTERM.
func serveNoop() {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gctune.Apply() // the sidecar's runtime settings, as its transport's
	s := grpc.NewServer(check.ServerOptions()...)
	authv3.RegisterAuthorizationServer(s, noop{})
	rlsv3.RegisterRateLimitServiceServer(s, noopRLS{})
	slog.New(slog.NewJSONHandler(os.Stderr, nil)).Info("serving", "grpc", lis.Addr().String(), "admin", "")
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		s.Stop()
	}()
	s.Serve(lis)
}

// serveNoopHTTP is the HTTP door's ceiling: an HTTP server that answers
// 200 to every request without looking at it, with the sidecar's server
// settings (internal/sidecar/sidecar.go) and runtime settings. It logs
// "serving" like the sidecar, with its address as "http", until SIGTERM.
func serveNoopHTTP() {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gctune.Apply()
	s := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }),
		IdleTimeout:       5 * time.Minute,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    http.DefaultMaxHeaderBytes,
	}
	slog.New(slog.NewJSONHandler(os.Stderr, nil)).Info("serving", "grpc", "", "http", lis.Addr().String(), "admin", "")
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		s.Close()
	}()
	s.Serve(lis)
}
