//go:build !invariants

package partition

// invariantsEnabled turns on the expensive self-checks of the invariants
// build tag (go test -tags invariants), which CI runs as well.
const invariantsEnabled = false
