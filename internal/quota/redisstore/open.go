package redisstore

import (
	"context"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// OpenOptions are what Open assembles the Redis-backed limiters from.
type OpenOptions struct {
	// Store configures the Store; over Clients, pass it through
	// Clients.StoreOptions so the breaker probes each master.
	Store StoreOptions
	// MaxKeys bounds the table of what Redis last said of each key (and
	// of hybrid leases): local.max_keys.
	MaxKeys int
	// Counts is the local table the fallback buckets live in, the one
	// local mode counts in.
	Counts *local.Table
	// Warm runs once the Store exists, before the first heartbeat goes
	// through it (typically to load the scripts); its error fails Open.
	// Nil: nothing runs.
	Warm func(*Store) error
	// ReplicaID, PeerTTL and MinPeers are this replica's heartbeat (see
	// NewPeers).
	ReplicaID string
	PeerTTL   time.Duration
	MinPeers  int
	Hybrid    HybridOptions
}

// Opened is the Redis side of one replica: redis and hybrid modes' limiters
// over one Store, and Close, which releases all of it.
type Opened struct {
	Redis  quota.Limiter // redis mode
	Hybrid quota.Limiter // hybrid mode
	Store  *Store
	Table  *Table // per-key state, for the tables' gauges
	Peers  *Peers

	hybrid    *Hybrid
	closeConn func() error
}

// Open builds the limiters of redis and hybrid modes over rdb, each
// wrapped in Resilient with the level source that belongs to its primary
// (redis mode: the table of remaining counts; hybrid: its leases) and the
// fallback buckets in o.Counts. Production and the fleet driver both wire
// a replica here, so what is measured is what runs.
//
// Open owns closeConn (which closes what rdb talks through; nil: nothing
// to close): it calls it when it fails, and Close calls it last.
func Open(rdb rediser, closeConn func() error, o OpenOptions) (*Opened, error) {
	if closeConn == nil {
		closeConn = func() error { return nil }
	}
	table, err := NewTable(o.MaxKeys)
	if err != nil {
		closeConn()
		return nil, err
	}
	p := &Opened{Table: table, closeConn: closeConn}
	p.Store = NewStore(rdb, o.Store)
	p.Store.ChargeDebtsOf(table)
	if o.Warm != nil {
		if err := o.Warm(p.Store); err != nil {
			p.Store.Close()
			closeConn()
			return nil, err
		}
	}
	p.Peers = NewPeers(p.Store, o.ReplicaID, o.PeerTTL, o.MinPeers, o.Store.Log)
	p.hybrid = NewHybrid(table, p.Store, p.Peers, o.Hybrid)
	p.Peers.Watch(p.hybrid)
	fallback := local.NewFallback(o.Counts)
	p.Redis = NewResilient(NewRedis(p.Store, table), table, fallback, p.Peers, p.Store)
	p.Hybrid = NewResilient(p.hybrid, p.hybrid, fallback, p.Peers, p.Store)
	return p, nil
}

// Close gives unspent hybrid tokens back (first, within ctx's deadline),
// leaves the heartbeat set, stops the Store and closes the connection,
// returning the connection's error. Safe on a nil receiver.
func (p *Opened) Close(ctx context.Context) error {
	if p == nil {
		return nil
	}
	p.hybrid.Close(ctx)
	p.Peers.Close(ctx)
	p.Store.Close()
	return p.closeConn()
}
