package recovery

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// boundaryGate holds the source's executor at S until the stream is
// activated, as the recovery source does.
type boundaryGate struct {
	s         txnid.ID
	set       bool
	activated bool
}

func (g *boundaryGate) BeforeTxn(next txnid.ID) bool {
	return !g.set || g.activated || next < g.s
}

func noopRegistry(t testing.TB) *partition.Registry {
	reg := partition.NewRegistry()
	if err := reg.Register("noop", func(*partition.Txn, []wire.Value) ([]wire.Value, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestHandshakeProperties runs seeded histories: initiators with skewed
// clocks send txns and heartbeats to the source; the destination joins the
// feed at a random moment, proposes P once it has heard every initiator;
// the source answers S and activates at the boundary. Checked: S >= P;
// at activation the source has executed exactly the txns < S that exist,
// and no txn < S arrives afterwards; the destination holds every txn >= S.
// Half the seeds send heartbeats only, where the handshake must still end.
func TestHandshakeProperties(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		heartbeatsOnly := seed%2 == 0
		nInit := 1 + rng.IntN(4)
		now := txnid.EpochUnixMillis + 10_000
		gens := make([]*txnid.Generator, nInit)
		var ins []txnid.Initiator
		for i := range gens {
			skew := int64(rng.IntN(200)) - 100
			g, err := txnid.NewGenerator(txnid.Initiator(i+1), func() int64 { return now + skew })
			if err != nil {
				t.Fatal(err)
			}
			gens[i] = g
			ins = append(ins, txnid.Initiator(i+1))
		}
		src := partition.NewExecutor(partition.New(), noopRegistry(t), partition.ExecutorConfig{})
		gate := &boundaryGate{}
		src.SetGate(gate)
		for _, in := range ins {
			src.AddInitiator(in)
		}

		var (
			joined    bool
			cov       = NewCoverage(ins)
			buffered  = map[txnid.ID]bool{}
			sent      []txnid.ID // every txn (not heartbeat) sent
			p, s      txnid.ID
			executed  = map[txnid.ID]bool{}
			atActive  map[txnid.ID]bool
			lateBelow []txnid.ID
			proposed  bool
			answerAt  int
		)
		joinAt := rng.IntN(100)
		for step := 0; step < 400 && !(gate.activated && step > 300); step++ {
			now += int64(rng.IntN(3))
			i := rng.IntN(nInit)
			id := gens[i].Next()
			isTxn := !heartbeatsOnly && rng.IntN(3) > 0
			if isTxn {
				if err := src.Offer(partition.Invocation{ID: id, Proc: "noop", Params: []byte{0x90}}); err != nil {
					t.Fatalf("seed %d: offer: %v", seed, err)
				}
				sent = append(sent, id)
				if gate.activated && id < s {
					lateBelow = append(lateBelow, id)
				}
			} else if err := src.Heartbeat(id); err != nil {
				t.Fatalf("seed %d: heartbeat: %v", seed, err)
			}
			if step == joinAt {
				joined = true
			}
			if joined {
				cov.Observe(id)
				if isTxn {
					buffered[id] = true
				}
				if !proposed {
					if pp, err := cov.Proposal(); err == nil {
						p, proposed = pp, true
						answerAt = step + rng.IntN(30) // the source keeps executing while P travels
					} else if !errors.Is(err, ErrNoProposal) {
						t.Fatal(err)
					}
				}
			}
			if proposed && !gate.set && step >= answerAt {
				s = Answer(src, p)
				gate.s, gate.set = s, true
				if s < p {
					t.Fatalf("seed %d: answer %v below proposal %v", seed, s, p)
				}
			}
			// The source runs some of what is ready, checking the boundary
			// between every two txns as its driver does.
			for n := rng.IntN(4); ; n-- {
				if gate.set && !gate.activated && AtBoundary(src, s) {
					gate.activated = true
					atActive = make(map[txnid.ID]bool, len(executed))
					for id := range executed {
						atActive[id] = true
					}
				}
				if n == 0 {
					break
				}
				res, ok := src.Step()
				if !ok {
					break
				}
				executed[res.ID] = true
			}
		}
		if !gate.set {
			t.Fatalf("seed %d: destination never proposed (joined at %d of 400 steps)", seed, joinAt)
		}
		if !gate.activated {
			t.Fatalf("seed %d: source never reached the boundary S=%v (heartbeats only: %v)", seed, s, heartbeatsOnly)
		}
		if len(lateBelow) > 0 {
			t.Fatalf("seed %d: txns %v below S=%v arrived after activation", seed, lateBelow, s)
		}
		for _, id := range sent {
			if id < s && !atActive[id] {
				t.Fatalf("seed %d: txn %v < S=%v not executed at activation", seed, id, s)
			}
			if id >= s && atActive[id] {
				t.Fatalf("seed %d: txn %v >= S=%v executed before activation", seed, id, s)
			}
			if id >= s && !buffered[id] {
				t.Fatalf("seed %d: txn %v >= S=%v missing from the destination's buffer (P=%v)", seed, id, s, p)
			}
		}
	}
}

// TestFirstBufferedTxnIsNotASafeProposal pins the reason Coverage takes the
// maximum over initiators: initiator 2's clock runs ahead, it sent txn
// t=105 before the destination joined, and the first txn the destination
// then buffers is initiator 1's t=100.
func TestFirstBufferedTxnIsNotASafeProposal(t *testing.T) {
	cov := NewCoverage([]txnid.Initiator{1, 2})
	// Before joining: initiator 2 sent 105 (not seen).
	cov.Observe(txnid.Make(100, 0, 1))
	if _, err := cov.Proposal(); !errors.Is(err, ErrNoProposal) {
		t.Fatalf("proposal with initiator 2 unheard: %v, want ErrNoProposal", err)
	}
	cov.Observe(txnid.Make(110, 0, 2))
	cov.Observe(txnid.Make(120, 0, 1))
	p, err := cov.Proposal()
	if err != nil {
		t.Fatal(err)
	}
	if p != txnid.Make(110, 0, 2) {
		t.Fatalf("P = %v, want %v: the destination does not hold initiator 2's txn at 105", p, txnid.Make(110, 0, 2))
	}
	cov.RemoveInitiator(2)
	if p, _ := cov.Proposal(); p != txnid.Make(100, 0, 1) {
		t.Fatalf("after initiator 2 left, P = %v, want %v", p, txnid.Make(100, 0, 1))
	}
	if _, err := NewCoverage(nil).Proposal(); !errors.Is(err, ErrNoProposal) {
		t.Fatalf("no initiators: %v, want ErrNoProposal", err)
	}
}

// TestCoverageLateInitiator: an initiator whose feed opens while the
// attempt runs (docs/DESIGN.md "Feeds that open late"). Before the
// proposal, the proposal waits for it; after, Covers accepts E only once
// it was heard at or below E, and refuses an initiator the source names
// that was never heard here.
func TestCoverageLateInitiator(t *testing.T) {
	id := func(ms int64, in txnid.Initiator) txnid.ID { return txnid.Make(ms, 0, in) }
	cov := NewCoverage([]txnid.Initiator{1})
	cov.Observe(id(100, 1))
	cov.AddInitiator(2)
	if _, err := cov.Proposal(); !errors.Is(err, ErrNoProposal) {
		t.Fatalf("proposal with the late initiator 2 unheard: %v, want ErrNoProposal", err)
	}
	cov.Observe(id(110, 2))
	if p, err := cov.Proposal(); err != nil || p != id(110, 2) {
		t.Fatalf("P = %v, %v; want %v", p, err, id(110, 2))
	}
	if err := cov.Covers(id(110, 2), []txnid.Initiator{1, 2}); err != nil {
		t.Fatalf("E = P: %v", err)
	}

	// After the proposal: initiator 3 is added, then heard at 120.
	cov.AddInitiator(3)
	if err := cov.Covers(id(115, 1), []txnid.Initiator{1, 2}); !errors.Is(err, ErrUncovered) {
		t.Fatalf("initiator 3 added, unheard: %v, want ErrUncovered", err)
	}
	cov.Observe(id(120, 3))
	if err := cov.Covers(id(115, 1), nil); !errors.Is(err, ErrUncovered) {
		t.Fatalf("initiator 3 heard from 120 on, E=115: %v, want ErrUncovered", err)
	}
	if err := cov.Covers(id(120, 3), []txnid.Initiator{1, 2, 3}); err != nil {
		t.Fatalf("initiator 3 heard from E on: %v", err)
	}
	// One the source names and this side never heard.
	if err := cov.Covers(id(200, 1), []txnid.Initiator{1, 4}); !errors.Is(err, ErrUncovered) {
		t.Fatalf("initiator 4 never heard: %v, want ErrUncovered", err)
	}
	// A removed initiator keeps what was heard: its txns stay buffered.
	cov.RemoveInitiator(3)
	if err := cov.Covers(id(200, 1), []txnid.Initiator{3}); err != nil {
		t.Fatalf("initiator 3 removed after it was heard at 120: %v", err)
	}
	// Added again (a new process): its first ID is taken afresh.
	cov.AddInitiator(3)
	if err := cov.Covers(id(200, 1), nil); !errors.Is(err, ErrUncovered) {
		t.Fatalf("initiator 3 back, unheard: %v, want ErrUncovered", err)
	}
	cov.Observe(id(130, 3))
	if err := cov.Covers(id(200, 1), []txnid.Initiator{1, 2, 3}); err != nil {
		t.Fatalf("initiator 3 back and heard at 130: %v", err)
	}
}
