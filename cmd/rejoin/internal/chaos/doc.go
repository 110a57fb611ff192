// Package chaos is `rejoin chaos`: a randomized fault self-check of a real
// cluster, after FoundationDB's simulation and Jepsen.
//
// Run starts etcd as a process of its own and the node processes on
// loopback in a temporary directory (internal/demo's process helpers:
// every process is ours, signalled and killed by its pid only), all
// secure: mutual TLS between the nodes, and etcd over TLS requiring a
// certificate of the run's CA from every client (demo.EnsureCerts), loads
// rows, and runs for Config.Duration:
//   - a register workload: callers writing unique values to a few
//     registers (rows of table kv) and reading them, every op recorded
//     with its call and return times and its outcome (ok, failed,
//     uncertain; see Op);
//   - the volume writer of bench/load, its acknowledged writes kept;
//   - a nemesis playing a schedule that is a pure function of the seed
//     (Plan): SIGKILL a node and restart it 0 to 10 s later, SIGSTOP a
//     node past its TTL, kill the source or the destination of a rejoin
//     in progress, pause etcd for 1 to 6 s. Before each node fault it
//     reads the cluster and skips the fault if the node is not up or
//     holds the last live replica of a partition; so the same seed
//     replays the same schedule, while what was skipped depends on the
//     run;
//   - with Config.NetFaults (as root on Linux, netfault.go), network
//     faults by the kernel: for 2 to 30 s, the packets of a node to its
//     peers, to etcd or both, of a minority to the rest, or of two sides
//     but for a bridge node, dropped or reset by iptables owner rules on
//     loopback, each node process running as a uid of its own (NodeUID).
//
// Every successful op is recorded with its partition and time: the
// summary's Availability is each partition's longest gap during network
// and pause faults, split by whether the fault hit one of its replicas.
// Config.AvailabilityBounds fails the run past GapBoundFaulted (from
// the start of each fault that hit the partition: Availability) and
// GapBoundUnfaulted: issue 23's goal, which `rejoin chaos` checks by
// default.
//
// Then it heals everything and checks: every replica live within
// Config.LiveWithin; digests equal across each partition's replicas;
// every acknowledged write read back (an uncertain one may or may not be
// there); each register's history linearizable (porcupine, an uncertain
// write open-ended as Jepsen's :info, its return after every other op);
// no node exited on its own. The verdict is PASS or FAIL with the
// reasons; a FAIL keeps the run directory, with porcupine's HTML
// visualisation of a failing register.
//
// Config.Plant is a test-only planted fault (node.Config.PlantDropKey):
// each node loses its first write of one register, which the checker must
// report.
package chaos
