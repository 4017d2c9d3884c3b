package check

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// JWTAuthnNamespace is where Envoy's jwt_authn filter puts verified JWT
// payloads (payload_in_metadata), and where ext_authz forwards them from
// when metadata_context_namespaces names it.
const JWTAuthnNamespace = "envoy.filters.http.jwt_authn"

// attrs is the view of a CheckRequest a decision needs. Every accessor
// tolerates missing parts: a request with no attributes at all is a request
// with no headers, no path and no peer.
type attrs struct {
	headers   map[string]string // lower-case names, as Envoy sends them
	method    string
	path      string // without the query string
	host      string // lower case, without port
	peer      string // source IP as Envoy saw it
	principal string
	context   map[string]string
	jwt       *structpb.Struct

	payloads []*structpb.Struct // jwt's payloads in name order; set by claim
	sorted   bool               // payloads is set
}

func newAttrs(req *authv3.CheckRequest) attrs {
	a := req.GetAttributes()
	h := a.GetRequest().GetHttp()
	at := attrs{
		headers:   h.GetHeaders(),
		peer:      a.GetSource().GetAddress().GetSocketAddress().GetAddress(),
		principal: a.GetSource().GetPrincipal(),
		context:   a.GetContextExtensions(),
	}
	if len(at.headers) == 0 && h.GetHeaderMap() != nil {
		at.headers = flattenHeaderMap(h)
	}
	at.method = h.GetMethod()
	if at.method == "" {
		at.method = at.headers[":method"]
	}
	path := h.GetPath()
	if path == "" {
		path = at.headers[":path"]
	}
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	at.path = path
	host := h.GetHost()
	if host == "" {
		host = at.headers[":authority"]
	}
	if host == "" {
		host = at.headers["host"]
	}
	at.host = normalizeHost(host)
	if md := a.GetMetadataContext().GetFilterMetadata(); md != nil {
		at.jwt = md[JWTAuthnNamespace]
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

func normalizeHost(host string) string {
	host = strings.ToLower(host)
	if strings.HasPrefix(host, "[") { // [::1]:8080
		if i := strings.IndexByte(host, ']'); i > 0 {
			return host[:i+1]
		}
		return host
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 && strings.IndexByte(host, ':') == i {
		return host[:i]
	}
	return host
}

// claim returns a JWT claim verified by jwt_authn. The namespace holds one
// payload per provider, each under the name set by payload_in_metadata; the
// claim is looked up in each payload in name order, then at the top level.
// Strings, numbers and booleans are claims; objects and lists are not.
// The payloads are sorted once per request, however many claims are read.
func (a *attrs) claim(name string) (string, bool) {
	if a.jwt == nil {
		return "", false
	}
	fields := a.jwt.GetFields()
	if !a.sorted {
		for _, k := range slices.Sorted(maps.Keys(fields)) {
			if payload := fields[k].GetStructValue(); payload != nil {
				a.payloads = append(a.payloads, payload)
			}
		}
		a.sorted = true
	}
	for _, payload := range a.payloads {
		if v, ok := scalar(payload.GetFields()[name]); ok {
			return v, true
		}
	}
	return scalar(fields[name])
}

func scalar(v *structpb.Value) (string, bool) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return k.StringValue, k.StringValue != ""
	case *structpb.Value_NumberValue:
		return strconv.FormatFloat(k.NumberValue, 'f', -1, 64), true
	case *structpb.Value_BoolValue:
		return strconv.FormatBool(k.BoolValue), true
	}
	return "", false
}
