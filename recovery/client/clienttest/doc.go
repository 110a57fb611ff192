// Package clienttest is a fake rejoin cluster for tests of code on the
// client: nodes that speak the client side of the node protocol (Hello,
// Call, Reply over stream.Conn) and execute the calls on in-memory
// partitions with the builtin procedures, plus helpers that write the etcd
// keys the client reads. It has no replication, feed or rejoin: every node
// of a Cluster executes on the same partitions, and a CallEach answers one
// identical result per name in Cluster.Replicas.
package clienttest
