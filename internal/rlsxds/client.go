// Package rlsxds takes the rate limit service's descriptors over xDS, as
// envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW and as Envoy
// Gateway serves them: a State of the World subscription on the
// aggregated stream (ADS) for
// type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig,
// keyed by the node id, through go-control-plane's client
// (pkg/client/sotw/v3).
//
// Each update is converted to the descriptor language (internal/rlsconfig
// checks it as it checks files) and handed to Apply, which swaps it in
// whole or refuses it: a refused update is NACKed with the error, and the
// running descriptors stay. The stream is reconnected after any failure
// with a growing, jittered wait; the running descriptors stay while the
// server is away. TLS is the caller's (internal/certfile reads rotated
// certificates at each handshake).
package rlsxds

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// TypeURL is the resource type subscribed to.
const TypeURL = resourcev3.RateLimitConfigType

// Options configure a subscription.
type Options struct {
	ServerURL    string // host:port
	NodeID       string
	NodeMetadata map[string]string
	Headers      map[string]string // gRPC metadata on the stream
	TLS          *tls.Config       // nil: plaintext
	// Reconnection waits: the first, the longest, the growth per
	// attempt (below 1, every wait is the first, as the anchor's
	// backoff library makes it), and whether each is jittered.
	BackoffInitial, BackoffMax time.Duration
	BackoffFactor              float64
	Jitter                     bool
	MaxMsgSize                 int // 0: gRPC's default
	Log                        *slog.Logger
	// Apply checks an update and makes it the running one; an error
	// refuses it (NACK), keeping what runs.
	Apply func(*Set) error
}

// Run subscribes until ctx ends.
func Run(ctx context.Context, o Options) {
	node := &corev3.Node{Id: o.NodeID, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{}}}
	for k, v := range o.NodeMetadata {
		node.Metadata.Fields[k] = structpb.NewStringValue(v)
	}
	if len(o.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(o.Headers))
	}
	attempt := 0
	for ctx.Err() == nil {
		got, err := session(ctx, o, node)
		if ctx.Err() != nil {
			return
		}
		if got {
			attempt = 0 // the server answered: start the waits over
		}
		wait := o.backoff(attempt)
		attempt++
		o.Log.Warn("xds: the configuration server is unavailable; keeping the running descriptors, reconnecting", "server", o.ServerURL, "error", err.Error(), "retry_in", wait.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// backoff is the wait before reconnection attempt n (from 0).
func (o Options) backoff(n int) time.Duration {
	d := float64(o.BackoffInitial)
	if o.BackoffFactor > 1 {
		d *= math.Pow(o.BackoffFactor, float64(n))
	}
	d = min(d, float64(o.BackoffMax))
	if o.Jitter && d > float64(o.BackoffInitial) {
		d = float64(o.BackoffInitial) + rand.Float64()*(d-float64(o.BackoffInitial))
	}
	return time.Duration(d)
}

// session is one connection's subscription: it returns when the stream
// fails, saying whether the server sent anything.
func session(ctx context.Context, o Options, node *corev3.Node) (got bool, err error) {
	creds := insecure.NewCredentials()
	if o.TLS != nil {
		creds = credentials.NewTLS(o.TLS)
	}
	dial := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if o.MaxMsgSize > 0 {
		dial = append(dial, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.MaxMsgSize)))
	}
	conn, err := grpc.NewClient(o.ServerURL, dial...)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := sotw.NewADSClient(sctx, node, TypeURL)
	// A server that cannot be reached fails the stream at once, and Run
	// waits before the next attempt.
	if err := client.InitConnect(conn); err != nil {
		return false, err
	}
	o.Log.Info("xds: subscribed", "server", o.ServerURL, "node", o.NodeID, "type", TypeURL)
	for {
		resp, err := client.Fetch()
		if err != nil {
			return got, err
		}
		got = true
		set, err := decode(resp)
		if err == nil {
			err = o.Apply(set)
		}
		if err != nil {
			o.Log.Error("xds: update refused (NACK); keeping the running descriptors", "error", err.Error())
			if err := client.Nack(err.Error()); err != nil {
				return got, err
			}
			continue
		}
		if err := client.Ack(); err != nil {
			return got, err
		}
	}
}

// decode unpacks an update's resources.
func decode(resp *sotw.Response) (*Set, error) {
	cfgs := make([]*rlsconfv3.RateLimitConfig, 0, len(resp.Resources))
	for i, r := range resp.Resources {
		c := &rlsconfv3.RateLimitConfig{}
		if err := r.UnmarshalTo(c); err != nil {
			return nil, fmt.Errorf("xds: resources[%d] (%s): %w", i, r.GetTypeUrl(), err)
		}
		cfgs = append(cfgs, c)
	}
	return newSet("", cfgs)
}
