//go:build invariants

package partition

const invariantsEnabled = true
