package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"
)

// ErrPeer: the peer of a TLS connection is not who it must be.
var ErrPeer = errors.New("certs: peer refused")

// TLS is one holder's credentials: its certificate and key, and the
// cluster CA it trusts. Safe for concurrent use; the configs it returns
// are new values each call.
type TLS struct {
	id   Identity
	ca   *x509.Certificate
	pool *x509.CertPool
	cert tls.Certificate
	leaf *x509.Certificate
}

// New builds credentials from PEM texts: the CA's certificate and the
// holder's certificate and key. The certificate must carry a valid
// identity and be issued by the CA.
func New(caPEM, certPEM, keyPEM []byte) (*TLS, error) {
	ca, err := parseCert(caPEM)
	if err != nil {
		return nil, fmt.Errorf("certs: CA certificate: %w", err)
	}
	if !ca.IsCA {
		return nil, fmt.Errorf("certs: %q is not a CA certificate", ca.Subject.CommonName)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certs: certificate and key: %w", err)
	}
	leaf := pair.Leaf
	id, err := IdentityOf(leaf)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if err := leaf.CheckSignatureFrom(ca); err != nil {
		return nil, fmt.Errorf("certs: %s's certificate is not issued by this CA (%q): %w", id, ca.Subject.CommonName, err)
	}
	return &TLS{id: id, ca: ca, pool: pool, cert: pair, leaf: leaf}, nil
}

// Identity is the holder's identity.
func (t *TLS) Identity() Identity { return t.id }

// NotAfter is when the holder's certificate expires.
func (t *TLS) NotAfter() time.Time { return t.leaf.NotAfter }

// ServerConfig is how a node accepts connections: TLS 1.3, its
// certificate, and a client certificate from the cluster CA with a valid
// identity required of every dialler. What the identity may do, the
// node decides per connection kind (PeerOf).
func (t *TLS) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    t.pool,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := PeerOf(cs)
			return err
		},
	}
}

// DialConfig is how the holder dials a node: TLS 1.3, its own
// certificate, and the server's chain verified against the cluster CA.
// The server must be a node, and node want when want is not empty (the
// node the dialler looked up in etcd). The host name is not checked: the
// identity stands for it, so a node's certificate does not name its
// address.
func (t *TLS) DialConfig(want string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.cert},
		// Verification is VerifyConnection's below, done in full: chain,
		// validity, key usage, then the identity in place of a host name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return t.verifyServer(cs, want)
		},
	}
}

func (t *TLS) verifyServer(cs tls.ConnectionState, want string) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("%w: the server sent no certificate", ErrPeer)
	}
	opts := x509.VerifyOptions{Roots: t.pool, Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		return fmt.Errorf("%w: server certificate: %w", ErrPeer, err)
	}
	id, err := IdentityOf(cs.PeerCertificates[0])
	if err != nil {
		return fmt.Errorf("%w: server certificate: %w", ErrPeer, err)
	}
	if id.Role != RoleNode {
		return fmt.Errorf("%w: the server is %s, not a node", ErrPeer, id)
	}
	if want != "" && id.Name != want {
		return fmt.Errorf("%w: the server is %s, not node %s", ErrPeer, id, want)
	}
	return nil
}

// PeerOf is the identity of the verified peer of a TLS connection whose
// handshake is done.
func PeerOf(cs tls.ConnectionState) (Identity, error) {
	if len(cs.PeerCertificates) == 0 {
		return Identity{}, fmt.Errorf("%w: no certificate", ErrPeer)
	}
	id, err := IdentityOf(cs.PeerCertificates[0])
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %w", ErrPeer, err)
	}
	return id, nil
}
