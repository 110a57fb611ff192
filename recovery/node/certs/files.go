package certs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// The CA's files in a certificates directory.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// Files are the certificate and key file names of id in dir:
// node.n3.crt and node.n3.key, client.NAME.crt and client.NAME.key.
func Files(dir string, id Identity) (cert, key string) {
	base := filepath.Join(dir, string(id.Role)+"."+id.Name)
	return base + ".crt", base + ".key"
}

// CreateCA writes a new CA to dir (made if missing): ca.crt and ca.key.
// It refuses to overwrite either: a new CA would orphan every
// certificate the old one issued.
func CreateCA(dir string, lifetime time.Duration) (*CA, error) {
	ca, err := NewCA(time.Now(), lifetime)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	kder, err := ca.keyPEM()
	if err != nil {
		return nil, err
	}
	if err := writeNew(map[string][]byte{
		filepath.Join(dir, CACertFile): ca.CertPEM,
		filepath.Join(dir, CAKeyFile):  kder,
	}); err != nil {
		return nil, err
	}
	return ca, nil
}

// LoadCA reads the CA of dir, key included.
func LoadCA(dir string) (*CA, error) {
	c, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("certs: %w (create the CA with `rejoin cert create-ca`)", err)
	}
	k, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("certs: %w (certificates are issued where the CA key is)", err)
	}
	return ParseCA(c, k)
}

// Create issues a certificate for id with the CA of dir and writes it
// beside the CA (Files); it refuses to overwrite one.
func Create(dir string, id Identity, o IssueOptions) (cert, key string, err error) {
	ca, err := LoadCA(dir)
	if err != nil {
		return "", "", err
	}
	is, err := ca.Issue(id, o)
	if err != nil {
		return "", "", err
	}
	cert, key = Files(dir, id)
	if err := writeNew(map[string][]byte{cert: is.CertPEM, key: is.KeyPEM}); err != nil {
		return "", "", err
	}
	return cert, key, nil
}

// Load reads the credentials of id from dir: ca.crt and id's files. The
// certificate must name id.
func Load(dir string, id Identity) (*TLS, error) {
	if err := id.Check(); err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	cf, kf := Files(dir, id)
	c, err := os.ReadFile(cf)
	if err != nil {
		return nil, fmt.Errorf("certs: %w (issue it with `rejoin cert create-%s`)", err, id.Role)
	}
	k, err := os.ReadFile(kf)
	if err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	t, err := New(ca, c, k)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cf, err)
	}
	if t.Identity() != id {
		return nil, fmt.Errorf("%w: %s holds a certificate of %s, not %s", ErrIdentity, cf, t.Identity(), id)
	}
	return t, nil
}

// writeNew writes each file (keys 0600, the rest 0644), creating them
// all or none: an existing file is an error and nothing is written.
func writeNew(files map[string][]byte) error {
	for p := range files {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("certs: %s exists: remove it first to replace it", p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("certs: %w", err)
		}
	}
	var written []string
	for p, b := range files {
		mode := os.FileMode(0o644)
		if filepath.Ext(p) == ".key" {
			mode = 0o600
		}
		if err := writeExcl(p, b, mode); err != nil {
			for _, w := range written {
				_ = os.Remove(w)
			}
			return err
		}
		written = append(written, p)
	}
	return nil
}

func writeExcl(p string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		_ = os.Remove(p)
		return fmt.Errorf("certs: %w", err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(p)
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}
