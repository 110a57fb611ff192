package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rejoin-db/rejoin/bench/load"
	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/clusterview"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/node"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// Fault is what happens in the middle of the snapshot stream.
type Fault string

// The faults of --fault.
const (
	FaultNone            Fault = "none"
	FaultKillSource      Fault = "kill-source"
	FaultKillDestination Fault = "kill-destination"
	FaultCutLink         Fault = "cut-link"
	FaultPauseHolder     Fault = "pause-holder"
	// FaultPauseEtcd pauses etcd (SIGSTOP), run as a process of its own,
	// for 3 x the node TTL plus a second: every node loses its
	// registration, and its lease on resume, and must keep its process
	// and its replicas (docs/DESIGN.md "Without the coordinator").
	FaultPauseEtcd Fault = "pause-etcd"
)

// RenamedFault is f by its current name: pause-holder was pause-executor
// until "executor" came to name the partition's executor alone
// (docs/DESIGN.md "Vocabulary"), and a script written then still runs.
func RenamedFault(f Fault) Fault {
	if f == "pause-executor" {
		return FaultPauseHolder
	}
	return f
}

// Faults lists them in --fault's order.
var Faults = []Fault{FaultNone, FaultKillSource, FaultKillDestination, FaultCutLink, FaultPauseHolder, FaultPauseEtcd}

// Gateway is the node every write goes through; it is never a fault's
// target, so the writer's acknowledgements come from a node that lives.
const Gateway = "n1"

// ErrCheck: the run ended but a check failed (digests differ, or an
// acknowledged write was lost).
var ErrCheck = errors.New("demo: check failed")

// Config is one demo run.
type Config struct {
	// Binary is the rejoin executable started as `node` (os.Executable()
	// for the command, a test-built binary in the tests).
	Binary string
	// Dir holds etcd's data, the nodes' data and their logs; "" makes a
	// temporary one, removed at the end unless Keep.
	Dir string
	// Keep leaves the cluster running after the summary until ctx ends.
	Keep bool

	Nodes, Replicas int
	Partitions      uint32
	Rows            int
	ValueBytes      int
	// WriteRate is the writer's writes per second; 0 is as fast as it can.
	WriteRate int
	// Writers is the writer's concurrent callers, each waiting for its
	// write's answer before the next (default 64).
	Writers int
	// WriteAll sends the writes through every node, the fault's victims
	// included, instead of the gateway only. A write whose node dies has
	// no answer: it is uncertain, and the read-back takes either outcome.
	// The survivors repair a dead initiator's torn tail between them.
	WriteAll bool
	Fault    Fault
	// JSON prints the summary as one JSON object, and no progress bars.
	JSON bool
	// Progress draws progress bars (ignored with JSON).
	Progress bool
	// Plot, if set, is a PNG file to draw the run in, its data beside it
	// in CSV (plot.go).
	Plot string

	// Before is the writer's measured interval before the kill (default 2s).
	Before time.Duration
	// Timeout bounds the run up to the summary (0: none).
	Timeout time.Duration
	// NodeTTL and ClaimTTL go to the nodes (0: 4 s and 5 s, the nodes'
	// own defaults: tighter leases stop healthy work on a busy machine).
	NodeTTL, ClaimTTL time.Duration
	// IncomingMax is each node's limit of rejoins as destination (0: the
	// number of partitions, so all of a node's replicas rejoin at once).
	IncomingMax int
	// OutgoingMax is each node's limit of rejoins served as source (0:
	// IncomingMax). The nodes' own default is 2: with it, a restarted
	// node hosting 64 partitions rejoined from two sources 4 at a time,
	// whatever IncomingMax said.
	OutgoingMax int
	// RateBytes limits each rejoin stream (bytes/s, 0: none).
	RateBytes int64
	// PaceTarget is the nodes' --pace-target (0: their default).
	PaceTarget time.Duration
	// Insecure runs the nodes without TLS (--insecure); by default the
	// demo makes a CA and certificates in its directory and every
	// connection is mutual TLS.
	Insecure bool
	// Stderr receives what is not the summary in JSON mode (default
	// os.Stderr).
	Stderr io.Writer
}

// Check fills the defaults and checks the config.
func (c *Config) Check() error {
	if c.Nodes == 0 {
		c.Nodes = 3
	}
	if c.Partitions == 0 {
		c.Partitions = 4
	}
	if c.Replicas == 0 {
		c.Replicas = 2
	}
	if c.ValueBytes == 0 {
		c.ValueBytes = 100
	}
	c.Fault = RenamedFault(c.Fault)
	if c.Fault == "" {
		c.Fault = FaultNone
	}
	if c.Writers == 0 {
		c.Writers = 64
	}
	if c.Before == 0 {
		c.Before = 2 * time.Second
	}
	if c.NodeTTL == 0 {
		c.NodeTTL = 4 * time.Second
	}
	if c.ClaimTTL == 0 {
		c.ClaimTTL = 5 * time.Second
	}
	if c.IncomingMax == 0 {
		c.IncomingMax = int(c.Partitions)
	}
	if c.OutgoingMax == 0 {
		c.OutgoingMax = c.IncomingMax
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	switch {
	case c.Binary == "":
		return errors.New("demo: no binary to run the nodes with")
	case !slices.Contains(Faults, c.Fault):
		return fmt.Errorf("demo: unknown fault %q (want one of %v)", c.Fault, Faults)
	case c.Nodes < 2 || c.Nodes > 64:
		return fmt.Errorf("demo: --nodes %d, want 2..64", c.Nodes)
	case c.Replicas < 2:
		return fmt.Errorf("demo: --replicas %d: the killed node's replicas rejoin from another live replica, so at least 2", c.Replicas)
	case c.Replicas > c.Nodes:
		return fmt.Errorf("demo: --replicas %d on %d nodes: each replica of a partition needs its own node", c.Replicas, c.Nodes)
	case c.Fault == FaultKillSource && c.Replicas < 3:
		return fmt.Errorf("demo: --fault kill-source needs --replicas >= 3: with %d replicas the source is the only live copy of its partition while the killed node rejoins, and killing it would lose the partition", c.Replicas)
	case c.Fault == FaultKillSource && c.Partitions < 2:
		return errors.New("demo: --fault kill-source needs --partitions >= 2: the supervisor spreads the rejoining partitions over the least loaded sources, so with two or more one of them has a source other than the gateway n1, which is never killed")
	case c.Fault == FaultKillSource && c.Nodes < 3:
		return errors.New("demo: --fault kill-source needs --nodes >= 3: the gateway n1 is never killed")
	case c.IncomingMax < 0 || c.OutgoingMax < 0:
		return fmt.Errorf("demo: --incoming-max %d, --outgoing-max %d: want >= 0 (0: the default)", c.IncomingMax, c.OutgoingMax)
	case c.Rows < 0:
		return fmt.Errorf("demo: --rows %d: want 0 or more", c.Rows)
	case c.ValueBytes < 0:
		return fmt.Errorf("demo: --value-bytes %d: want 0 or more", c.ValueBytes)
	case c.WriteRate < 0:
		return fmt.Errorf("demo: --write-rate %d: want 0 or more (0: as fast as the writers go)", c.WriteRate)
	case c.Writers < 0 || c.Writers > 4096:
		return fmt.Errorf("demo: --writers %d: want 1..4096", c.Writers)
	}
	if c.Plot != "" {
		return CheckPlotPath(c.Plot)
	}
	return nil
}

// Summary is what a run measured; every figure comes from the run.
type Summary struct {
	Fault string `json:"fault"`
	Nodes int    `json:"nodes"`
	// Partitions and Replicas are the cluster's shape.
	Partitions uint32 `json:"partitions"`
	Replicas   int    `json:"replicas"`
	// Gateway is the node every write went through; never a fault target.
	// Empty with WriteAll: the writes went through every node.
	Gateway string `json:"gateway"`
	// Victim is the node killed and restarted; FaultTarget the node or
	// partition the fault hit (the source for kill-source).
	Victim      string `json:"victim"`
	FaultTarget string `json:"fault_target,omitempty"`
	// TLS: every node connection of the run was mutual TLS (false with
	// --insecure).
	TLS bool `json:"tls"`
	// EtcdTLS: etcd served TLS only and required a client certificate
	// from the demo's CA of every client, nodes included (false with
	// --insecure).
	EtcdTLS bool `json:"etcd_tls"`
	// LoadRows and LoadRowsPerSec are the bulk load's.
	LoadRows       int     `json:"load_rows"`
	LoadRowsPerSec float64 `json:"load_rows_per_sec"`

	// Rows and Bytes were applied by the destinations' latest attempts
	// (their /status RejoinStatus), snapshot and catch-up.
	Rows         int64 `json:"rows"`
	Bytes        int64 `json:"bytes"`
	SnapshotRows int64 `json:"snapshot_rows"`
	// RejoinSeconds runs from the victim's restart to every replica of
	// every partition live.
	RejoinSeconds float64 `json:"rejoin_seconds"`
	// StreamSeconds is the destinations' latest attempts, first start to
	// last end; RowsPerSec and MBPerSec are over it.
	StreamSeconds  float64 `json:"stream_seconds"`
	RowsPerSec     float64 `json:"rows_per_sec"`
	MBPerSec       float64 `json:"mb_per_sec"`
	HandoffPauseMs float64 `json:"handoff_pause_ms_max"`
	// PaceStarts counts the times a source slowed its snapshot for its
	// partition's write latency (the nodes' --pace-target).
	PaceStarts int `json:"pace_starts"`
	// Attempts counts the distinct rejoin attempts (partition,
	// destination, epoch) seen in the nodes' status during the run;
	// TaskAttempts sums the task records' starts at the end.
	Attempts      int   `json:"attempts"`
	TaskAttempts  int   `json:"task_attempts"`
	BlocksResent  int64 `json:"blocks_resent"`
	RejoinedTasks int   `json:"rejoined_tasks"`

	WritesPerSecBefore float64 `json:"writes_per_sec_before"`
	WritesPerSecDuring float64 `json:"writes_per_sec_during"`
	WriteP99MsBefore   float64 `json:"write_p99_ms_before"`
	WriteP99MsDuring   float64 `json:"write_p99_ms_during"`
	// WritesPerSecOutage is between the kill and the restart.
	WritesPerSecOutage float64 `json:"writes_per_sec_outage"`
	// WriteGapMaxSeconds is the longest time without an acknowledged
	// write from the kill until every replica is live: how long the
	// fault held the writer's callers, whatever the outage's length.
	WriteGapMaxSeconds float64 `json:"write_gap_max_seconds"`
	// WriteErrors failed for sure; WritesUncertain got no answer (each may
	// or may not have happened; the read-back accepts either).
	WriteErrors     int64 `json:"write_errors"`
	WritesUncertain int64 `json:"writes_uncertain"`

	ReplicasChecked    int                            `json:"replicas_checked"`
	DigestsMatch       bool                           `json:"digests_match"`
	Digests            []clusterview.PartitionDigests `json:"digests,omitempty"`
	AckedWritesChecked int                            `json:"acked_writes_checked"`
	AckedWritesLost    int                            `json:"acked_writes_lost"`
	LostExamples       []string                       `json:"lost_examples,omitempty"`

	Dir  string `json:"dir"`
	Etcd string `json:"etcd"`
}

// run is the state of one demo.
type run struct {
	cfg Config
	// name is the command's: "demo" or "bench".
	name   string
	out    io.Writer // events and the human summary
	events io.Writer // where event lines go (above the bars while they run)
	cli    *clientv3.Client
	ps     *procs
	// etcd is etcd's own process with FaultPauseEtcd; nil when it runs
	// embedded in this one.
	etcd *etcdProc
	hc   *http.Client
	sum  Summary
	// certsDir holds the demo's CA and certificates, tls its client's
	// credentials; both empty with Insecure.
	certsDir string
	tls      *certs.TLS
	// admin posts the fault points: over TLS with the admin identity's
	// certificate (certs.AdminName), which the nodes require of them;
	// plain HTTP with Insecure.
	admin       *http.Client
	adminScheme string
	// seen attempts of rejoins into restarted nodes.
	attempts map[string]bool
	// restarted: node ids killed and restarted.
	restarted []string
	// plot records the run for cfg.Plot; nil without.
	plot *plotRec
	// before and during are the writer's windows before the kill and
	// from the restart to all live, for the bench's served/offered.
	before, during WindowStats
}

// etcdAccessTimeout bounds the setup of etcd's users and roles.
const etcdAccessTimeout = 30 * time.Second

// Run runs the demo and prints its summary on out: human text, or one JSON
// object with cfg.JSON. It returns ErrCheck (wrapped) when the run ended
// but digests differ or an acknowledged write was lost. Every process it
// started is stopped before it returns, also when ctx ends; so is etcd.
func Run(ctx context.Context, cfg Config, out io.Writer) (Summary, error) {
	return runWith(ctx, cfg, out, "demo", (*run).printSummary)
}

// runWith is Run with the command's name (in the plot's title) and the
// summary's printer: `rejoin demo` prints the demo's, `rejoin bench
// --processes` its own (bench.go).
func runWith(ctx context.Context, cfg Config, out io.Writer, name string, print func(*run) error) (sum Summary, err error) {
	if err := cfg.Check(); err != nil {
		return Summary{}, err
	}
	dir, removeDir, err := workDir(cfg.Dir)
	if err != nil {
		return Summary{}, err
	}
	defer func() {
		if removeDir && !cfg.Keep {
			if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
				err = rerr
			}
		}
	}()
	r := &run{cfg: cfg, name: name, out: out, events: out, hc: &http.Client{Timeout: 5 * time.Second}, attempts: map[string]bool{}}
	if cfg.JSON {
		r.events = cfg.Stderr
	}
	r.sum = Summary{Fault: string(cfg.Fault), Nodes: cfg.Nodes, Partitions: cfg.Partitions, Replicas: cfg.Replicas,
		Gateway: Gateway, Dir: dir, LoadRows: cfg.Rows}
	if cfg.WriteAll {
		r.sum.Gateway = ""
	}
	if !cfg.Insecure {
		r.certsDir = filepath.Join(dir, "certs")
		if r.tls, err = EnsureCerts(r.certsDir, cfg.Nodes); err != nil {
			return r.sum, err
		}
		r.sum.TLS = true
		admin, err := certs.Load(r.certsDir, certs.ClientID(certs.AdminName))
		if err != nil {
			return r.sum, err
		}
		r.admin, r.adminScheme = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: admin.DialConfig("")}}, "https://"
		defer r.admin.CloseIdleConnections()
	} else {
		r.admin, r.adminScheme = r.hc, "http://"
	}

	// The demo writes the cluster and etcd's users as the admin; its
	// loader and writer call the nodes as its client.
	var admin *certs.TLS
	if r.tls != nil {
		if admin, err = AdminCreds(r.certsDir); err != nil {
			return r.sum, err
		}
	}
	var cli *clientv3.Client
	if cfg.Fault == FaultPauseEtcd {
		// Its own process, so that pausing it pauses nothing else.
		ep, err := startEtcdProc(ctx, cfg.Binary, dir, r.certsDir)
		if err != nil {
			return r.sum, err
		}
		defer ep.stop(stopGrace)
		r.etcd, r.sum.Etcd = ep, ep.endpoint
		ecfg := clientv3.Config{Endpoints: []string{ep.endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
		if admin != nil {
			ecfg.TLS = admin.EtcdClientConfig()
		}
		if cli, err = clientv3.New(ecfg); err != nil {
			return r.sum, err
		}
	} else {
		opts := claim.EmbeddedOptions{}
		if admin != nil {
			opts.TLS = EmbeddedEtcdTLS(r.certsDir, admin)
		}
		etcd, err := claim.StartEmbedded(filepath.Join(dir, "etcd"), opts)
		if err != nil {
			return r.sum, err
		}
		defer etcd.Stop()
		r.sum.Etcd = strings.Join(etcd.Endpoints(), ",")
		if cli, err = etcd.Client(); err != nil {
			return r.sum, err
		}
	}
	r.sum.EtcdTLS = r.tls != nil
	defer cli.Close()
	if admin != nil {
		actx, cancel := context.WithTimeout(ctx, etcdAccessTimeout)
		err := SetupEtcdAccess(actx, cli, cfg.Nodes)
		cancel()
		if err != nil {
			return r.sum, fmt.Errorf("demo: etcd's roles: %w", err)
		}
	}
	r.cli = cli
	r.ps = newProcs(cfg.Binary, r.sum.Etcd, dir, r.nodeFlags)
	defer r.ps.stopAll(stopGrace)

	runCtx := ctx
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	if err := r.main(runCtx); err != nil {
		if ctx.Err() == nil && runCtx.Err() != nil {
			err = fmt.Errorf("demo: not done within --timeout %s: %w", cfg.Timeout, err)
		}
		if removeDir && !cfg.Keep {
			if ctx.Err() == nil { // not interrupted: show why
				tailLogs(cfg.Stderr, dir, cfg.Nodes)
			}
			return r.sum, err
		}
		return r.sum, fmt.Errorf("%w (node logs in %s)", err, dir)
	}
	if err := print(r); err != nil {
		return r.sum, err
	}
	var checkErr error
	switch {
	case !r.sum.DigestsMatch:
		checkErr = fmt.Errorf("%w: digests differ in partitions %v", ErrCheck, badPartitions(r.sum.Digests))
	case r.sum.AckedWritesLost > 0:
		checkErr = fmt.Errorf("%w: %d acknowledged writes lost", ErrCheck, r.sum.AckedWritesLost)
	}
	if cfg.Keep {
		w := out
		if cfg.JSON {
			w = cfg.Stderr
		}
		fmt.Fprintf(w, "\nThe cluster keeps running (--keep); Ctrl-C stops it.\n")
		// With --certs-dir, an https:// etcd's client files default to the
		// directory's CA and the client's certificate.
		statusCreds, creds := "", "--insecure"
		if r.certsDir != "" {
			creds = "--certs-dir " + r.certsDir + " --client " + ClientName
			statusCreds = " " + creds
		}
		fmt.Fprintf(w, "  etcd:   %s\n  status: %s status --etcd %s%s\n  verify: %s verify --etcd %s %s\n  data and node logs: %s\n",
			r.sum.Etcd, cfg.Binary, r.sum.Etcd, statusCreds, cfg.Binary, r.sum.Etcd, creds, dir)
		<-ctx.Done()
	}
	return r.sum, checkErr
}

func badPartitions(ds []clusterview.PartitionDigests) []uint32 {
	var bad []uint32
	for _, d := range ds {
		if !d.Match {
			bad = append(bad, d.Partition)
		}
	}
	return bad
}

// tailLogs prints the last lines of each node's log: the directory is
// about to go.
func tailLogs(w io.Writer, dir string, nodes int) {
	const lines = 15
	for id := 1; id <= nodes; id++ {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("n%d.log", id)))
		if err != nil {
			continue
		}
		ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		fmt.Fprintf(w, "--- last lines of n%d's log ---\n%s\n", id, strings.Join(ls[max(0, len(ls)-lines):], "\n"))
	}
}

// workDir returns dir, or a new temporary one to remove at the end.
func workDir(dir string) (string, bool, error) {
	if dir != "" {
		return dir, false, os.MkdirAll(dir, 0o755)
	}
	d, err := os.MkdirTemp("", "rejoin-demo-")
	return d, true, err
}

// nodeFlags are the flags of node id beyond its identity.
func (r *run) nodeFlags(id int) []string {
	f := []string{"--node-ttl", r.cfg.NodeTTL.String(), "--claim-ttl", r.cfg.ClaimTTL.String(),
		"--incoming-max", strconv.Itoa(r.cfg.IncomingMax), "--outgoing-max", strconv.Itoa(r.cfg.OutgoingMax), "--fault-points", "--pprof"}
	if r.certsDir != "" {
		f = append(f, "--certs-dir", r.certsDir)
		f = append(f, EtcdTLSFlags(r.certsDir, certs.NodeID(id))...)
	} else {
		f = append(f, "--insecure")
	}
	if r.cfg.RateBytes > 0 {
		f = append(f, "--rate-bytes", strconv.FormatInt(r.cfg.RateBytes, 10))
	}
	if r.cfg.PaceTarget != 0 {
		f = append(f, "--pace-target", r.cfg.PaceTarget.String())
	}
	return f
}

// progressEvery is how often a long phase of the demo (the load, the
// read-back) says how far it is.
const progressEvery = 2 * time.Second

// every returns a function that runs say if progressEvery has passed
// since it last did (or since every), from any goroutine, one at a time.
func (r *run) every() func(say func()) {
	var mu sync.Mutex
	last := time.Now()
	return func(say func()) {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(last) >= progressEvery {
			last = time.Now()
			say()
		}
	}
}

func (r *run) eventf(format string, args ...any) {
	fmt.Fprintf(r.events, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

// main is the demo's flow up to the summary.
func (r *run) main(ctx context.Context) error {
	cfg := r.cfg
	names := make([]string, cfg.Nodes)
	for i := range names {
		names[i] = node.NodeName(i + 1)
	}
	err := layout.Init(ctx, r.cli, layout.Config{Partitions: cfg.Partitions, Replicas: cfg.Replicas,
		Tables: []layout.Table{layout.KV()}}, names)
	if err != nil && !errors.Is(err, layout.ErrExists) {
		return err
	}
	r.eventf("etcd at %s; cluster: %d nodes, %d partitions x %d replicas, table kv; dir %s",
		r.sum.Etcd, cfg.Nodes, cfg.Partitions, cfg.Replicas, r.sum.Dir)

	if err := r.startAll(ctx); err != nil {
		return err
	}

	// Load.
	loader, err := client.Open(ctx, r.cli, client.Options{TLS: r.tls})
	if err != nil {
		return err
	}
	defer loader.Close()
	if err := WaitAnswering(ctx, r.cli, loader, 30*time.Second); err != nil {
		return err
	}
	if cfg.Rows > 0 {
		r.eventf("loading %d rows of %d-byte values", cfg.Rows, cfg.ValueBytes)
		start, every := time.Now(), r.every()
		rate, err := bulkLoad(ctx, loader, cfg.Rows, cfg.ValueBytes, func(n int) {
			every(func() {
				r.eventf("loading: %d of %d rows (%.0f%%), %.0f rows/s", n, cfg.Rows, 100*float64(n)/float64(cfg.Rows), float64(n)/time.Since(start).Seconds())
			})
		})
		if err != nil {
			return err
		}
		r.sum.LoadRowsPerSec = rate
		r.eventf("loaded %d rows: %.0f rows/s", cfg.Rows, rate)
	}

	// The writer, through the gateway only, or every node.
	via := client.Options{Nodes: []string{Gateway}, TLS: r.tls}
	if cfg.WriteAll {
		via = client.Options{TLS: r.tls}
	}
	gw, err := client.Open(ctx, r.cli, via)
	if err != nil {
		return err
	}
	defer gw.Close()
	w, err := startWriter(ctx, load.ClientPut(gw), true, cfg.Rows, cfg.ValueBytes, cfg.WriteRate, cfg.Writers)
	if err != nil {
		return err
	}
	defer w.Stop()
	if cfg.Plot != "" {
		r.plot = startPlotRec(w.g.Snapshot, node.TimelineEvery)
		defer r.plot.finish()
	}
	if cfg.WriteAll {
		r.eventf("writer started through every node, the fault's victims included: %d callers, rate %s", cfg.Writers, rateText(cfg.WriteRate))
	} else {
		r.eventf("writer started through gateway %s (never a fault target): %d callers, rate %s", Gateway, cfg.Writers, rateText(cfg.WriteRate))
	}
	w.Phase() // the window starts now
	if err := sleep(ctx, cfg.Before); err != nil {
		return err
	}
	before := w.Phase()
	r.before = before
	r.sum.WritesPerSecBefore, r.sum.WriteP99MsBefore = before.PerSec, ms(before.P99)
	r.eventf("before: %.0f writes/s, p99 %.2f ms", before.PerSec, ms(before.P99))
	if before.Writes == 0 {
		w.Stop()
		return fmt.Errorf("the writer got no write acknowledged in %s: %s", cfg.Before, w.LastError())
	}

	// Kill the victim, the last node, and wait until etcd knows it dead.
	victimID := cfg.Nodes
	victim := node.NodeName(victimID)
	r.sum.Victim = victim
	hosted, err := r.hostedBy(ctx, victim)
	if err != nil {
		return err
	}
	w.g.TakeGapMax() // the gaps from the kill on
	if err := r.ps.killNode(victimID); err != nil {
		return err
	}
	r.eventf("killed %s (SIGKILL); it hosts partitions %v", victim, hosted)
	r.plot.mark("kill " + victim)
	if err := r.waitDead(ctx, victim); err != nil {
		return err
	}

	// Hold the sources mid-snapshot, so the fault hits the stream.
	if cfg.Fault != FaultNone {
		if err := r.hold(ctx, hosted); err != nil {
			return err
		}
	}

	outage := w.Phase()
	r.sum.WritesPerSecOutage = outage.PerSec
	vp, err := r.ps.start(ctx, victimID)
	if err != nil {
		return err
	}
	restartAt := time.Now()
	r.plot.mark("restart " + victim)
	r.restarted = append(r.restarted, victim)
	r.eventf("restarted %s (same id, same data dir; http %s): its replicas rejoin (writes while it was down: %.0f/s)", victim, vp.ready.HTTP, outage.PerSec)

	var b *bars
	if cfg.Progress && !cfg.JSON {
		b = newBars(r.out)
		r.events = b
	}
	finishBars := func() {
		if b != nil {
			b.finish()
			b = nil
			r.events = r.out
		}
	}
	defer finishBars()

	if cfg.Fault != FaultNone {
		if err := r.inject(ctx, victimID, hosted); err != nil {
			return err
		}
	}
	if err := r.waitAllLive(ctx, b); err != nil {
		return err
	}
	allLive := time.Now()
	r.plot.mark("all live")
	finishBars()
	r.sum.RejoinSeconds = allLive.Sub(restartAt).Seconds()
	r.sum.WriteGapMaxSeconds = w.g.TakeGapMax().Seconds()
	during := w.Phase()
	r.during = during
	r.sum.WritesPerSecDuring, r.sum.WriteP99MsDuring = during.PerSec, ms(during.P99)
	r.eventf("every replica live %.2f s after the restart; during: %.0f writes/s, p99 %.2f ms",
		r.sum.RejoinSeconds, during.PerSec, ms(during.P99))
	r.plot.finish()
	w.Stop()
	r.sum.WriteErrors = before.Errors + outage.Errors + during.Errors
	r.sum.WritesUncertain = before.Uncertain + outage.Uncertain + during.Uncertain
	if err := r.figures(ctx); err != nil {
		return err
	}
	if err := r.savePlot(ctx); err != nil {
		return err
	}

	// Checks.
	rep, err := r.checkDigests(ctx, loader)
	if err != nil {
		return err
	}
	r.sum.ReplicasChecked, r.sum.DigestsMatch, r.sum.Digests = rep.ReplicasChecked, rep.OK(), rep.Partitions
	r.eventf("digests: %d replicas checked, match=%v", rep.ReplicasChecked, rep.OK())
	r.eventf("reading back every acknowledged write")
	every := r.every()
	checked, lost, examples, err := w.CheckAcked(ctx, loader, func(n, of int) {
		every(func() {
			r.eventf("reading back: %d of %d acknowledged writes (%.0f%%)", n, of, 100*float64(n)/float64(of))
		})
	})
	if err != nil {
		return err
	}
	r.sum.AckedWritesChecked, r.sum.AckedWritesLost, r.sum.LostExamples = checked, lost, examples
	r.eventf("acknowledged writes read back: %d, lost: %d", checked, lost)
	return nil
}

// checkDigests asks every replica for its digest at a common txn ID. A
// replica just back live may be left out of a call by an initiator that
// has not seen it live yet; a partition that answered short is asked
// again for a while, a partition whose digests differ is not.
func (r *run) checkDigests(ctx context.Context, c *client.Client) (clusterview.DigestReport, error) {
	deadline := time.Now().Add(digestRetryWithin)
	for {
		rep, err := clusterview.CheckDigests(ctx, r.cli, c)
		if err != nil || rep.OK() || rep.Differ() || time.Now().After(deadline) {
			return rep, err
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return rep, err
		}
	}
}

// digestRetryWithin bounds checkDigests's retries of short answers.
const digestRetryWithin = 15 * time.Second

func rateText(rate int) string {
	if rate == 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%d/s", rate)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startAll starts every node at once and waits until all are registered.
func (r *run) startAll(ctx context.Context) error {
	errs := make(chan error, r.cfg.Nodes)
	for id := 1; id <= r.cfg.Nodes; id++ {
		go func() {
			p, err := r.ps.start(ctx, id)
			if err == nil {
				r.eventf("started n%d (pid %d): tcp %s, http %s", id, p.pid(), p.ready.TCP, p.ready.HTTP)
			}
			errs <- err
		}()
	}
	var all []error
	for range r.cfg.Nodes {
		all = append(all, <-errs)
	}
	if err := errors.Join(all...); err != nil {
		return err
	}
	return Poll(ctx, 30*time.Second, "every node registered", func() (bool, error) {
		nodes, err := supervise.Nodes(ctx, r.cli)
		return len(nodes) == r.cfg.Nodes, err
	})
}

// WaitAnswering waits, within a bound, until every replica of every
// partition answers a digest call: the cluster is ready for writes (the
// initiators have opened their feeds).
func WaitAnswering(ctx context.Context, cli *clientv3.Client, c *client.Client, within time.Duration) error {
	return Poll(ctx, within, "every replica answering", func() (bool, error) {
		rep, err := clusterview.CheckDigests(ctx, cli, c)
		if err != nil {
			return false, err
		}
		if !rep.OK() {
			return false, errors.New(rep.Partitions[rep.Bad[0]].Problem)
		}
		return true, nil
	})
}

// Poll calls f every 100 ms until it says done, halts (an error made by
// Halt), or within ends. Any other error of f is retried, and reported
// with the timeout if it is the last: a node that is restarting does not
// answer yet.
func Poll(ctx context.Context, within time.Duration, what string, f func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		done, err := f()
		if done && err == nil {
			return nil
		}
		if h := (haltError{}); errors.As(err, &h) {
			return fmt.Errorf("waiting for %s: %w", what, h.error)
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
			}
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// haltError is an error no later call can clear: Poll returns it at once.
type haltError struct{ error }

func (h haltError) Unwrap() error { return h.error }

// Halt marks err as one that ends a Poll at once: a node process that
// exited does not come back by waiting, and a run that retried it until
// its bound (10 minutes for the rejoin) would look hung.
func Halt(err error) error { return haltError{err} }

// hostedBy lists the partitions node hosts, from the placement.
func (r *run) hostedBy(ctx context.Context, nodeID string) ([]uint32, error) {
	reps, err := supervise.Replicas(ctx, r.cli)
	if err != nil {
		return nil, err
	}
	var ps []uint32
	for _, rp := range reps {
		if rp.Node == nodeID {
			ps = append(ps, rp.Partition)
		}
	}
	slices.Sort(ps)
	if len(ps) == 0 {
		return nil, fmt.Errorf("%s hosts no partition: nothing would rejoin", nodeID)
	}
	return ps, nil
}

// waitDead waits until the node's record is gone from etcd.
func (r *run) waitDead(ctx context.Context, nodeID string) error {
	start := time.Now()
	err := Poll(ctx, 3*r.cfg.NodeTTL+10*time.Second, nodeID+"'s registration to expire", func() (bool, error) {
		nodes, err := supervise.Nodes(ctx, r.cli)
		if err != nil {
			return false, err
		}
		return !slices.ContainsFunc(nodes, func(n supervise.NodeRecord) bool { return n.ID == nodeID }), nil
	})
	if err == nil {
		r.eventf("etcd has %s dead after %.1f s (its lease expired)", nodeID, time.Since(start).Seconds())
	}
	return err
}

// view reads the cluster.
func (r *run) view(ctx context.Context) (clusterview.View, error) {
	return clusterview.Read(ctx, r.cli, r.hc, time.Second)
}

// hold asks every live node hosting each partition to hold its rejoin's
// snapshot stream once half the partition's rows are sent: whichever of
// them the supervisor picks as the source holds.
func (r *run) hold(ctx context.Context, partitions []uint32) error {
	v, err := r.view(ctx)
	if err != nil {
		return err
	}
	rows := map[uint32]int64{}
	for _, rp := range v.Replicas {
		if rp.Reported {
			rows[rp.Partition] = max(rows[rp.Partition], rp.Rows)
		}
	}
	for _, p := range partitions {
		half := max(1, rows[p]/2)
		for _, h := range liveHosts(v, p) {
			if err := r.post(ctx, h.HTTP, "/fault/hold", url.Values{"partition": {fmt.Sprint(p)}, "rows": {fmt.Sprint(half)}}); err != nil {
				return fmt.Errorf("hold partition %d on %s: %w", p, h.ID, err)
			}
		}
		r.eventf("hold: the source of partition %d's rejoin stops after %d of its ~%d rows", p, half, rows[p])
	}
	return nil
}

// liveHosts lists the registered nodes that host partition p.
func liveHosts(v clusterview.View, p uint32) []clusterview.NodeRow {
	var out []clusterview.NodeRow
	for _, n := range v.Nodes {
		if slices.ContainsFunc(v.Replicas, func(rp clusterview.ReplicaRow) bool { return rp.Partition == p && rp.Node == n.ID }) {
			out = append(out, n)
		}
	}
	return out
}

// release lifts the holds on every live node hosting the partitions.
func (r *run) release(ctx context.Context, partitions []uint32) error {
	v, err := r.view(ctx)
	if err != nil {
		return err
	}
	for _, p := range partitions {
		for _, h := range liveHosts(v, p) {
			// Best effort: a node just killed may still be registered.
			if err := r.post(ctx, h.HTTP, "/fault/release", url.Values{"partition": {fmt.Sprint(p)}}); err != nil {
				r.eventf("release partition %d on %s: %v", p, h.ID, err)
			}
		}
	}
	r.eventf("released the holds")
	return nil
}

func (r *run) post(ctx context.Context, addr, path string, q url.Values) error {
	if addr == "" {
		return errors.New("no admin HTTP address")
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.adminScheme+addr+path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := r.admin.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// heldRejoin is a source holding its stream mid-snapshot.
type heldRejoin struct {
	Partition    uint32
	Source, Dest string
}

// waitHeld waits until a source holds the stream of a partition into dest
// that ok accepts, and returns every held one seen then.
func (r *run) waitHeld(ctx context.Context, dest string, partitions []uint32, ok func(heldRejoin) bool) ([]heldRejoin, error) {
	var held []heldRejoin
	err := Poll(ctx, 60*time.Second, "a rejoin into "+dest+" held mid-snapshot", func() (bool, error) {
		if err := r.ps.exited(); err != nil {
			return false, err
		}
		v, err := r.view(ctx)
		if err != nil {
			return false, err
		}
		r.noteAttempts(v)
		held = held[:0]
		for id, st := range v.Status {
			for _, rs := range st.Replicas {
				if !slices.Contains(partitions, rs.Partition) {
					continue
				}
				for _, s := range rs.Sources {
					if s.Held && s.Peer == dest && s.Ended.IsZero() {
						held = append(held, heldRejoin{rs.Partition, id, dest})
					}
				}
			}
		}
		slices.SortFunc(held, func(a, b heldRejoin) int { return int(a.Partition) - int(b.Partition) })
		return slices.ContainsFunc(held, ok), nil
	})
	return held, err
}

// inject waits for the hold and puts the fault in, then releases.
func (r *run) inject(ctx context.Context, victimID int, hosted []uint32) error {
	victim := node.NodeName(victimID)
	anyHeld := func(heldRejoin) bool { return true }
	switch r.cfg.Fault {
	case FaultKillDestination:
		held, err := r.waitHeld(ctx, victim, hosted, anyHeld)
		if err != nil {
			return err
		}
		r.sum.FaultTarget = victim
		if err := r.ps.killNode(victimID); err != nil {
			return err
		}
		r.eventf("fault kill-destination: killed %s (SIGKILL) while %s held partition %d mid-snapshot", victim, held[0].Source, held[0].Partition)
		if err := r.release(ctx, hosted); err != nil {
			return err
		}
		if err := r.waitDead(ctx, victim); err != nil {
			return err
		}
		if _, err := r.ps.start(ctx, victimID); err != nil {
			return err
		}
		r.eventf("restarted %s again", victim)
		return nil

	case FaultKillSource:
		notGateway := func(h heldRejoin) bool { return h.Source != Gateway }
		held, err := r.waitHeld(ctx, victim, hosted, notGateway)
		if err != nil {
			return fmt.Errorf("%w: kill-source needs a rejoining partition whose source is not the gateway %s (held: %v); try more partitions", err, Gateway, held)
		}
		h := held[slices.IndexFunc(held, notGateway)]
		var srcID int
		if _, err := fmt.Sscanf(h.Source, "n%d", &srcID); err != nil {
			return fmt.Errorf("source %q: %w", h.Source, err)
		}
		r.sum.FaultTarget = h.Source
		if err := r.ps.killNode(srcID); err != nil {
			return err
		}
		r.eventf("fault kill-source: killed %s (SIGKILL), the source of partition %d, mid-snapshot", h.Source, h.Partition)
		if err := r.release(ctx, hosted); err != nil {
			return err
		}
		srcHosted, err := r.hostedBy(ctx, h.Source)
		if err != nil {
			return err
		}
		if err := r.waitDead(ctx, h.Source); err != nil {
			return err
		}
		if _, err := r.ps.start(ctx, srcID); err != nil {
			return err
		}
		r.restarted = append(r.restarted, h.Source)
		r.eventf("restarted %s: its partitions %v rejoin too", h.Source, srcHosted)
		return nil

	case FaultCutLink, FaultPauseHolder:
		held, err := r.waitHeld(ctx, victim, hosted, anyHeld)
		if err != nil {
			return err
		}
		h := held[0]
		r.sum.FaultTarget = fmt.Sprintf("partition %d on %s", h.Partition, h.Source)
		n, err := r.nodeRecord(ctx, h.Source)
		if err != nil {
			return err
		}
		q := url.Values{"partition": {fmt.Sprint(h.Partition)}}
		path := "/fault/cut-link"
		if r.cfg.Fault == FaultPauseHolder {
			path = "/fault/pause-holder"
			q.Set("for", (2 * r.cfg.ClaimTTL).String())
		}
		if err := r.post(ctx, n.HTTP, path, q); err != nil {
			return err
		}
		if r.cfg.Fault == FaultCutLink {
			r.eventf("fault cut-link: closed the rejoin connection of partition %d (%s -> %s) mid-snapshot", h.Partition, h.Source, victim)
		} else {
			r.eventf("fault pause-holder: the claim holder of partition %d's rejoin on %s stops for %s (2x the claim TTL) mid-snapshot", h.Partition, h.Source, 2*r.cfg.ClaimTTL)
		}
		return r.release(ctx, hosted)

	case FaultPauseEtcd:
		held, err := r.waitHeld(ctx, victim, hosted, anyHeld)
		if err != nil {
			return err
		}
		pause := 3*r.cfg.NodeTTL + time.Second
		r.sum.FaultTarget = fmt.Sprintf("etcd (pid %d)", r.etcd.pid())
		if err := r.etcd.pause(); err != nil {
			return err
		}
		r.eventf("fault pause-etcd: paused etcd (SIGSTOP, pid %d) for %s (3x the node TTL + 1s) while %s held partition %d mid-snapshot",
			r.etcd.pid(), pause, held[0].Source, held[0].Partition)
		slept := sleep(ctx, pause)
		if err := r.etcd.resume(); err != nil {
			return err
		}
		if slept != nil {
			return slept
		}
		resumed := time.Now()
		r.eventf("resumed etcd (SIGCONT)")
		if err := r.ps.exited(); err != nil {
			return fmt.Errorf("a node exited while etcd was paused: %w", err)
		}
		// Registered and updating since the resume: a record read at once
		// may be one whose lease etcd has not revoked yet.
		if err := Poll(ctx, 30*time.Second, "every node registered again", func() (bool, error) {
			if err := r.ps.exited(); err != nil {
				return false, err
			}
			nodes, err := supervise.Nodes(ctx, r.cli)
			fresh := 0
			for _, n := range nodes {
				if n.LastActive.After(resumed) {
					fresh++
				}
			}
			return fresh == r.cfg.Nodes, err
		}); err != nil {
			return err
		}
		r.eventf("every node registered again %.1f s after etcd resumed; none exited", time.Since(resumed).Seconds())
		return r.release(ctx, hosted)
	}
	return nil
}

func (r *run) nodeRecord(ctx context.Context, id string) (supervise.NodeRecord, error) {
	nodes, err := supervise.Nodes(ctx, r.cli)
	if err != nil {
		return supervise.NodeRecord{}, err
	}
	for _, n := range nodes {
		if n.ID == id {
			return n, nil
		}
	}
	return supervise.NodeRecord{}, fmt.Errorf("%s is not registered", id)
}

// noteAttempts records the rejoin attempts into restarted nodes seen in v.
func (r *run) noteAttempts(v clusterview.View) {
	for _, st := range v.Status {
		for _, rs := range st.Replicas {
			if rj := rs.Rejoin; rj != nil && rj.Epoch != 0 {
				r.attempts[fmt.Sprintf("%d/%s/%d", rs.Partition, st.Node, rj.Epoch)] = true
			}
			for _, s := range rs.Sources {
				if s.Epoch != 0 {
					r.attempts[fmt.Sprintf("%d/%s/%d", rs.Partition, s.Peer, s.Epoch)] = true
				}
			}
		}
	}
}

// allLive reports whether every replica of every partition is live, in
// etcd and as its node reports it, with every node up.
func (r *run) allLive(v clusterview.View) bool {
	if len(v.Nodes) != r.cfg.Nodes || len(v.Replicas) != int(r.cfg.Partitions)*r.cfg.Replicas {
		return false
	}
	for _, rp := range v.Replicas {
		if rp.Placement != recovery.ReplicaLive || !rp.Alive || !rp.Reported || rp.State != recovery.ReplicaLive {
			return false
		}
	}
	return true
}

// waitAllLive polls the cluster until every replica is live, moving the
// bars.
func (r *run) waitAllLive(ctx context.Context, b *bars) error {
	within := 10 * time.Minute
	if dl, ok := ctx.Deadline(); ok {
		within = time.Until(dl)
	}
	return Poll(ctx, within, "every replica live", func() (bool, error) {
		if err := r.ps.exited(); err != nil {
			return false, err
		}
		v, err := r.view(ctx)
		if err != nil {
			return false, nil // a node restarting may not answer: retry
		}
		r.noteAttempts(v)
		if b != nil {
			b.update(v, time.Now())
		}
		return r.allLive(v), nil
	})
}

// figures fills the rejoin figures from the destinations' status and the
// task records.
func (r *run) figures(ctx context.Context) error {
	v, err := r.view(ctx)
	if err != nil {
		return err
	}
	r.noteAttempts(v)
	// The source side of each attempt, for an end time the destination
	// may not report.
	srcEnded := map[string]time.Time{}
	for _, st := range v.Status {
		for _, rs := range st.Replicas {
			for _, s := range rs.Sources {
				srcEnded[fmt.Sprintf("%d/%s/%d", rs.Partition, s.Peer, s.Epoch)] = s.Ended
				if slices.Contains(r.restarted, s.Peer) {
					r.sum.PaceStarts += s.PaceStarts
				}
			}
		}
	}
	var first, last time.Time
	for _, dest := range r.restarted {
		st, ok := v.Status[dest]
		if !ok {
			return fmt.Errorf("%s did not answer /status", dest)
		}
		for _, rs := range st.Replicas {
			rj := rs.Rejoin
			if rj == nil {
				continue
			}
			r.sum.RejoinedTasks++
			r.sum.Rows += rj.Rows
			r.sum.Bytes += rj.Bytes
			r.sum.SnapshotRows += rj.SnapshotRows
			r.sum.HandoffPauseMs = max(r.sum.HandoffPauseMs, rj.HandoffPauseMs)
			if first.IsZero() || rj.Started.Before(first) {
				first = rj.Started
			}
			ended := rj.Ended
			if ended.IsZero() {
				ended = srcEnded[fmt.Sprintf("%d/%s/%d", rs.Partition, dest, rj.Epoch)]
			}
			if ended.After(last) {
				last = ended
			}
		}
	}
	for _, st := range v.Status {
		for _, rs := range st.Replicas {
			for _, s := range rs.Sources {
				if slices.Contains(r.restarted, s.Peer) {
					r.sum.BlocksResent += s.BlocksResent
					r.sum.HandoffPauseMs = max(r.sum.HandoffPauseMs, s.HandoffPauseMs)
				}
			}
		}
	}
	if !first.IsZero() && last.After(first) {
		r.sum.StreamSeconds = last.Sub(first).Seconds()
		r.sum.RowsPerSec = float64(r.sum.Rows) / r.sum.StreamSeconds
		r.sum.MBPerSec = float64(r.sum.Bytes) / 1e6 / r.sum.StreamSeconds
	}
	r.sum.Attempts = len(r.attempts)
	tasks, err := claim.Tasks(ctx, r.cli)
	if err != nil {
		return err
	}
	for _, t := range tasks {
		if slices.Contains(r.restarted, t.Task.Dest) {
			r.sum.TaskAttempts += int(t.Attempts)
		}
	}
	return nil
}
