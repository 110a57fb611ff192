// Package certs is the cluster's public-key infrastructure: a cluster CA,
// the certificates it issues to nodes and clients, and the TLS
// configurations with which a node serves and dials, and a client dials
// (docs/DESIGN.md "Who may talk to a node").
//
// # Identities
//
// A certificate carries its holder's role and name as exactly one URI
// subject alternative name:
//
//	rejoin://node/n3        node n3 (feeds as initiator 3, rejoins as n3)
//	rejoin://client/loader  a client named loader (procedure calls only)
//
// The URI SAN, not the CommonName, is the identity: SANs are where X.509
// puts names a relying party checks (RFC 6125 retired the CommonName for
// that), Go's x509 parses them into a typed field, and a name constraint
// on a CA can bound them. The CommonName repeats the identity as
// "node:n3" or "client:loader" for a human reading `openssl x509 -text`
// and for etcd, which under its authentication takes a client
// certificate's CommonName as its user (docs/DESIGN.md "Who may write
// etcd"); the nodes never read it. Extended key usage bounds the role too: a node's
// certificate is good for both ends of a connection (server and client
// auth), a client's only for the dialling end, so a client certificate
// cannot serve as a node.
//
// # Verification
//
// Both ends verify the peer's chain against the cluster CA, with TLS 1.3
// only. A dialler checks the name of the node it meant to reach (from
// etcd) against the server's certificate instead of a host name, so a
// node's certificate does not depend on its address; a node checks the
// dialler's identity against what its hello claims (recovery/node).
//
// # Files
//
// A certificates directory holds ca.crt (every holder needs it),
// node.n<N>.crt and .key, and client.<name>.crt and .key, and for an etcd
// the cluster runs itself (`rejoin etcd --certs-dir`, the demo's) etcd.crt
// and .key: a server certificate naming etcd's host, with no rejoin
// identity, so no node accepts it as a peer. The CA's key, ca.key, is kept
// apart (CADir: <dir>-ca beside it, or `rejoin cert --ca-dir`): every node
// is given the certificates directory, and one node holding the CA's key
// could mint any identity. Keys are written 0600, every file and its
// directory synced before a call returns, and nothing is overwritten.
// `rejoin cert` writes them; Load reads them back.
//
// A node or client certificate is also an etcd client certificate
// (EtcdClientConfig): an etcd that requires client certificates from the
// cluster CA admits the nodes and the tools, and nobody else.
package certs
