package loadgen

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

func header(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: v}}
}

func denied(grpcCode int32, httpCode typev3.StatusCode) *authv3.CheckResponse {
	return &authv3.CheckResponse{
		Status: &status.Status{Code: grpcCode, Message: "over limit"},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: httpCode},
			Headers: []*corev3.HeaderValueOption{header("retry-after", "12"), header("ratelimit", `"orders";r=0;t=12`)},
			Body:    `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","status":429}`,
		}},
	}
}

// The lean decoder yields the HTTP status a full decode yields, for every
// shape of response a Check server sends.
func TestStatusCodecAgreesWithFullDecode(t *testing.T) {
	md, _ := structpb.NewStruct(map[string]any{"client": "ada", "policy": "orders", "remaining": 99.0})
	cases := map[string]*authv3.CheckResponse{
		"empty": {},
		"ok": {
			Status: &status.Status{},
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
				Headers:              []*corev3.HeaderValueOption{header("x-client-id", "ada")},
				HeadersToRemove:      []string{"x-api-key"},
				ResponseHeadersToAdd: []*corev3.HeaderValueOption{header("ratelimit-policy", `"orders";q=100;w=60`)},
			}},
			DynamicMetadata: md,
		},
		"429":              denied(8, typev3.StatusCode_TooManyRequests),
		"401":              denied(16, typev3.StatusCode_Unauthorized),
		"503":              denied(14, typev3.StatusCode_ServiceUnavailable),
		"denied, no http":  {Status: &status.Status{Code: 7}},
		"denied, no code":  {Status: &status.Status{Code: 7}, HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{}}},
		"error response":   {Status: &status.Status{Code: 13}, HttpResponse: &authv3.CheckResponse_ErrorResponse{ErrorResponse: &authv3.DeniedHttpResponse{Status: &typev3.HttpStatus{Code: 500}}}},
		"ok with metadata": {Status: &status.Status{}, DynamicMetadata: md},
	}
	c := newStatusCodec()
	for name, full := range cases {
		b, err := proto.Marshal(full)
		if err != nil {
			t.Fatal(err)
		}
		// Split the bytes in two buffers as well, as gRPC may hand them over.
		half := len(b) / 2
		for _, data := range []mem.BufferSlice{
			{mem.SliceBuffer(b)},
			{mem.SliceBuffer(b[:half]), mem.SliceBuffer(b[half:])},
		} {
			var lean authv3.CheckResponse
			if err := c.Unmarshal(data, &lean); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got, want := HTTPStatus(&lean), HTTPStatus(full); got != want {
				t.Errorf("%s: lean decode says %d, full decode %d", name, got, want)
			}
		}
	}
}

// For the rate limit service, the lean decoder reads the overall code a
// full decode reads, whatever else the answer carries.
func TestStatusCodecReadsRateLimitCode(t *testing.T) {
	c := newStatusCodec()
	for _, full := range []*rlsv3.RateLimitResponse{
		{},
		{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 7}}},
		{
			OverallCode:          rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT}},
			ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "retry-after", Value: "3"}},
			RawBody:              []byte(`{"status":429}`),
		},
	} {
		b, err := proto.Marshal(full)
		if err != nil {
			t.Fatal(err)
		}
		var lean rlsv3.RateLimitResponse
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &lean); err != nil || lean.GetOverallCode() != full.GetOverallCode() {
			t.Fatalf("%v: lean decode %v, %v", full, lean.GetOverallCode(), err)
		}
	}
}

// Truncated or corrupt bytes are an error, never a panic or a made-up
// status.
func TestStatusCodecRefusesBrokenBytes(t *testing.T) {
	b, err := proto.Marshal(denied(8, typev3.StatusCode_TooManyRequests))
	if err != nil {
		t.Fatal(err)
	}
	c := newStatusCodec()
	for i := 1; i < len(b); i++ {
		var resp authv3.CheckResponse
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b[:i])}, &resp); err == nil {
			// A prefix can be a complete message (a cut between fields):
			// then it must decode as the full decoder decodes it.
			var full authv3.CheckResponse
			if err := proto.Unmarshal(b[:i], &full); err != nil {
				t.Fatalf("prefix %d: lean decode accepted what proto refuses: %v", i, err)
			}
			if HTTPStatus(&resp) != HTTPStatus(&full) {
				t.Fatalf("prefix %d: lean %d, full %d", i, HTTPStatus(&resp), HTTPStatus(&full))
			}
		}
	}
	// Field 1 as a varint where a message belongs.
	var resp authv3.CheckResponse
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x08, 0x01})}, &resp); err == nil {
		t.Fatal("a varint status was accepted")
	}
}

// The codec decodes nothing but the status: zero allocations beyond the
// two small messages it fills.
func BenchmarkStatusCodec(b *testing.B) {
	md, _ := structpb.NewStruct(map[string]any{"client": "ada", "policy": "orders", "remaining": 99.0, "result": "allowed"})
	full := &authv3.CheckResponse{
		Status: &status.Status{},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
			Headers:              []*corev3.HeaderValueOption{header("x-client-id", "ada")},
			HeadersToRemove:      []string{"x-api-key"},
			ResponseHeadersToAdd: []*corev3.HeaderValueOption{header("ratelimit-policy", `"orders";q=100;w=60`), header("ratelimit", `"orders";r=99;t=1`)},
		}},
		DynamicMetadata: md,
	}
	data, _ := proto.Marshal(full)
	c := newStatusCodec()
	b.Run("lean", func(b *testing.B) {
		for b.Loop() {
			var resp authv3.CheckResponse
			c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, &resp)
		}
	})
	b.Run("full", func(b *testing.B) {
		for b.Loop() {
			var resp authv3.CheckResponse
			proto.Unmarshal(data, &resp)
		}
	})
}
