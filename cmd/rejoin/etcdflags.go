package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rejoin-db/rejoin/recovery/node/certs"
)

// Environment variables that stand for the flags every command of a
// cluster repeats; a flag given wins.
const (
	envEtcd     = "REJOIN_ETCD"      // --etcd
	envCertsDir = "REJOIN_CERTS_DIR" // --certs-dir
	envClient   = "REJOIN_CLIENT"    // --client
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// etcdFlags are how a command reaches etcd: its endpoints, and for an
// etcd that serves TLS or has auth, the CA, a client certificate and a
// user.
type etcdFlags struct {
	endpoints          string
	cacert, cert, key  string
	user, passwordFile string
	// certsDir and id, set by useCertsDir, are the command's certificates
	// directory (its --certs-dir, read after parsing) and whose
	// certificate in it is the command's own.
	certsDir *string
	id       func() certs.Identity
}

func newEtcdFlags(fs *flag.FlagSet) *etcdFlags {
	f := &etcdFlags{}
	fs.StringVar(&f.endpoints, "etcd", os.Getenv(envEtcd), "comma-separated etcd `endpoints` ($REJOIN_ETCD if not given; https:// ones need a CA: --certs-dir's ca.crt or --etcd-cacert)")
	fs.StringVar(&f.cacert, "etcd-cacert", "", "`file`: the CA certificate (PEM) that etcd's server certificate is checked against (default for an https:// --etcd: --certs-dir's ca.crt)")
	fs.StringVar(&f.cert, "etcd-cert", "", "`file`: a client certificate (PEM) for an etcd that asks for one; with --etcd-key (default for an https:// --etcd: the command's own certificate in --certs-dir)")
	fs.StringVar(&f.key, "etcd-key", "", "`file`: the key of --etcd-cert (PEM)")
	fs.StringVar(&f.user, "etcd-user", "", "etcd user `name`, for an etcd with auth enabled; its password is read from --etcd-password-file")
	fs.StringVar(&f.passwordFile, "etcd-password-file", "", "`file` holding the password of --etcd-user (a file, so it shows in no process list)")
	return f
}

// config is the etcd client's config; errors name the flag.
func (f *etcdFlags) config() (clientv3.Config, error) {
	cfg := clientv3.Config{Endpoints: splitEndpoints(f.endpoints), DialTimeout: 3 * time.Second, Logger: zap.NewNop()}
	if len(cfg.Endpoints) == 0 {
		return cfg, errors.New("--etcd is required")
	}
	tlsCfg, err := f.tls()
	if err != nil {
		return cfg, err
	}
	cfg.TLS = tlsCfg
	user, pass, err := f.credentials()
	if err != nil {
		return cfg, err
	}
	cfg.Username, cfg.Password = user, pass
	return cfg, nil
}

// useCertsDir makes a command's certificates directory the default of
// its etcd client's files, the one rule of every command that reaches
// etcd: with an https:// endpoint and *dir given, --etcd-cacert defaults
// to dir's ca.crt and --etcd-cert and --etcd-key to the command's own
// certificate there (id's files: a node's node.n<N>, a client's
// client.<NAME>), so that the cluster's etcd (`rejoin etcd --certs-dir`,
// which requires a certificate of the cluster CA) needs no more flags than
// the nodes do. A flag given wins over its default. dir and id are read
// when the config is made, after the flags are parsed.
func (f *etcdFlags) useCertsDir(dir *string, id func() certs.Identity) {
	f.certsDir, f.id = dir, id
}

func (f *etcdFlags) https() bool {
	for _, e := range splitEndpoints(f.endpoints) {
		if strings.HasPrefix(e, "https://") {
			return true
		}
	}
	return false
}

// files are the etcd client's CA, certificate and key files: the flags,
// and where one is not given and useCertsDir's rule applies, the
// certificates directory's, each checked to be there so that a missing
// one is named now rather than as a failed handshake later.
func (f *etcdFlags) files() (cacert, cert, key string, err error) {
	if (f.cert == "") != (f.key == "") {
		return "", "", "", errors.New("--etcd-cert and --etcd-key go together")
	}
	cacert, cert, key = f.cacert, f.cert, f.key
	if f.certsDir == nil || *f.certsDir == "" || !f.https() {
		return cacert, cert, key, nil
	}
	dir := *f.certsDir
	var need []string
	if cacert == "" {
		cacert = filepath.Join(dir, certs.CACertFile)
		need = append(need, cacert)
	}
	if cert == "" {
		id := f.id()
		if err := id.Check(); err != nil {
			return "", "", "", err
		}
		cert, key = certs.Files(dir, id)
		need = append(need, cert, key)
	}
	for _, p := range need {
		if _, err := os.Stat(p); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return "", "", "", fmt.Errorf("%s: no such file; the etcd client of %s needs it, from --certs-dir %s (rejoin cert makes it; or give --etcd-cacert, --etcd-cert and --etcd-key)", p, f.endpoints, dir)
			}
			return "", "", "", fmt.Errorf("--certs-dir: %w", err)
		}
	}
	return cacert, cert, key, nil
}

// tls is the TLS config of the etcd client; nil when neither a flag nor
// the certificates directory asks for one.
func (f *etcdFlags) tls() (*tls.Config, error) {
	cacert, cert, key, err := f.files()
	if err != nil {
		return nil, err
	}
	if cacert == "" && cert == "" {
		if f.https() {
			return nil, errors.New("an https:// etcd endpoint needs a CA: --certs-dir (its ca.crt) or --etcd-cacert")
		}
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cacert != "" {
		b, err := os.ReadFile(cacert)
		if err != nil {
			return nil, fmt.Errorf("--etcd-cacert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--etcd-cacert %s: no PEM certificate", cacert)
		}
		cfg.RootCAs = pool
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("--etcd-cert/--etcd-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

func (f *etcdFlags) credentials() (user, password string, err error) {
	switch {
	case f.user == "" && f.passwordFile == "":
		return "", "", nil
	case f.user == "" || f.passwordFile == "":
		return "", "", errors.New("--etcd-user and --etcd-password-file go together")
	}
	b, err := os.ReadFile(f.passwordFile)
	if err != nil {
		return "", "", fmt.Errorf("--etcd-password-file: %w", err)
	}
	return f.user, strings.TrimRight(string(b), "\r\n"), nil
}

// probeTimeout bounds each step of a probe: the dial, the handshake, and
// the wait for the server's verdict on the client's certificate.
const probeTimeout = time.Second

// explain adds to err, etcd not answering in time, why when a probe finds
// it: etcd's client retries a refused connection or handshake until its
// deadline and then says only that.
func (f *etcdFlags) explain(err error) error {
	if errors.Is(err, rpctypes.ErrPermissionDenied) || errors.Is(err, rpctypes.ErrUserNotFound) {
		// etcd names neither the user nor what would do.
		who := "this command's etcd user"
		if f.certsDir != nil && *f.certsDir != "" && f.cert == "" && f.user == "" {
			who = "etcd user " + f.id().String() + " (this command's certificate)"
		}
		return fmt.Errorf("%w: etcd's authentication does not let %s do this: init, replace, drain, rebalance, undo-move, accept-loss and access are the admin's (--client root), status and verify need a reader at least (rejoin access --reader NAME)", err, who)
	}
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if why := f.probe(); why != nil {
		return fmt.Errorf("%w; %w", err, why)
	}
	return err
}

// check is what a command runs before its first etcd call, a node's too:
// a refused connection, handshake or certificate is named now, not after
// the command's bound as a "did not answer".
func (f *etcdFlags) check() error {
	if err := f.probe(); err != nil {
		return fmt.Errorf("etcd cannot be used: %w", err)
	}
	return nil
}

// probe checks each endpoint as the etcd client would reach it, at once
// and within probeTimeout each: nil if one answered (or gave no verdict
// in time: a paused etcd is waited for as before), else why none can be
// used: a refused connection, a TLS server dialled as plain, a plain one
// dialled as TLS, our refusing etcd's certificate, etcd refusing ours.
// Every command calls it, through check, before its first etcd call, so
// such a cause is reported within a second, not after its --timeout (a
// node's --etcd-timeout) under a "did not answer".
func (f *etcdFlags) probe() error {
	cfg, err := f.tls()
	if err != nil {
		return err
	}
	// Name the certificate etcd refused: the flag, or the file that
	// --certs-dir gave in its place.
	certFile := "--etcd-cert"
	if _, c, _, _ := f.files(); f.cert == "" && c != "" {
		certFile = c
	}
	eps := splitEndpoints(f.endpoints)
	causes := make([]error, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() { causes[i] = probeEndpoint(ep, cfg, certFile) })
	}
	wg.Wait()
	for _, c := range causes {
		if c == nil {
			return nil
		}
	}
	return errors.Join(causes...)
}

// probeEndpoint is probe's check of one endpoint.
func probeEndpoint(ep string, cfg *tls.Config, certFile string) error {
	host, scheme := ep, ""
	if u, err := url.Parse(ep); err == nil && u.Host != "" {
		host, scheme = u.Host, u.Scheme
	}
	if _, port, err := net.SplitHostPort(host); err != nil || port == "" {
		return fmt.Errorf("etcd endpoint %q names no port: write it as https://HOST:PORT (etcd's client port is 2379 unless set otherwise)", ep)
	}
	conn, err := net.DialTimeout("tcp", host, probeTimeout)
	if err != nil {
		if timedOut(err) {
			return nil
		}
		return fmt.Errorf("etcd at %s: %w", ep, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(probeTimeout))
	if scheme != "https" || cfg == nil {
		// A plain client of a TLS server: gRPC sees a closed connection.
		c := tls.Client(conn, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a probe: nothing is sent
		if c.Handshake() != nil {
			return nil
		}
		if scheme == "" {
			return fmt.Errorf("etcd endpoint %q has no scheme, and etcd there serves TLS: write https://%s, with --certs-dir (or --etcd-cacert, and a client certificate, --etcd-cert and --etcd-key, if it asks for one)", ep, host)
		}
		return fmt.Errorf("etcd at %s serves TLS: use https:// and --certs-dir (or --etcd-cacert, and a client certificate, --etcd-cert and --etcd-key, if it asks for one)", ep)
	}
	pc := cfg.Clone()
	pc.ServerName, _, _ = net.SplitHostPort(host)
	pc.NextProtos = []string{"h2"}
	c := tls.Client(conn, pc)
	if err := c.Handshake(); err != nil {
		var rh tls.RecordHeaderError
		switch {
		case timedOut(err):
			return nil
		case errors.As(err, &rh):
			return fmt.Errorf("etcd at %s does not serve TLS: use http:// (%w)", ep, err)
		}
		return fmt.Errorf("TLS with etcd at %s (its certificate is checked against --etcd-cacert, or --certs-dir's ca.crt): %w", ep, err)
	}
	// In TLS 1.3 the server's verdict on our certificate comes after our
	// side of the handshake is done: a read waits for it, or for etcd's
	// first HTTP/2 frame.
	_, err = c.Read(make([]byte, 1))
	var alert tls.AlertError
	if errors.As(err, &alert) || (err != nil && strings.Contains(err.Error(), "remote error")) {
		return fmt.Errorf("etcd at %s refused this client's certificate (%s): %w", ep, certFile, err)
	}
	return nil
}

func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
