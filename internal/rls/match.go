package rls

import (
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/extauthz/extauthz/internal/rlsconfig"
)

// How a request's descriptor finds its rate limit, as envoyproxy/ratelimit
// finds it: the descriptor's entries are looked up one level of the tree
// each, the first entry in the domain's top list, each next one among the
// descriptors nested in the one before. At each level an entry matches,
// in this order:
//
//  1. the descriptor with its key and exactly its value;
//  2. the first descriptor, in configuration order, with its key and a
//     wildcard value the entry's value matches;
//  3. the descriptor with its key and no value.
//
// The rate limit that applies is the one at the level of the last entry:
// a request descriptor of two entries matches a limit nested two deep,
// never one at the first level (the most specific match, at the same
// depth as the request). Nothing applies when an entry finds no
// descriptor, or when the descriptor it finds has no rate limit.

// How an entry was matched.
const (
	byValue = iota
	byWildcard
	byKey
)

// step is one entry's match.
type step struct {
	node *node
	how  uint8
}

// match returns the rate limit for entries, and each entry's match in
// steps (which must hold len(entries) ≤ rlsconfig.MaxDepth).
func (d *domain) match(entries []*ratelimitv3.RateLimitDescriptor_Entry, steps []step) *rule {
	lv := &d.root
	for i, e := range entries {
		n, how := lv.find(e.GetKey(), e.GetValue())
		if n == nil {
			return nil
		}
		steps[i] = step{node: n, how: how}
		if i == len(entries)-1 {
			return n.rule
		}
		lv = &n.level
	}
	return nil
}

func (lv *level) find(key, value string) (*node, uint8) {
	if n, ok := lv.exact[entry{key, value}]; ok {
		return n, byValue
	}
	for i := range lv.wild {
		if w := &lv.wild[i]; w.key == key && wildcardMatch(w.parts, value) {
			return w.node, byWildcard
		}
	}
	if n, ok := lv.any[key]; ok {
		return n, byKey
	}
	return nil, 0
}

// wildcardMatch reports whether v matches the pattern split at its '*'s
// into parts (at least two): v starts with the first part, ends with the
// last, and holds the others in order between them, each '*' standing for
// any run of characters, the empty one included.
func wildcardMatch(parts []string, v string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(v) < len(first)+len(last) || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	// What lies between the first and the last part; each middle part is
	// found at its leftmost place, which leaves the most room for the
	// parts after it.
	rest := v[len(first) : len(v)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// maxEntries is the most entries a request's descriptor may hold: no
// configured rate limit nests deeper.
const maxEntries = rlsconfig.MaxDepth
