package claim

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits of the embedded server's start-up.
const (
	// embedStartAttemptsMax bounds how often StartEmbedded picks fresh ports
	// after losing a port race: a free port found by listening on port 0 and
	// closing can be taken by another process before etcd binds it.
	embedStartAttemptsMax = 5
	// embedRestartAttemptsMax bounds how often Restart retries binding the
	// same ports. They were ours a moment ago; a retry covers a socket still
	// closing, not a port taken for good, which is an error.
	embedRestartAttemptsMax = 10
	// embedRestartRetryDelay is the pause between those retries.
	embedRestartRetryDelay = 100 * time.Millisecond
	// embedReadyTimeoutDefault is how long a start waits for the server to
	// become ready (elected itself and applied its log) before giving up.
	embedReadyTimeoutDefault = 30 * time.Second
)

// EmbeddedOptions configure StartEmbedded. The zero value is the default
// single-machine setup.
type EmbeddedOptions struct {
	// Name is the member name, stored in the data dir: a Restart must use
	// the same. Default "rejoin".
	Name string
	// ClientPort and PeerPort are the loopback ports to listen on; 0 picks
	// free ones. The chosen ports are kept across Restart so that clients
	// made before the stop reconnect by themselves.
	ClientPort, PeerPort int
	// Logger receives the server's logs. Default: zap at error level on
	// stderr; etcd logs at info every few hundred milliseconds otherwise.
	Logger *zap.Logger
	// ReadyTimeout bounds each start and restart. Default 30 s.
	ReadyTimeout time.Duration
	// UnsafeNoFsync skips fsync: for tests only, a crash loses writes.
	UnsafeNoFsync bool
	// TLS, if set, serves the client and peer URLs over TLS (https) and
	// requires of every client a certificate issued by its CA (etcd's
	// --client-cert-auth): whoever may write to etcd controls placement,
	// addresses and claims.
	TLS *EmbeddedTLS
	// Setup, if set, runs once before the client port serves anyone,
	// with a client of the server within this process (as LocalClient)
	// and whether its authentication is on: it is how a new server
	// turns its authentication on before any certificate of the CA may
	// write as it likes. The server first starts with its client URL on
	// a unix socket in a directory of its own (mode 0700), runs Setup,
	// stops, and only then starts on ClientPort. An error of Setup ends
	// the start.
	Setup func(ctx context.Context, cli *clientv3.Client, authEnabled bool) error
}

// embedSetupTimeout bounds EmbeddedOptions.Setup.
const embedSetupTimeout = 30 * time.Second

// EmbeddedTLS are the embedded server's TLS files, PEM.
type EmbeddedTLS struct {
	// CertFile and KeyFile are the server's certificate, naming
	// 127.0.0.1; TrustedCAFile is the CA its clients' certificates must
	// come from.
	CertFile, KeyFile, TrustedCAFile string
	// Client is the TLS config of the clients Client makes (a client
	// certificate from that CA); nil if Client is not used.
	Client *tls.Config
}

// Embedded is an etcd server running in this process, listening only on
// 127.0.0.1: the coordinator of the default single-machine setup, and the
// real etcd every test of this package runs against.
//
// Invariant: at most one server runs per Embedded; between Stop and
// Restart none does and no goroutine of it is left.
type Embedded struct {
	dir  string
	opts EmbeddedOptions
	log  *zap.Logger
	// level is the level of the default logger (nil with a caller's
	// logger): raised while stopping, because a normal Close logs each
	// closed listener as an error ("use of closed network connection").
	level *zap.AtomicLevel

	mu         sync.Mutex
	etcd       *embed.Etcd // nil while stopped
	streams    *streamStopper
	clientPort int
	peerPort   int
	// sock, while set, is the unix socket the client URL listens on
	// instead of clientPort (setUp).
	sock string
}

// StartEmbedded starts a single-member etcd whose data lives in dir (created
// if absent; an existing one is reopened), listening on 127.0.0.1 only.
// It returns once the server is ready to serve linearizable requests.
func StartEmbedded(dir string, opts EmbeddedOptions) (*Embedded, error) {
	if dir == "" {
		return nil, errors.New("claim: embedded etcd needs a data dir")
	}
	if opts.Name == "" {
		opts.Name = "rejoin"
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = embedReadyTimeoutDefault
	}
	e := &Embedded{dir: dir, opts: opts, log: opts.Logger}
	if e.log == nil {
		level := zap.NewAtomicLevelAt(zapcore.ErrorLevel)
		e.log, e.level = quietLogger(level), &level
	}
	if opts.Setup != nil {
		if err := e.setUp(); err != nil {
			return nil, err
		}
	}
	if err := e.startOnPorts(); err != nil {
		return nil, err
	}
	return e, nil
}

// startOnPorts starts the server on the options' ports, picking free ones
// for those left 0 and picking again when another process took one
// between the pick and the start.
func (e *Embedded) startOnPorts() error {
	picked := e.opts.ClientPort == 0 || e.opts.PeerPort == 0
	var err error
	for range embedStartAttemptsMax {
		e.clientPort, e.peerPort = e.opts.ClientPort, e.opts.PeerPort
		if e.clientPort, err = pickPort(e.clientPort); err != nil {
			return err
		}
		if e.peerPort, err = pickPort(e.peerPort); err != nil {
			return err
		}
		if err = e.start(); err == nil {
			return nil
		}
		if !picked || !errors.Is(err, syscall.EADDRINUSE) {
			break // a fixed port in use, or not a port race at all
		}
	}
	return err
}

// setUp runs opts.Setup on the server started with its client URL on a
// private unix socket, then stops it (EmbeddedOptions.Setup). Before,
// `rejoin etcd` served its port for the moment its setup took, on a new
// data directory, to any certificate of the CA, with every permission.
func (e *Embedded) setUp() error {
	sockDir, err := os.MkdirTemp("", "rejoin-etcd-setup-")
	if err != nil {
		return fmt.Errorf("claim: embedded etcd setup: %w", err)
	}
	defer os.RemoveAll(sockDir)
	e.sock = filepath.Join(sockDir, "client.sock")
	defer func() { e.sock = "" }()
	if err := e.startOnPorts(); err != nil {
		return err
	}
	defer e.Stop()
	cli := e.LocalClient()
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), embedSetupTimeout)
	defer cancel()
	if err := e.opts.Setup(ctx, cli, e.AuthEnabled()); err != nil {
		return fmt.Errorf("claim: embedded etcd setup: %w", err)
	}
	return nil
}

// Endpoints returns the client URLs to give clientv3.
func (e *Embedded) Endpoints() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return []string{e.clientURL()}
}

// clientURL is the client URL, https with TLS.
func (e *Embedded) clientURL() string {
	u := loopbackURL(e.clientPort)
	if e.opts.TLS != nil {
		u = "https" + strings.TrimPrefix(u, "http")
	}
	return u
}

// Client returns a new client of the server, logging at error level only.
// The caller closes it.
func (e *Embedded) Client() (*clientv3.Client, error) {
	cfg := loopbackClientConfig(e.Endpoints(), e.log)
	if e.opts.TLS != nil {
		if e.opts.TLS.Client == nil {
			return nil, errors.New("claim: the embedded etcd requires client certificates: EmbeddedTLS.Client is nil")
		}
		cfg.TLS = e.opts.TLS.Client
	}
	return clientv3.New(cfg)
}

// LocalClient returns a client of the server within this process, not
// over its port: it presents no certificate, so once etcd's
// authentication is on it may do nothing; before, anything. It is how
// the server's own process sets up authentication (roles, users) before
// turning it on. The caller closes it; nil while stopped.
func (e *Embedded) LocalClient() *clientv3.Client {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.etcd == nil {
		return nil
	}
	return v3client.New(e.etcd.Server)
}

// AuthEnabled reports whether the server enforces its authentication.
func (e *Embedded) AuthEnabled() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.etcd != nil && e.etcd.Server.AuthStore().IsAuthEnabled()
}

// loopbackClientConfig is a client of a server on this machine: it
// reconnects within a second after the server comes back (gRPC's default
// backoff grows to two minutes, meant for remote servers), so a claim can
// be released soon after a restart.
func loopbackClientConfig(endpoints []string, log *zap.Logger) clientv3.Config {
	return clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      log,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		})},
	}
}

// Stop stops the server and returns once it and every goroutine it started
// are gone. Clients stay open and fail (or wait) until a Restart. Stopping
// a stopped server does nothing.
func (e *Embedded) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopLocked()
}

// Restart starts the server again on the same data dir and ports, after a
// Stop (or stops it first). Everything committed before survives, the
// revision counter included, so fencing epochs keep growing.
func (e *Embedded) Restart() error {
	e.mu.Lock()
	e.stopLocked()
	e.mu.Unlock()
	var err error
	for range embedRestartAttemptsMax {
		if err = e.start(); err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return err
		}
		time.Sleep(embedRestartRetryDelay)
	}
	return err
}

func (e *Embedded) stopLocked() {
	if e.etcd == nil {
		return
	}
	if e.level != nil {
		e.level.SetLevel(zapcore.FatalLevel)
		defer e.level.SetLevel(zapcore.ErrorLevel)
	}
	// End the open streams first. Close drains gRPC gracefully, and a
	// client's lease keepalive stream or a watch never ends by itself: the
	// drain would wait out etcd's request timeout, 7 s, serving keepalives
	// meanwhile.
	e.streams.stopAll()
	// Close stops the gRPC servers, the raft loop and the peer handlers and
	// waits for each; Err is closed once the last serving goroutine ended.
	e.etcd.Close()
	for range e.etcd.Err() {
	}
	e.etcd = nil
}

// start runs one server on the current ports and waits until it is ready.
func (e *Embedded) start() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.etcd != nil {
		return errors.New("claim: embedded etcd already running")
	}
	cfg := embed.NewConfig()
	cfg.Name = e.opts.Name
	cfg.Dir = e.dir
	curl, purl := mustURL(e.clientURL()), mustURL(loopbackURL(e.peerPort))
	if e.sock != "" {
		curl = url.URL{Scheme: "unix", Path: e.sock}
	}
	if t := e.opts.TLS; t != nil {
		info := transport.TLSInfo{CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.TrustedCAFile, ClientCertAuth: true}
		cfg.ClientTLSInfo, cfg.PeerTLSInfo = info, info
		purl.Scheme = "https"
		if e.sock != "" {
			curl.Scheme = "unixs"
		}
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{curl}, []url.URL{curl}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{purl}, []url.URL{purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(e.log)
	// The gateway is an HTTP/JSON front that dials the server's own gRPC
	// port; nothing here uses it and it only adds connections.
	cfg.EnableGRPCGateway = false
	// Claims and task records churn revisions; keep one hour of history.
	// Compaction never lowers the revision counter, so epochs still grow.
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	cfg.AutoCompactionRetention = "1h"
	cfg.UnsafeNoFsync = e.opts.UnsafeNoFsync
	streams := &streamStopper{cancels: map[uint64]context.CancelFunc{}}
	cfg.GRPCAdditionalServerOptions = []grpc.ServerOption{grpc.ChainStreamInterceptor(streams.intercept)}

	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("claim: start embedded etcd on %s: %w", curl.Host, err)
	}
	timer := time.NewTimer(e.opts.ReadyTimeout)
	defer timer.Stop()
	select {
	case <-srv.Server.ReadyNotify():
	case err := <-srv.Err():
		srv.Close()
		for range srv.Err() {
		}
		return fmt.Errorf("claim: embedded etcd failed while starting: %w", err)
	case <-timer.C:
		srv.Close()
		for range srv.Err() {
		}
		return fmt.Errorf("claim: embedded etcd not ready after %s", e.opts.ReadyTimeout)
	}
	e.etcd, e.streams = srv, streams
	return nil
}

// streamStopper is a gRPC stream interceptor that can end every open
// stream of the server at once, so that a stop does not wait for them.
type streamStopper struct {
	mu       sync.Mutex
	stopping bool
	next     uint64
	cancels  map[uint64]context.CancelFunc // of the open streams
}

func (s *streamStopper) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return status.Error(codes.Unavailable, "claim: embedded etcd stopping")
	}
	id := s.next
	s.next++
	s.cancels[id] = cancel
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.cancels, id)
		s.mu.Unlock()
	}()
	// etcd's stream handlers (watch, lease keepalive) return when their
	// stream's context is done.
	return handler(srv, &ctxStream{ServerStream: ss, ctx: ctx})
}

// stopAll ends every open stream and refuses new ones.
func (s *streamStopper) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopping = true
	for _, cancel := range s.cancels {
		cancel()
	}
}

// ctxStream is a server stream with a context of ours.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c *ctxStream) Context() context.Context { return c.ctx }

// pickPort returns port, or a free loopback port when port is 0. The port
// is free when picked and may be taken before etcd binds it; the caller
// retries on EADDRINUSE.
func pickPort(port int) (int, error) {
	if port != 0 {
		return port, nil
	}
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("claim: pick a loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func loopbackURL(port int) string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

func mustURL(s string) url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(fmt.Sprintf("claim: bad loopback URL %q: %v", s, err))
	}
	return *u
}

// quietLogger logs at level (errors and worse) to stderr: etcd's info logs
// are a line per lease, election and snapshot.
func quietLogger(level zap.AtomicLevel) *zap.Logger {
	cfg := zap.NewProductionConfig()
	cfg.Level = level
	cfg.Sampling = nil
	lg, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return lg
}
