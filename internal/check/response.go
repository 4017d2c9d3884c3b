package check

import (
	"encoding/json"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/quota"
)

// Problem types (RFC 9457) of the bodies the sidecar sends.
const (
	ProblemQuotaExceeded   = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	ProblemReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
	problemBlank           = "about:blank"
	problemContentType     = "application/problem+json"
)

// problem is an RFC 9457 problem detail. Field order is the wire order.
type problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// policyHeader renders one RateLimit-Policy item (draft-ietf-httpapi-
// ratelimit-headers, a structured-field list): `"orders";q=100;w=60`. The
// window is whole seconds, at least 1. Numbers are clamped to what the
// fields allow: q ≥ 0, and none above the largest sf-integer.
func policyHeader(name string, quota int64, window time.Duration) string {
	b := appendSFString(nil, name)
	b = append(b, ";q="...)
	b = appendSFInt(b, quota)
	b = append(b, ";w="...)
	b = appendSFInt(b, ceilSeconds(window))
	return string(b)
}

// rateLimitHeader renders one RateLimit item: `"orders";r=0;t=59`. Like
// policyHeader, it clamps r and t to 0..sfIntMax.
func rateLimitHeader(name string, remaining int64, reset time.Duration) string {
	b := appendSFString(make([]byte, 0, len(name)+24), name)
	b = append(b, ";r="...)
	b = appendSFInt(b, remaining)
	b = append(b, ";t="...)
	b = appendSFInt(b, ceilSecondsMin0(reset))
	return string(b)
}

// sfIntMax is the largest RFC 8941 sf-integer (15 digits).
const sfIntMax = 999_999_999_999_999

// appendSFInt appends v as a non-negative sf-integer, clamped to
// 0..sfIntMax. (Configuration keeps limits far below the top; the clamp
// keeps the rendering valid whatever it is given.)
func appendSFInt(b []byte, v int64) []byte {
	return strconv.AppendInt(b, min(max(v, 0), sfIntMax), 10)
}

// appendSFString appends s as an RFC 8941 sf-string. Policy names are
// restricted to printable ASCII by validation; quotes and backslashes are
// escaped and anything else outside printable ASCII is dropped.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20 && c < 0x7f:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// ceilSeconds rounds d up to whole seconds, at least 1: the form of
// Retry-After and of a window.
func ceilSeconds(d time.Duration) int64 {
	return max(ceilSecondsMin0(d), 1)
}

// ceilSecondsMin0 rounds d up to whole seconds, 0 when d ≤ 0. It divides
// first: d + time.Second - 1 would overflow for d near the largest Duration.
func ceilSecondsMin0(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

func header(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, Value: v},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

func denied(code codes.Code, httpStatus typev3.StatusCode, headers []*corev3.HeaderValueOption, body problem, md *structpb.Struct) *authv3.CheckResponse {
	raw, _ := json.Marshal(body) // a struct of strings and ints cannot fail
	headers = append(headers, header("content-type", problemContentType))
	return &authv3.CheckResponse{
		Status: &status.Status{Code: int32(code), Message: body.Title},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: httpStatus},
			Headers: headers,
			Body:    string(raw),
		}},
		DynamicMetadata: md,
	}
}

// unauthorized is the 401 for a missing or unknown API key.
func unauthorized(detail string) *authv3.CheckResponse {
	return denied(codes.Unauthenticated, typev3.StatusCode_Unauthorized,
		[]*corev3.HeaderValueOption{header("www-authenticate", "ApiKey")},
		problem{Type: problemBlank, Title: "Unauthorized", Status: 401, Detail: detail}, nil)
}

// The dynamic metadata's result values, shared by every response.
var (
	resultOK          = structpb.NewStringValue("ok")
	resultOverLimit   = structpb.NewStringValue("over_limit")
	resultUnavailable = structpb.NewStringValue("unavailable")
)

// metadata is the CheckResponse's dynamic_metadata, for Envoy's access
// logs: result, and client, policy and remaining when known. Client and
// policy values are shared read-only across responses.
func metadata(c *client, p *policy, result *structpb.Value, d *quota.Decision) *structpb.Struct {
	f := metadataFields(c, p, result)
	if d != nil {
		f["remaining"] = structpb.NewNumberValue(float64(max(d.Remaining, 0)))
	}
	return &structpb.Struct{Fields: f}
}

// metadataFields is the metadata map without the remaining count.
func metadataFields(c *client, p *policy, result *structpb.Value) map[string]*structpb.Value {
	f := make(map[string]*structpb.Value, 4)
	f["result"] = result
	if c != nil {
		f["client"] = c.idValue
	}
	if p != nil {
		f["policy"] = p.nameVal
	}
	return f
}
