package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
)

// rateLimitRequest builds the RateLimitRequest of `check -rls`: one
// descriptor per argument, each a comma-separated list of key=value
// entries, as Envoy's rate limit filter sends the entries of its actions.
func rateLimitRequest(domain string, hits uint32, args []string) (*rlsv3.RateLimitRequest, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%w: -rls needs at least one descriptor key=value[,key=value]", errUsage)
	}
	req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
	for _, arg := range args {
		d := &ratelimitv3.RateLimitDescriptor{}
		for _, kv := range strings.Split(arg, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("%w: descriptor %q: %q is not key=value", errUsage, arg, kv)
			}
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req, nil
}

// askRLS sends req and prints the answer: exit status 0 when OK, 1 when
// over the limit.
func askRLS(e env, conn *grpc.ClientConn, addr string, timeout time.Duration, verbose bool, req *rlsv3.RateLimitRequest) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if verbose {
		fmt.Fprintf(e.stdout, "request:\n%s\n", protojson.Format(req))
	}
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil {
		return 2, fmt.Errorf("ShouldRateLimit %s: %w", addr, err)
	}
	printRLS(e.stdout, req, resp)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		return 1, nil
	}
	return 0, nil
}

// printRLS writes the answer as Envoy acts on it: the overall code (OK
// lets the request on, OVER_LIMIT is a 429), each descriptor's status,
// the headers and the body.
func printRLS(w io.Writer, req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse) {
	verdict := "OK"
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		verdict = "OVER_LIMIT (Envoy answers 429)"
	}
	fmt.Fprintf(w, "%s, domain %s\n", verdict, req.GetDomain())
	for i, st := range resp.GetStatuses() {
		var entries []string
		if i < len(req.GetDescriptors()) {
			for _, en := range req.GetDescriptors()[i].GetEntries() {
				entries = append(entries, en.GetKey()+"="+en.GetValue())
			}
		}
		fmt.Fprintf(w, "  descriptor %d (%s): %s, %s\n", i, strings.Join(entries, ","), st.GetCode(), describeStatus(st))
	}
	var hs []*corev3.HeaderValueOption
	for _, h := range resp.GetResponseHeadersToAdd() {
		hs = append(hs, &corev3.HeaderValueOption{Header: h})
	}
	printHeaders(w, "response headers", hs)
	if len(resp.GetRawBody()) > 0 {
		fmt.Fprintf(w, "body:\n%s\n", resp.GetRawBody())
	}
}

func describeStatus(st *rlsv3.RateLimitResponse_DescriptorStatus) string {
	l := st.GetCurrentLimit()
	if l == nil {
		if st.GetLimitRemaining() == 1<<32-1 {
			return "unlimited"
		}
		return "no limit applies"
	}
	unit := strings.ToLower(l.GetUnit().String())
	if m := l.GetUnitMultiplier().GetValue(); m > 1 {
		unit = fmt.Sprintf("%d %ss", m, unit)
	}
	s := fmt.Sprintf("limit %d per %s", l.GetRequestsPerUnit(), unit)
	if l.GetName() != "" {
		s += fmt.Sprintf(" (%s)", l.GetName())
	}
	return s + fmt.Sprintf(", %d remaining, resets in %v", st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration().Round(time.Millisecond))
}
