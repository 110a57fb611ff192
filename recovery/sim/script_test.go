package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"go.uber.org/goleak"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/wire"
)

// TestScenarios runs the scripts in testdata/scenarios: the simulator's
// world driven one step at a time, with nothing happening on its own (no
// workload, no supervisor, no faults, no random delays). Rewrite the
// golden output with -rewrite.
func TestScenarios(t *testing.T) {
	defer goleak.VerifyNone(t)
	datadriven.Walk(t, filepath.Join("testdata", "scenarios"), func(t *testing.T, path string) {
		s := &script{}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return s.run(t, d)
		})
	})
}

// script is the state of one scenario file: the world its last setup
// built.
type script struct {
	w *world
}

// scriptCommands maps each command to its handler. A handler acts on the
// world; what it traced is the command's output, with its own lines
// after.
var scriptCommands = map[string]func(s *script, t *testing.T, d *datadriven.TestData) string{
	"setup":             (*script).setup,
	"start":             (*script).start,
	"retry":             (*script).start,
	"write":             (*script).write,
	"heartbeat":         (*script).heartbeat,
	"step-source":       (*script).stepSource,
	"deliver":           (*script).deliver,
	"tick":              (*script).tick,
	"run":               (*script).runUntil,
	"cut":               (*script).cut,
	"abort":             (*script).abort,
	"restart-dest":      (*script).restartDest,
	"pause":             (*script).pause,
	"outage":            (*script).outage,
	"supervise":         (*script).supervise,
	"health":            (*script).health,
	"poll":              (*script).poll,
	"lose":              (*script).lose,
	"kill-source":       (*script).killSource,
	"cut-off":           (*script).cutOff,
	"state":             (*script).state,
	"open-feed":         (*script).openFeed,
	"check":             (*script).check,
	"lose-registration": (*script).loseRegistration,
	"sources":           (*script).sources,
	"held":              (*script).held,
	"end":               (*script).end,
	"break-feed":        (*script).breakFeed,
	"redial":            (*script).redial,
	"silence":           (*script).silence,
	"fence":             (*script).fence,
}

func (s *script) run(t *testing.T, d *datadriven.TestData) (out string) {
	h, ok := scriptCommands[d.Cmd]
	if !ok {
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	if d.Cmd != "setup" && s.w == nil {
		d.Fatalf(t, "%s before setup", d.Cmd)
	}
	from := 0
	if s.w != nil {
		from = len(s.w.tr.lines)
	}
	var own string
	func() {
		defer func() {
			if r := recover(); r != nil {
				v, ok := r.(*Violation)
				if !ok {
					panic(r)
				}
				own = "VIOLATION " + v.Error() + "\n"
			}
		}()
		own = h(s, t, d)
	}()
	var b strings.Builder
	if d.Cmd != "setup" {
		for _, l := range s.w.tr.lines[from:] {
			if keepLine(d, l) {
				b.WriteString(strings.TrimLeft(l[7:], " "))
				b.WriteByte('\n')
			}
		}
	}
	b.WriteString(own)
	if b.Len() == 0 {
		return "ok\n"
	}
	return b.String()
}

// keepLine leaves acks out of a run's output: they are many and say
// little; a late one, delivered to a newer attempt, stays. A brief run
// (run ... brief) leaves out the blocks and their acks too.
func keepLine(d *datadriven.TestData, l string) bool {
	if d.Cmd != "run" {
		return true
	}
	line := strings.TrimLeft(l[7:], " ")
	if strings.HasPrefix(line, "late ") {
		return true
	}
	if d.HasArg("brief") && (strings.Contains(line, " > block e") || strings.Contains(line, " < block e")) {
		return false
	}
	return !strings.Contains(l, " ack e")
}

// scriptKnobs are a script's defaults: one table of 10 rows, one
// initiator, no clock skew, feed delivered at once, connection delivered
// only when the script says, blocks as large as they come, a window of
// one, a log that never fills, processors that do not heartbeat or stall
// within a script's few ticks.
func scriptKnobs() Knobs {
	return Knobs{
		Tables: 1, Sources: 1, Rows: 10, Initiators: 1, HeartbeatTicks: 1,
		ConnDelayMax: 1, GhostDelayMax: 1, StepsMax: 1000, Codec: wire.CodecNone,
		BlockBytesMax: 1 << 20, WindowBlocksMax: 1,
		ChangeLogBytesMax: 1 << 20, ChangeLogTxnBytesMax: txnLogBytesMax, PaceTxnsPerTick: 1, ThrottleWindowTicks: 1,
		RoundsMax: 4, StallTicksMax: 100, ProcHeartbeatTicks: 50, TicksMax: 1 << 30,
		FeedAckPct: 100,
	}
}

func (s *script) setup(t *testing.T, d *datadriven.TestData) string {
	k := scriptKnobs()
	ints := map[string]*int{
		"rows": &k.Rows, "tables": &k.Tables, "sources": &k.Sources, "initiators": &k.Initiators, "block-bytes": &k.BlockBytesMax,
		"window": &k.WindowBlocksMax, "log-bytes": &k.ChangeLogBytesMax, "pace-low": &k.PaceLowWaterBytes,
		"pace": &k.PaceTxnsPerTick, "handoff-bytes": &k.HandoffLogBytesMax, "rounds": &k.RoundsMax,
		"stall": &k.StallTicksMax, "heartbeat": &k.ProcHeartbeatTicks,
		"claim-ttl": &k.ClaimTTLTicks, "keepalive": &k.KeepaliveTicks, "claim-window": &k.ClaimWindowTicks,
		"stale": &k.StaleTicks, "claim-within": &k.ClaimWithinTicks, "feed-log-bytes": &k.FeedLogBytesMax,
	}
	late := 0
	auto, joiner := false, false
	for _, a := range d.CmdArgs {
		switch a.Key {
		case "joiner":
			joiner = true
		case "late":
			a.Scan(t, 0, &late)
		case "lease-guard":
			k.LeaseGuard = true
		case "joins":
			k.Joins = true
		case "supervisor":
			auto = true
		case "block-rows":
			var n int
			a.Scan(t, 0, &n)
			if n != 1 {
				d.Fatalf(t, "block-rows: only 1 is supported")
			}
			k.BlockBytesMax = 1 // at least one tuple each: one row per block
		case "codec":
			var c string
			a.Scan(t, 0, &c)
			k.Codec = map[string]wire.Codec{"none": wire.CodecNone, "s2": wire.CodecS2, "zstd": wire.CodecZstd}[c]
		default:
			p, ok := ints[a.Key]
			if !ok {
				d.Fatalf(t, "setup: unknown argument %q", a.Key)
			}
			a.Scan(t, 0, p)
		}
	}
	if !d.HasArg("pace-low") {
		// No pacing unless the script asks: the log's hold mark alone.
		k.PaceLowWaterBytes = k.ChangeLogBytesMax - k.ChangeLogTxnBytesMax
	}
	if k.ClaimTTLTicks > 0 {
		// Claims on: the executor keeps its lease alive and checks it every
		// quarter TTL unless the script says otherwise.
		if !d.HasArg("keepalive") {
			k.KeepaliveTicks = max(1, k.ClaimTTLTicks/4)
		}
		if !d.HasArg("claim-window") {
			k.ClaimWindowTicks = max(1, k.ClaimTTLTicks/4)
		}
		if !d.HasArg("stale") {
			k.StaleTicks = k.StallTicksMax + 2*k.ClaimWindowTicks
		}
		if !d.HasArg("claim-within") {
			k.ClaimWithinTicks = 50
		}
	}
	if late < 0 || late > k.Initiators {
		d.Fatalf(t, "setup: late=%d, want 1..%d", late, k.Initiators)
	}
	if auto && k.ClaimTTLTicks == 0 {
		d.Fatalf(t, "supervisor needs claims: setup claim-ttl=N")
	}
	w := &world{reg: newRegistry(), scripted: true, auto: auto, k: k, claims: k.ClaimTTLTicks > 0, late: late}
	if joiner {
		// A new initiator process, last of the initiators, that registers
		// only while a source node is away (lose-registration).
		w.regPlan = regLossPlan{on: true, joiner: true, at: math.MaxUint64}
	}
	w.tr.on = true
	w.work = rand.New(rand.NewPCG(1, 1))
	w.net = rand.New(rand.NewPCG(2, 2))
	w.faultRng = rand.New(rand.NewPCG(3, 3))
	w.setup()
	w.tr.lines = nil
	s.w = w
	var b strings.Builder
	for _, tbl := range w.srcExec.Partition().Tables() {
		var keys []string
		for sl := partition.Slot(0); sl < tbl.SlotsLen(); sl++ {
			keys = append(keys, s.slotKey(tbl, sl))
		}
		fmt.Fprintf(&b, "source %s: %d rows, slot i holds %s\n", tbl.Schema().Name, tbl.Len(), strings.Join(keys, " "))
	}
	if late > 0 {
		fmt.Fprintf(&b, "initiator %d is late: no feed to the source or the destination node yet\n", late)
	}
	fmt.Fprintf(&b, "initiators: %d; block %d B, window %d, change log %d B (reserve %d B), handoff at <= %d B, rounds <= %d, codec %s\n",
		k.Initiators, k.BlockBytesMax, k.WindowBlocksMax, k.ChangeLogBytesMax, k.ChangeLogTxnBytesMax, k.HandoffLogBytesMax, k.RoundsMax, k.Codec)
	return b.String()
}

// slotKey names the key in a slot, or "-" for a free one.
func (s *script) slotKey(tbl *partition.Table, sl partition.Slot) string {
	if !tbl.Live(sl) {
		return "-"
	}
	row, err := tbl.Row(sl, nil)
	if err != nil {
		panic(err)
	}
	key := make([]wire.Value, len(tbl.Schema().Key))
	for i, c := range tbl.Schema().Key {
		key[i] = row[c]
	}
	return keyName(key)
}

// start starts an attempt (the first, or a retry with the next epoch).
// With claims the source node takes it as an assignment: it claims the
// task, starts it, and says hello to the destination. Without, the
// destination side starts now and the source side source-delay ticks
// later, at the next tick or run.
func (s *script) start(t *testing.T, d *datadriven.TestData) string {
	delay := 0
	d.MaybeScanArgs(t, "source-delay", &delay)
	if s.w.claims {
		s.w.takeAssignment(s.w.srcs[0])
		return ""
	}
	s.w.startAttempt(s.w.srcs[0], nil, uint64(delay))
	return ""
}

func (s *script) initiator(t *testing.T, d *datadriven.TestData) *initiator {
	n := 1
	d.MaybeScanArgs(t, "initiator", &n)
	if n < 1 || n > len(s.w.inits) {
		d.Fatalf(t, "no initiator %d", n)
	}
	return s.w.inits[n-1]
}

// write sends a txn from an initiator to every replica: write op=upsert
// key=3 [table=kv|acct] [to=5] [by=2] [initiator=1] [unaware] [held]
// (held: it stays in flight on the links until the feed is next
// delivered, or lost if its feed breaks first). The
// initiator keeps recovery/node's rule (recovery.Unfed): it sends the txn
// only with a feed open to the source node and to the destination node,
// which holds a replica whatever its state, unless it is unaware of the
// destination node (a stale membership view): then it sends to the
// source alone.
func (s *script) write(t *testing.T, d *datadriven.TestData) string {
	var opName string
	d.ScanArgs(t, "op", &opName)
	o, ok := parseOp(opName)
	if !ok {
		d.Fatalf(t, "unknown op %q", opName)
	}
	sp := txnSpec{op: o, amount: 1}
	d.ScanArgs(t, "key", &sp.key)
	d.MaybeScanArgs(t, "to", &sp.to)
	d.MaybeScanArgs(t, "by", &sp.amount)
	if d.HasArg("table") {
		var name string
		d.ScanArgs(t, "table", &name)
		sp.table = slices.IndexFunc(s.w.schemas, func(sc partition.Schema) bool { return sc.Name == name })
		if sp.table < 0 {
			d.Fatalf(t, "no table %q", name)
		}
	}
	in := s.initiator(t, d)
	if in.silent {
		d.Fatalf(t, "i%d is silent: it sends nothing", in.id)
	}
	v := s.w.view
	if d.HasArg("unaware") {
		v = unawareView(v)
	}
	var unfed *recovery.UnfedError
	if err := s.w.sendTxn(in, sp, v); errors.As(err, &unfed) {
		var names []string
		for _, n := range unfed.Nodes {
			name := "source"
			switch n {
			case dstNode:
				name = "destination"
			case oracleNode:
				name = "oracle"
			}
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
		if unfed.Joining {
			// Its joins went out with the refusal: their answers come
			// back as the feed is delivered.
			s.deliverFeed()
			return fmt.Sprintf("i%d sends nothing: its join is not answered yet by %s\n", in.id, strings.Join(unfed.Nodes, ", "))
		}
		return fmt.Sprintf("i%d sends nothing: no feed to the %s node\n", in.id, strings.Join(names, " and "))
	} else if errors.Is(err, recovery.ErrNoLiveReplica) || errors.Is(err, recovery.ErrFeedLogFull) {
		return fmt.Sprintf("i%d sends nothing: %v\n", in.id, err)
	} else if err != nil {
		d.Fatalf(t, "write: %v", err)
	}
	if !d.HasArg("held") {
		s.deliverFeed()
	}
	return ""
}

// heartbeat: every initiator (or one) sends a heartbeat.
func (s *script) heartbeat(t *testing.T, d *datadriven.TestData) string {
	ins := s.w.inits
	if d.HasArg("initiator") {
		ins = []*initiator{s.initiator(t, d)}
	}
	var b strings.Builder
	for _, in := range ins {
		s.w.sendHeartbeat(in)
		fmt.Fprintf(&b, "i%d heartbeat %v\n", in.id, in.core.Last())
	}
	s.w.tracef("%s", strings.TrimSuffix(b.String(), "\n"))
	s.deliverFeed()
	return ""
}

// deliverFeed delivers the initiators' links at once: a script's feed
// has no delay.
func (s *script) deliverFeed() {
	w := s.w
	for _, in := range w.inits {
		for _, l := range in.toSrc {
			for len(l.q) > 0 {
				l.deliver(w)
			}
		}
	}
	for _, a := range w.atts {
		for _, l := range a.feed {
			for len(l.q) > 0 {
				l.deliver(w)
			}
		}
	}
	// The answers (acks, and with joins the joins') come back at once.
	for _, in := range w.inits {
		for _, l := range in.toSrc {
			l.takeAcks(w)
		}
	}
	w.answerJoins()
}

// openFeed opens a late initiator's feed to one node: open-feed
// initiator=N to=source|dest. The node's replicas track it from now on,
// as recovery/node's addInitiator does (a destination through
// Destination.AddInitiator); its first message follows.
func (s *script) openFeed(t *testing.T, d *datadriven.TestData) string {
	in := s.initiator(t, d)
	var to string
	d.ScanArgs(t, "to", &to)
	w := s.w
	var nodes []string
	switch to {
	case "source":
		for _, sr := range w.srcs {
			nodes = append(nodes, sr.id)
		}
	case "dest":
		nodes = []string{dstNode}
	default:
		d.Fatalf(t, "open-feed to=%s: want source or dest", to)
	}
	if !in.late || in.core.Fed(nodes[0]) {
		d.Fatalf(t, "i%d's feed to the %s is open already", in.id, to)
	}
	for _, n := range nodes {
		in.opened[n] = true
	}
	w.dial(in)
	w.tracef("i%d feed to the %s opens", in.id, map[string]string{"source": "source", "dest": "destination"}[to])
	return ""
}

// feedTo names the source node and initiator of a break-feed or redial:
// node=src2 (the first source by default) [initiator=N].
func (s *script) feedTo(t *testing.T, d *datadriven.TestData) (*initiator, *srcReplica) {
	in := s.initiator(t, d)
	node := s.w.srcs[0].id
	d.MaybeScanArgs(t, "node", &node)
	sr := s.w.srcNamed(node)
	if sr == nil {
		d.Fatalf(t, "no source node %q", node)
	}
	return in, sr
}

// breakFeed breaks an initiator's open feed to a source node (feedbreak.go):
// break-feed [node=src2] [initiator=N] [out=N]. What is in flight on it
// is lost; the node is out of reach for out ticks, or until redial.
func (s *script) breakFeed(t *testing.T, d *datadriven.TestData) string {
	in, sr := s.feedTo(t, d)
	if !in.core.Fed(sr.id) {
		d.Fatalf(t, "i%d's feed to %s is not open", in.id, sr.id)
	}
	out := uint64(untilRedial)
	if d.HasArg("out") {
		var n int
		d.ScanArgs(t, "out", &n)
		out = uint64(n)
	}
	s.w.breakFeed(in, sr, out)
	return ""
}

// redial brings a source node whose feed broke back in reach of an
// initiator, which dials it again now: redial [node=src2] [initiator=N].
// The node resumes the feed or refuses it (takeUp); a resend is
// delivered at once, as a script's feed is.
func (s *script) redial(t *testing.T, d *datadriven.TestData) string {
	in, sr := s.feedTo(t, d)
	if !sr.broke[in.idx] {
		d.Fatalf(t, "i%d's feed to %s is not broken", in.id, sr.id)
	}
	w := s.w
	sr.redialAt[in.idx] = w.tick
	w.dial(in)
	s.deliverFeed()
	if sr.broke[in.idx] {
		return fmt.Sprintf("i%d's redial of %s failed\n", in.id, sr.id)
	}
	return ""
}

// stepSource runs up to n ready txns on the source (all by default) and
// says whether its gate holds the next.
func (s *script) stepSource(t *testing.T, d *datadriven.TestData) string {
	n := 1 << 30
	d.MaybeScanArgs(t, "n", &n)
	w := s.w
	ran := w.stepSource(n)
	out := fmt.Sprintf("source ran %d txns, last %v\n", ran, w.srcExec.LastExecuted())
	if id, ok := w.srcExec.Ready(); ok && ran < n {
		state := "no attempt"
		if a := w.srcAttempt(); a != nil {
			state = a.src.State().String()
		}
		out += fmt.Sprintf("source gate holds %v (source %s)\n", id, state)
	}
	return out
}

// deliver delivers up to n packets in flight (all, and the answers they
// cause, by default) to=dest, to=source, or both, alternating; the
// script's deliveries ignore delays.
func (s *script) deliver(t *testing.T, d *datadriven.TestData) string {
	n := 1 << 30
	d.MaybeScanArgs(t, "n", &n)
	to := "both"
	d.MaybeScanArgs(t, "to", &to)
	if to != "both" && to != "dest" && to != "source" {
		d.Fatalf(t, "deliver to=%s: want dest, source or both", to)
	}
	w := s.w
	next := func(toSrc bool) *pipe {
		for _, a := range w.atts {
			p := a.s2d
			if toSrc {
				p = a.d2s
			}
			if len(p.q) > 0 && p.up() && !w.pausedNow(a) {
				return p
			}
		}
		if g := map[bool]*pipe{true: w.ghostSrc, false: w.ghostDst}[toSrc]; len(g.q) > 0 && (!toSrc || !w.ghostSrcHeld()) {
			return g
		}
		return nil
	}
	done := 0
	for toSrc := to == "source"; done < n; {
		p := next(toSrc)
		if p == nil && to == "both" {
			toSrc = !toSrc
			p = next(toSrc)
		}
		if p == nil {
			break
		}
		p.deliver(w)
		done++
		if to == "both" {
			toSrc = !toSrc
		}
	}
	if done == 0 {
		for _, a := range w.atts {
			if w.pausedNow(a) && len(a.s2d.q)+len(a.d2s.q) > 0 {
				return fmt.Sprintf("held: %d packets of attempt %d, whose holder is paused\n", len(a.s2d.q)+len(a.d2s.q), a.epoch)
			}
		}
		return "nothing in flight\n"
	}
	return ""
}

// tick advances the clock n ticks: cuts are learnt, processors tick
// (heartbeats, stall windows, the throttle). Nothing is delivered or run.
func (s *script) tick(t *testing.T, d *datadriven.TestData) string {
	n := 1
	d.MaybeScanArgs(t, "n", &n)
	w := s.w
	for range n {
		w.tick++
		w.stepCoordinator()
		if w.auto {
			w.supervise()
			w.stepSourceNodes()
		}
		w.startDueSources()
		w.stepHolders()
		w.learnCuts()
		w.tickProcessors()
	}
	return ""
}

// runUntil runs the world tick by tick (initiators heartbeat every tick,
// everything due is delivered, executors run) until=live, aborted, or
// src:<state> / dst:<state>, for at most max ticks.
func (s *script) runUntil(t *testing.T, d *datadriven.TestData) string {
	until := "live"
	limit := 5000
	d.MaybeScanArgs(t, "until", &until)
	d.MaybeScanArgs(t, "max", &limit)
	w := s.w
	reached := func() bool {
		a := w.cur()
		if a == nil && until != "settled" && until != "joined" && until != "broken" {
			return false
		}
		switch {
		case until == "live":
			return a.dstUp() && a.dst.State() == recovery.StateLive
		case until == "aborted":
			return a.dstEnded() && (a.src == nil || a.src.State().Final())
		case until == "done":
			return w.coord.task.Status == claim.StatusDone
		case until == "broken":
			return w.stats.FeedsBroken > 0
		case until == "joined":
			return w.joiner != nil && w.joiner.active
		case until == "settled":
			return w.regFired && !slices.ContainsFunc(w.srcs, (*srcReplica).unsettled)
		case strings.HasPrefix(until, "src:"):
			return a.src != nil && a.src.State().String() == until[4:]
		case strings.HasPrefix(until, "dst:"):
			return a.dstUp() && a.dst.State().String() == until[4:]
		}
		d.Fatalf(t, "run until=%s: want live, aborted, done, broken, joined, settled, src:<state> or dst:<state>", until)
		return false
	}
	start := w.tick
	for !reached() {
		if w.tick-start >= uint64(limit) {
			return fmt.Sprintf("not %s after %d ticks: %s\n", until, limit, w.where())
		}
		w.startDueSources()
		w.step()
	}
	return fmt.Sprintf("%s after %d ticks\n", until, w.tick-start)
}

// cut cuts the current attempt's connection: cut [source-learns=N]
// [dest-learns=N] [late] (0: never told; late: messages sent after the
// cut take the late route to a newer attempt).
func (s *script) cut(t *testing.T, d *datadriven.TestData) string {
	src, dst := 1, 1
	d.MaybeScanArgs(t, "source-learns", &src)
	d.MaybeScanArgs(t, "dest-learns", &dst)
	s.w.cut(s.w.cur(), src, dst, d.HasArg("late"))
	return ""
}

// abort aborts one side of the current attempt: abort side=source|dest
// [reason=shutdown|claim-lost|node-failed].
func (s *script) abort(t *testing.T, d *datadriven.TestData) string {
	var side string
	d.ScanArgs(t, "side", &side)
	reason := "shutdown"
	d.MaybeScanArgs(t, "reason", &reason)
	r, ok := map[string]wire.AbortReason{"shutdown": wire.AbortShutdown, "claim-lost": wire.AbortClaimLost, "node-failed": wire.AbortNodeFailed}[reason]
	if !ok {
		d.Fatalf(t, "unknown reason %q", reason)
	}
	a := s.w.cur()
	switch side {
	case "source":
		a.sn.core.AbortSource(a.epoch, r, "script")
	case "dest":
		s.w.dst.AbortDestination(a.epoch, r, "script")
	default:
		d.Fatalf(t, "abort side=%s: want source or dest", side)
	}
	s.w.afterCall(a)
	return ""
}

// restartDest restarts the destination node: restart-dest
// [source-learns=N] [late].
func (s *script) restartDest(t *testing.T, d *datadriven.TestData) string {
	src := 1
	d.MaybeScanArgs(t, "source-learns", &src)
	s.w.restartDestination(s.w.cur(), src, d.HasArg("late"))
	return ""
}

// pause freezes the current attempt's holder (its guard, its source
// processor, its connection both ways): pause ticks=N [check-after=N]
// (its guard's first look after it wakes, 0 by default).
func (s *script) pause(t *testing.T, d *datadriven.TestData) string {
	if !s.w.claims {
		d.Fatalf(t, "pause needs claims: setup claim-ttl=N")
	}
	var n, check int
	d.ScanArgs(t, "ticks", &n)
	d.MaybeScanArgs(t, "check-after", &check)
	s.w.pause(s.w.cur(), uint64(n), uint64(check))
	return ""
}

// outage makes the coordinator answer nothing: outage ticks=N.
func (s *script) outage(t *testing.T, d *datadriven.TestData) string {
	if !s.w.claims {
		d.Fatalf(t, "outage needs claims: setup claim-ttl=N")
	}
	var n int
	d.ScanArgs(t, "ticks", &n)
	s.w.outage(uint64(n))
	return ""
}

// supervise runs one supervision pass now: supervise.Decide on the
// coordinator's model, its actions applied.
func (s *script) supervise(t *testing.T, d *datadriven.TestData) string {
	if !s.w.claims {
		d.Fatalf(t, "supervise needs claims: setup claim-ttl=N")
	}
	if s.w.supervisePass() == 0 {
		return "no action\n"
	}
	return ""
}

// health runs the health task now.
func (s *script) health(t *testing.T, d *datadriven.TestData) string {
	if !s.w.claims {
		d.Fatalf(t, "health needs claims: setup claim-ttl=N")
	}
	s.w.healthRun()
	return ""
}

// poll makes the source node read its assignment now, and take it if it
// is new.
func (s *script) poll(t *testing.T, d *datadriven.TestData) string {
	if !s.w.claims {
		d.Fatalf(t, "poll needs claims: setup claim-ttl=N")
	}
	for _, sr := range s.w.srcs {
		sr.nextPoll = 0
	}
	s.w.stepSourceNodes()
	return ""
}

// lose makes the next message of a type a processor sends be lost on
// the way: lose type=handoff|handoff-ack.
func (s *script) lose(t *testing.T, d *datadriven.TestData) string {
	var name string
	d.ScanArgs(t, "type", &name)
	mt, ok := map[string]wire.MsgType{"handoff": wire.MsgHandoff, "handoff-ack": wire.MsgHandoffAck}[name]
	if !ok {
		d.Fatalf(t, "lose type=%s: want handoff or handoff-ack", name)
	}
	if s.w.lose == nil {
		s.w.lose = map[wire.MsgType]bool{}
	}
	s.w.lose[mt] = true
	return ""
}

// cutOff cuts the current attempt's source node off from the
// coordinator: cut-off ticks=N.
func (s *script) cutOff(t *testing.T, d *datadriven.TestData) string {
	var n int
	d.ScanArgs(t, "ticks", &n)
	a := s.w.cur()
	if a == nil || a.x == nil {
		d.Fatalf(t, "cut-off needs an attempt with claims")
	}
	s.w.cutOff(a.sn.id, uint64(n))
	return ""
}

// killSource makes the current attempt's source node die: kill-source
// [dest-learns=N] (0: the destination is never told; 1 by default).
func (s *script) killSource(t *testing.T, d *datadriven.TestData) string {
	learn := 1
	d.MaybeScanArgs(t, "dest-learns", &learn)
	a := s.w.cur()
	if a == nil || a.x == nil {
		d.Fatalf(t, "kill-source needs an attempt with claims")
	}
	s.w.sourceDies(a, learn)
	return ""
}

// src is the source replica a script shows: the current attempt's, or,
// its node dead or no attempt yet, the first that lives.
func (s *script) src() *partition.Executor {
	if a := s.w.cur(); a != nil && !a.sn.dead {
		return a.sn.exec
	}
	return s.w.liveSources()[0]
}

// state prints where the current attempt and the replicas stand.
func (s *script) state(t *testing.T, d *datadriven.TestData) string {
	w := s.w
	var b strings.Builder
	a := w.cur()
	if a == nil {
		b.WriteString("no attempt\n")
	} else {
		fmt.Fprintf(&b, "attempt %d: source %s, destination %s\n", a.epoch, a.srcStateString(), a.dstStateString())
		if a.src != nil {
			m := a.src.Metrics()
			fmt.Fprintf(&b, "  source: S=%v sent %s; rounds %d; log peak %d B; throttled ticks %d; stale rejected %d\n",
				a.src.Boundary(), counts(m), m.Rounds, m.LogBytesPeak, m.ThrottledTicks, m.StaleRejected)
			if err := a.src.Err(); err != nil {
				fmt.Fprintf(&b, "  source: %v\n", err)
			}
		}
		if a.dstUp() {
			m := a.dst.Metrics()
			fmt.Fprintf(&b, "  destination: P=%v applied %s; dropped %d buffered txns; stale rejected %d\n",
				a.dst.Proposal(), counts(m), m.TxnsDropped, m.StaleRejected)
			if err := a.dst.Err(); err != nil {
				fmt.Fprintf(&b, "  destination: %v\n", err)
			}
		}
		fmt.Fprintf(&b, "  in flight: %d to destination, %d to source, %d late\n", len(a.s2d.q), len(a.d2s.q), len(w.ghostSrc.q)+len(w.ghostDst.q))
	}
	if w.claims {
		fmt.Fprintf(&b, "coordinator: %s\n", &w.coord)
	}
	src := s.src()
	fmt.Fprintf(&b, "source replica: %s, %d queued; slots %s\n", w.describeReplica(src), src.Queued(), s.slots(src))
	if a != nil && a.dstUp() {
		fmt.Fprintf(&b, "destination replica: %s, %d queued; slots %s\n", w.describeReplica(a.exec), a.exec.Queued(), s.slots(a.exec))
	}
	return b.String()
}

func counts(m recovery.Metrics) string {
	return fmt.Sprintf("snapshot %d blocks/%d rows, deletes %d/%d, upserts %d/%d",
		m.Snapshot.Blocks, m.Snapshot.Rows, m.Deletes.Blocks, m.Deletes.Rows, m.Upserts.Blocks, m.Upserts.Rows)
}

// slots lists the keys in the first table's slots.
func (s *script) slots(e *partition.Executor) string {
	tbl := e.Partition().Tables()[0]
	var keys []string
	for sl := partition.Slot(0); sl < tbl.SlotsLen(); sl++ {
		keys = append(keys, s.slotKey(tbl, sl))
	}
	return "[" + strings.Join(keys, " ") + "]"
}

// check brings every replica to the end of what it has received and
// compares them: the live destination with the source at a common txn,
// the source with the oracle; with no live destination, it checks that
// the source is released and an aborted destination replica empty.
func (s *script) check(t *testing.T, d *datadriven.TestData) string {
	w := s.w
	// Every initiator heartbeats so everything queued may run.
	for _, in := range w.inits {
		w.sendHeartbeat(in)
	}
	s.deliverFeed()
	w.stepSource(1 << 30)
	for {
		if _, ok := w.ref.Step(); !ok {
			break
		}
	}
	var b strings.Builder
	a := w.cur()
	if w.live != nil {
		for w.dst.Step(1<<16) > 0 {
		}
		src, dst := s.src(), w.live.exec
		eq := "equal"
		if src.Partition().Digest() != dst.Partition().Digest() || recompute(dst.Partition()) != src.Partition().Digest() {
			eq = "DIFFER"
		}
		fmt.Fprintf(&b, "destination live since E=%v; source at %v, destination at %v: digests %s\n", w.live.e, src.LastExecuted(), dst.LastExecuted(), eq)
	} else if a != nil && a.dstUp() && a.dst.State() == recovery.StateAborted {
		fmt.Fprintf(&b, "destination aborted; its replica holds %v rows, digest zero: %v\n", rowCounts(a.exec.Partition()), a.exec.Partition().Digest() == 0)
	} else {
		b.WriteString("destination not live\n")
	}
	src := s.src()
	eq := "equal"
	if src.Partition().Digest() != w.ref.Partition().Digest() || src.LastExecuted() != w.ref.LastExecuted() {
		eq = "DIFFER"
	}
	fmt.Fprintf(&b, "source and oracle at %v: digests %s\n", src.LastExecuted(), eq)
	if sa := w.srcAttempt(); sa == nil || sa.src.State().Final() || sa.src.HandoffSent() {
		fmt.Fprintf(&b, "source executor: gate %v, stream %v\n", hasGate(src), hasObserver(src.Partition()))
	}
	return b.String()
}

// loseRegistration makes a source node lose its registration while its
// process runs on (registration.go): lose-registration node=src2 out=N
// [break=I [break-at=N]] [join-after=N] [joiner-feed=N] [alone]. It is cut off
// from the coordinator for out ticks; its lease (half the claim's TTL)
// lapses if that is longer; initiator I's feed to it breaks break-at
// ticks into the outage (1 unless said); the
// joiner (setup joiner) registers join-after ticks into a lapse, and its
// feed to the node opens joiner-feed ticks after the node is back. With
// alone, the loss fires as soon as the other source node is dead and its
// record gone, and the destination not live (regLossPlan.alone), which
// the next run may wait for.
func (s *script) loseRegistration(t *testing.T, d *datadriven.TestData) string {
	w := s.w
	var node string
	var out int
	d.ScanArgs(t, "node", &node)
	d.ScanArgs(t, "out", &out)
	i := slices.IndexFunc(w.srcs, func(sr *srcReplica) bool { return sr.id == node })
	if i < 0 || out < 1 {
		d.Fatalf(t, "lose-registration: no source node %q, or out %d < 1", node, out)
	}
	p := &w.regPlan
	p.on, p.node, p.at, p.out = true, i, w.tick, uint64(out)
	p.alone = d.HasArg("alone")
	p.lapse = p.out > w.regTTL()
	p.breaks = make([]uint64, len(w.inits))
	if d.HasArg("break") {
		var in int
		d.ScanArgs(t, "break", &in)
		if in < 1 || in > len(w.inits) || w.inits[in-1].joiner {
			d.Fatalf(t, "lose-registration: no initiator %d to break", in)
		}
		at := 1
		d.MaybeScanArgs(t, "break-at", &at)
		if at < 1 || at > out {
			d.Fatalf(t, "lose-registration: break-at=%d, want 1..%d", at, out)
		}
		p.breaks[in-1] = uint64(at)
	}
	var after, feed int
	d.MaybeScanArgs(t, "join-after", &after)
	d.MaybeScanArgs(t, "joiner-feed", &feed)
	p.joinAfter, p.joinerFeed = uint64(after), uint64(feed)
	w.maybeLoseRegistration()
	if !w.regFired && !p.alone {
		d.Fatalf(t, "lose-registration: the loss cannot fire now")
	}
	return ""
}

// sources says, of each source node, whether it is dead, its replica
// live (and then whether it equals the oracle: both run everything
// queued first), failed, or unsettled.
func (s *script) sources(t *testing.T, d *datadriven.TestData) string {
	w := s.w
	for _, in := range w.inits {
		if !in.joiner || in.active {
			w.sendHeartbeat(in)
		}
	}
	s.deliverFeed()
	w.stepSource(1 << 30)
	for {
		if _, ok := w.ref.Step(); !ok {
			break
		}
	}
	var b strings.Builder
	for _, sr := range w.srcs {
		switch {
		case sr.dead:
			fmt.Fprintf(&b, "%s: node dead\n", sr.id)
		case sr.failed:
			fmt.Fprintf(&b, "%s: replica failed\n", sr.id)
		case sr.held:
			fmt.Fprintf(&b, "%s: replica held at %v since tick %d; digest and rows as then: %v\n", sr.id, sr.exec.LastExecuted(), sr.hold.tick,
				sr.exec.Partition().Digest() == sr.hold.digest && slices.Equal(rowCounts(sr.exec.Partition()), sr.hold.rows))
		case sr.unsettled():
			fmt.Fprintf(&b, "%s: not settled\n", sr.id)
		default:
			eq := "equal"
			if sr.exec.Partition().Digest() != w.ref.Partition().Digest() || sr.exec.LastExecuted() != w.ref.LastExecuted() {
				eq = "DIFFER"
			}
			fmt.Fprintf(&b, "%s: live at %v; digest and oracle's %s\n", sr.id, sr.exec.LastExecuted(), eq)
		}
	}
	return b.String()
}

// held says, of each held source replica, what it lacks of the txns
// the other replicas ran (the oracle's count, Stats.HeldLacking), after
// invariant (f)'s check that it ran and took nothing since its hold.
func (s *script) held(t *testing.T, d *datadriven.TestData) string {
	w := s.w
	w.checkHolds("held")
	var b strings.Builder
	for _, sr := range w.srcs {
		if sr.held {
			fmt.Fprintf(&b, "%s: held at %v since tick %d, unchanged; lacks %d txns another replica ran\n", sr.id, sr.hold.last, sr.hold.tick, w.lacking(sr))
		}
	}
	if b.Len() == 0 {
		return "no replica held\n"
	}
	return b.String()
}

// end ends the run as a seed's ends (maybeFinish): with the destination
// live, or the partition held and no replica live (stranded), the
// workload stops, and once every replica ran the feed and every attempt
// ended, the final checks run: end [max=N] ticks at most.
func (s *script) end(t *testing.T, d *datadriven.TestData) string {
	w := s.w
	if w.live == nil && !w.stranded() {
		return fmt.Sprintf("the run would not end: no destination live, and the partition not held (%s)\n", w.where())
	}
	limit := 5000
	d.MaybeScanArgs(t, "max", &limit)
	if !w.quiescing {
		w.quiescing, w.quietTick = true, w.tick
	}
	start := w.tick
	for !w.done {
		if w.tick-start >= uint64(limit) {
			return fmt.Sprintf("not ended after %d ticks: %s\n", limit, w.where())
		}
		w.step()
		w.maybeFinish()
	}
	return fmt.Sprintf("ended after %d ticks\n", w.tick-start)
}

// silence stops an initiator's process with its feeds open (silent.go):
// silence initiator=N [reach=src,src2]. What it sent to the source nodes
// named in reach arrives; what was on its way to the others is lost.
// Nothing of it leaves from then on.
func (s *script) silence(t *testing.T, d *datadriven.TestData) string {
	in := s.initiator(t, d)
	var reach []string
	if d.HasArg("reach") {
		var arg string
		d.ScanArgs(t, "reach", &arg)
		reach = strings.Split(arg, ",")
		for _, n := range reach {
			if s.w.srcNamed(n) == nil {
				d.Fatalf(t, "no source node %q", n)
			}
		}
	}
	s.w.silence(in, reach, true)
	return ""
}

// fence takes a silent initiator's process for dead (silent.go): fence
// initiator=N. Each live source replica repairs its tail of the
// initiator from its peers and stops waiting for it.
func (s *script) fence(t *testing.T, d *datadriven.TestData) string {
	in := s.initiator(t, d)
	if !in.silent || in.fenced {
		d.Fatalf(t, "i%d: fence a silent initiator, once", in.id)
	}
	s.w.fenceInitiator(in)
	return ""
}
