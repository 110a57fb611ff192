package layout_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the package's tests: every
// etcd and client a test starts is stopped at its cleanup.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
