package redisstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClientOptions says how to reach Redis: one address is a standalone
// server, several are the seed nodes of a Redis Cluster; with MasterName,
// they are the sentinels that name the master of a replication group.
type ClientOptions struct {
	Addrs    []string
	Username string // of the servers
	Password string
	TLS      *tls.Config // nil: plaintext (for the sentinels too)
	// MasterName finds the master through Redis Sentinel: Addrs are the
	// sentinels, asked for the master's address on every dial, and a
	// failover they announce closes the connections to the old master.
	// "": no Sentinel.
	MasterName string
	// SentinelUsername and SentinelPassword authenticate to the
	// sentinels (Sentinel's own requirepass); Username and Password are
	// the servers'.
	SentinelUsername string
	SentinelPassword string
	// Timeout is the per-call timeout (the store's); dials get five times
	// it, at least 100ms.
	Timeout time.Duration
	// PoolSize caps the connections this process opens to each Redis
	// server (each Cluster master) for decisions. Zero: DefaultPoolSize.
	PoolSize int
	// Name is the CLIENT SETNAME of decision connections; probes add
	// "-probe".
	Name string
}

// DefaultPoolSize is the connections a replica may open to one Redis
// server for decisions when ClientOptions leaves it zero. Decisions are
// autopipelined: the calls that arrive while a batch is in flight leave
// together as the next batch, one batch at a time (per Cluster master),
// so one connection carries them all (docs/capacity.md measures it).
// The others are spare: for script loads and shutdown's calls, and for a
// connection being redialled. go-redis's own default, ten per CPU on the
// main pool plus ten for pipelines, times a fleet of a thousand sidecars
// would pass Redis's default maxclients (10,000) with connections that
// sit idle.
const DefaultPoolSize = 4

// Clients are the go-redis clients of one replica: the decision client,
// its autopipeliner (what the Store runs scripts through), and the
// breaker's probes, each on connections of their own.
type Clients struct {
	Client redis.UniversalClient
	Pipe   *redis.AutoPipeliner
	Probe  redis.UniversalClient

	cluster   *redis.ClusterClient // nil for a standalone server
	probeOpts *redis.Options       // a Cluster master's probe client, but for its address

	mu         sync.Mutex // guards nodeProbes
	nodeProbes map[string]*redis.Client
}

// NewClients builds the clients; it does not wait for Redis to answer.
func NewClients(o ClientOptions) (*Clients, error) {
	if o.PoolSize <= 0 {
		o.PoolSize = DefaultPoolSize
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	opts := &redis.UniversalOptions{
		Addrs:     o.Addrs,
		Username:  o.Username,
		Password:  o.Password,
		TLSConfig: o.TLS,
		// A decision never waits longer than the timeout; the store's
		// breaker, not client retries, deals with failures: one dial
		// attempt, no command retries.
		DialTimeout:           max(o.Timeout*5, 100*time.Millisecond),
		DialerRetries:         1,
		ReadTimeout:           o.Timeout,
		WriteTimeout:          o.Timeout,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		// A Cluster still follows MOVED and ASK, and tries another node
		// after a failed one, but without sleeping between attempts.
		MinRetryBackoff: -1,
		MaxRetryBackoff: -1,
		// Decisions ride one full-duplex connection per server (below),
		// from a pipeline pool of one, dialled at start-up by the first
		// heartbeat. The main pool (PoolSize) carries the rest: WAIT's
		// pipelines, what spills. No MinIdleConns: idle connections
		// nothing takes. (The scripts load on the probes' connections:
		// Store.Warm.)
		PoolSize:         o.PoolSize,
		PipelinePoolSize: 1,
		ClientName:       o.Name,
		// With Sentinel there is one master at a time, found anew on
		// every dial: to the breaker it is a standalone server whose
		// address may change, so its one breaker (and its probe, on a
		// failover client of its own) follows the master Sentinel names.
		MasterName:       o.MasterName,
		SentinelUsername: o.SentinelUsername,
		SentinelPassword: o.SentinelPassword,
	}
	c := &Clients{nodeProbes: map[string]*redis.Client{}}
	c.Client = redis.NewUniversalClient(opts)
	// The breaker's probe has a connection of its own (one per node), so
	// a pool full of slow decisions never delays the verdict on Redis.
	probeOpts := *opts
	probeOpts.PoolSize, probeOpts.MinIdleConns = 1, 0
	// Kept however long it idles (Store.Warm dials it): a suspicion may
	// come after hours of calls that answered, and a dial inside the
	// probe's timeout costs round trips a slow link may not have.
	probeOpts.ConnMaxIdleTime = -1
	if o.Name != "" {
		probeOpts.ClientName = o.Name + "-probe"
	}
	c.Probe = redis.NewUniversalClient(&probeOpts)
	if cc, ok := c.Client.(*redis.ClusterClient); ok {
		c.cluster = cc
		c.probeOpts = probeOpts.Simple()
	}
	// Decisions go through go-redis's autopipeliner, full duplex: one
	// connection per server (per Cluster master) on which a writer sends
	// each call as it comes, batched with whatever else is waiting,
	// while a reader takes the replies in order. A call never waits for
	// another's reply before it is sent, so each costs one round trip.
	// The half-duplex default sends a batch only once the batch ahead of
	// it has been answered: behind a slow link a call made while one was
	// in flight took two round trips, and under 80 ms ± 40 of reply
	// latency a fifth of the calls ran into the 150 ms call timeout,
	// each costing an admission (docs/reliability.md; both modes then
	// admitted 0.89 of one exact window where envoyproxy/ratelimit,
	// a connection per call, admitted all of it).
	apo := redis.DefaultBlockingAutoPipelineOptions()
	apo.FullDuplex = true
	pipe, err := c.Client.AutoPipelineWithOptions(apo)
	if err != nil {
		c.Client.Close()
		c.Probe.Close()
		return nil, fmt.Errorf("redis autopipelining: %w", err)
	}
	c.Pipe = pipe
	return c, nil
}

// StoreOptions returns opts with the client parts set: the probe, and for
// a Cluster the router and per-master probes the breaker judges masters
// by.
func (c *Clients) StoreOptions(opts StoreOptions) StoreOptions {
	opts.Probe = c.Probe
	opts.Pipeline = c.pipelineFor
	if c.cluster != nil {
		opts.Router = c.cluster
		opts.NodeProbe = c.nodeProbe
		opts.LoadScript = c.loadScript
	}
	return opts
}

// pipelineFor returns a pipeline whose commands leave in order on one
// connection to the master serving key: a Cluster's master for the key's
// slot (a Cluster pipeline would send a keyless WAIT to any node), or the
// one master.
func (c *Clients) pipelineFor(ctx context.Context, key string) (redis.Pipeliner, error) {
	if c.cluster != nil {
		m, err := c.cluster.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return m.Pipeline(), nil
	}
	return c.Client.Pipeline(), nil
}

// loadScript loads sc on each master's probe connection (Store.Warm).
func (c *Clients) loadScript(ctx context.Context, sc *redis.Script) error {
	return c.cluster.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return sc.Load(ctx, c.nodeProbe(m.Options().Addr)).Err()
	})
}

// nodeProbe returns the probe client of the master at addr: one
// connection to that master alone.
func (c *Clients) nodeProbe(addr string) rediser {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.nodeProbes[addr]; p != nil {
		return p
	}
	o := *c.probeOpts
	o.Addr = addr
	p := redis.NewClient(&o)
	c.nodeProbes[addr] = p
	return p
}

// Close closes every client.
func (c *Clients) Close() error {
	c.Pipe.Close()
	c.mu.Lock()
	for _, p := range c.nodeProbes {
		p.Close()
	}
	c.mu.Unlock()
	c.Probe.Close()
	return c.Client.Close()
}
