package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/sidecar"
)

func init() {
	register(command{
		name: "check",
		usage: "[-addr A] [-H 'name: value']... [-source IP] [-host H] [-context k=v]... [-cacert F [-cert F -key F]] METHOD PATH\n" +
			"       extauthz check -rls DOMAIN [-hits N] [-addr A] [-cacert F [-cert F -key F]] key=value[,key=value]...",
		short: "send one CheckRequest (or, with -rls, one ShouldRateLimit) as Envoy does and print the decision",
		run:   runCheck,
	})
}

// repeated collects a flag given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ", ") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

func runCheck(e env, args []string) (int, error) {
	fs := newFlags("check", e)
	addr := fs.String("addr", config.DefaultGRPC, "sidecar gRPC address (host:port or unix:///path)")
	source := fs.String("source", "127.0.0.1", "client (peer) IP address Envoy saw")
	host := fs.String("host", "localhost", "request host (:authority)")
	timeout := fs.Duration("timeout", 2*time.Second, "give up after this long")
	verbose := fs.Bool("v", false, "also print the CheckRequest and the dynamic metadata as JSON")
	caFile := fs.String("cacert", "", "connect with TLS, trusting the CAs in this PEM file")
	certFile := fs.String("cert", "", "client certificate (PEM) for mTLS; with -key")
	keyFile := fs.String("key", "", "client key (PEM) for mTLS; with -cert")
	rlsDomain := fs.String("rls", "", "ask Envoy's rate limit service for this domain instead: each argument is a descriptor key=value[,key=value]")
	hits := fs.Uint("hits", 0, "with -rls, the request's hits_addend (0: one hit)")
	var headers, contexts repeated
	fs.Var(&headers, "H", "request header 'name: value' (repeatable)")
	fs.Var(&contexts, "context", "per-route context extension key=value (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	if *rlsDomain != "" {
		if *hits > math.MaxUint32 {
			return 2, fmt.Errorf("%w: -hits %d is more than the protocol carries (%d)", errUsage, *hits, uint32(math.MaxUint32))
		}
		req, err := rateLimitRequest(*rlsDomain, uint32(*hits), fs.Args())
		if err != nil {
			return 2, err
		}
		conn, err := dial(*addr, *caFile, *certFile, *keyFile)
		if err != nil {
			return 2, err
		}
		defer conn.Close()
		return askRLS(e, conn, *addr, *timeout, *verbose, req)
	}
	if fs.NArg() != 2 {
		return 2, fmt.Errorf("%w: need METHOD and PATH", errUsage)
	}
	spec := check.RequestSpec{
		Method: fs.Arg(0), Path: fs.Arg(1), Host: *host, Source: *source,
		Headers: map[string]string{}, Context: map[string]string{},
	}
	if !strings.HasPrefix(spec.Path, "/") {
		return 2, fmt.Errorf("%w: PATH %q must start with /", errUsage, spec.Path)
	}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return 2, fmt.Errorf("%w: -H %q is not 'name: value'", errUsage, h)
		}
		name = strings.ToLower(strings.TrimSpace(name))
		value = strings.TrimSpace(value)
		if prev, ok := spec.Headers[name]; ok {
			value = prev + "," + value
		}
		spec.Headers[name] = value
	}
	for _, c := range contexts {
		k, v, ok := strings.Cut(c, "=")
		if !ok || k == "" {
			return 2, fmt.Errorf("%w: -context %q is not key=value", errUsage, c)
		}
		spec.Context[k] = v
	}
	req := check.NewRequest(spec)

	conn, err := dial(*addr, *caFile, *certFile, *keyFile)
	if err != nil {
		return 2, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if *verbose {
		fmt.Fprintf(e.stdout, "request:\n%s\n", protojson.Format(req))
	}
	resp, err := authv3.NewAuthorizationClient(conn).Check(ctx, req)
	if err != nil {
		return 2, fmt.Errorf("Check %s: %w", *addr, err)
	}
	allowed := printDecision(e, resp)
	if *verbose && resp.GetDynamicMetadata() != nil {
		fmt.Fprintf(e.stdout, "dynamic metadata:\n%s\n", protojson.Format(resp.GetDynamicMetadata()))
	}
	if !allowed {
		return 1, nil
	}
	return 0, nil
}

// dial connects to the sidecar at addr (host:port or unix:///path), over
// TLS when a CA or a client certificate is given.
func dial(addr, caFile, certFile, keyFile string) (*grpc.ClientConn, error) {
	target := addr
	if !strings.HasPrefix(target, "unix://") {
		target = "passthrough:///" + target
	}
	creds := insecure.NewCredentials()
	if caFile != "" || certFile != "" {
		tc, err := sidecar.ClientTLS(&config.ClientTLS{CAFile: caFile, CertFile: certFile, KeyFile: keyFile})
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	return grpc.NewClient(target, grpc.WithTransportCredentials(creds))
}

// printDecision writes the decision as Envoy would act on it and reports
// whether the request was allowed.
func printDecision(e env, resp *authv3.CheckResponse) bool {
	w := e.stdout
	code := codes.Code(resp.GetStatus().GetCode())
	if ok := resp.GetOkResponse(); code == codes.OK {
		fmt.Fprintf(w, "ALLOWED (grpc %s)\n", code)
		printHeaders(w, "response headers added", ok.GetResponseHeadersToAdd())
		printHeaders(w, "upstream headers set", ok.GetHeaders())
		if len(ok.GetHeadersToRemove()) > 0 {
			fmt.Fprintf(w, "upstream headers removed: %s\n", strings.Join(ok.GetHeadersToRemove(), ", "))
		}
		return true
	}
	d := resp.GetDeniedResponse()
	st := int(d.GetStatus().GetCode())
	if st == 0 {
		st = http.StatusForbidden // Envoy's default for a denial
	}
	fmt.Fprintf(w, "DENIED %d %s (grpc %s)\n", st, http.StatusText(st), code)
	printHeaders(w, "headers", d.GetHeaders())
	if d.GetBody() != "" {
		fmt.Fprintf(w, "body:\n%s\n", d.GetBody())
	}
	return false
}

func printHeaders(w io.Writer, title string, hs []*corev3.HeaderValueOption) {
	if len(hs) == 0 {
		return
	}
	lines := make([]string, 0, len(hs))
	for _, h := range hs {
		lines = append(lines, fmt.Sprintf("  %s: %s", h.GetHeader().GetKey(), h.GetHeader().GetValue()))
	}
	sort.Strings(lines)
	fmt.Fprintf(w, "%s:\n%s\n", title, strings.Join(lines, "\n"))
}
