package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/chaos"
	"github.com/rejoin-db/rejoin/recovery/node"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/txnid"
)

const nodeUsage = `usage: rejoin node --id N --etcd ENDPOINTS --data DIR (--certs-dir DIR | --insecure) [flags]

Runs one node of a cluster: it registers itself in etcd, hosts the
partition replicas the placement gives it, runs an initiator for client
calls, and rejoins its replicas after a restart. Once registered it prints
one line on stdout:
  ready node=n<N> tcp=<addr> http=<addr>
An etcd that refuses the connection, the TLS handshake or the node's
certificate makes it exit 1 at once, naming the cause; each other wait on
etcd before that line is bounded by --etcd-timeout, past which the node
exits 1 with the step that waited. Once ready, a node that loses etcd
keeps running (its replicas stay, its rejoin work stops) and registers
again when etcd answers. Every connection is mutual TLS with the
certificates of --certs-dir (rejoin cert makes them), and so is etcd's
when --etcd is https:// (its ca.crt and the node's certificate, unless
--etcd-cacert, --etcd-cert and --etcd-key name others); --insecure runs
without, open to anyone who reaches the port. A node refuses to start
while a live process of its id is registered (another data directory, a
typo of --id), unless given --replace-running. Logs go to stderr. SIGINT
or SIGTERM stop it gracefully: it refuses new calls at once (its clients
send them to other nodes, nothing sequenced), answers those in flight (at
most 5 s), then stops and says goodbye to etcd.

flags:
`

// nodeFlags binds the flags of `rejoin node` to a node.Config.
type nodeFlags struct {
	cfg       node.Config
	etcd      *etcdFlags
	certsDir  string
	logFormat string
	logLevel  string
}

func newNodeFlags(fs *flag.FlagSet) *nodeFlags {
	f := &nodeFlags{}
	fs.IntVar(&f.cfg.ID, "id", 0, "node `number` 1..1023: the node id is n<N>, its initiator id N")
	fs.StringVar(&f.cfg.Listen, "listen", "127.0.0.1:0", "TCP `address` for clients, feeds and rejoin streams")
	fs.StringVar(&f.cfg.HTTP, "http", "127.0.0.1:0", "admin HTTP `address` (status, metrics, faults)")
	fs.StringVar(&f.cfg.Advertise, "advertise", "", "`address` peers and clients dial, HOST or HOST:PORT (default: --listen's bound address); required when --listen or --http is a wildcard such as 0.0.0.0")
	fs.BoolVar(&f.cfg.FaultPoints, "fault-points", false, "serve POST /fault/* on the admin HTTP (hold, cut and pause rejoins: for the demo and tests only)")
	fs.BoolVar(&f.cfg.Pprof, "pprof", false, "serve Go's profiles on the admin HTTP at /debug/pprof/")
	f.etcd = newEtcdFlags(fs)
	fs.DurationVar(&f.cfg.EtcdTimeout, "etcd-timeout", node.EtcdTimeoutDefault, "bound of each wait on etcd before the node is ready (reading the layout and the placement, registering): past it the node exits with an error naming the step")
	fs.StringVar(&f.cfg.DataDir, "data", "", "data `directory` (the node's durable record)")
	fs.DurationVar(&f.cfg.NodeTTL, "node-ttl", 0, "node lease TTL in etcd (0: 4s)")
	fs.DurationVar(&f.cfg.ClaimTTL, "claim-ttl", 0, "rejoin claim lease TTL (0: 5s)")
	fs.IntVar(&f.cfg.IncomingMax, "incoming-max", 0, "rejoins run at once as destination (0: 2)")
	fs.IntVar(&f.cfg.OutgoingMax, "outgoing-max", 0, "rejoins served at once as source (0: 2)")
	fs.IntVar(&f.cfg.ApplyMax, "apply-max", 0, "rejoin blocks applied at once as destination, across all rejoins; the other cores stay for the live replicas' writes (0: the number of CPUs less one, at least 1)")
	fs.Int64Var(&f.cfg.RateBytesPerSec, "rate-bytes", 0, "rate limit of each rejoin stream in bytes/s (0: none)")
	fs.DurationVar(&f.cfg.PaceTarget, "pace-target", 2*time.Millisecond, "a source's snapshot stream slows while more than one txn of its partition in 50 waits longer than this at the source replica, and speeds up as they stop (a negative value: never paced)")
	fs.DurationVar(&f.cfg.BeatLead, "beat-lead", 0, "how far ahead of its clock the heartbeats of an initiator that sequenced nothing for 25 ms stand, so a writing node need not wait for this one's heartbeats while they are late by less (0: 100ms, a negative value: never ahead)")
	fs.DurationVar(&f.cfg.CallWait, "call-wait", node.CallWaitDefault, "how long a call this node sequenced waits for its replicas' results; past it the caller is answered that the txn's outcome is unknown, with the replicas that did not answer, and the node logs a warning")
	fs.IntVar(&f.cfg.ConnsMax, "conns-max", 0, "connections the node serves at once past their hello; one more is refused (0: 256)")
	fs.IntVar(&f.cfg.NodeConnsReserved, "node-conns", 0, "of --conns-max, the slots kept for node certificates (feeds, rejoin and repair streams), which clients cannot take (0: a quarter; a negative value: none)")
	fs.IntVar(&f.cfg.HandshakesMax, "handshakes-max", 0, "connections not yet past TLS and their hello at once, apart from --conns-max; past it the oldest silent one is closed (0: 128)")
	fs.IntVar(&f.cfg.HandshakesPerSourceMax, "handshakes-per-source", 0, "of --handshakes-max, those from one IP address (0: 32)")
	fs.DurationVar(&f.cfg.ClientIdleTimeout, "client-idle-timeout", node.ClientIdleTimeoutDefault, "a client connection with no call for this long, and none in flight, is closed (a negative value: never)")
	fs.Int64Var(&f.cfg.RejoinBufferBytesMax, "rejoin-buffer-bytes", 0, "bytes of txns a rejoining replica may buffer; past half, its source holds the partition's writes (0: 512 MiB)")
	fs.StringVar(&f.certsDir, "certs-dir", os.Getenv(envCertsDir), "certificates `directory` ($REJOIN_CERTS_DIR if not given): ca.crt, node.n<N>.crt and node.n<N>.key (`rejoin cert`); every connection is then mutual TLS and a peer may do only what its certificate names; for an https:// --etcd they are the etcd client's CA and certificate too")
	f.etcd.useCertsDir(&f.certsDir, func() certs.Identity { return certs.NodeID(f.cfg.ID) })
	fs.BoolVar(&f.cfg.Insecure, "insecure", false, "run without TLS: anyone who reaches the node's port may call procedures, open feeds and rejoin streams; for trusted networks and tests only")
	fs.BoolVar(&f.cfg.ReplaceRunning, "replace-running", false, "start even if a live process of this node id is registered in etcd; that process then stops, superseded (without it the node refuses to start)")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format on stderr: text or json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return f
}

// config checks the flags and returns the node.Config, logging to stderr.
func (f *nodeFlags) config(stderr io.Writer) (node.Config, error) {
	cfg := f.cfg
	switch {
	case cfg.ID == 0:
		// Before the etcd client's files, which are the node's own: named
		// from a missing --id, they were a "bad identity" of n0.
		return cfg, fmt.Errorf("--id is required (1..%d)", txnid.InitiatorsMax-1)
	case cfg.ID < 0 || cfg.ID >= int(txnid.InitiatorsMax):
		return cfg, fmt.Errorf("--id %d: want 1..%d, the N of node n<N>", cfg.ID, txnid.InitiatorsMax-1)
	}
	for _, a := range []struct{ flag, addr string }{{"--listen", cfg.Listen}, {"--http", cfg.HTTP}} {
		if err := checkListenAddr(a.addr); err != nil {
			return cfg, fmt.Errorf("%s %q: %v; want HOST:PORT, such as 127.0.0.1:7001 (port 0: any free one)", a.flag, a.addr, err)
		}
	}
	ec, err := f.etcd.config()
	if err != nil {
		return cfg, err
	}
	cfg.Etcd, cfg.EtcdTLS, cfg.EtcdUser, cfg.EtcdPassword = ec.Endpoints, ec.TLS, ec.Username, ec.Password
	if cfg.Insecure && f.certsDir == os.Getenv(envCertsDir) {
		f.certsDir = "" // --insecure given wins over $REJOIN_CERTS_DIR
	}
	switch {
	case cfg.DataDir == "":
		return cfg, errors.New("--data is required")
	case cfg.EtcdTimeout <= 0:
		return cfg, fmt.Errorf("--etcd-timeout %s: want > 0", cfg.EtcdTimeout)
	case f.certsDir == "" && !cfg.Insecure:
		return cfg, errors.New("--certs-dir is required (create the certificates with `rejoin cert`), or --insecure to run without TLS, open to anyone who reaches the node")
	case f.certsDir != "" && cfg.Insecure:
		return cfg, errors.New("--certs-dir and --insecure both given: pick one")
	}
	if f.certsDir != "" {
		t, err := certs.Load(f.certsDir, certs.NodeID(cfg.ID))
		if err != nil {
			return cfg, err
		}
		cfg.TLS = t
	}
	log, err := newLogger(stderr, f.logFormat, f.logLevel)
	if err != nil {
		return cfg, err
	}
	cfg.Log = log
	if f.certsDir != "" {
		if _, err := os.Stat(filepath.Join(f.certsDir, certs.CAKeyFile)); err == nil {
			log.Warn("the CA's key is in --certs-dir, which every node is given: whoever holds one node can then mint any identity; move it out (rejoin cert --ca-dir, default "+certs.CADir(f.certsDir)+")", "file", filepath.Join(f.certsDir, certs.CAKeyFile))
		}
	}
	// Test-only: rejoin chaos --plant hands its nodes the planted fault.
	cfg.PlantDropKey = os.Getenv(chaos.PlantEnv)
	return cfg, nil
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// checkListenAddr is nil if addr is one a node can listen on: HOST:PORT
// with a port of 0..65535 (the host is the listener's to refuse).
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("no port")
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number 0..65535", port)
	}
	return nil
}

// splitEndpoints splits a comma-separated list, dropping empty items.
func splitEndpoints(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// ReadyLine is the line `rejoin node` prints once registered; the demo
// parses it with parseReadyLine's twin in internal/demo.
func readyLine(a node.Addrs) string {
	return fmt.Sprintf("ready node=%s tcp=%s http=%s", a.Node, a.TCP, a.HTTP)
}

func runNode(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("node", stderr)
	f := newNodeFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, nodeUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, "node", args, stderr); err != nil {
		return err
	}
	fields := flagFields(fs, &f.cfg)
	cfg, err := f.config(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "rejoin node: %s\n", userMessage("node", err, fields))
		return errUsage
	}
	if err := f.etcd.check(); err != nil {
		return err
	}
	// Made here, so that a path the node cannot use is said with its
	// flag, not as the error of the store that opens it.
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("--data %s: cannot make the data directory: %w", cfg.DataDir, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = node.Run(ctx, cfg, func(a node.Addrs) {
		// One line, unbuffered: stdout is a pipe when the demo runs us.
		fmt.Fprintln(stdout, readyLine(a))
	})
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return nil // stopped by a signal
	}
	if err = f.etcd.explain(err); err != nil && errors.Is(err, node.ErrConfig) {
		fmt.Fprintf(stderr, "rejoin node: %s\n", userMessage("node", err, fields))
		return errUsage
	}
	return err
}
