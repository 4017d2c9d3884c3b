package quota

// Design note: a replica that decides without Redis takes a share of each
// limit, limit ÷ peers, so that the replicas together stay close to the
// limit while each decides alone. A share must not start from a fresh
// budget when Redis told the replica what was left: CapToShare lowers a
// share's count to the replica's part of that remaining level, brought
// forward by what the algorithm restores since.

// Share is this replica's part of l among peers, decided locally with l's
// own algorithm, so a window stays a window and a leaky bucket still
// shapes: limit ÷ peers (at least 1), a token bucket's burst likewise, a
// leaky bucket's queue likewise.
func Share(l Limit, peers int64) Limit {
	peers = max(peers, 1)
	fl := Limit{
		Algorithm: l.Algorithm,
		Limit:     max(l.Limit/peers, 1),
		Window:    l.Window,
		Queue:     l.Queue,
		MaxDelay:  l.MaxDelay,
		OnError:   l.OnError,
		Calendar:  l.Calendar,
		Overdraft: l.Overdraft,
		BlockFor:  l.BlockFor,
	}
	if l.Algorithm == TokenBucket {
		fl.Burst = max(l.Capacity()/peers, 1)
	}
	if l.Queue > 0 {
		fl.Queue = max(l.Queue/peers, 1)
	}
	return fl
}

// CapToShare lowers the state, counted under fl = Share(l, peers), so that
// it admits at most this replica's share of `remote`, the units Redis said
// remained at remoteAt (unix ns), brought forward to ns by what l's
// algorithm restores in between. It only ever takes units away, so
// applying it again before each decision is harmless: once the state's own
// spending is the lower bound, it changes nothing.
//
//   - token bucket: Redis restores one unit per interval of l, up to the
//     capacity; the share is the restored count ÷ peers;
//   - leaky bucket: likewise, in free slots;
//   - fixed and sliding window: the count is the window's, and says
//     nothing once the window has ended (a sliding window's previous
//     count still weighs then, but how much of it was this key's is
//     unknown); within the window the remaining count only grows as a
//     sliding window's previous count fades, which is not credited;
//   - sliding log: entries leave the log at unknown instants within a
//     window of remoteAt, so the units missing from the share are entered
//     at remoteAt (never earlier than the newest) and leave a window later.
func (s *State) CapToShare(l, fl Limit, ns, peers, remote, remoteAt int64) {
	peers = max(peers, 1)
	if s.alg != fl.Algorithm {
		s.reset(fl.Algorithm)
	}
	switch fl.Algorithm {
	case TokenBucket, LeakyBucket:
		iv := fl.Interval()
		if s.iv != iv {
			s.tat, s.iv = tokenBucketRescale(s.tat, ns, s.iv, iv), iv
		}
		restored := max(ns-remoteAt, 0) / l.Interval()
		if fl.Algorithm == TokenBucket {
			share := min(min(remote+restored, l.Capacity())/peers, fl.Capacity())
			s.tat = max(s.tat, ns+(fl.Capacity()-share)*iv)
			return
		}
		// A leaky bucket admits now while its next slot is within the
		// tolerance: n more fit when tat ≤ ns + tol − (n−1)·iv.
		share := (remote + restored) / peers
		s.tat = max(s.tat, ns+fl.Tolerance()-(share-1)*iv)
	case FixedWindow:
		c := s.windows(fl.windowKey())
		start, _ := fl.bounds(ns)
		if c.win.start != start {
			c.win = windowCount{start: start}
		}
		if remoteStart, _ := fl.bounds(remoteAt); remoteStart != start {
			return // Redis counted a window that has ended
		}
		share := min(remote/peers, fl.Limit)
		c.win.cur = max(c.win.cur, fl.Limit-share)
	case SlidingWindow:
		w := int64(fl.Window)
		c := s.windows(w)
		c.win = c.win.roll(ns, w)
		if windowStart(remoteAt, w) != c.win.start {
			return // Redis counted a window that has ended
		}
		share := min(remote/peers, fl.Limit)
		if left := slidingRemaining(c.win.prev, c.win.cur, fl.Limit, w, ns-c.win.start); left > share {
			c.win.cur += left - share
		}
	case SlidingLog:
		if s.counts == nil {
			s.counts = &counts{}
		}
		g := &s.counts.log
		w := int64(fl.Window)
		for g.n > 0 && g.at(0) <= ns-w {
			g.dropOldest()
		}
		if remoteAt <= ns-w {
			return // every entry Redis counted then has left the window
		}
		share := min(remote/peers, fl.Limit)
		at := remoteAt
		if g.n > 0 {
			at = max(at, g.at(g.n-1))
		}
		for left := fl.Limit - int64(g.n); left > share; left-- {
			g.push(at, fl.Limit)
		}
	}
}

// StartEmpty sets a state that has counted nothing to hold no units at
// `at` (unix ns), restored since by l's algorithm as ns: what a key
// evicted from this process's table at `at` gets when it comes back. It
// never holds more than the key held when it was evicted (some units,
// restored by the same rule), so eviction cannot hand out a fresh budget;
// the price is that a key evicted while it held units loses them until
// they are restored. For a sliding window, "nothing at `at`" in the window
// before ns's counts that previous window as full.
func (s *State) StartEmpty(l Limit, at, ns int64) {
	at = min(at, ns) // an eviction stamped by a decision a moment later
	s.CapToShare(l, l, ns, 1, 0, at)
	if l.Algorithm == SlidingWindow {
		w := int64(l.Window)
		if c := s.counts; c != nil && windowStart(at, w) == c.win.start-w {
			c.win.prev = max(c.win.prev, l.Limit)
		}
	}
}
