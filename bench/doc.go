// Package bench holds the workloads and measurements shared by the Go
// benchmarks and `rejoin bench`: the binary only binds flags, the work lives
// here, so a figure from either comes from the same code.
//
// Sub-benchmarks are named key=value (rows=1e6/codec=zstd) so benchstat can
// compare runs. Speed is measured here, never asserted by a timed test.
//
// Status: the per-package benchmarks live beside their code for now
// (partition, wire); end-to-end workloads arrive with the protocol issue.
package bench
