package quota

import "time"

// Design note: sliding_log is the exact algorithm. It keeps the instant of
// every admitted request of the last window and admits a request when
// fewer than limit of them are newer than now − window: no approximation,
// no boundary burst, at any instant. The price is memory proportional to
// the limit: one timestamp per admitted request per key.
//
//   - local: 8 bytes per entry in a ring that grows as needed and never
//     beyond limit entries (a key at limit 1,000 holds at most 8 KB; the
//     largest limit of the last window, when the limit changes);
//   - redis: one sorted-set member per entry (score = the instant in µs,
//     member = a unique id of about 20 bytes), measured by
//     TestSlidingLogMemory at about 40 bytes per entry while Redis keeps
//     the set as a listpack (up to 128 entries) and about 120-130 beyond
//     (skiplist and dict), so a key at limit 1,000 holds up to about
//     120 KB. Configuration caps sliding_log limits at 100,000
//     (config.MaxSlidingLogLimit; about 13 MB per key in Redis) for that
//     reason.
//
// The wait of a rejected request is exact: the oldest entry that keeps the
// count at the limit leaves the window at its instant + window.
//
// A refund removes the newest entry rather than the refunded request's
// own: they differ only when another request was admitted in between, and
// then the entry kept is the older one, which leaves the window sooner.
// Every later window that holds the older entry also holds the newer one,
// so no window ever counts more than an exact refund would leave in it.

// timeLog holds a sliding log's admitted instants (unix ns), oldest first,
// in a ring that grows up to the limit. The zero value is an empty log.
type timeLog struct {
	ts   []int64
	head int // index of the oldest entry
	n    int // entries held
}

func (g *timeLog) at(i int) int64 { return g.ts[(g.head+i)%len(g.ts)] }

func (g *timeLog) dropOldest() {
	g.head = (g.head + 1) % len(g.ts)
	g.n--
	if g.n == 0 {
		g.ts, g.head = nil, 0 // an idle key gives its memory back
	}
}

func (g *timeLog) dropNewest() {
	g.n--
	if g.n == 0 {
		g.ts, g.head = nil, 0
	}
}

// push appends t, growing the ring up to limit entries.
func (g *timeLog) push(t, limit int64) {
	if g.n == len(g.ts) {
		size := int(min(max(2*int64(len(g.ts)), 8), limit))
		ts := make([]int64, size)
		for i := 0; i < g.n; i++ {
			ts[i] = g.at(i)
		}
		g.ts, g.head = ts, 0
	}
	g.ts[(g.head+g.n)%len(g.ts)] = t
	g.n++
}

// slidingLogTake asks for n units of log g at now; n = 0 decides as for one
// unit and logs nothing.
func slidingLogTake(g *timeLog, now int64, l Limit, n int64) Decision {
	w := int64(l.Window)
	for g.n > 0 && g.at(0) <= now-w {
		g.dropOldest()
	}
	// A lowered limit (a reload, or a limit read from each request) keeps
	// every entry: the oldest of the newest `limit` is the one that must
	// leave first (k below), as if the others were gone, and a limit
	// raised again still counts them, as Redis's log does. The ring thus
	// holds at most the largest limit the window saw.
	spend := max(n, 1)
	if int64(g.n)+spend <= l.Limit {
		for i := int64(0); i < n; i++ {
			g.push(now, l.Limit)
		}
		d := Decision{Allowed: true, Limit: l.Limit, Remaining: l.Limit - int64(g.n), ResetAfter: l.Window}
		if g.n == 0 {
			d.ResetAfter = 0
		} else if n == 0 {
			d.ResetAfter = time.Duration(g.at(g.n-1) + w - now)
		}
		return d
	}
	d := Decision{Limit: l.Limit, ResetAfter: time.Duration(g.at(g.n-1) + w - now)}
	if spend > l.Limit {
		d.RetryAfter = d.ResetAfter // never fits; say when the log is empty
		return d
	}
	// The oldest k entries must leave for the n units to fit (more than
	// spend when the log holds more than a lowered limit).
	k := int64(g.n) + spend - l.Limit
	d.RetryAfter = time.Duration(g.at(int(k-1)) + w - now)
	return d
}

// slidingLogRefund removes the n newest entries (see the design note).
func slidingLogRefund(g *timeLog, n int64) {
	for ; n > 0 && g.n > 0; n-- {
		g.dropNewest()
	}
}
