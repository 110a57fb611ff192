package recovery

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// TestInitiatorScripts runs the scenario scripts of
// testdata/initiator/*.txt against the initiator core: a driver's inputs
// as commands, and what the core asked of the driver (messages sent,
// dials, closes) and answered its callers, printed. The initiator is n9's
// (initiator 9) in a cluster of two partitions; its clock moves by one
// millisecond a command. Commands:
//
//	config [beat=<ticks>] [log=<bytes>] [call-ticks=<n>]   before anything else
//	node <n> [inc=<i>]                   alive in the next view (incarnation 1)
//	down <n>                             out of the next view
//	place p=<P> <n>[=live|=rejoining]... the partition's replicas (live)
//	view                                 SetView with what the commands above built
//	open <n> [floor=<id>]                FeedOpened (floor: 0, or a txn's name)
//	resumed <n> at=<txn>                 FeedResumed
//	lost <n> | dial-failed <n>           FeedLost, DialFailed
//	acked <n> id=<txn>                   FeedAcked
//	call <name> p=<P> [each]             Submit, naming the txn for later
//	done <n> <name> [out=<text>]         OnDone of a named txn
//	tick [n=<count>] | heartbeat | fenced
//	io                                   what was sent, dialled and closed since
//	replies                              the answers since
func TestInitiatorScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/initiator", func(t *testing.T, path string) {
		s := &initiatorScript{io: &scriptIO{fakeIO: newFakeIO()}, now: txnid.EpochUnixMillis + 1_000_000_000,
			view: &InitiatorView{Nodes: map[string]int64{}, Placement: map[uint32][]ReplicaPlace{}, Bootstrapped: true},
			ids:  map[string]txnid.ID{}, names: map[txnid.ID]string{}, cfg: InitiatorConfig{BeatTicks: 1}}
		datadriven.RunTest(t, path, s.run)
	})
}

type initiatorScript struct {
	cfg     InitiatorConfig
	in      *Initiator
	io      *scriptIO
	now     int64
	view    *InitiatorView
	cur     *InitiatorView      // the view set last, which calls are made with
	ids     map[string]txnid.ID // a call's name: its txn
	names   map[txnid.ID]string
	replies []string
}

func (s *initiatorScript) initiator(t *testing.T) *Initiator {
	if s.in == nil {
		s.cfg.Node, s.cfg.ID, s.cfg.Partitions = "n9", 9, 2
		s.cfg.Clock = func() int64 { return s.now }
		in, err := NewInitiator(s.cfg, s.io)
		if err != nil {
			t.Fatal(err)
		}
		s.in = in
	}
	return s.in
}

// bare returns the command's arguments that have no value: node names,
// call names, flags.
func bare(d *datadriven.TestData) []string {
	var out []string
	for _, a := range d.CmdArgs {
		if len(a.Vals) == 0 {
			out = append(out, a.Key)
		}
	}
	return out
}

// txn reads a txn id argument: a call's name, or 0.
func (s *initiatorScript) txn(t *testing.T, d *datadriven.TestData, key string) txnid.ID {
	var name string
	d.ScanArgs(t, key, &name)
	if name == "0" {
		return txnid.Zero
	}
	id, ok := s.ids[name]
	if !ok {
		d.Fatalf(t, "no call %q", name)
	}
	return id
}

func (s *initiatorScript) run(t *testing.T, d *datadriven.TestData) string {
	s.now++
	var out strings.Builder
	switch d.Cmd {
	case "config":
		if s.in != nil {
			d.Fatalf(t, "config after the initiator started")
		}
		if d.HasArg("beat") {
			d.ScanArgs(t, "beat", &s.cfg.BeatTicks)
		}
		if d.HasArg("log") {
			d.ScanArgs(t, "log", &s.cfg.FeedLogBytesMax)
		}
		if d.HasArg("call-ticks") {
			d.ScanArgs(t, "call-ticks", &s.cfg.CallTicks)
		}
		return ""
	case "node":
		inc := int64(1)
		if d.HasArg("inc") {
			d.ScanArgs(t, "inc", &inc)
		}
		s.view.Nodes[bare(d)[0]] = inc
		return ""
	case "down":
		delete(s.view.Nodes, bare(d)[0])
		return ""
	case "place":
		var p uint64
		d.ScanArgs(t, "p", &p)
		var places []ReplicaPlace
		for _, a := range d.CmdArgs {
			if a.Key == "p" {
				continue
			}
			live := len(a.Vals) == 0 || a.Vals[0] == "live"
			if !live && a.Vals[0] != "rejoining" {
				d.Fatalf(t, "replica %s: %q is neither live nor rejoining", a.Key, a.Vals[0])
			}
			places = append(places, ReplicaPlace{Node: a.Key, Live: live})
		}
		s.view.Placement[uint32(p)] = places
		return ""
	}
	in := s.initiator(t)
	switch d.Cmd {
	case "view":
		// The core keeps the view it is given; each view is a copy, as a
		// driver's reads are.
		v := &InitiatorView{Nodes: map[string]int64{}, Placement: map[uint32][]ReplicaPlace{}, Bootstrapped: s.view.Bootstrapped}
		for n, inc := range s.view.Nodes {
			v.Nodes[n] = inc
		}
		for p, rs := range s.view.Placement {
			v.Placement[p] = slices.Clone(rs)
		}
		in.SetView(v)
		s.cur = v
	case "open":
		floor := txnid.Zero
		if d.HasArg("floor") {
			floor = s.txn(t, d, "floor")
		}
		in.FeedOpened(bare(d)[0], floor)
	case "resumed":
		in.FeedResumed(bare(d)[0], s.txn(t, d, "at"))
	case "lost":
		in.FeedLost(bare(d)[0])
	case "dial-failed":
		in.DialFailed(bare(d)[0])
	case "acked":
		in.FeedAcked(bare(d)[0], s.txn(t, d, "id"))
	case "call":
		name := bare(d)[0]
		var p uint64
		d.ScanArgs(t, "p", &p)
		err := in.Submit(s.cur, true, &wire.Call{Req: uint64(len(s.ids) + 1), Partition: uint32(p), Proc: "upsert", Each: d.HasArg("each")},
			func(r *wire.Reply) { s.replies = append(s.replies, s.replyText(r)) })
		if err != nil {
			fmt.Fprintf(&out, "refused: %v\n", err)
			break
		}
		id := in.Last()
		s.ids[name], s.names[id] = id, name
	case "done":
		args := bare(d)
		if len(args) != 2 {
			d.Fatalf(t, "done names a node and a call")
		}
		o := "ok"
		if d.HasArg("out") {
			d.ScanArgs(t, "out", &o)
		}
		id, ok := s.ids[args[1]]
		if !ok {
			d.Fatalf(t, "no call %q", args[1])
		}
		in.OnDone(args[0], &wire.Done{ID: id, Out: []byte(o)})
	case "tick":
		n := 1
		if d.HasArg("n") {
			d.ScanArgs(t, "n", &n)
		}
		for range n {
			in.Tick()
		}
		for _, e := range in.Expired() {
			fmt.Fprintf(&out, "expired %s, waited for %s\n", s.name(e.ID), strings.Join(e.Waited, ", "))
		}
	case "heartbeat":
		in.Heartbeat()
	case "fenced":
		in.Fenced()
	case "io":
		s.printIO(&out)
	case "replies":
		for _, r := range s.replies {
			fmt.Fprintln(&out, r)
		}
		s.replies = nil
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	return out.String()
}

func (s *initiatorScript) name(id txnid.ID) string {
	if n, ok := s.names[id]; ok {
		return n
	}
	if id == txnid.Zero {
		return "0"
	}
	return "another txn"
}

func (s *initiatorScript) replyText(r *wire.Reply) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s:", s.name(r.ID))
	switch {
	case r.Err != "":
		fmt.Fprintf(&b, " error %q", r.Err)
	default:
		fmt.Fprintf(&b, " %q", r.Out)
	}
	if r.Uncertain {
		b.WriteString(" (uncertain)")
	}
	for _, e := range r.Each {
		fmt.Fprintf(&b, " %s=%q", e.Node, e.Out)
	}
	return b.String()
}

func (s *initiatorScript) printIO(out *strings.Builder) {
	nodes := make([]string, 0, len(s.io.sent))
	for n := range s.io.sent {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	for _, n := range nodes {
		var ms []string
		for _, m := range s.io.take(n) {
			switch m := m.(type) {
			case *wire.Txn:
				ms = append(ms, "txn "+s.name(m.ID))
			case *wire.Beat:
				ms = append(ms, "beat")
			case *wire.Join:
				ms = append(ms, fmt.Sprintf("join %d", m.Partition))
			default:
				ms = append(ms, m.Type().String())
			}
		}
		fmt.Fprintf(out, "to %s: %s\n", n, strings.Join(ms, ", "))
	}
	for _, a := range s.io.asks {
		fmt.Fprintf(out, "dial %s inc %d", a.node, a.Inc)
		if len(a.Missed) > 0 {
			fmt.Fprintf(out, ", missed %v", a.Missed)
		}
		if a.Resume {
			fmt.Fprintf(out, ", resume above %s", s.name(a.Kept))
		}
		out.WriteString("\n")
	}
	for _, c := range s.io.closes {
		fmt.Fprintf(out, "close %s\n", c)
	}
	s.io.asks, s.io.closes = nil, nil
}

// scriptIO is fakeIO with each dial's ask kept whole, to print by name.
type scriptIO struct {
	*fakeIO
	asks []struct {
		node string
		DialAsk
	}
}

func (f *scriptIO) Dial(node string, d DialAsk) {
	f.asks = append(f.asks, struct {
		node string
		DialAsk
	}{node, d})
}
