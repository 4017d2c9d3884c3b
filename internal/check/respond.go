package check

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
)

// Every CheckResponse the sidecar sends: the OK of an allowed request, and
// the 401, 429, 500 and 503 of the others. Header values and problem
// bodies come from the engine (render.go), so every door says the same.

// ClientIDHeader carries the verified client id to the upstream. Every
// allowed request without a verified client lists it in headers_to_remove,
// so a caller cannot forge it.
const ClientIDHeader = "x-client-id"

// prerendered holds what every response about a policy, limit or client
// carries, rendered once per configuration: responses share these
// read-only values, indexed by the engine's numbering.
type prerendered struct {
	policyName []*structpb.Value           // by Policy.Index
	policyOpt  []*corev3.HeaderValueOption // ratelimit-policy, by Limit.Index
	clientID   []*corev3.HeaderValueOption // x-client-id, by Client.Index
	clientVal  []*structpb.Value           // by Client.Index
}

func prerender(e *engine.Engine) *prerendered {
	p := &prerendered{policyOpt: make([]*corev3.HeaderValueOption, e.LimitCount())}
	for _, pol := range e.Policies() {
		p.policyName = append(p.policyName, structpb.NewStringValue(pol.Name))
		for _, l := range pol.Limits() {
			p.policyOpt[l.Index] = header("ratelimit-policy", l.Header)
		}
	}
	for _, c := range e.Clients() {
		p.clientID = append(p.clientID, header(ClientIDHeader, c.ID))
		p.clientVal = append(p.clientVal, structpb.NewStringValue(c.ID))
	}
	return p
}

// policy is l's RateLimit-Policy header: the one rendered for its Index,
// or for a limit read from the request (Index -1), its own.
func (p *prerendered) policy(l *engine.Limit) *corev3.HeaderValueOption {
	if l.Index < 0 {
		return header("ratelimit-policy", l.Header)
	}
	return p.policyOpt[l.Index]
}

// statusOK is the gRPC status of every allowed Check, shared read-only.
var statusOK = &status.Status{Code: int32(codes.OK)}

// okParts holds every message of an allowed CheckResponse, so building one
// costs one allocation (and the metadata map). The messages are never
// copied: only pointers into this struct escape.
type okParts struct {
	resp    authv3.CheckResponse
	http    authv3.CheckResponse_OkResponse
	ok      authv3.OkHttpResponse
	addBuf  [2]*corev3.HeaderValueOption
	setBuf  [1]*corev3.HeaderValueOption
	rmBuf   [2]string
	rl      corev3.HeaderValueOption
	rlValue corev3.HeaderValue
	md      structpb.Struct
	rem     structpb.Value
	remNum  structpb.Value_NumberValue
}

// allow builds the OK: RateLimit headers for the most constrained enforcing
// policy, the client id for the upstream, the credential stripped.
func (p *prerendered) allow(v *engine.Verdict, cfg *config.Config) *authv3.CheckResponse {
	// Every part of the answer lives in one allocation: an allowed Check
	// is the hot path, and a dozen small objects per call showed up as
	// garbage-collection time under load.
	o := &okParts{}
	ok := &o.ok
	t := v.Tightest()
	if t != nil {
		d := &t.Decision
		o.rlValue = corev3.HeaderValue{Key: "ratelimit", Value: engine.RateLimitHeader(t.Policy.Name, d.Remaining, d.ResetAfter)}
		o.rl = corev3.HeaderValueOption{Header: &o.rlValue, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
		ok.ResponseHeadersToAdd = append(o.addBuf[:0], p.policy(&t.Limit), &o.rl)
		if cfg.Headers.Legacy {
			ok.ResponseHeadersToAdd = append(ok.ResponseHeadersToAdd, headers(engine.LegacyHeaders(d.Limit, d.Remaining, d.ResetAfter))...)
		}
	}
	if c := v.Client; c != nil {
		ok.Headers = append(o.setBuf[:0], p.clientID[c.Index])
	} else {
		// Removed whether or not this request carried it: the sidecar
		// may not see every header the proxy forwards (an Envoy
		// allowed_headers list, a header added after ext_authz), and the
		// upstream must never trust an x-client-id nobody verified.
		ok.HeadersToRemove = append(o.rmBuf[:0], ClientIDHeader)
	}
	if v.CredHeader != "" && cfg.Clients.Strip {
		if ok.HeadersToRemove == nil {
			ok.HeadersToRemove = o.rmBuf[:0]
		}
		ok.HeadersToRemove = append(ok.HeadersToRemove, v.CredHeader)
		if v.AlsoCredHeader != "" {
			ok.HeadersToRemove = append(ok.HeadersToRemove, v.AlsoCredHeader)
		}
	}
	o.http.OkResponse = ok
	o.resp.Status = statusOK
	o.resp.HttpResponse = &o.http
	o.md.Fields = p.metadataFields(v, t, resultOK)
	if t != nil {
		o.remNum.NumberValue = float64(max(t.Decision.Remaining, 0))
		o.rem.Kind = &o.remNum
		o.md.Fields["remaining"] = &o.rem
	}
	o.resp.DynamicMetadata = &o.md
	return &o.resp
}

// The gRPC status and Envoy HTTP status of each denial.
var denialCodes = map[engine.Outcome]struct {
	grpc codes.Code
	http typev3.StatusCode
}{
	engine.Unauthorized: {codes.Unauthenticated, typev3.StatusCode_Unauthorized},
	engine.OverLimit:    {codes.ResourceExhausted, typev3.StatusCode_TooManyRequests},
	engine.Unavailable:  {codes.Unavailable, typev3.StatusCode_ServiceUnavailable},
	engine.Failed:       {codes.Internal, typev3.StatusCode_InternalServerError},
}

// deny builds the CheckResponse of a verdict that is not OK: a 429 with
// Retry-After and the RateLimit headers of the policy with the longest
// wait; a 503 for on_redis_error: deny; a 401; or a 500. Each carries a
// problem+json body, and, but for the 401 and the 500, dynamic metadata.
func (p *prerendered) deny(v *engine.Verdict, cfg *config.Config) *authv3.CheckResponse {
	d := v.Deny(cfg.Headers.Legacy)
	codes := denialCodes[v.Outcome]
	hs := append(headers(d.Headers), header("content-type", engine.ProblemContentType))
	var md *structpb.Struct
	switch v.Outcome {
	case engine.OverLimit:
		worst := described(v)
		md = &structpb.Struct{Fields: p.metadataFields(v, worst, resultOverLimit)}
		md.Fields["remaining"] = structpb.NewNumberValue(float64(max(worst.Decision.Remaining, 0)))
	case engine.Unavailable:
		md = &structpb.Struct{Fields: p.metadataFields(v, described(v), resultUnavailable)}
	}
	return &authv3.CheckResponse{
		Status: &status.Status{Code: int32(codes.grpc), Message: d.Problem.Title},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: codes.http},
			Headers: hs,
			Body:    d.Problem.JSON(),
		}},
		DynamicMetadata: md,
	}
}

// undecodableResponse answers a CheckRequest that did not decode (see
// codec.Unmarshal): a 400 whatever the policies, since nothing of the
// request can be read. Shared read-only by every such answer.
var undecodableResponse = &authv3.CheckResponse{
	Status: &status.Status{Code: int32(codes.InvalidArgument), Message: "Bad Request"},
	HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode_BadRequest},
		Headers: []*corev3.HeaderValueOption{header("content-type", engine.ProblemContentType)},
		Body: engine.Problem{Type: "about:blank", Title: "Bad Request", Status: 400,
			Detail: "The request's attributes could not be decoded: a header or other string that is not valid UTF-8, a message nested too deeply, or malformed protobuf."}.JSON(),
	}},
}

// described is the policy a response describes in its headers and
// dynamic metadata: an allowed request's tightest enforcing policy, a
// 429's with the longest wait, a 503's first enforcing policy Redis
// failed for. Nil when none (and for a 401 or a 500).
func described(v *engine.Verdict) *engine.Taken {
	switch v.Outcome {
	case engine.OK:
		return v.Tightest()
	case engine.OverLimit:
		worst, _ := v.Denials()
		return worst
	case engine.Unavailable:
		takes := v.Takes()
		for i := range takes {
			if t := &takes[i]; !t.OK && !t.Policy.Shadow {
				return t
			}
		}
	}
	return nil
}

// reported is what a response's dynamic metadata says of v, for the span
// and the decision log: the client and the policy it names ("" when it
// names none) and that policy's remaining count (0 when it gives none).
func reported(v *engine.Verdict) (client, policy string, remaining int64) {
	switch v.Outcome {
	case engine.OK, engine.OverLimit, engine.Unavailable:
	default:
		return "", "", 0 // a 401, a 500 or a canceled Check carries no metadata
	}
	if v.Client != nil {
		client = v.Client.ID
	}
	if t := described(v); t != nil {
		policy = t.Policy.Name
		if v.Outcome != engine.Unavailable {
			remaining = max(t.Decision.Remaining, 0)
		}
	}
	return client, policy, remaining
}

// The dynamic metadata's result values, shared by every response.
var (
	resultOK          = structpb.NewStringValue("ok")
	resultOverLimit   = structpb.NewStringValue("over_limit")
	resultUnavailable = structpb.NewStringValue("unavailable")
)

// metadataFields is the CheckResponse's dynamic_metadata for Envoy's
// access logs, but for the remaining count: result, and client and policy
// when known. Client and policy values are shared read-only across
// responses.
func (p *prerendered) metadataFields(v *engine.Verdict, t *engine.Taken, result *structpb.Value) map[string]*structpb.Value {
	f := make(map[string]*structpb.Value, 4)
	f["result"] = result
	if v.Client != nil {
		f["client"] = p.clientVal[v.Client.Index]
	}
	if t != nil {
		f["policy"] = p.policyName[t.Policy.Index]
	}
	return f
}

func header(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, Value: v},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

func headers(kvs [][2]string) []*corev3.HeaderValueOption {
	out := make([]*corev3.HeaderValueOption, len(kvs))
	for i, kv := range kvs {
		out[i] = header(kv[0], kv[1])
	}
	return out
}
