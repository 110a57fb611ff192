package certs

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"path/filepath"
)

// The files of an etcd server certificate in a certificates directory:
// the single-machine setup's etcd (`rejoin etcd`, the demo's) serves its
// clients with them.
const (
	EtcdCertFile = "etcd.crt"
	EtcdKeyFile  = "etcd.key"
)

// EtcdFiles are the etcd server certificate and key file names in dir.
func EtcdFiles(dir string) (cert, key string) {
	return filepath.Join(dir, EtcdCertFile), filepath.Join(dir, EtcdKeyFile)
}

// IssueEtcd makes the server certificate of an etcd that the cluster's
// CA vouches for, naming o.Hosts (the addresses clients dial: etcd's
// clients check the host name, as for any TLS server). It carries no
// rejoin identity, so a node refuses it as a peer: it is etcd's, good for
// etcd's client and peer URLs (server auth, and client auth for etcd's
// peer links), never for the node protocol.
func (ca *CA) IssueEtcd(o IssueOptions) (Issued, error) {
	if ca.key == nil {
		return Issued{}, errors.New("certs: the CA has no key here: issue where ca.key is")
	}
	if len(o.Hosts) == 0 {
		return Issued{}, errors.New("certs: an etcd certificate needs the hosts its clients dial")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "etcd", Organization: []string{"rejoin"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	addHosts(tmpl, o.Hosts)
	return ca.sign(tmpl, o, "etcd's certificate")
}

// CreateEtcd issues an etcd server certificate with the CA of dir (its
// key in CADir(dir)) and writes it to dir (EtcdFiles); it refuses to
// overwrite one.
func CreateEtcd(dir string, o IssueOptions) (cert, key string, err error) {
	return CreateEtcdAt(dir, CADir(dir), o)
}

// CreateEtcdAt is CreateEtcd with the CA's key in caDir.
func CreateEtcdAt(dir, caDir string, o IssueOptions) (cert, key string, err error) {
	ca, err := LoadCAAt(dir, caDir)
	if err != nil {
		return "", "", err
	}
	is, err := ca.IssueEtcd(o)
	if err != nil {
		return "", "", err
	}
	cert, key = EtcdFiles(dir)
	if err := writeNew(map[string][]byte{cert: is.CertPEM, key: is.KeyPEM}); err != nil {
		return "", "", err
	}
	return cert, key, nil
}

// EtcdClientConfig is how the holder dials an etcd whose server
// certificate the cluster CA issued (IssueEtcd), presenting its own
// certificate for etcd's client-certificate auth: TLS 1.3, and etcd's
// certificate checked against the CA and the host name dialled.
func (t *TLS) EtcdClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		RootCAs:      t.pool,
		Certificates: []tls.Certificate{t.cert},
	}
}
