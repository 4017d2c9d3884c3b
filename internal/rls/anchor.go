package rls

import (
	"github.com/extauthz/extauthz/internal/anchorstats"
	"github.com/extauthz/extauthz/internal/engine"
)

// WithAnchorStats counts each descriptor's decision in envoyproxy/
// ratelimit's stats as well (total_hits, within_limit, near_limit,
// over_limit, shadow_mode per domain and descriptor key), for the
// dashboards written for it.
func WithAnchorStats(a *anchorstats.Stats) Option { return func(s *Server) { s.anchor = a } }

// countAnchor records a decided request's descriptors in the anchor's
// stats: for each descriptor with a rate limit, the one its status
// reports, with the count before the request as its decision tells it.
func (s *Server) countAnchor(a *answer, o engine.Outcome) {
	for i := range a.slots {
		sl := &a.slots[i]
		if sl.n == 0 || sl.stat == "" {
			continue
		}
		if sl.take >= a.asked {
			s.anchor.Count(sl.stat, anchorstats.Decision{Hits: uint64(max(a.takes[sl.take].Units, 0))})
			continue
		}
		j := a.reported(sl, o)
		t := &a.takes[j]
		d := anchorstats.Decision{Limit: uint64(max(t.Decision.Limit, 0)), Hits: uint64(max(t.Units, 0)), Decided: true}
		// The count before: what an admitted take left, plus its hits;
		// a denied take counted nothing.
		used := max(t.Decision.Limit-t.Decision.Remaining, 0)
		if t.OK {
			used = max(used-t.Units, 0)
		}
		d.Before = uint64(used)
		if l := a.limits[j]; l != nil {
			d.Shadow = l.ownShadow
		}
		s.anchor.Count(sl.stat, d)
	}
}
