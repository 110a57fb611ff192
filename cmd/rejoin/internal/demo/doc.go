// Package demo is `rejoin demo`: it starts an embedded etcd and a cluster
// of node processes on loopback, loads rows, runs a writer through the
// gateway node n1, kills a node with SIGKILL, restarts it, injects a fault
// in the middle of the snapshot stream if asked, waits until every replica
// of every partition is live again, checks every replica's digest at a
// common txn ID and reads every acknowledged write back, and reports what
// it measured. It runs secure unless Config.Insecure: a CA and
// certificates in its directory (EnsureCerts), mutual TLS between the
// nodes, and etcd over TLS requiring a certificate of that CA from every
// client, the nodes included (EtcdTLSFlags, EmbeddedEtcdTLS), with etcd's
// authentication and the cluster's roles on (SetupEtcdAccess): the demo
// writes etcd as the admin (client root) and calls the nodes as its
// client, which etcd lets read only.
//
// Run is the whole demo; the command only binds flags to Config, and the
// end-to-end tests call Run with the binary they built.
//
// With Config.Plot (`--plot FILE.png`) the run is drawn (plot.go): the
// writer's throughput and p99 every 100 ms (plotrec.go) and the nodes'
// rejoin timelines (GET /timeline, recovery/node) on one time axis, with
// the run's events; the data goes to FILE.csv beside the picture
// (plotdata.go), and the picture is drawn from what that file reads back.
//
// bench.go is `rejoin bench --processes` (Bench): the same run in one
// fixed shape, two nodes with every partition on both and a writer at a
// fixed offered rate through n1, so that n2 rejoins every row of the
// cluster (a Redis replica's full resync of N keys); its summary adds the
// writes served against the rate offered, before and during the rejoin.
//
// redisbench.go is `rejoin bench --redis` (BenchRedis), the yardstick:
// the same rows and open-loop writer on a redis-server master, and a
// fresh replica's full resync (diskless sync and load) measured into the
// same BenchSummary fields where they mean the same thing; its master and
// replica are stopped by their pids and their directories removed.
//
// export.go lends `rejoin chaos` (internal/chaos) the process helpers:
// etcd as a process of its own and the node processes, each signalled and
// killed by its pid only.
package demo
