package sidecar

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota/local"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
)

// ReplicaIDEnv names this replica in Redis heartbeats (feed it the pod name
// through the downward API); the hostname is used without it.
const ReplicaIDEnv = "EXTAUTHZ_REPLICA_ID"

// redisLog carries go-redis's own messages (a failed dial, a pool
// problem) into the structured log at debug level instead of unstructured
// lines on stderr. During an outage go-redis writes one per failed call;
// the store already logs the transitions that matter (marked down, back
// up) and counts every failure in extauthz_redis_calls_total.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "go-redis", "detail", fmt.Sprintf(format, v...))
}

// redisParts is everything that talks to Redis.
type redisParts struct {
	*redisstore.Opened
	clients *redisstore.Clients
	resets  *redisstore.Resets // counter resets between replicas; set once the counters API exists
}

// connectRedis builds the client and the Redis-backed limiters. An
// unreachable Redis is not fatal: policies follow on_redis_error until it
// answers. A refused password is, because it will not fix itself.
func connectRedis(cfg *config.Config, counts *local.Table, reg prometheus.Registerer, log *slog.Logger) (*redisParts, error) {
	rc := cfg.Redis
	password, err := secretFromEnv(rc.PasswordEnv, "redis.password_env")
	if err != nil {
		return nil, err
	}
	co := redisstore.ClientOptions{
		Addrs:    rc.Addrs,
		Username: rc.Username,
		Password: password,
		Timeout:  rc.Timeout,
		PoolSize: rc.PoolSize,
		Name:     "extauthz",
	}
	where := []any{"addrs", strings.Join(rc.Addrs, ","), "cluster", len(rc.Addrs) > 1}
	if sc := rc.Sentinel; sc != nil {
		sp, err := secretFromEnv(sc.PasswordEnv, "redis.sentinel.password_env")
		if err != nil {
			return nil, err
		}
		co.Addrs, co.MasterName, co.SentinelUsername, co.SentinelPassword = sc.Addrs, sc.MasterName, sc.Username, sp
		where = []any{"sentinels", strings.Join(sc.Addrs, ","), "master_name", sc.MasterName}
	}
	if rc.TLS != nil {
		tc, err := ClientTLS(rc.TLS)
		if err != nil {
			return nil, err
		}
		co.TLS = tc
	}
	redis.SetLogger(redisLog{log.With("component", "go-redis")})
	clients, err := redisstore.NewClients(co)
	if err != nil {
		return nil, err
	}
	// Asked on the connection decisions ride (clients.Pipe), which this
	// dials: the main pool would dial one that then idles.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	pingErr := clients.Pipe.Ping(ctx).Err()
	cancel()
	switch err := pingErr; {
	case err == nil:
		log.Info("redis connected", where...)
	case isAuthError(err):
		clients.Close()
		return nil, authError(rc, err)
	default:
		log.Warn("redis unreachable at start-up; policies follow on_redis_error until it answers",
			append(where, "error", err.Error())...)
	}

	opened, err := redisstore.Open(clients.Pipe, clients.Close, redisstore.OpenOptions{
		Store: clients.StoreOptions(redisstore.StoreOptions{Prefix: rc.KeyPrefix, Timeout: rc.Timeout, Metrics: redisstore.NewMetrics(reg), Log: log,
			WaitReplicas: rc.WaitReplicas, WaitTimeout: rc.WaitTimeout}),
		MaxKeys: cfg.Local.MaxKeys,
		Counts:  counts,
		Warm: func(store *redisstore.Store) error {
			if pingErr != nil {
				return nil // the scripts load on first use once Redis answers
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if werr := store.Warm(ctx); werr != nil {
				log.Warn("loading scripts into redis", "error", werr.Error())
			}
			return nil
		},
		ReplicaID: redisstore.ReplicaID(os.Getenv(ReplicaIDEnv)),
		PeerTTL:   cfg.Fallback.PeerTTL,
		MinPeers:  cfg.Fallback.MinPeers,
		Hybrid:    redisstore.HybridOptions{SliceIdle: cfg.Local.SliceIdle, LeaseTTL: cfg.Local.LeaseTTL, Log: log},
	})
	if err != nil {
		return nil, err
	}
	return &redisParts{Opened: opened, clients: clients}, nil
}

// secretFromEnv returns the value of the environment variable name
// (configured at path); "" when name is.
func secretFromEnv(name, path string) (string, error) {
	if name == "" {
		return "", nil
	}
	v, ok := os.LookupEnv(name)
	if !ok {
		return "", fmt.Errorf("%s: environment variable %s is not set", path, name)
	}
	return v, nil
}

// authError says whose credentials were refused. go-redis reports a
// sentinel's refusal when no sentinel would name the master, so with
// Sentinel both sets of credentials are named.
func authError(rc *config.Redis, err error) error {
	if sc := rc.Sentinel; sc != nil {
		return fmt.Errorf("redis (master %q through sentinels %s) refused the credentials (redis: user %q, password from $%s; sentinels: user %q, password from $%s): %v",
			sc.MasterName, strings.Join(sc.Addrs, ","), rc.Username, rc.PasswordEnv, sc.Username, sc.PasswordEnv, err)
	}
	return fmt.Errorf("redis %s refused the credentials (user %q, password from $%s): %v",
		strings.Join(rc.Addrs, ","), rc.Username, rc.PasswordEnv, err)
}

func isAuthError(err error) bool {
	msg := err.Error()
	for _, prefix := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "ERR AUTH", "ERR invalid password"} {
		if strings.Contains(msg, prefix) {
			return true
		}
	}
	return false
}

// close stops listening for counter resets, gives unspent hybrid tokens
// back, leaves the heartbeat set and closes the client. It is safe on a
// nil receiver.
func (p *redisParts) close(log *slog.Logger) {
	if p == nil {
		return
	}
	p.resets.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := p.Opened.Close(ctx); err != nil {
		log.Warn("closing redis client", "error", err.Error())
	}
}
