// Package layout is the cluster's shape as etcd keeps it: how many
// partitions, how many replicas of each, the tables every partition
// holds, and the placement written with it. Nodes, clients and tools read
// it from here, one decoding for all.
//
// Init is called by `rejoin init` and by the demo. The placement grows
// with partitions x replicas, past the 128 operations etcd takes in one
// transaction by default, so Init writes it in transactions of at most
// InitTxnOpsMax puts, and Key last.
//
// Invariants: Key is written once, by the last transaction of an Init,
// after the whole placement; so a reader that finds Key finds the whole
// placement, and one that does not finds no cluster (ErrMissing), never
// half of one. While an Init writes, InitKey holds its token, and each of
// its transactions is conditional on that token and on Key being absent:
// a newer Init takes the token (clearing the placement the older one
// left), after which the older one can write nothing. Every Config read
// back has passed Validate, so each table converts to a valid
// partition.Schema.
package layout
