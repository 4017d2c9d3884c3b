package httpauth

import (
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
)

// The answers: 200 allows, anything else denies. Header values and problem
// bodies come from the engine (render.go), so every door says the same;
// which proxy copies what where is its configuration's business
// (docs/http-door.md and proxies/).

// Response headers, spelt as the specifications spell them. They are set
// in the header map directly: net/http would otherwise canonicalise
// RateLimit to Ratelimit, which proxies read alike but people do not.
const (
	hRateLimitPolicy = "RateLimit-Policy"
	hRateLimit       = "RateLimit"
	hRetryAfter      = "Retry-After"
	hContentType     = "Content-Type"
	hContentLength   = "Content-Length"
	// ClientIDHeader carries the verified client id for the proxy to set
	// on the upstream request.
	ClientIDHeader = "X-Client-Id"
	// ProblemHeader repeats a denial's problem+json body for nginx, whose
	// auth_request drops the subrequest's body: its error_page returns
	// this header's value as the body.
	ProblemHeader = "X-Extauthz-Problem"
	// envoyRemove lists request headers for Envoy to remove before the
	// upstream sees them (http_service honours it on a 200).
	envoyRemove = "X-Envoy-Auth-Headers-To-Remove"
)

// deniedNames maps the engine's lower-case denial headers to their
// spelling on the wire.
var deniedNames = map[string]string{
	"retry-after":           hRetryAfter,
	"ratelimit-policy":      hRateLimitPolicy,
	"ratelimit":             hRateLimit,
	"www-authenticate":      "WWW-Authenticate",
	"x-ratelimit-limit":     "X-RateLimit-Limit",
	"x-ratelimit-remaining": "X-RateLimit-Remaining",
	"x-ratelimit-reset":     "X-RateLimit-Reset",
}

// allow writes the 200 of an allowed request: the RateLimit headers of the
// most constrained enforcing policy and the client id, for the proxy to
// copy to the client and to the upstream. Envoy also removes, on our word,
// the credential (clients.strip) and, for an anonymous caller, any
// x-client-id it sent; the other proxies' configurations do both.
func allow(w http.ResponseWriter, conv convention, v *engine.Verdict, c *compiled, cfg *config.Config) {
	h := w.Header()
	if t := v.Tightest(); t != nil {
		d := &t.Decision
		if t.Limit.Index < 0 { // a limit read from the request
			h[hRateLimitPolicy] = []string{t.Limit.Header}
		} else {
			h[hRateLimitPolicy] = c.policyVals[t.Limit.Index]
		}
		h[hRateLimit] = []string{engine.RateLimitHeader(t.Policy.Name, d.Remaining, d.ResetAfter)}
		if cfg.Headers.Legacy {
			for _, kv := range engine.LegacyHeaders(d.Limit, d.Remaining, d.ResetAfter) {
				h[deniedNames[kv[0]]] = []string{kv[1]}
			}
		}
	}
	if v.Client != nil {
		h[ClientIDHeader] = c.clientVals[v.Client.Index]
	}
	if conv == envoy {
		var remove []string
		if v.Client == nil {
			remove = append(remove, strings.ToLower(ClientIDHeader))
		}
		if v.CredHeader != "" && cfg.Clients.Strip {
			remove = append(remove, v.CredHeader)
			if v.AlsoCredHeader != "" {
				remove = append(remove, v.AlsoCredHeader)
			}
		}
		if len(remove) > 0 {
			h[envoyRemove] = []string{strings.Join(remove, ",")}
		}
	}
	w.WriteHeader(http.StatusOK) // net/http adds Content-Length: 0
}

// deny writes a verdict that is not OK: 429 with Retry-After and the
// RateLimit headers, 401 with WWW-Authenticate, 503 with Retry-After, or
// 500, each with a problem+json body.
func deny(w http.ResponseWriter, conv convention, v *engine.Verdict, cfg *config.Config) {
	d := v.Deny(cfg.Headers.Legacy)
	h := w.Header()
	for _, kv := range d.Headers {
		name, ok := deniedNames[kv[0]]
		if !ok {
			name = http.CanonicalHeaderKey(kv[0])
		}
		h[name] = []string{kv[1]}
	}
	writeProblem(w, conv, d.Status, d.Problem.JSON())
}

// writeProblem writes a problem+json answer.
func writeProblem(w http.ResponseWriter, conv convention, status int, body string) {
	h := w.Header()
	h[hContentType] = []string{engine.ProblemContentType}
	h[hContentLength] = []string{strconv.Itoa(len(body))}
	if conv == nginx {
		h[ProblemHeader] = []string{body} // JSON has no line breaks: a valid field value
	}
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// misconfigured answers an auth request the door cannot read.
func misconfigured(w http.ResponseWriter, conv convention, b *badRequest) {
	title := http.StatusText(b.status)
	body := engine.Problem{Type: "about:blank", Title: title, Status: b.status, Detail: b.detail}.JSON()
	writeProblem(w, conv, b.status, body)
}
