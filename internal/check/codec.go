package check

import (
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"

	// Registers the "proto" codec this one falls back to.
	_ "google.golang.org/grpc/encoding/proto"
)

// vtMarshaler is the fast marshalling code go-control-plane generates
// (vtprotobuf) beside its messages: no reflection, and the Struct of the
// dynamic metadata encoded by generated code rather than the generic map
// encoder, which profiles showed at ~7% of a Check's CPU.
type vtMarshaler interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict(dAtA []byte) (int, error)
}

// codec is gRPC's proto codec, except that messages with generated
// marshallers use them. Requests are decoded by the standard codec: the
// generated code for Envoy's request types marshals only.
type codec struct {
	std encoding.CodecV2
}

func newCodec() codec { return codec{std: encoding.GetCodecV2("proto")} }

func (codec) Name() string { return "proto" }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(vtMarshaler)
	if !ok {
		return c.std.Marshal(v)
	}
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf := make([]byte, size)
		if _, err := m.MarshalToSizedBufferVTStrict(buf); err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := m.MarshalToSizedBufferVTStrict((*buf)[:size]); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal decodes a request. A CheckRequest that does not decode (a
// string that is not valid UTF-8, which proto3 forbids and older Envoys
// passed through from the client's headers; a Struct nested deeper than
// protobuf's recursion limit of 10,000; malformed bytes) is not an error:
// gRPC would answer Internal, uncounted, and Envoy's failure_mode_allow
// would let the request through. It decodes as the request undecodable
// marks, which Check answers with a 400 and counts.
//
// The rate limit service's requests share the server and this codec: a
// RateLimitRequest that does not decode decodes as one whose descriptors
// are undecodableDescriptors, which UndecodableRateLimitRequest tells
// internal/rls, and which it answers as rls.on_undecodable says.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.std.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	switch req := v.(type) {
	case *authv3.CheckRequest:
		req.Reset()
		req.Attributes = undecodable
		return nil
	case *rlsv3.RateLimitRequest:
		req.Reset()
		req.Descriptors = undecodableDescriptors
		return nil
	}
	return err
}

// undecodable is the Attributes of a CheckRequest that did not decode:
// compared by identity, never read or written.
var undecodable = &authv3.AttributeContext{}

// undecodableDescriptors are the descriptors of a RateLimitRequest that
// did not decode: compared by the identity of their one element, never
// read or written.
var undecodableDescriptors = []*ratelimitv3.RateLimitDescriptor{{}}

// UndecodableRateLimitRequest reports whether req is one the server could
// not decode (see codec.Unmarshal).
func UndecodableRateLimitRequest(req *rlsv3.RateLimitRequest) bool {
	ds := req.GetDescriptors()
	return len(ds) == 1 && ds[0] == undecodableDescriptors[0]
}
