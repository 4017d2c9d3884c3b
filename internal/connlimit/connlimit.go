// Package connlimit caps the connections a listener holds open at once.
//
// A connection past the cap is accepted and closed at once (with a reset,
// for TCP), counted, and logged at most once a second with the number
// refused since the last line. golang.org/x/net/netutil's LimitListener
// caps too, but by not calling Accept while full: the kernel still
// completes the handshakes and queues the connections in the listen
// backlog, where clients wait for an answer that comes only when another
// connection closes, with nothing counted or logged. An operator wants
// the refusal seen, and Envoy wants it prompt: a reset connection is a
// failure it retries (another host, or failure_mode_allow), not a hang
// until its timeout.
package connlimit

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// logEvery is the least time between two log lines of one listener's
// refusals.
const logEvery = time.Second

// Metrics are the collectors of every capped listener, by its name.
type Metrics struct {
	Refused *prometheus.CounterVec // connections closed at accept, past the cap
	Open    *prometheus.GaugeVec   // connections held open
}

// NewMetrics creates the collectors and registers them with reg (none
// when reg is nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "extauthz", Name: "connections_refused_total",
			Help: "Connections closed as soon as accepted because the listener held listen.max_connections, by listener (grpc, http).",
		}, []string{"listener"}),
		Open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "extauthz", Name: "connections_open",
			Help: "Connections the listener holds open, by listener (grpc, http); at most listen.max_connections.",
		}, []string{"listener"}),
	}
	if reg != nil {
		reg.MustRegister(m.Refused, m.Open)
	}
	return m
}

// Listener is a net.Listener that holds at most max connections open at
// once. It is safe for concurrent use, as net.Listener is.
type Listener struct {
	net.Listener
	name    string
	max     int64
	open    atomic.Int64 // connections returned by Accept and not yet closed
	refused prometheus.Counter
	gauge   prometheus.Gauge
	log     *slog.Logger
	now     func() time.Time

	lastLog  atomic.Int64 // unix ns of the last refusal line (0: none yet)
	sinceLog atomic.Int64 // refusals not yet logged
}

// Wrap caps l at max connections open at once (max > 0), counting and
// logging under name.
func Wrap(l net.Listener, name string, max int, m *Metrics, log *slog.Logger) *Listener {
	return &Listener{Listener: l, name: name, max: int64(max),
		refused: m.Refused.WithLabelValues(name), gauge: m.Open.WithLabelValues(name), log: log, now: time.Now}
}

// Accept returns the next connection within the cap; those past it are
// closed here and never returned.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			l.gauge.Inc()
			return &conn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset: the client learns at once, and no TIME_WAIT is left here
		}
		c.Close()
		l.refuse()
	}
}

// refuse counts a refused connection and logs, at most once per
// logEvery, how many were refused since the last line.
func (l *Listener) refuse() {
	l.refused.Inc()
	l.sinceLog.Add(1)
	now := l.now().UnixNano()
	last := l.lastLog.Load()
	if now-last < int64(logEvery) || !l.lastLog.CompareAndSwap(last, now) {
		return
	}
	l.log.Warn("connlimit: refused connections: the listener holds listen.max_connections open",
		"listener", l.name, "max_connections", l.max, "refused", l.sinceLog.Swap(0))
}

// conn gives its place back once, on its first Close.
type conn struct {
	net.Conn
	l    *Listener
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.gauge.Dec()
	})
	return err
}
