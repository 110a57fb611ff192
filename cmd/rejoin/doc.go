// Command rejoin is the one binary of the project: it runs a node, the demo,
// the benchmarks and the simulator, and inspects a running cluster.
//
//	rejoin demo      a local cluster on loopback: load, kill a node, rejoin it under writes, verify
//	rejoin init      create a cluster in an existing etcd: partitions, replicas, tables, placement
//	rejoin node      one node of a cluster (etcd endpoints, data directory, listen addresses)
//	rejoin replace   move a dead node's replicas onto a node that is not running yet
//	rejoin drain     move every replica off a running node (each a rejoin, then the old one removed)
//	rejoin rebalance move replicas onto the running nodes that hold fewest, until within one
//	rejoin put       write a value under a key (table kv, or --table; text, --hex or --base64)
//	rejoin get       print the value under a key
//	rejoin del       delete a key
//	rejoin load      write N rows at a rate through W callers, with a progress bar; throughput and latency percentiles
//	rejoin status    a cluster's nodes, replicas, moves and rejoin tasks, from etcd and each node's /status;
//	                 --watch redraws the rejoins under way every second
//	rejoin verify    every replica's digest at one common txn ID
//	rejoin bench     one in-process rejoin, and what it measured; --processes: 2 node processes,
//	                 one killed and rejoining every row under a fixed offered write rate
//	                 --redis: a fresh Redis replica's full resync of the same rows, to set beside it
//	rejoin sim       the seeded simulator: --seeds N runs 1..N, --seed S -v replays one
//	rejoin chaos     random faults over real processes for --duration, then the checks: PASS or FAIL
//	rejoin etcd      the embedded etcd as a process of its own (the walk-through's, the demo's, chaos's)
//	rejoin version   the module's version, commit and Go version (also --version)
//	rejoin completion a bash or zsh completion script, made from the commands' own flags
//	rejoin help      the usage, or one command's: rejoin help COMMAND
//
// `rejoin help <command>` (or `rejoin <command> -h`) says what a command does and lists its flags.
//
// Each subcommand only binds flags; the work lives in the packages
// (cmd/rejoin/internal/demo, cmd/rejoin/internal/chaos, recovery/node,
// recovery/sim, bench), so the tests drive the same code the command runs.
//
// Every command that reaches etcd takes --etcd. With an https:// endpoint
// and --certs-dir DIR, its etcd client checks etcd's certificate against
// DIR/ca.crt and presents its own from DIR: a node its node.n<N>, a client
// command client.<NAME> (--client: by default app for the commands that
// read and write the data, root, the admin, for those that change the
// cluster); --etcd-cacert,
// --etcd-cert and --etcd-key name other files and win over these. One
// function holds the rule for every command (etcdFlags.useCertsDir), and
// a file it needs that is missing is named before any dial.
//
// Exit status (usage lists them too): 0 on success (and for -h); 1 when
// the command ran and failed, or found what it checks for wrong (digests
// that differ, a simulator seed that failed, acknowledged writes lost, a
// chaos FAIL); 2 for a usage error; 3 when an outcome is unknown (a write
// sent with no answer: it may or may not have happened; verify: a
// partition no replica of which could be read); 4 when the key is not
// there (get, del); 5 when status finds no node registered; 130 when
// Ctrl-C stopped a command before it was done (drain, rebalance say what
// is under way and what to run next).
package main
