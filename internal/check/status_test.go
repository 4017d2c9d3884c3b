package check

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/extauthz/extauthz/internal/engine"
)

// A decision that failed because its caller went away carries the
// context's code; any other failure is INTERNAL with the door's prefix.
func TestDecisionError(t *testing.T) {
	for _, tc := range []struct {
		err     error
		outcome engine.Outcome
		code    codes.Code
		msg     string
	}{
		{context.Canceled, engine.Canceled, codes.Canceled, context.Canceled.Error()},
		{context.DeadlineExceeded, engine.Canceled, codes.DeadlineExceeded, context.DeadlineExceeded.Error()},
		{errors.New("boom"), engine.Failed, codes.Internal, "rls: boom"},
	} {
		st := grpcstatus.Convert(DecisionError(tc.err, tc.outcome, "rls: "))
		if st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("%v (%v): %v %q, want %v %q", tc.err, tc.outcome, st.Code(), st.Message(), tc.code, tc.msg)
		}
	}
}
