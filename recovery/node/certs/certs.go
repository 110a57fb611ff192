package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/rejoin-db/rejoin/txnid"
)

// ErrIdentity: a certificate, or a name given to be put in one, that is
// not a valid rejoin identity.
var ErrIdentity = errors.New("certs: bad identity")

// Role is what a certificate's holder may do.
type Role string

const (
	// RoleNode: a node of the cluster; it serves all connection kinds
	// and dials feeds, rejoin and repair streams under its own name.
	RoleNode Role = "node"
	// RoleClient: a client; it may only call procedures.
	RoleClient Role = "client"
)

// uriScheme is the scheme of identity URIs (rejoin://node/n3).
const uriScheme = "rejoin"

// Identity is who holds a certificate.
type Identity struct {
	Role Role
	// Name is "n<N>" for a node, the client's name for a client.
	Name string
}

// NodeID is the identity of node number n (named n<N>, as
// node.NodeName does).
func NodeID(n int) Identity { return Identity{Role: RoleNode, Name: "n" + strconv.Itoa(n)} }

// ClientID is the identity of the client named name.
func ClientID(name string) Identity { return Identity{Role: RoleClient, Name: name} }

// String is "node:n3" or "client:NAME" (also the certificate's CommonName).
func (id Identity) String() string { return string(id.Role) + ":" + id.Name }

// nodeNumberMax bounds a node number as the node package does: a node's
// number is its initiator's.
const nodeNumberMax = int(txnid.InitiatorsMax)

// clientName is the shape of a client's name: a file name and a URI path
// segment without escaping.
var clientName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// NodeNumber is the node's number (3 for n3); ok is false for a client.
func (id Identity) NodeNumber() (int, bool) {
	if id.Role != RoleNode || !strings.HasPrefix(id.Name, "n") {
		return 0, false
	}
	n, err := strconv.Atoi(id.Name[1:])
	if err != nil || n < 1 || n >= nodeNumberMax || "n"+strconv.Itoa(n) != id.Name {
		return 0, false
	}
	return n, true
}

// Check reports whether id is a valid identity.
func (id Identity) Check() error {
	switch id.Role {
	case RoleNode:
		if _, ok := id.NodeNumber(); !ok {
			return fmt.Errorf("%w: node name %q, want n<N> with N in 1..%d", ErrIdentity, id.Name, nodeNumberMax-1)
		}
	case RoleClient:
		if !clientName.MatchString(id.Name) {
			return fmt.Errorf("%w: client name %q, want 1-64 of A-Z a-z 0-9 . _ - (not starting with . _ -)", ErrIdentity, id.Name)
		}
	default:
		return fmt.Errorf("%w: role %q, want node or client", ErrIdentity, id.Role)
	}
	return nil
}

func (id Identity) uri() *url.URL {
	return &url.URL{Scheme: uriScheme, Host: string(id.Role), Path: "/" + id.Name}
}

// IdentityOf reads the identity a certificate carries: its one URI SAN
// of scheme rejoin. It does not verify the certificate.
func IdentityOf(c *x509.Certificate) (Identity, error) {
	var found []Identity
	for _, u := range c.URIs {
		if u.Scheme != uriScheme {
			continue
		}
		id := Identity{Role: Role(u.Host), Name: strings.TrimPrefix(u.Path, "/")}
		if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Port() != "" {
			return Identity{}, fmt.Errorf("%w: identity URI %q has more than a role and a name", ErrIdentity, u)
		}
		if err := id.Check(); err != nil {
			return Identity{}, fmt.Errorf("identity URI %q: %w", u, err)
		}
		found = append(found, id)
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("%w: certificate %q has no rejoin:// URI SAN: it was not issued by `rejoin cert`", ErrIdentity, c.Subject.CommonName)
	case 1:
		return found[0], nil
	}
	return Identity{}, fmt.Errorf("%w: certificate %q has %d identities, want one", ErrIdentity, c.Subject.CommonName, len(found))
}

// CA is a cluster CA: its certificate and, where certificates are issued,
// its key.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     *ecdsa.PrivateKey
}

// Lifetimes of what `rejoin cert` issues by default.
const (
	CALifetimeDefault   = 10 * 365 * 24 * time.Hour
	CertLifetimeDefault = 2 * 365 * 24 * time.Hour
	// backdate is how far before now a certificate starts: a peer whose
	// clock is a little behind still accepts it.
	backdate = time.Hour
)

// NewCA makes a CA valid from now-backdate for lifetime.
func NewCA(now time.Time, lifetime time.Duration) (*CA, error) {
	if lifetime <= 0 {
		return nil, fmt.Errorf("certs: CA lifetime %s, want > 0", lifetime)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "rejoin cluster CA", Organization: []string{"rejoin"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(lifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true, // issues leaves only
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certs: create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), key: key}, nil
}

// ParseCA reads a CA from its PEM certificate and key.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parseCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("certs: CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("certs: %q is not a CA certificate", cert.Subject.CommonName)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certs: CA key: %w", err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("certs: the CA key does not match the CA certificate")
	}
	return &CA{Cert: cert, CertPEM: certPEM, key: key}, nil
}

// IssueOptions bound one issued certificate.
type IssueOptions struct {
	// NotBefore and NotAfter are its validity; zero values mean
	// now-backdate and now+CertLifetimeDefault.
	NotBefore, NotAfter time.Time
	// Hosts are DNS names and IP addresses put in a node's certificate
	// for clients that check a host name (a browser or a scraper on the
	// admin HTTP); the node protocol checks the identity instead.
	Hosts []string
}

// Issued is a certificate and its key, in PEM.
type Issued struct {
	CertPEM, KeyPEM []byte
}

// Issue makes a certificate for id, signed by the CA.
func (ca *CA) Issue(id Identity, o IssueOptions) (Issued, error) {
	if ca.key == nil {
		return Issued{}, errors.New("certs: the CA has no key here: issue where ca.key is")
	}
	if err := id.Check(); err != nil {
		return Issued{}, err
	}
	tmpl := &x509.Certificate{
		Subject:  pkix.Name{CommonName: id.String(), Organization: []string{"rejoin"}},
		KeyUsage: x509.KeyUsageDigitalSignature,
		URIs:     []*url.URL{id.uri()},
	}
	switch id.Role {
	case RoleNode:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		addHosts(tmpl, o.Hosts)
	case RoleClient:
		if len(o.Hosts) > 0 {
			return Issued{}, errors.New("certs: a client certificate names no hosts")
		}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	return ca.sign(tmpl, o, id.String())
}

// sign fills tmpl's validity (o's, bounded by the CA's), serial number
// and a new key, and signs it; what names the certificate in errors.
func (ca *CA) sign(tmpl *x509.Certificate, o IssueOptions, what string) (Issued, error) {
	now := time.Now()
	if o.NotBefore.IsZero() {
		o.NotBefore = now.Add(-backdate)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = now.Add(CertLifetimeDefault)
	}
	if !o.NotAfter.After(o.NotBefore) {
		return Issued{}, fmt.Errorf("certs: validity %s..%s is empty", o.NotBefore, o.NotAfter)
	}
	if o.NotAfter.After(ca.Cert.NotAfter) {
		o.NotAfter = ca.Cert.NotAfter // a leaf outliving its CA fails to verify anyway
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Issued{}, err
	}
	if tmpl.SerialNumber, err = newSerial(); err != nil {
		return Issued{}, err
	}
	tmpl.NotBefore, tmpl.NotAfter = o.NotBefore, o.NotAfter
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return Issued{}, fmt.Errorf("certs: issue %s: %w", what, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Issued{}, err
	}
	return Issued{CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", kder)}, nil
}

// addHosts puts hosts in tmpl's subject alternative names: IP addresses
// as such, the rest as DNS names.
func addHosts(tmpl *x509.Certificate, hosts []string) {
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// parseCert reads the first certificate of a PEM text.
func parseCert(b []byte) (*x509.Certificate, error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, errors.New("no PEM certificate")
		}
		if blk.Type == "CERTIFICATE" {
			return x509.ParseCertificate(blk.Bytes)
		}
	}
}

// parseKey reads a PKCS#8 (or SEC 1) ECDSA key from PEM.
func parseKey(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM key")
	}
	switch blk.Type {
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return nil, err
		}
		ek, ok := k.(*ecdsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("key is %T, want ECDSA", k)
		}
		return ek, nil
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(blk.Bytes)
	}
	return nil, fmt.Errorf("PEM block %q, want PRIVATE KEY", blk.Type)
}

// keyPEM is the CA's key in PEM (PKCS#8).
func (ca *CA) keyPEM() ([]byte, error) {
	if ca.key == nil {
		return nil, errors.New("certs: the CA has no key here")
	}
	der, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, err
	}
	return pemBlock("PRIVATE KEY", der), nil
}

// Credentials issues id a certificate and returns its credentials,
// without files (the tests' and an in-process cluster's way).
func (ca *CA) Credentials(id Identity, o IssueOptions) (*TLS, error) {
	is, err := ca.Issue(id, o)
	if err != nil {
		return nil, err
	}
	return New(ca.CertPEM, is.CertPEM, is.KeyPEM)
}
