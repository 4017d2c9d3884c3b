package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/quota/local"
)

// openAgainstNothing opens over a client of an address nothing listens on:
// Open dials nothing itself, and the first heartbeat fails at once.
func openAgainstNothing(t *testing.T, o OpenOptions) (*Opened, *int, error) {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 50 * time.Millisecond, MaxRetries: -1})
	closed := new(int)
	closeConn := func() error { *closed++; return client.Close() }
	counts, err := local.NewTable(16)
	if err != nil {
		t.Fatal(err)
	}
	o.Counts, o.PeerTTL, o.MinPeers = counts, 3*time.Second, 1
	o.Store.Log = slog.New(slog.DiscardHandler)
	if o.MaxKeys == 0 {
		o.MaxKeys = 16
	}
	opened, err := Open(client, closeConn, o)
	return opened, closed, err
}

// What Open was given to close is closed when Open fails, whichever step
// fails: the caller has nothing to close it with.
func TestOpenClosesTheConnectionWhenItFails(t *testing.T) {
	_, closed, err := openAgainstNothing(t, OpenOptions{MaxKeys: -1})
	if err == nil || *closed != 1 {
		t.Fatalf("a table that cannot be made: err %v, connection closed %d times, want an error and 1", err, *closed)
	}
	warmErr := errors.New("no scripts")
	_, closed, err = openAgainstNothing(t, OpenOptions{Warm: func(*Store) error { return warmErr }})
	if !errors.Is(err, warmErr) || *closed != 1 {
		t.Fatalf("a failed warm-up: err %v, connection closed %d times, want %v and 1", err, *closed, warmErr)
	}
}

// Both modes come out of one Open, each wrapped in Resilient over its own
// level source, and Close releases the connection once.
func TestOpenWiresBothModesAndClosesOnce(t *testing.T) {
	opened, closed, err := openAgainstNothing(t, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, ok := opened.Redis.(*Resilient)
	if !ok {
		t.Fatalf("redis mode is a %T, want a *Resilient", opened.Redis)
	}
	if _, ok := r.primary.(*Redis); !ok || r.levels != LevelSource(opened.Table) {
		t.Errorf("redis mode: primary %T over levels %T, want *Redis over the Table", r.primary, r.levels)
	}
	h, ok := opened.Hybrid.(*Resilient)
	if !ok {
		t.Fatalf("hybrid mode is a %T, want a *Resilient", opened.Hybrid)
	}
	if hy, ok := h.primary.(*Hybrid); !ok || h.levels != LevelSource(hy) {
		t.Errorf("hybrid mode: primary %T over levels %T, want *Hybrid over its own leases", h.primary, h.levels)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	opened.Close(ctx)
	if *closed != 1 {
		t.Fatalf("Close closed the connection %d times, want 1", *closed)
	}
}
