package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdFlags are how a command reaches etcd: its endpoints, and for an
// external cluster that serves TLS or has auth, the CA, a client
// certificate and a user.
type etcdFlags struct {
	endpoints          string
	cacert, cert, key  string
	user, passwordFile string
}

func newEtcdFlags(fs *flag.FlagSet) *etcdFlags {
	f := &etcdFlags{}
	fs.StringVar(&f.endpoints, "etcd", "", "comma-separated etcd `endpoints` (https:// ones need --etcd-cacert)")
	fs.StringVar(&f.cacert, "etcd-cacert", "", "`file`: the CA certificate (PEM) that etcd's server certificate is checked against")
	fs.StringVar(&f.cert, "etcd-cert", "", "`file`: a client certificate (PEM) for an etcd that asks for one; with --etcd-key")
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

// tls is the TLS config of the etcd client; nil when no flag asks for one.
func (f *etcdFlags) tls() (*tls.Config, error) {
	if (f.cert == "") != (f.key == "") {
		return nil, errors.New("--etcd-cert and --etcd-key go together")
	}
	https := false
	for _, e := range splitEndpoints(f.endpoints) {
		https = https || strings.HasPrefix(e, "https://")
	}
	if f.cacert == "" && f.cert == "" {
		if https {
			return nil, errors.New("an https:// etcd endpoint needs --etcd-cacert")
		}
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.cacert != "" {
		b, err := os.ReadFile(f.cacert)
		if err != nil {
			return nil, fmt.Errorf("--etcd-cacert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--etcd-cacert %s: no PEM certificate", f.cacert)
		}
		cfg.RootCAs = pool
	}
	if f.cert != "" {
		pair, err := tls.LoadX509KeyPair(f.cert, f.key)
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

// probeTimeout bounds each step of probe: the dial and handshake, and the
// wait for the server's verdict on the client's certificate.
const probeTimeout = time.Second

// explain adds to err, etcd not answering in time, why when it is TLS:
// etcd's client retries a refused handshake until its deadline and then
// says only that, so the cause is found by a handshake of our own.
func (f *etcdFlags) explain(err error) error {
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if why := f.probe(); why != nil {
		return fmt.Errorf("%w; %w", err, why)
	}
	return err
}

// probe shakes hands with each endpoint as the etcd client would and
// returns the first TLS refusal: etcd refusing our certificate (in TLS
// 1.3 its verdict comes after our side of the handshake is done, so it
// waits for it), our refusing etcd's, or a TLS server dialled as plain
// http. Nil if nothing was learned.
func (f *etcdFlags) probe() error {
	cfg, err := f.tls()
	if err != nil {
		return err
	}
	for _, ep := range splitEndpoints(f.endpoints) {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			continue
		}
		d := &net.Dialer{Timeout: probeTimeout}
		if u.Scheme != "https" || cfg == nil {
			// A plain client of a TLS server: gRPC sees a closed connection.
			c, err := tls.DialWithDialer(d, "tcp", u.Host, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a probe: nothing is sent
			if err == nil {
				c.Close()
				return fmt.Errorf("etcd at %s serves TLS: use https:// and --etcd-cacert (and a client certificate, --etcd-cert and --etcd-key, if it asks for one)", ep)
			}
			continue
		}
		pc := cfg.Clone()
		pc.ServerName = u.Hostname()
		pc.NextProtos = []string{"h2"}
		c, err := tls.DialWithDialer(d, "tcp", u.Host, pc)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("TLS with etcd at %s: %w", ep, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(probeTimeout))
		_, err = c.Read(make([]byte, 1))
		c.Close()
		var alert tls.AlertError
		if errors.As(err, &alert) || (err != nil && strings.Contains(err.Error(), "remote error")) {
			return fmt.Errorf("etcd at %s refused this client's certificate (--etcd-cert): %w", ep, err)
		}
	}
	return nil
}
