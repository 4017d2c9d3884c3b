package check

import (
	"net"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/extauthz/extauthz/internal/engine"
)

// JWTAuthnNamespace is where Envoy's jwt_authn filter puts verified JWT
// payloads (payload_in_metadata), and where ext_authz forwards them from
// when metadata_context_namespaces names it.
const JWTAuthnNamespace = "envoy.filters.http.jwt_authn"

// newRequest reads what a decision needs of a CheckRequest. Envoy sends
// the headers as a map, or as header_map when encode_raw_headers is set;
// the method, path and host both as fields and as pseudo-headers.
func newRequest(req *authv3.CheckRequest) engine.Request {
	a := req.GetAttributes()
	h := a.GetRequest().GetHttp()
	at := engine.Request{
		Headers:   h.GetHeaders(),
		Peer:      a.GetSource().GetAddress().GetSocketAddress().GetAddress(),
		Principal: a.GetSource().GetPrincipal(),
		Context:   a.GetContextExtensions(),
	}
	if len(at.Headers) == 0 && h.GetHeaderMap() != nil {
		at.Headers = flattenHeaderMap(h)
	}
	at.Method = h.GetMethod()
	if at.Method == "" {
		at.Method = at.Headers[":method"]
	}
	path := h.GetPath()
	if path == "" {
		path = at.Headers[":path"]
	}
	// Normalised as the HTTP door normalises a raw URI: Envoy's own
	// normalisation is configuration (on in envoy/, off by default in
	// Istio), and a policy must not be dodged by //orders or /%6Frders.
	at.Path = engine.NormalizePath(path)
	host := h.GetHost()
	if host == "" {
		host = at.Headers[":authority"]
	}
	if host == "" {
		host = at.Headers["host"]
	}
	at.Host = engine.NormalizeHost(host)
	if md := a.GetMetadataContext().GetFilterMetadata(); md != nil {
		at.JWT = md[JWTAuthnNamespace]
		at.Metadata = md
	}
	return at
}

// flattenHeaderMap turns the header_map form (sent when Envoy's
// encode_raw_headers is set) into the map form, joining repeated headers
// with commas as Envoy does for the map. Repeats are collected and joined
// once, in time linear in the request: joining each onto the previous join
// would copy O(n²) bytes for a name repeated n times.
func flattenHeaderMap(h *authv3.AttributeContext_HttpRequest) map[string]string {
	m := make(map[string]string, len(h.GetHeaderMap().GetHeaders()))
	var repeats map[string][]string // every value of a repeated name, in order
	for _, hv := range h.GetHeaderMap().GetHeaders() {
		k := strings.ToLower(hv.GetKey())
		v := hv.GetValue()
		if v == "" && len(hv.GetRawValue()) > 0 {
			v = string(hv.GetRawValue())
		}
		prev, seen := m[k]
		if !seen {
			m[k] = v
			continue
		}
		if repeats == nil {
			repeats = map[string][]string{}
		}
		if repeats[k] == nil {
			repeats[k] = []string{prev}
		}
		repeats[k] = append(repeats[k], v)
	}
	for k, vs := range repeats {
		m[k] = strings.Join(vs, ",")
	}
	return m
}

// RequestSpec describes an HTTP request for NewRequest.
type RequestSpec struct {
	Method  string
	Path    string            // with any query string
	Host    string            // :authority; "localhost" when empty
	Headers map[string]string // names are lower-cased as Envoy does
	Source  string            // peer IP; 127.0.0.1 when empty
	Context map[string]string // per-route context_extensions
	ID      string            // request id; generated from the time when empty
	Time    time.Time         // request time; now when zero
}

// NewRequest builds the CheckRequest Envoy's ext_authz HTTP filter would
// send for spec: peer addresses, request time, and the HTTP attributes with
// the pseudo-headers in the header map. `extauthz check` uses it.
func NewRequest(spec RequestSpec) *authv3.CheckRequest {
	if spec.Time.IsZero() {
		spec.Time = time.Now()
	}
	if spec.Host == "" {
		spec.Host = "localhost"
	}
	if spec.Source == "" {
		spec.Source = "127.0.0.1"
	}
	if spec.ID == "" {
		spec.ID = strconv.FormatInt(spec.Time.UnixNano(), 10)
	}
	method := strings.ToUpper(spec.Method)
	headers := map[string]string{
		":authority":   spec.Host,
		":method":      method,
		":path":        spec.Path,
		":scheme":      "http",
		"x-request-id": spec.ID,
	}
	for k, v := range spec.Headers {
		k = strings.ToLower(k)
		if prev, ok := headers[k]; ok && !strings.HasPrefix(k, ":") {
			v = prev + "," + v // Envoy joins repeated headers
		}
		headers[k] = v
	}
	_, query, _ := strings.Cut(spec.Path, "?")
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source:      &authv3.AttributeContext_Peer{Address: socketAddress(spec.Source, 50000)},
		Destination: &authv3.AttributeContext_Peer{Address: socketAddress("127.0.0.1", 8080)},
		Request: &authv3.AttributeContext_Request{
			Time: timestamppb.New(spec.Time),
			Http: &authv3.AttributeContext_HttpRequest{
				Id:       spec.ID,
				Method:   method,
				Headers:  headers,
				Path:     spec.Path,
				Host:     spec.Host,
				Scheme:   "http",
				Query:    query,
				Protocol: "HTTP/1.1",
			},
		},
		ContextExtensions: spec.Context,
	}}
}

func socketAddress(ip string, port uint32) *corev3.Address {
	if h, p, err := net.SplitHostPort(ip); err == nil {
		ip = h
		if n, err := strconv.ParseUint(p, 10, 32); err == nil {
			port = uint32(n)
		}
	}
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       ip,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}
