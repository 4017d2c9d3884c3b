package engine

import (
	"encoding/json"
	"strconv"
	"time"
)

// What every door says, whatever its protocol: the RateLimit headers
// (draft-ietf-httpapi-ratelimit-headers, structured fields), Retry-After
// and the RFC 9457 problem bodies.

// Problem types of the bodies the sidecar sends.
const (
	problemQuotaExceeded   = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	problemReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
	problemBlank           = "about:blank"
	ProblemContentType     = "application/problem+json"
)

// Problem is an RFC 9457 problem detail. Field order is the wire order.
type Problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// JSON renders the problem.
func (p Problem) JSON() string {
	raw, _ := json.Marshal(p) // a struct of strings and ints cannot fail
	return string(raw)
}

// Denial is what a door sends for a verdict that is not OK: a status, the
// headers besides the content type, and a problem body.
type Denial struct {
	Status  int
	Headers [][2]string // lower-case names
	Problem Problem
}

// Deny renders v, which must not be OK or Canceled. legacy adds the
// X-RateLimit-* headers to a 429.
func (v *Verdict) Deny(legacy bool) Denial {
	switch v.Outcome {
	case Unauthorized:
		return Denial{Status: 401, Headers: [][2]string{{"www-authenticate", "ApiKey"}},
			Problem: Problem{Type: problemBlank, Title: "Unauthorized", Status: 401, Detail: v.Detail}}
	case Unavailable:
		var wait time.Duration
		var names []string
		takes := v.Takes()
		for i := range takes {
			if t := &takes[i]; !t.OK && !t.Policy.Shadow {
				wait = max(wait, t.Decision.RetryAfter)
				names = append(names, t.Policy.Name)
			}
		}
		retry := strconv.FormatInt(ceilSeconds(wait), 10)
		return Denial{Status: 503, Headers: [][2]string{{"retry-after", retry}},
			Problem: Problem{Type: problemReducedCapacity, Title: "Service Unavailable", Status: 503,
				Detail: "The rate limit store is unavailable. Retry after " + retry + " s.", ViolatedPolicies: names}}
	case OverLimit:
		worst, names := v.Denials()
		wait := ceilSeconds(worst.Decision.RetryAfter)
		retry := strconv.FormatInt(wait, 10)
		h := [][2]string{
			{"retry-after", retry},
			{"ratelimit-policy", worst.Limit.Header},
			{"ratelimit", RateLimitHeader(worst.Policy.Name, worst.Decision.Remaining, time.Duration(wait)*time.Second)},
		}
		if legacy {
			h = append(h, LegacyHeaders(worst.Decision.Limit, worst.Decision.Remaining, time.Duration(wait)*time.Second)...)
		}
		detail := "Retry after " + retry + " s."
		if v.Detail != "" {
			detail = v.Detail // the request costs more than a policy admits at once
		}
		return Denial{Status: 429, Headers: h,
			Problem: Problem{Type: problemQuotaExceeded, Title: "Too Many Requests", Status: 429,
				Detail: detail, ViolatedPolicies: names}}
	}
	return Denial{Status: 500, Problem: Problem{Type: problemBlank, Title: "Internal Server Error", Status: 500, Detail: v.Detail}}
}

// policyHeader renders one RateLimit-Policy item: `"orders";q=100;w=60`.
// The window is whole seconds, at least 1. Numbers are clamped to what the
// fields allow: q ≥ 0, and none above the largest sf-integer.
func policyHeader(name string, quota int64, window time.Duration) string {
	b := appendSFString(nil, name)
	b = append(b, ";q="...)
	b = appendSFInt(b, quota)
	b = append(b, ";w="...)
	b = appendSFInt(b, ceilSeconds(window))
	return string(b)
}

// RateLimitHeader renders one RateLimit item: `"orders";r=0;t=59`. Like
// policyHeader, it clamps r and t to 0..sfIntMax.
func RateLimitHeader(name string, remaining int64, reset time.Duration) string {
	b := appendSFString(make([]byte, 0, len(name)+24), name)
	b = append(b, ";r="...)
	b = appendSFInt(b, remaining)
	b = append(b, ";t="...)
	b = appendSFInt(b, ceilSecondsMin0(reset))
	return string(b)
}

// LegacyHeaders are the X-RateLimit-Limit/Remaining/Reset headers.
func LegacyHeaders(limit, remaining int64, reset time.Duration) [][2]string {
	return [][2]string{
		{"x-ratelimit-limit", strconv.FormatInt(limit, 10)},
		{"x-ratelimit-remaining", strconv.FormatInt(max(remaining, 0), 10)},
		{"x-ratelimit-reset", strconv.FormatInt(ceilSecondsMin0(reset), 10)},
	}
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
