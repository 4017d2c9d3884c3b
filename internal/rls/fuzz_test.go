package rls

import (
	"context"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// FuzzShouldRateLimit: whatever bytes arrive as a RateLimitRequest, the
// door never panics; it answers one status per descriptor, or refuses the
// request with InvalidArgument; and every partition key it builds stays
// short whatever the entries hold.
func FuzzShouldRateLimit(f *testing.F) {
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "sms", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("kind", "promo", "phone", "1"), desc("phone", "1")}},
		{Domain: "wildcards", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("route", "/v1/a/items/b/price")}, HitsAddend: 5},
		{Domain: "upgrades", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("area", "reports", "account", "carol"), desc("plan", "premium", "account", "carol")}},
		{Domain: "detailed", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("device", "\x00:{}%é")}},
		{Domain: "downloads", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("object", "reports/x")}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	fx := newFixture(f, "", example("02_nested"), example("07_replaces"), example("08_detailed"), example("09_wildcards"), example("11_share_threshold"))
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &rlsv3.RateLimitRequest{}
		if proto.Unmarshal(data, req) != nil {
			return
		}
		resp, err := fx.srv.ShouldRateLimit(context.Background(), req)
		if err != nil {
			if s, _ := grpcstatus.FromError(err); s.Code() != codes.InvalidArgument {
				t.Fatalf("error %v", err)
			}
			return
		}
		if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
		}
		for _, d := range req.GetDescriptors() {
			// Each entry adds its key and value, escaped, at most 3 × 128
			// bytes each and a digest beyond that: 16 entries and the
			// domain stay within 16 × (2 × 384 + 2) + 384 + 4.
			if k := partition(req.GetDomain(), d.GetEntries(), nil); len(k) > 16*(2*384+2)+384+4 {
				t.Fatalf("a key of %d bytes", len(k))
			}
		}
	})
}
