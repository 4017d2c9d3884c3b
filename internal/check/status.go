package check

import (
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/extauthz/extauthz/internal/engine"
)

// DecisionError is the gRPC status a door answers with when the engine's
// decision failed with err (never nil): the caller's own context ending
// (outcome engine.Canceled) is its gRPC code, CANCELED or
// DEADLINE_EXCEEDED, as the caller went away and no answer reaches it;
// anything else is INTERNAL, its message err's text after prefix (the
// door's name, "rls: ", or "" for Check). Envoy applies its failure mode
// to either; the status only tells the two apart in its logs and stats.
// The Check door and the rate limit service door answer with it.
func DecisionError(err error, outcome engine.Outcome, prefix string) error {
	if outcome == engine.Canceled {
		return grpcstatus.FromContextError(err).Err()
	}
	return grpcstatus.Error(codes.Internal, prefix+err.Error())
}
