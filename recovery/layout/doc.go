// Package layout is the cluster's shape as etcd keeps it: how many
// partitions, how many replicas of each, the tables every partition
// holds, and the placement written with it. Nodes, clients and tools read
// it from here, one decoding for all.
//
// Invariants: Key is written once (Init is create-if-absent, with the
// placement in the same etcd transaction); every Config read back has
// passed Validate, so each table converts to a valid partition.Schema.
package layout
