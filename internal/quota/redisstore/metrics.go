package redisstore

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/extauthz/extauthz/internal/breaker"
)

// Metrics are the collectors of the Redis-backed limiters. Create them once
// per process with NewMetrics; the zero value is not usable.
type Metrics struct {
	// Calls counts calls to Redis by operation (lease, return, peers, an
	// algorithm's script, refund, confirm, probe) and result (ok, error,
	// timeout, canceled, abandoned).
	Calls *prometheus.CounterVec
	// Duration is the time Redis calls take, by operation.
	Duration *prometheus.HistogramVec
	// Up is 1 while the store answers, 0 while it is marked down.
	Up prometheus.Gauge
	// BreakerOpened counts the times the store (a Cluster: one master)
	// was marked down.
	BreakerOpened prometheus.Counter
	// NodesDown is the number of Redis servers marked down now: 0 or 1
	// for a standalone server, the masters marked down in a Cluster.
	NodesDown prometheus.Gauge
	// SlicesLeased counts hybrid lease calls that granted tokens;
	// TokensLeased the tokens they granted.
	SlicesLeased prometheus.Counter
	TokensLeased prometheus.Counter
	// TokensReturned counts unspent hybrid tokens given back to Redis, by
	// reason (a GiveBackReason: renewed, idle, evicted, shutdown, refund,
	// reload, late), and those whose lease ended unspent (expired: never
	// given back, they stop counting in Redis by themselves).
	TokensReturned *prometheus.CounterVec
	// LeaseWaits counts hybrid decisions that waited for another request's
	// lease of the same key instead of calling Redis themselves.
	LeaseWaits prometheus.Counter
	// Peers is the replica count in use (see Peers).
	Peers prometheus.Gauge
	// StateLost counts the heartbeats that found Redis in another state
	// than the one before (Peers.CheckState), by how: epoch (the epoch
	// key was lost: a restart without persistence, a flush) or run_id
	// (another server or a restart: a failover, an RDB restored).
	StateLost *prometheus.CounterVec
	// LeasesForgotten counts hybrid leases Redis no longer held when they
	// were retired (nothing given back; what was spent charged).
	LeasesForgotten prometheus.Counter
	// LeasesUnreplicated counts hybrid leases whose WAIT (redis.wait_replicas)
	// found fewer replicas holding them than asked: such a lease is not
	// spent past the request that took it.
	LeasesUnreplicated prometheus.Counter
	// LateKept counts window units a call took in Redis after its
	// decision stopped waiting for it, kept as the count of the request
	// the fallback admitted (lateFate) rather than given back.
	LateKept prometheus.Counter
}

// NewMetrics creates the collectors and registers them with reg (none
// when reg is nil, as in tests that do not read them).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns = "extauthz"
	m := &Metrics{
		Calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "redis_calls_total",
			Help: "Redis calls by operation and result (ok, error, timeout, canceled by the caller, abandoned when Redis was marked down).",
		}, []string{"op", "result"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "redis_call_duration_seconds",
			Help:    "Time Redis calls take, by operation.",
			Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3, 150e-3},
		}, []string{"op"}),
		Up: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "redis_up",
			Help: "1 while Redis answers, 0 while it (in a Cluster: any master) is marked down.",
		}),
		BreakerOpened: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "redis_breaker_opened_total",
			Help: "Times Redis (in a Cluster: one master) was marked down (a failed or stalled call, confirmed by a failed probe on its own connection).",
		}),
		NodesDown: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "redis_nodes_down",
			Help: "Redis servers marked down now: in a Cluster, the masters whose keys follow on_redis_error.",
		}),
		SlicesLeased: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "hybrid_slices_leased_total",
			Help: "Hybrid lease calls that granted tokens.",
		}),
		TokensLeased: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "hybrid_tokens_leased_total",
			Help: "Tokens granted to hybrid slices.",
		}),
		TokensReturned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "hybrid_tokens_returned_total",
			Help: "Unspent hybrid tokens given back to Redis, by reason (renewed, idle, evicted, shutdown, refund, reload, late); expired: unspent when their lease ended, never given back.",
		}, []string{"reason"}),
		LeaseWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "hybrid_lease_waits_total",
			Help: "Hybrid decisions that waited for a lease already in flight for their key.",
		}),
		Peers: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "peers",
			Help: "Replicas assumed to share Redis: the highest count observed within the last peer_ttl (min_peers until a replica has heard the others).",
		}),
		StateLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "redis_state_lost_total",
			Help: "Heartbeats that found Redis in another state than before, by how: epoch (the epoch key was lost: restart without persistence, flush) or run_id (failover, restart, RDB restored).",
		}, []string{"how"}),
		LeasesForgotten: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "hybrid_leases_forgotten_total",
			Help: "Hybrid leases Redis no longer held when they were retired: nothing given back, what was spent of them charged.",
		}),
		LeasesUnreplicated: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "hybrid_leases_unreplicated_total",
			Help: "Hybrid leases that fewer replicas than redis.wait_replicas acknowledged within redis.wait_timeout: not spent past the request that took them.",
		}),
		LateKept: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "redis_late_units_kept_total",
			Help: "Window units a Redis call took after its decision stopped waiting for it, kept as the count of the request the fallback admitted instead of given back.",
		}),
	}
	// Series that exist from the start, so dashboards and alerts see 0
	// rather than nothing.
	for _, reason := range giveBackReasons {
		m.TokensReturned.WithLabelValues(string(reason))
	}
	for _, how := range []string{"epoch", "run_id"} {
		m.StateLost.WithLabelValues(how)
	}
	if reg != nil {
		reg.MustRegister(m.Calls, m.Duration, m.Up, m.BreakerOpened, m.NodesDown, m.SlicesLeased, m.TokensLeased,
			m.TokensReturned, m.LeaseWaits, m.Peers, m.StateLost, m.LeasesForgotten, m.LeasesUnreplicated, m.LateKept)
	}
	return m
}

// breakerMetrics returns the collectors the breaker writes to.
func (m *Metrics) breakerMetrics() breaker.Metrics {
	return breaker.Metrics{Calls: m.Calls, Up: m.Up, Opened: m.BreakerOpened, NodesDown: m.NodesDown}
}
