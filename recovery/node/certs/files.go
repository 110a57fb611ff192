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

// CADir is where the CA's key of certificates directory dir is kept
// unless told otherwise: beside dir, as <dir>-ca, never in it. Every node
// is given dir (it needs ca.crt), so a key there would let any one node
// mint any identity.
func CADir(dir string) string {
	clean := filepath.Clean(dir)
	return filepath.Join(filepath.Dir(clean), filepath.Base(clean)+"-ca")
}

// CreateCA writes a new CA: ca.crt to dir and ca.key to CADir(dir).
func CreateCA(dir string, lifetime time.Duration) (*CA, error) {
	return CreateCAAt(dir, CADir(dir), lifetime)
}

// CreateCAAt writes a new CA's certificate to dir and its key to caDir
// (both made if missing, caDir 0700). It refuses to overwrite either: a
// new CA would orphan every certificate the old one issued.
func CreateCAAt(dir, caDir string, lifetime time.Duration) (*CA, error) {
	if sameDir(dir, caDir) {
		return nil, fmt.Errorf("certs: the CA key's directory is the certificates directory %s, which every node is given: keep it apart", dir)
	}
	ca, err := NewCA(time.Now(), lifetime)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	if err := os.MkdirAll(caDir, 0o700); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	kder, err := ca.keyPEM()
	if err != nil {
		return nil, err
	}
	if err := writeNew(map[string][]byte{
		filepath.Join(dir, CACertFile):  ca.CertPEM,
		filepath.Join(caDir, CAKeyFile): kder,
	}); err != nil {
		return nil, err
	}
	return ca, nil
}

// sameDir reports whether a and b name one directory (b may not exist
// yet).
func sameDir(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}

// LoadCA reads the CA of dir, its key from CADir(dir).
func LoadCA(dir string) (*CA, error) { return LoadCAAt(dir, CADir(dir)) }

// LoadCAAt reads the CA's certificate from dir and its key from caDir.
func LoadCAAt(dir, caDir string) (*CA, error) {
	c, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("certs: %w (create the CA with `rejoin cert create-ca`)", err)
	}
	k, err := os.ReadFile(filepath.Join(caDir, CAKeyFile))
	if err != nil {
		hint := "certificates are issued where the CA key is: --ca-dir names its directory"
		if _, serr := os.Stat(filepath.Join(dir, CAKeyFile)); serr == nil {
			hint = fmt.Sprintf("%s holds a ca.key, as create-ca wrote it before: move it to %s, out of the directory every node is given", dir, caDir)
		}
		return nil, fmt.Errorf("certs: %w (%s)", err, hint)
	}
	return ParseCA(c, k)
}

// Create issues a certificate for id with the CA of dir (its key in
// CADir(dir)) and writes it to dir (Files); it refuses to overwrite one.
func Create(dir string, id Identity, o IssueOptions) (cert, key string, err error) {
	return CreateAt(dir, CADir(dir), id, o)
}

// CreateAt is Create with the CA's key in caDir.
func CreateAt(dir, caDir string, id Identity, o IssueOptions) (cert, key string, err error) {
	ca, err := LoadCAAt(dir, caDir)
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

// synced, if set, is told each path writeNew synced (a file, then its
// directory): the tests' view of what reached the disk.
var synced func(path string)

// writeNew writes each file (keys 0600, the rest 0644), creating them
// all or none: an existing file is an error and nothing is written. Each
// file is synced, and then each directory that got one, before it
// returns: a key is used (handed out, trusted by certificates issued
// next) as soon as it is written, and a crash must not leave a
// certificate whose key, or whose CA's key, is lost or torn.
func writeNew(files map[string][]byte) error {
	for p := range files {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("certs: %s exists: remove it first to replace it", p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("certs: %w", err)
		}
	}
	var written []string
	undo := func() {
		for _, w := range written {
			_ = os.Remove(w)
		}
	}
	dirs := map[string]bool{}
	for p, b := range files {
		mode := os.FileMode(0o644)
		if filepath.Ext(p) == ".key" {
			mode = 0o600
		}
		if err := writeExcl(p, b, mode); err != nil {
			undo()
			return err
		}
		written = append(written, p)
		dirs[filepath.Dir(p)] = true
	}
	for d := range dirs {
		if err := syncPath(d); err != nil {
			undo()
			return fmt.Errorf("certs: sync %s: %w", d, err)
		}
	}
	return nil
}

func writeExcl(p string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(p)
		return fmt.Errorf("certs: %w", err)
	}
	if synced != nil {
		synced(p)
	}
	return nil
}

// syncPath syncs a directory, so that the names of the files written in
// it survive a crash.
func syncPath(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err == nil && synced != nil {
		synced(dir)
	}
	return err
}
