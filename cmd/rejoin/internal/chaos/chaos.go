package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rejoin-db/rejoin/bench/load"
	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/clusterview"
	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/node"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/wire"
)

// PlantEnv names the environment variable through which `rejoin chaos
// --plant KEY` hands its node processes the planted fault
// (node.Config.PlantDropKey). Test-only.
const PlantEnv = "REJOIN_CHAOS_PLANT_DROP_KEY"

// ErrFail: the run ended with the verdict FAIL.
var ErrFail = errors.New("chaos: FAIL")

// The volume writer's rows: table kv, as the demo's.
const (
	volumeTable    = "kv"
	keyBytes       = 16
	newKeyFraction = 0.5
)

// Config is one chaos run.
type Config struct {
	// Binary is the rejoin executable run as `etcd` and `node`.
	Binary string
	// Dir holds etcd's and the nodes' data and logs; "" makes a temporary
	// one, removed after a PASS unless Keep. A FAIL keeps it.
	Dir  string
	Keep bool

	Duration time.Duration
	Seed     int64
	// Faults are the nemesis's actions to draw from (nil: none).
	Faults []Action

	Nodes, Replicas int
	Partitions      uint32
	Rows            int
	ValueBytes      int
	// Registers and Callers shape the register workload (default 8, 4).
	Registers, Callers int
	// WriteRate and Writers shape the volume writer (default 200/s, 8).
	WriteRate, Writers int
	// NodeTTL and ClaimTTL go to the nodes (default 4 s, 5 s).
	NodeTTL, ClaimTTL time.Duration
	// LiveWithin bounds the wait, after the heal, for every replica live
	// (default 2 min).
	LiveWithin time.Duration
	// Plant, test-only, loses the first write of register 0 through each
	// node (node.Config.PlantDropKey): the checker must say FAIL.
	Plant bool

	JSON   bool
	Stderr io.Writer
}

// Check fills the defaults and checks the config.
func (c *Config) Check() error {
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	def(&c.Nodes, 5)
	def(&c.Replicas, 3)
	def(&c.ValueBytes, 100)
	def(&c.Registers, 8)
	def(&c.Callers, 4)
	def(&c.WriteRate, 200)
	def(&c.Writers, 8)
	if c.Partitions == 0 {
		c.Partitions = 8
	}
	if c.NodeTTL == 0 {
		c.NodeTTL = 4 * time.Second
	}
	if c.ClaimTTL == 0 {
		c.ClaimTTL = 5 * time.Second
	}
	if c.LiveWithin == 0 {
		c.LiveWithin = 2 * time.Minute
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	switch {
	case c.Binary == "":
		return errors.New("chaos: no binary to run etcd and the nodes with")
	case c.Duration <= 0:
		return fmt.Errorf("chaos: --duration %s, want > 0", c.Duration)
	case c.Nodes < 2 || c.Nodes > 64:
		return fmt.Errorf("chaos: --nodes %d, want 2..64", c.Nodes)
	case c.Replicas < 2 || c.Replicas > c.Nodes:
		return fmt.Errorf("chaos: --replicas %d, want 2..--nodes (%d): a fault never takes the last live replica, so a partition needs two", c.Replicas, c.Nodes)
	case c.Partitions > 1<<16:
		return fmt.Errorf("chaos: --partitions %d, want 1..65536", c.Partitions)
	case c.Rows < 0 || c.ValueBytes < 0 || c.Registers < 1 || c.Registers > 1000 || c.Callers < 1 || c.Callers > 256:
		return errors.New("chaos: --rows and --value-bytes must not be negative, --registers 1..1000, --callers 1..256")
	case c.WriteRate < 0 || c.Writers < 1 || c.Writers > 1024:
		return errors.New("chaos: --write-rate must not be negative, --writers 1..1024")
	}
	return nil
}

// Summary is what a run found; Verdict is PASS or FAIL, Reasons say why
// it failed.
type Summary struct {
	Verdict  string   `json:"verdict"`
	Reasons  []string `json:"reasons,omitempty"`
	Seed     int64    `json:"seed"`
	Duration string   `json:"duration"`
	Faults   []Action `json:"faults"`
	// Planted: the test-only planted fault was on (Config.Plant).
	Planted  bool     `json:"planted,omitempty"`
	Schedule []string `json:"schedule"`
	// Faults done and skipped (a node not up, a last live replica, no
	// rejoin in progress, etcd unreadable).
	FaultsDone    int `json:"faults_done"`
	FaultsSkipped int `json:"faults_skipped"`

	Nodes      int    `json:"nodes"`
	Partitions uint32 `json:"partitions"`
	Replicas   int    `json:"replicas"`
	Rows       int    `json:"rows"`

	// The register workload.
	RegisterOps       int `json:"register_ops"`
	RegisterOK        int `json:"register_ok"`
	RegisterFailed    int `json:"register_failed"`
	RegisterUncertain int `json:"register_uncertain"`
	// Linearizable registers; Unknown ones porcupine could not decide in
	// time (no verdict either way).
	Linearizable int         `json:"linearizable"`
	Unknown      []string    `json:"linearizability_unknown,omitempty"`
	FailingKey   *KeyResult  `json:"failing_key,omitempty"`
	Registers    []KeyResult `json:"registers,omitempty"`

	// The volume writer.
	Writes             int64    `json:"writes"`
	WriteErrors        int64    `json:"write_errors"`
	WritesUncertain    int64    `json:"writes_uncertain"`
	AckedWritesChecked int      `json:"acked_writes_checked"`
	AckedWritesLost    int      `json:"acked_writes_lost"`
	LostExamples       []string `json:"lost_examples,omitempty"`

	// LiveSeconds: from the heal to every replica live.
	LiveSeconds     float64 `json:"live_seconds"`
	AllLive         bool    `json:"all_live"`
	ReplicasChecked int     `json:"replicas_checked"`
	DigestsMatch    bool    `json:"digests_match"`
	// DigestsDiffer: two replicas of a partition answered different
	// digests at one txn ID (with a replica not live, DigestsMatch is
	// false anyway: its partition answers short).
	DigestsDiffer bool                           `json:"digests_differ"`
	Digests       []clusterview.PartitionDigests `json:"digests,omitempty"`
	// SelfExits: node processes that exited without our kill.
	SelfExits []string `json:"self_exits,omitempty"`

	Dir  string `json:"dir"`
	Etcd string `json:"etcd"`
}

// run is the state of one chaos run.
type run struct {
	cfg Config
	// certsDir holds the run's CA and certificates; tls are the
	// workload's client credentials: the nodes run secure, as the demo's.
	certsDir string
	tls      *certs.TLS
	events   io.Writer
	dir      string
	cli      *clientv3.Client
	etcd     *demo.Etcd
	nodes    *demo.Nodes
	hc       *http.Client

	mu  sync.Mutex
	sum Summary
}

// Run runs chaos and prints the seed, the schedule, what the nemesis did
// and the summary (one JSON object with cfg.JSON) on out. It returns
// ErrFail (wrapped) for the verdict FAIL, another error when the run could
// not be made; every process it started is stopped before it returns.
func Run(ctx context.Context, cfg Config, out io.Writer) (sum Summary, err error) {
	if err := cfg.Check(); err != nil {
		return Summary{}, err
	}
	dir, temp := cfg.Dir, cfg.Dir == ""
	if temp {
		if dir, err = os.MkdirTemp("", "rejoin-chaos-"); err != nil {
			return Summary{}, err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return Summary{}, err
	}
	r := &run{cfg: cfg, events: out, dir: dir, hc: &http.Client{Timeout: 5 * time.Second}}
	if cfg.JSON {
		r.events = cfg.Stderr
	}
	steps := Plan(cfg.Seed, cfg.Duration, cfg.Nodes, cfg.NodeTTL, cfg.Faults)
	r.sum = Summary{Seed: cfg.Seed, Duration: cfg.Duration.String(), Faults: cfg.Faults, Planted: cfg.Plant, Nodes: cfg.Nodes, Partitions: cfg.Partitions,
		Replicas: cfg.Replicas, Rows: cfg.Rows, Dir: dir}
	for _, s := range steps {
		r.sum.Schedule = append(r.sum.Schedule, s.String())
	}
	fmt.Fprintf(r.events, "rejoin chaos: seed %d, duration %s, faults %v; replay with --seed %d\nschedule (%d faults):\n", cfg.Seed, cfg.Duration, cfg.Faults, cfg.Seed, len(steps))
	for _, s := range r.sum.Schedule {
		fmt.Fprintf(r.events, "  %s\n", s)
	}

	// Past the schedule: the load, the heal, the wait for live replicas
	// and the checks, each bounded on its own.
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration+cfg.LiveWithin+10*time.Minute)
	defer cancel()
	err = r.main(runCtx, steps)
	if r.nodes != nil {
		r.nodes.StopAll(demo.StopGrace)
	}
	if r.cli != nil {
		r.cli.Close()
	}
	if r.etcd != nil {
		r.etcd.Stop(demo.StopGrace)
	}
	sum = r.summary()
	if err != nil {
		sum.Verdict = "FAIL"
		sum.Reasons = append(sum.Reasons, "the run did not complete: "+err.Error())
	}
	if perr := r.print(out, sum); perr != nil && err == nil {
		err = perr
	}
	if sum.Verdict == "PASS" && temp && !cfg.Keep {
		return sum, os.RemoveAll(dir)
	}
	if sum.Verdict != "PASS" {
		return sum, fmt.Errorf("%w: %s (run dir kept: %s)", ErrFail, strings.Join(sum.Reasons, "; "), dir)
	}
	return sum, nil
}

func (r *run) eventf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.events, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

func (r *run) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sum.Reasons = append(r.sum.Reasons, fmt.Sprintf(format, args...))
}

func (r *run) summary() Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sum
	s.Verdict = "PASS"
	if len(s.Reasons) > 0 {
		s.Verdict = "FAIL"
	}
	return s
}

// nodeFlags are the flags of node id beyond its identity.
func (r *run) nodeFlags(id int) []string {
	f := []string{"--node-ttl", r.cfg.NodeTTL.String(), "--claim-ttl", r.cfg.ClaimTTL.String(),
		"--incoming-max", strconv.Itoa(int(r.cfg.Partitions)), "--certs-dir", r.certsDir}
	return append(f, demo.EtcdTLSFlags(r.certsDir, certs.NodeID(id))...)
}

func (r *run) main(ctx context.Context, steps []Step) error {
	cfg := r.cfg
	// The certificates first: etcd serves with one and requires them of
	// its clients, the nodes included.
	r.certsDir = filepath.Join(r.dir, "certs")
	var err error
	if r.tls, err = demo.EnsureCerts(r.certsDir, cfg.Nodes); err != nil {
		return err
	}
	etcd, err := demo.StartEtcd(ctx, cfg.Binary, r.dir, r.certsDir)
	if err != nil {
		return err
	}
	r.etcd = etcd
	r.sum.Etcd = etcd.Endpoint()
	r.cli, err = clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second,
		TLS: r.tls.EtcdClientConfig(), Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	names := make([]string, cfg.Nodes)
	for i := range names {
		names[i] = node.NodeName(i + 1)
	}
	if err := layout.Init(ctx, r.cli, layout.Config{Partitions: cfg.Partitions, Replicas: cfg.Replicas,
		Tables: []layout.Table{layout.KV()}}, names); err != nil && !errors.Is(err, layout.ErrExists) {
		return err
	}
	var env []string
	if cfg.Plant {
		env = []string{PlantEnv + "=" + RegisterKey(0)}
		r.eventf("planted fault (test-only): each node loses its first write of %s", RegisterKey(0))
	}
	r.nodes = demo.NewNodes(cfg.Binary, etcd.Endpoint(), r.dir, r.nodeFlags, env)
	r.eventf("etcd at %s (pid %d); cluster: %d nodes, %d partitions x %d replicas; dir %s",
		etcd.Endpoint(), etcd.Pid(), cfg.Nodes, cfg.Partitions, cfg.Replicas, r.dir)
	if err := r.startAll(ctx); err != nil {
		return err
	}

	c, err := client.Open(ctx, r.cli, client.Options{TLS: r.tls})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := demo.WaitAnswering(ctx, r.cli, c, 60*time.Second); err != nil {
		return err
	}
	if cfg.Rows > 0 {
		rep, err := load.Load(ctx, c, volumeTable, cfg.Rows, keyBytes, cfg.ValueBytes)
		if err != nil {
			return err
		}
		r.eventf("loaded %d rows: %.0f rows/s", cfg.Rows, rep.RowsPerSec)
	}

	// The workloads, through every node: a call whose node dies is
	// uncertain.
	g, err := load.Start(ctx, c, load.Config{Table: volumeTable, Rate: float64(cfg.WriteRate), Concurrency: cfg.Writers,
		KeyBytes: keyBytes, ValueBytes: cfg.ValueBytes, Keys: cfg.Rows, NewKeyFraction: newKeyFraction, Record: true,
		Seed: uint64(cfg.Seed)})
	if err != nil {
		return err
	}
	var report *load.Report
	stopWriter := func() {
		if report == nil {
			rp := g.Stop()
			report = &rp
		}
	}
	defer stopWriter()
	regs := startRegisters(ctx, c, cfg.Registers, cfg.Callers, cfg.Seed)
	var ops []Op
	stopRegs := func() {
		if ops == nil {
			ops = regs.stop()
		}
	}
	defer stopRegs()
	r.eventf("workloads: %d callers on %d registers; volume writer %d/s by %d callers", cfg.Callers, cfg.Registers, cfg.WriteRate, cfg.Writers)

	// The nemesis, for the duration.
	ns := newNemesis(ctx, r.nodes, etcd, r.cli, cfg.Nodes, r.eventf, func(id int, err error) {
		r.eventf("n%d EXITED on its own: %v", id, err)
		r.fail("n%d exited on its own (%v); see %s", id, err, filepath.Join(r.dir, fmt.Sprintf("n%d.log", id)))
		r.mu.Lock()
		r.sum.SelfExits = append(r.sum.SelfExits, fmt.Sprintf("n%d: %v", id, err))
		r.mu.Unlock()
	})
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		ns.watchExits(watchCtx)
	}()
	defer func() {
		stopWatch()
		<-watched
	}()
	nemCtx, stopNem := context.WithTimeout(ctx, cfg.Duration)
	ns.run(nemCtx, steps)
	<-nemCtx.Done()
	stopNem()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.eventf("nemesis done: healing (resume everything, restart every node down)")
	healErr := ns.heal()
	ns.mu.Lock()
	r.sum.FaultsDone, r.sum.FaultsSkipped = ns.done, ns.skipped
	ns.mu.Unlock()
	if healErr != nil {
		return healErr
	}
	healed := time.Now()
	liveErr := demo.Poll(ctx, cfg.LiveWithin, "every replica live", func() (bool, error) {
		v, err := clusterview.Read(ctx, r.cli, r.hc, time.Second)
		if err != nil {
			return false, nil // a node restarting may not answer: retry
		}
		return r.allLive(v), nil
	})
	if liveErr != nil {
		r.fail("not every replica live within %s of the heal: %s", cfg.LiveWithin, r.notLive(ctx))
	} else {
		r.sum.AllLive = true
		r.sum.LiveSeconds = time.Since(healed).Seconds()
		r.eventf("every replica live %.1f s after the heal", r.sum.LiveSeconds)
	}
	stopRegs()
	stopWriter()
	stopWatch()
	<-watched
	ns.noteExits()

	// Checks. With a replica not live, its partition cannot be read
	// back; the partitions whose replicas are all live still are, and
	// the digests of every partition that answers must not differ.
	var rep clusterview.DigestReport
	if r.sum.AllLive {
		rep, err = r.checkDigests(ctx, c)
	} else {
		rep, err = clusterview.CheckDigests(ctx, r.cli, c)
	}
	if err != nil {
		return err
	}
	r.sum.ReplicasChecked, r.sum.DigestsMatch, r.sum.Digests = rep.ReplicasChecked, rep.OK(), rep.Partitions
	r.eventf("digests: %d replicas checked, match=%v", rep.ReplicasChecked, rep.OK())
	for _, p := range rep.Partitions {
		r.sum.DigestsDiffer = r.sum.DigestsDiffer || p.Differ
		if p.Differ || (r.sum.AllLive && !p.Match) {
			r.fail("digests differ: partition %d: %s", p.Partition, p.Problem)
		}
	}
	acked := *report
	if !r.sum.AllLive {
		live, err := r.livePartitions(ctx)
		if err != nil {
			return err
		}
		acked.Acked, acked.Maybe = map[string][]byte{}, map[string][][]byte{}
		for k, v := range report.Acked {
			if live[c.Partition(wire.Bytes([]byte(k)))] {
				acked.Acked[k], acked.Maybe[k] = v, report.Maybe[k]
			}
		}
		r.eventf("reading back the acknowledged writes of the partitions whose replicas are all live only: %d of %d keys", len(acked.Acked), len(report.Acked))
	}
	vr, err := load.Verify(ctx, c, volumeTable, acked)
	if err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	r.sum.AckedWritesChecked, r.sum.AckedWritesLost, r.sum.LostExamples = vr.Checked, vr.Lost, vr.Examples
	r.eventf("acknowledged writes read back: %d, lost: %d", vr.Checked, vr.Lost)
	if vr.Lost > 0 {
		r.fail("%d acknowledged writes lost, e.g. %s", vr.Lost, vr.Examples[0])
	}
	r.sum.Writes, r.sum.WriteErrors, r.sum.WritesUncertain = report.Txns, report.Errors, report.Uncertain

	r.sum.RegisterOps = len(ops)
	for _, o := range ops {
		switch o.Outcome {
		case OK:
			r.sum.RegisterOK++
		case Failed:
			r.sum.RegisterFailed++
		case Uncertain:
			r.sum.RegisterUncertain++
		}
	}
	results, err := checkRegisters(ops, cfg.Registers, r.dir)
	if err != nil {
		return err
	}
	for i := range results {
		kr := results[i]
		switch kr.Result {
		case "Ok":
			r.sum.Linearizable++
		case "Unknown":
			r.sum.Unknown = append(r.sum.Unknown, kr.Key)
		default:
			if r.sum.FailingKey == nil {
				fk := kr
				r.sum.FailingKey = &fk
			}
			r.fail("register %s is not linearizable (%d ops); see %s", kr.Key, kr.Ops, kr.Visualization)
		}
		kr.History = nil
		r.sum.Registers = append(r.sum.Registers, kr)
	}
	r.eventf("registers: %d ops (%d ok, %d failed, %d uncertain); %d of %d linearizable, %d undecided",
		r.sum.RegisterOps, r.sum.RegisterOK, r.sum.RegisterFailed, r.sum.RegisterUncertain, r.sum.Linearizable, cfg.Registers, len(r.sum.Unknown))
	return nil
}

// startAll starts every node at once and waits until all are registered.
func (r *run) startAll(ctx context.Context) error {
	errs := make(chan error, r.cfg.Nodes)
	for id := 1; id <= r.cfg.Nodes; id++ {
		go func() {
			ready, pid, err := r.nodes.Start(ctx, id)
			if err == nil {
				r.eventf("started n%d (pid %d): tcp %s, http %s", id, pid, ready.TCP, ready.HTTP)
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
	return demo.Poll(ctx, 60*time.Second, "every node registered", func() (bool, error) {
		nodes, err := supervise.Nodes(ctx, r.cli)
		return len(nodes) == r.cfg.Nodes, err
	})
}

// allLive reports whether every replica of every partition is live, in
// etcd and as its node reports it, with every node up.
func (r *run) allLive(v clusterview.View) bool {
	if len(v.Nodes) != r.cfg.Nodes || len(v.Replicas) != int(r.cfg.Partitions)*r.cfg.Replicas {
		return false
	}
	for _, rp := range v.Replicas {
		if rp.Placement != string(supervise.ReplicaLive) || !rp.Alive || !rp.Reported || rp.State != node.StateLive {
			return false
		}
	}
	return true
}

// livePartitions are the partitions whose replicas are all live.
func (r *run) livePartitions(ctx context.Context) (map[uint32]bool, error) {
	v, err := clusterview.Read(ctx, r.cli, r.hc, time.Second)
	if err != nil {
		return nil, err
	}
	live := map[uint32]bool{}
	for p := range r.cfg.Partitions {
		live[p] = true
	}
	for _, rp := range v.Replicas {
		if rp.Placement != string(supervise.ReplicaLive) || !rp.Alive || !rp.Reported || rp.State != node.StateLive {
			live[rp.Partition] = false
		}
	}
	return live, nil
}

// notLive describes the replicas that are not live, for the verdict.
func (r *run) notLive(ctx context.Context) string {
	v, err := clusterview.Read(ctx, r.cli, r.hc, time.Second)
	if err != nil {
		return "cannot read the cluster: " + err.Error()
	}
	var out []string
	if len(v.Nodes) != r.cfg.Nodes {
		out = append(out, fmt.Sprintf("%d of %d nodes registered", len(v.Nodes), r.cfg.Nodes))
	}
	lost := map[uint32]int{}
	for _, rp := range v.Replicas {
		if rp.Placement == string(supervise.ReplicaLive) && rp.Alive && rp.Reported && rp.State == node.StateLive {
			lost[rp.Partition] += 0
			continue
		}
		lost[rp.Partition]++
		out = append(out, fmt.Sprintf("partition %d on %s: placement %s, node state %q", rp.Partition, rp.Node, rp.Placement, rp.State))
	}
	for p := range r.cfg.Partitions {
		if n, ok := lost[p]; ok && n == r.cfg.Replicas {
			out = append(out, fmt.Sprintf("partition %d has no live replica left", p))
		}
	}
	return strings.Join(out, "; ")
}

// digestRetryWithin bounds the retries of partitions that answered short:
// a replica just back live may be left out of a call by an initiator
// that has not seen it live yet. Digests that differ are not retried.
const digestRetryWithin = 30 * time.Second

func (r *run) checkDigests(ctx context.Context, c *client.Client) (clusterview.DigestReport, error) {
	deadline := time.Now().Add(digestRetryWithin)
	for {
		rep, err := clusterview.CheckDigests(ctx, r.cli, c)
		if err != nil || rep.OK() || rep.Differ() || time.Now().After(deadline) {
			return rep, err
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return rep, ctx.Err()
		}
	}
}

// print writes the summary: one JSON object, or text.
func (r *run) print(out io.Writer, s Summary) error {
	if r.cfg.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	w := &errWriter{w: out}
	w.printf("\nrejoin chaos summary (seed %d, %s, %d nodes, %d partitions x %d replicas)\n", s.Seed, s.Duration, s.Nodes, s.Partitions, s.Replicas)
	w.printf("  faults:    %d done, %d skipped of %d scheduled\n", s.FaultsDone, s.FaultsSkipped, len(s.Schedule))
	w.printf("  registers: %d ops (%d ok, %d failed, %d uncertain); %d linearizable, %d undecided %v\n",
		s.RegisterOps, s.RegisterOK, s.RegisterFailed, s.RegisterUncertain, s.Linearizable, len(s.Unknown), s.Unknown)
	w.printf("  writer:    %d writes acknowledged, %d failed, %d uncertain; read back %d keys, %d lost\n",
		s.Writes, s.WriteErrors, s.WritesUncertain, s.AckedWritesChecked, s.AckedWritesLost)
	if s.AllLive {
		w.printf("  replicas:  all live %.1f s after the heal; digests of %d replicas match %v\n", s.LiveSeconds, s.ReplicasChecked, s.DigestsMatch)
	} else {
		w.printf("  replicas:  NOT all live; digests of the %d replicas that answered differ %v\n", s.ReplicasChecked, s.DigestsDiffer)
	}
	w.printf("  exits:     %d on their own %v\n", len(s.SelfExits), s.SelfExits)
	if k := s.FailingKey; k != nil {
		lo, hi := 0, min(len(k.History), historyLinesMax)
		if k.Suspect >= 0 {
			lo = max(0, k.Suspect-historyLinesMax/2)
			hi = min(len(k.History), lo+historyLinesMax)
		}
		w.printf("\nfailing key %s (%d ops), history by call time, ops %d to %d of %d (--json has them all):\n", k.Key, k.Ops, lo, hi-1, len(k.History))
		for i := lo; i < hi; i++ {
			mark := "   "
			if i == k.Suspect {
				mark = "-> "
			}
			w.printf(" %s%s\n", mark, k.History[i])
		}
		w.printf("  visualization: %s\n", k.Visualization)
	}
	w.printf("\nverdict: %s\n", s.Verdict)
	for _, why := range s.Reasons {
		w.printf("  - %s\n", why)
	}
	if s.Verdict != "PASS" {
		plant := ""
		if s.Planted {
			plant = " --plant"
		}
		w.printf("run dir (logs, data): %s\nreplay: rejoin chaos --seed %d --duration %s --faults %s --nodes %d --partitions %d --replicas %d --rows %d%s\n",
			s.Dir, s.Seed, s.Duration, actionList(s.Faults), s.Nodes, s.Partitions, s.Replicas, s.Rows, plant)
	}
	return w.err
}

// historyLinesMax bounds the failing key's ops the text summary shows,
// around its first suspect read.
const historyLinesMax = 40

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

// actionList is the --faults value of actions.
func actionList(as []Action) string {
	if len(as) == 0 {
		return "none"
	}
	ss := make([]string, len(as))
	for i, a := range as {
		ss[i] = string(a)
	}
	return strings.Join(ss, ",")
}
