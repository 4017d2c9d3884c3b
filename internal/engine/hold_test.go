package engine

import (
	"context"
	"testing"
	"time"
)

// The default hold waits, and gives up with the context.
func TestSleepCtx(t *testing.T) {
	if err := sleepCtx(context.Background(), time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sleepCtx(ctx, time.Hour); err != context.Canceled {
		t.Fatalf("canceled: %v", err)
	}
}
