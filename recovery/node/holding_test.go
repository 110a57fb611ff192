package node

import (
	"testing"

	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// TestHoldingConfigValid: the attempt core takes the node's timing, which
// holdAttempt relies on (it panics otherwise).
func TestHoldingConfigValid(t *testing.T) {
	if _, err := supervise.NewHolding(holdingConfig, 0); err != nil {
		t.Fatal(err)
	}
}
