package rls

import (
	"context"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
)

// blocked is the limiter of a rate limit of 0 requests per unit
// (envoyproxy/ratelimit's way of blocking a descriptor): every request is
// over the limit, until the end of the unit's window (aligned to the
// unix epoch, as the windows of a fixed_window count), and nothing is
// counted anywhere.
type blocked struct{}

var _ quota.Limiter = blocked{}

func (blocked) Take(_ context.Context, _ string, l quota.Limit, _ int64, now time.Time) (quota.Decision, error) {
	w := int64(l.Window)
	left := time.Duration(w - now.UnixNano()%w)
	return quota.Decision{RetryAfter: left, ResetAfter: left}, nil
}

func (blocked) Refund(context.Context, string, quota.Limit, int64, time.Time) error { return nil }
