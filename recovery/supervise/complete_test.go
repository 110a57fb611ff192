package supervise

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/rejoin-db/rejoin/recovery/claim"
)

// TestCompleteAgain: a live destination's completion is tried again
// after any error but a final one, the rule the node and the simulator
// share.
func TestCompleteAgain(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("mark done: %w", claim.ErrStaleEpoch), false},
		{claim.ErrNoTask, false},
		{claim.ErrDuplicate, false},
		{errors.New("etcd unreachable"), true},
		{context.DeadlineExceeded, true},
	} {
		if got := CompleteAgain(c.err); got != c.want {
			t.Errorf("CompleteAgain(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
