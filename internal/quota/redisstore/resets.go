package redisstore

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Design note: a counter reset through one replica's admin API must reach
// every replica, because each holds part of a key's state itself (see
// inspect.go). The resetting replica deletes the key's Redis keys, forgets
// its own part, and publishes the partition key on a Redis pub/sub channel
// (PUBLISH reaches every node's subscribers in a Redis Cluster too); every
// replica subscribes and forgets its part when the message arrives, within
// a round trip.
//
// Pub/sub delivers at most once: a replica whose subscription is down at
// that moment (Redis unreachable for it, the connection re-established)
// misses the message. What it then keeps is bounded: in redis mode
// nothing that matters (the next decision reads Redis); in hybrid mode its
// unspent slice, at most a quarter of the bucket divided by the replicas,
// spent within the slice's horizon of traffic or given back after
// local.slice_idle, and a cached denial, until the next token was due; in
// local mode and in fallback buckets, its own count, which was never
// shared. go-redis re-subscribes on its own after a broken connection.

// ResetsChannel is the pub/sub channel of counter resets, after the key
// prefix.
const ResetsChannel = "counter-resets"

// Resets carries counter resets between the replicas sharing Redis.
type Resets struct {
	client  redis.UniversalClient
	channel string
	id      string // this replica's, to skip its own messages
	ps      *redis.PubSub
	log     *slog.Logger
	wg      sync.WaitGroup
}

// NewResets subscribes to the resets of the replicas sharing client's
// Redis (keys under prefix) and calls forget with each partition key
// another replica reset. id names this replica (Peers.ID). It waits up
// to wait for the subscription to be confirmed, so a reset right after
// start-up is not missed; an unreachable Redis does not hold it longer,
// and go-redis subscribes once Redis answers.
func NewResets(client redis.UniversalClient, prefix, id string, forget func(partition string), wait time.Duration, log *slog.Logger) *Resets {
	r := &Resets{client: client, channel: prefix + ResetsChannel, id: id, log: log}
	r.ps = client.Subscribe(context.Background(), r.channel)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	if _, err := r.ps.Receive(ctx); err != nil {
		log.Warn("counter resets: not subscribed yet; resets through other replicas reach this one once redis answers", "error", err.Error())
	}
	cancel()
	ch := r.ps.Channel()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for m := range ch {
			from, partition, ok := strings.Cut(m.Payload, "\n")
			if !ok || from == r.id {
				continue
			}
			forget(partition)
		}
	}()
	return r
}

// Publish tells the other replicas that partition's counter was reset.
func (r *Resets) Publish(ctx context.Context, partition string) error {
	return r.client.Publish(ctx, r.channel, r.id+"\n"+partition).Err()
}

// Close unsubscribes.
func (r *Resets) Close() {
	if r == nil {
		return
	}
	r.ps.Close()
	r.wg.Wait()
}
