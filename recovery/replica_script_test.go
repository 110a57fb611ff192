package recovery

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// TestReplicaScripts runs the scenario scripts of testdata/replica/*.txt
// against the replica core, as raft's datadriven tests run its RawNode:
// no driver, no clock, every input named and every output printed, so a
// script reads as the rule it holds. Replicas are named; every txn is an
// upsert of the next key by one of the feed's initiators, fed to the
// replicas named. Commands:
//
//	new <name> [live] [fence=<e>]       a replica of the test partition
//	initiator <name>... in=<i> [remove] AddInitiator (RemoveInitiator)
//	txn <name>... [in=<i>] [n=<count>]  the next txns of initiator i (1)
//	heartbeat <name>... [in=<i>]        the initiator's next ID as a heartbeat
//	step <name> [n=<max>]               Step; prints what ran and the results
//	tick <name> [n=<count>]
//	start-source <name> peer=<p> epoch=<e>
//	check-destination <name> peer=<p> epoch=<e>
//	start-destination <name> peer=<p> epoch=<e>
//	resume-source|resume-destination <name> epoch=<e>
//	abort-source|abort-destination <name> epoch=<e> why=<text>
//	fail <name> why=<text>
//	lose <name> why=<text> [others]     Lose; others: another replica live
//	accept-loss <name>
//	stop <name>
//	link <src> <dst> epoch=<e> [rounds=<n>] [feed]
//	                                    carries each side's messages to
//	                                    the other, stepping both, until
//	                                    neither has any (at most n rounds;
//	                                    feed: a txn of initiator 1 to both
//	                                    each round); prints the messages
//	                                    by type and every other output
//	outbox <name>                       prints and clears the outputs
//	state                               every replica, and whether the
//	                                    live ones' digests agree
func TestReplicaScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/replica", func(t *testing.T, path string) {
		s := &replicaScript{t: t, now: txnid.EpochUnixMillis + 5000, reps: map[string]*Replica{}, gens: map[txnid.Initiator]*txnid.Generator{}, held: map[string][]Output{}}
		datadriven.RunTest(t, path, s.run)
	})
}

type replicaScript struct {
	t     *testing.T
	now   int64
	reps  map[string]*Replica
	order []string
	gens  map[txnid.Initiator]*txnid.Generator
	key   int
	// held are the message outputs a command printed, kept for the next
	// link to carry: printing an outbox empties it.
	held map[string][]Output
}

func (s *replicaScript) replica(d *datadriven.TestData, name string) *Replica {
	r, ok := s.reps[name]
	if !ok {
		d.Fatalf(s.t, "no replica %q", name)
	}
	return r
}

// named returns the replicas the command's bare arguments name.
func (s *replicaScript) named(d *datadriven.TestData) []string {
	var names []string
	for _, a := range d.CmdArgs {
		if len(a.Vals) == 0 && a.Key != "live" && a.Key != "remove" && a.Key != "feed" && a.Key != "others" {
			s.replica(d, a.Key)
			names = append(names, a.Key)
		}
	}
	if len(names) == 0 {
		d.Fatalf(s.t, "%s names no replica", d.Cmd)
	}
	return names
}

func (s *replicaScript) arg(d *datadriven.TestData, key string, def uint64) uint64 {
	v := def
	if d.HasArg(key) {
		d.ScanArgs(s.t, key, &v)
	}
	return v
}

func (s *replicaScript) text(d *datadriven.TestData, key string) string {
	var v string
	d.ScanArgs(s.t, key, &v)
	return v
}

func (s *replicaScript) next(in txnid.Initiator) txnid.ID {
	g, ok := s.gens[in]
	if !ok {
		g = testGenerator(s.t, in, &s.now)
		s.gens[in] = g
	}
	s.now++
	return g.Next()
}

func (s *replicaScript) run(t *testing.T, d *datadriven.TestData) string {
	s.t = t
	var out strings.Builder
	switch d.Cmd {
	case "new":
		name := d.CmdArgs[0].Key
		if _, ok := s.reps[name]; ok {
			d.Fatalf(t, "replica %q exists", name)
		}
		r := newTestReplica(t, d.HasArg("live"), s.arg(d, "fence", 0))
		s.reps[name] = r
		s.order = append(s.order, name)
		return r.State().String()
	case "initiator":
		in := txnid.Initiator(s.arg(d, "in", 1))
		for _, name := range s.named(d) {
			if d.HasArg("remove") {
				s.replica(d, name).RemoveInitiator(in)
			} else {
				s.replica(d, name).AddInitiator(in)
			}
		}
		s.outputs(&out)
	case "txn":
		in := txnid.Initiator(s.arg(d, "in", 1))
		for i := range s.arg(d, "n", 1) {
			inv := upsert(t, s.next(in), s.key%50)
			s.key++
			for _, name := range s.named(d) {
				if !s.replica(d, name).OnTxn(inv) {
					fmt.Fprintf(&out, "%s refused txn %d\n", name, i+1)
				}
			}
		}
		s.outputs(&out)
	case "heartbeat":
		id := s.next(txnid.Initiator(s.arg(d, "in", 1)))
		for _, name := range s.named(d) {
			if !s.replica(d, name).OnHeartbeat(id) {
				fmt.Fprintf(&out, "%s refused the heartbeat\n", name)
			}
		}
		s.outputs(&out)
	case "step":
		name := s.named(d)[0]
		r := s.replica(d, name)
		ran := r.Step(int(s.arg(d, "n", 1000)))
		fmt.Fprintf(&out, "ran %d, %d results\n", ran, len(r.Results()))
		s.outputs(&out)
	case "tick":
		r := s.replica(d, s.named(d)[0])
		for range s.arg(d, "n", 1) {
			r.Tick()
		}
		s.outputs(&out)
	case "start-source", "check-destination", "start-destination":
		r := s.replica(d, s.named(d)[0])
		peer, epoch := s.text(d, "peer"), s.arg(d, "epoch", 0)
		var err error
		switch d.Cmd {
		case "start-source":
			err = r.StartSource(peer, sourceConfig(epoch))
		case "start-destination":
			err = r.StartDestination(peer, destConfig(epoch))
		default:
			var resume bool
			if resume, err = r.CheckDestination(peer, epoch); err == nil {
				fmt.Fprintf(&out, "resume %v\n", resume)
			}
		}
		if err != nil {
			fmt.Fprintf(&out, "error: %v\n", err)
		}
		s.outputs(&out)
	case "resume-source", "resume-destination":
		r := s.replica(d, s.named(d)[0])
		resume := r.ResumeSource
		if d.Cmd == "resume-destination" {
			resume = r.ResumeDestination
		}
		if err := resume(s.arg(d, "epoch", 0)); err != nil {
			fmt.Fprintf(&out, "error: %v\n", err)
		}
		s.outputs(&out)
	case "abort-source", "abort-destination":
		r := s.replica(d, s.named(d)[0])
		abort := r.AbortSource
		if d.Cmd == "abort-destination" {
			abort = r.AbortDestination
		}
		abort(s.arg(d, "epoch", 0), wire.AbortShutdown, s.text(d, "why"))
		s.outputs(&out)
	case "fail":
		s.replica(d, s.named(d)[0]).Fail(s.text(d, "why"))
		s.outputs(&out)
	case "lose":
		s.replica(d, s.named(d)[0]).Lose(s.text(d, "why"), d.HasArg("others"))
		s.outputs(&out)
	case "accept-loss":
		if err := s.replica(d, s.named(d)[0]).AcceptLoss(); err != nil {
			fmt.Fprintf(&out, "error: %v\n", err)
		}
		s.outputs(&out)
	case "stop":
		s.replica(d, s.named(d)[0]).Stop("stopping")
		s.outputs(&out)
	case "link":
		s.link(d, &out)
	case "outbox":
		s.outputs(&out)
	case "state":
		s.state(&out)
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	return out.String()
}

// link runs an attempt between two replicas: the source's messages to the
// destination and back, each replica stepped every round.
func (s *replicaScript) link(d *datadriven.TestData, out *strings.Builder) {
	names := s.named(d)
	if len(names) != 2 {
		d.Fatalf(s.t, "link names a source and a destination")
	}
	src, dst := s.replica(d, names[0]), s.replica(d, names[1])
	epoch := s.arg(d, "epoch", 0)
	var types []string
	last, count := "", 0
	flush := func() {
		if count > 1 {
			types = append(types, fmt.Sprintf("%s x%d", last, count))
		} else if count == 1 {
			types = append(types, last)
		}
		last, count = "", 0
		if len(types) > 0 {
			fmt.Fprintf(out, "%s\n", strings.Join(types, ", "))
			types = nil
		}
	}
	note := func(from string, m wire.Message) {
		t := from + " " + m.Type().String()
		if t == last {
			count++
			return
		}
		if count > 1 {
			types = append(types, fmt.Sprintf("%s x%d", last, count))
		} else if count == 1 {
			types = append(types, last)
		}
		last, count = t, 1
	}
	for round := range s.arg(d, "rounds", 200) {
		if d.HasArg("feed") {
			inv := upsert(s.t, s.next(1), s.key%50)
			s.key++
			src.OnTxn(inv)
			dst.OnTxn(inv)
		}
		src.Step(1000)
		src.Results()
		dst.Step(1000)
		dst.Results()
		if round%10 == 9 {
			src.Tick()
			dst.Tick()
		}
		moved := false
		for _, side := range []struct {
			name     string
			from, to *Replica
		}{{names[0], src, dst}, {names[1], dst, src}} {
			outs := append(s.held[side.name], side.from.Outbox()...)
			delete(s.held, side.name)
			for _, o := range outs {
				switch o.Kind {
				case OutSourceMessages, OutDestinationMessages:
					for _, m := range o.Msgs {
						moved = true
						note(side.name, m)
						var err error
						if o.Kind == OutSourceMessages {
							err = side.to.OnDestinationMessage(epoch, m)
						} else {
							err = side.to.OnSourceMessage(epoch, m)
						}
						if err != nil {
							flush()
							fmt.Fprintf(out, "%s refused %v: %v\n", side.name, m.Type(), err)
						}
					}
				default:
					flush()
					fmt.Fprintf(out, "%s: %s\n", side.name, outputText(o))
				}
			}
		}
		if !moved && !d.HasArg("feed") && !src.SourcePending() {
			break
		}
	}
	flush()
}

func (s *replicaScript) outputs(out *strings.Builder) {
	for _, name := range s.order {
		for _, o := range s.reps[name].Outbox() {
			fmt.Fprintf(out, "%s: %s\n", name, outputText(o))
			if o.Kind == OutSourceMessages || o.Kind == OutDestinationMessages {
				s.held[name] = append(s.held[name], o)
			}
		}
	}
}

var outputKindNames = map[OutputKind]string{
	OutSourceMessages:      "source messages",
	OutDestinationMessages: "destination messages",
	OutSourceEnded:         "source ended",
	OutDestinationEnded:    "destination ended",
	OutLive:                "live",
	OutFailed:              "failed",
	OutHeld:                "held",
	OutLossAccepted:        "loss accepted",
}

func outputText(o Output) string {
	var b strings.Builder
	b.WriteString(outputKindNames[o.Kind])
	if o.Epoch != 0 {
		fmt.Fprintf(&b, " e%d", o.Epoch)
	}
	for _, m := range o.Msgs {
		fmt.Fprintf(&b, " %v", m.Type())
	}
	if o.Err != nil {
		fmt.Fprintf(&b, ": %v", o.Err)
	}
	if o.Why != "" {
		fmt.Fprintf(&b, ": %s", o.Why)
	}
	return b.String()
}

func (s *replicaScript) state(out *strings.Builder) {
	var digest uint64
	agree, live := true, 0
	for _, name := range s.order {
		r := s.reps[name]
		fmt.Fprintf(out, "%s: %v fence %d", name, r.State(), r.Fence())
		if src := r.Source(); src != nil {
			fmt.Fprintf(out, ", source %v", src.State())
		}
		if dst := r.Destination(); dst != nil {
			fmt.Fprintf(out, ", destination %v", dst.State())
		}
		if why := r.Held(); why != "" {
			fmt.Fprintf(out, ", held: %s", why)
		}
		if exec := r.Executor(); exec != nil {
			p := exec.Partition()
			fmt.Fprintf(out, ", %d rows, %d queued", p.TableByName("kv").Len(), exec.Queued())
			if r.State() != ReplicaLive {
				// A held replica's content is not a copy to compare.
			} else if live++; live == 1 {
				digest = p.Digest()
			} else if p.Digest() != digest {
				agree = false
			}
		}
		out.WriteString("\n")
	}
	if live > 1 {
		fmt.Fprintf(out, "live digests agree: %v\n", agree)
	}
}
