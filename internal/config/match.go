package config

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// MatchKind is how a ValueMatch tests a value.
type MatchKind string

// The ways to test a header or a claim.
const (
	MatchExact   MatchKind = "exact"
	MatchPrefix  MatchKind = "prefix"
	MatchRegex   MatchKind = "regex"
	MatchPresent MatchKind = "present"
	MatchAbsent  MatchKind = "absent"
)

// ValueMatch is one condition on a request header or a verified JWT
// claim.
type ValueMatch struct {
	Name  string    // header name (lower case) or claim name
	Kind  MatchKind //
	Value string    // the exact value, the prefix, or the regular expression as written
	// Regexp is Value compiled (MatchRegex only), anchored at both ends:
	// the whole value must match, as in Envoy's safe_regex.
	Regexp *regexp.Regexp
}

// maxMatchDepth bounds how deeply `not` may nest: one level says "all but",
// two say "all but these, except those"; more is a configuration no one
// can read.
const maxMatchDepth = 3

// maxRegexLen bounds a regular expression's source. RE2 runs in time
// linear in the input whatever the expression, but compiling a huge one
// costs memory.
const maxRegexLen = 1024

type rawValueMatch struct {
	Name    string  `yaml:"name"`
	Exact   *string `yaml:"exact"`
	Prefix  *string `yaml:"prefix"`
	Regex   *string `yaml:"regex"`
	Present bool    `yaml:"present"`
	Absent  bool    `yaml:"absent"`
}

// validateValueMatches checks header (isHeader) or claim conditions.
func validateValueMatches(raw []rawValueMatch, path string, isHeader bool, errs *Errors) []ValueMatch {
	var out []ValueMatch
	for i, r := range raw {
		p := fmt.Sprintf("%s[%d]", path, i)
		vm := ValueMatch{Name: r.Name}
		switch {
		case r.Name == "":
			errs.add(p+".name", "is required")
		case isHeader && !headerName.MatchString(strings.TrimPrefix(r.Name, ":")):
			errs.add(p+".name", "%q is not a header name", r.Name)
		}
		if isHeader {
			vm.Name = strings.ToLower(r.Name)
		}
		given := 0
		if r.Exact != nil {
			given++
			vm.Kind, vm.Value = MatchExact, *r.Exact
		}
		if r.Prefix != nil {
			given++
			vm.Kind, vm.Value = MatchPrefix, *r.Prefix
		}
		if r.Regex != nil {
			given++
			vm.Kind, vm.Value = MatchRegex, *r.Regex
			if len(*r.Regex) > maxRegexLen {
				errs.add(p+".regex", "is %d bytes; at most %d", len(*r.Regex), maxRegexLen)
			} else if _, err := regexp.Compile(*r.Regex); err != nil {
				errs.add(p+".regex", "%q is not an RE2 regular expression: %v", *r.Regex, strings.TrimPrefix(err.Error(), "error parsing regexp: "))
			} else if re, err := regexp.Compile(`^(?:` + *r.Regex + `)$`); err != nil {
				errs.add(p+".regex", "%q cannot be anchored: %v", *r.Regex, err)
			} else {
				vm.Regexp = re // anchored: the whole value must match
			}
		}
		if r.Present {
			given++
			vm.Kind = MatchPresent
		}
		if r.Absent {
			given++
			vm.Kind = MatchAbsent
		}
		if given != 1 {
			errs.add(p, "give exactly one of exact, prefix, regex, present: true, absent: true")
		}
		out = append(out, vm)
	}
	return out
}

// validateCIDRs parses source_cidrs: networks in CIDR notation, or single
// addresses (a /32 or /128).
func validateCIDRs(raw []string, path string, errs *Errors) []netip.Prefix {
	var out []netip.Prefix
	for i, s := range raw {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, err2 := netip.ParseAddr(s)
			if err2 != nil {
				errs.add(fmt.Sprintf("%s[%d]", path, i), "%q is not a network (10.0.0.0/8, fd00::/8) or an address", s)
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		// An IPv4 network written in IPv6 form (::ffff:10.0.0.0/104)
		// would never match: client addresses are unmapped.
		if p.Addr().Is4In6() {
			errs.add(fmt.Sprintf("%s[%d]", path, i), "%q: write IPv4 networks in IPv4 form", s)
			continue
		}
		out = append(out, p.Masked())
	}
	return out
}

// empty reports whether m has no condition: it would match every request.
func (m *Match) empty() bool {
	return m.PathPrefix == "" && len(m.Methods) == 0 && len(m.Hosts) == 0 && len(m.Context) == 0 &&
		len(m.Headers) == 0 && len(m.Claims) == 0 && len(m.SourceCIDRs) == 0 && m.Not == nil
}
