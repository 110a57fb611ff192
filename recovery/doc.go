// Package recovery holds the rejoin protocol: the handshake that agrees on
// the txn ID S where streaming starts, the RecoverySource and
// RecoveryDestination processors, claims with fencing epochs, supervision
// and startup recovery (DESIGN.md steps 1 to 10).
//
// The protocol is written as state machines fed messages and ticks that
// return messages to send; only thin drivers touch connections, goroutines
// and timers, so a seeded simulator can replay every run.
//
// Invariants:
//   - Exactly one executor works a rejoin at a time; every message carries
//     the claim's fencing epoch and both ends reject an epoch lower than the
//     highest they have seen.
//   - The destination holds every txn >= S from its buffer, and becomes live
//     at the handoff txn E only if its digest equals the source's at E.
//   - Every phase has a stall timeout; every abort leaves the source as it
//     was before activation and the destination empty.
//
// Status: specified here, built by the protocol and claims issues.
package recovery
