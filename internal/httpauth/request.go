package httpauth

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/extauthz/extauthz/internal/engine"
)

// How each proxy tells the original request, chosen by the path the proxy
// is configured to call. The path, not a header, selects the convention:
// every proxy passes the client's own headers through to the auth request,
// so a header-chosen convention would let a client pick which headers
// describe its request (an X-Original-URI sent through Caddy, say).
const (
	// EnvoyPrefix is Envoy http_service's path_prefix: Envoy appends the
	// original path and sends the original method and Host.
	EnvoyPrefix = "/envoy"
	// NginxPath is where nginx's auth_request subrequest goes. nginx sends
	// it as GET, so the original method and URI come in the headers
	// http.method_header and http.uri_header name.
	NginxPath = "/nginx"
	// ForwardAuthPath is the forward-auth convention of Traefik's
	// forwardAuth and Caddy's forward_auth: X-Forwarded-Method, -Uri and
	// -Host (and -Proto, -For).
	ForwardAuthPath = "/forward-auth"
)

// convention is one proxy's way of telling the original request.
type convention uint8

const (
	envoy convention = iota
	nginx
	forwardAuth
)

// The forward-auth headers, in Go's canonical form.
const (
	forwardedMethod = "X-Forwarded-Method"
	forwardedURI    = "X-Forwarded-Uri"
	forwardedHost   = "X-Forwarded-Host"
)

// badRequest is an auth request the door cannot read: the proxy is
// misconfigured, so the answer names what to fix.
type badRequest struct {
	status int // 400 or 404
	detail string
}

// newRequest reads the original request that r describes into at, its
// headers into hm (empty). c holds the configured nginx header names in
// Go's canonical form and the headers decisions read.
func newRequest(r *http.Request, c *compiled, hm map[string]string, at *engine.Request) (convention, *badRequest) {
	// The escaped path is the request-target as sent (Go decodes Path).
	target := r.URL.EscapedPath()
	var conv convention
	switch {
	case target == EnvoyPrefix || strings.HasPrefix(target, EnvoyPrefix+"/"):
		conv = envoy
	case target == NginxPath:
		conv = nginx
	case target == ForwardAuthPath:
		conv = forwardAuth
	default:
		return 0, &badRequest{http.StatusNotFound, "No such endpoint: the HTTP door serves " +
			EnvoyPrefix + "/… (Envoy http_service, path_prefix " + EnvoyPrefix + "), " +
			NginxPath + " (nginx auth_request) and " + ForwardAuthPath + " (Traefik, Caddy)."}
	}

	at.Headers = c.headers(r.Header, hm)
	at.Peer = peerIP(r.RemoteAddr)
	switch conv {
	case envoy:
		// Envoy sends its :path: normalised by its HTTP connection
		// manager in envoy/ (normalize_path, merge_slashes), but not
		// everywhere (Istio merges no slashes by default), so the door
		// normalises it as Check does.
		at.Method = r.Method
		at.Path = engine.NormalizePath(strings.TrimPrefix(target, EnvoyPrefix))
		at.Host = engine.NormalizeHost(r.Host)
	case nginx:
		uri, bad := single(r.Header, c.uriKey, c.uriName, "the original request URI: proxy_set_header %s $request_uri;")
		if bad != nil {
			return conv, bad
		}
		method, bad := single(r.Header, c.methodKey, c.methodName, "the original method: proxy_set_header %s $request_method;")
		if bad != nil {
			return conv, bad
		}
		at.Method = method
		host := r.Host // nginx passes $host with proxy_set_header Host $host
		if u, ok := absoluteURL(uri); ok {
			// ingress-nginx's auth-url sends X-Original-URL: the whole URL.
			host, uri = u.Host, u.EscapedPath()
		}
		at.Path = engine.NormalizePath(uri)
		at.Host = engine.NormalizeHost(host)
	case forwardAuth:
		method, bad := single(r.Header, forwardedMethod, forwardedMethod, "the original method")
		if bad != nil {
			return conv, bad
		}
		uri, bad := single(r.Header, forwardedURI, forwardedURI, "the original request URI")
		if bad != nil {
			return conv, bad
		}
		host, bad := single(r.Header, forwardedHost, forwardedHost, "the original host")
		if bad != nil {
			return conv, bad
		}
		at.Method = method
		at.Path = engine.NormalizePath(uri)
		at.Host = engine.NormalizeHost(host)
	}
	return conv, nil
}

// single returns the one value of the header whose canonical key is key
// (name is how messages spell it). None, or several (a client sent its
// own and the proxy added one rather than replacing it), is a
// misconfigured proxy: deciding on a guess could match the wrong
// policies. what says what the header carries; a %s in it stands for name.
func single(h http.Header, key, name, what string) (string, *badRequest) {
	vs := h[key]
	switch {
	case len(vs) == 1 && vs[0] != "":
		return vs[0], nil
	case len(vs) > 1:
		return "", &badRequest{http.StatusBadRequest, "Header " + name + " is repeated: the proxy must replace the client's, not add another."}
	}
	if strings.Contains(what, "%s") {
		what = fmt.Sprintf(what, name)
	}
	return "", &badRequest{http.StatusBadRequest, "Header " + name + " is missing: the proxy must send " + what + "."}
}

// absoluteURL parses an absolute http(s) URL.
func absoluteURL(s string) (*url.URL, bool) {
	if !strings.HasPrefix(s, "http://") && !strings.HasPrefix(s, "https://") {
		return nil, false
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return nil, false
	}
	return u, true
}

// peerIP is the IP of the proxy's connection: "" on a unix socket.
func peerIP(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return ""
	}
	return host
}
