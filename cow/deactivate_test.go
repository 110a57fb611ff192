package cow

import (
	"errors"
	"testing"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/txnid"
)

// Deactivate, in every phase, removes the observer (the stream hears no
// later change: its change count and log stay frozen, and changes that
// would panic during the final delta pass silently), frees the logs, lets
// the gate through, and is idempotent.
func TestDeactivateInEveryPhase(t *testing.T) {
	for _, ph := range []Phase{PhaseSnapshot, PhaseBetweenRounds, PhaseRound, PhaseFinal, PhaseDone} {
		t.Run(ph.String(), func(t *testing.T) {
			src, dst := newTestPartition(t), newTestPartition(t)
			for i := range int64(10) {
				mustInsert(t, src, tabInts, intRow(i, "x"))
			}
			s, sh := activate(t, src, dst, testConfig())
			sh.blocks(4)
			tab := src.TableByName(tabInts)
			if err := tab.Update(1, intRow(1, "logged")); err != nil {
				t.Fatal(err)
			}
			if ph != PhaseSnapshot {
				sh.drain()
			}
			switch ph {
			case PhaseRound:
				if err := tab.Update(2, intRow(2, "logged")); err != nil {
					t.Fatal(err)
				}
				if err := s.StartRound(); err != nil {
					t.Fatal(err)
				}
			case PhaseFinal, PhaseDone:
				if err := s.FinalDelta(); err != nil {
					t.Fatal(err)
				}
				if ph == PhaseDone {
					sh.drain()
				}
			}
			if s.Phase() != ph {
				t.Fatalf("reached phase %v, want %v", s.Phase(), ph)
			}
			digest := src.Digest()
			s.Deactivate()
			if src.Digest() != digest {
				t.Fatal("Deactivate changed the partition")
			}
			verifyStream(t, s)
			frozen := s.Metrics()
			// Changes behind and ahead of where the cursor was, of every kind.
			if err := tab.Update(0, intRow(0, "after")); err != nil {
				t.Fatal(err)
			}
			if err := tab.Update(1, intRow(100, "pk change")); err != nil {
				t.Fatal(err)
			}
			if err := tab.Delete(2); err != nil {
				t.Fatal(err)
			}
			mustInsert(t, src, tabInts, intRow(200, "insert"))
			mustInsert(t, src, tabBlobs, blobRow(1, "other table"))
			s.Deactivate() // idempotent
			if m := s.Metrics(); m != frozen {
				t.Fatalf("the stream heard changes after Deactivate: %+v, was %+v", m, frozen)
			}
			if s.Phase() != PhaseInactive || s.LogBytes() != 0 || s.Holding() || s.Pacing() {
				t.Fatalf("after Deactivate: phase %v, log %d, holding %v, pacing %v", s.Phase(), s.LogBytes(), s.Holding(), s.Pacing())
			}
			if !s.BeforeTxn(txnid.ID(1)) {
				t.Fatal("the gate holds after Deactivate")
			}
			s.Tick()
			if b, ok := s.NextBlock(nil); ok {
				t.Fatalf("NextBlock after Deactivate: %+v", b)
			}
			if err := s.StartRound(); !errors.Is(err, ErrPhase) {
				t.Fatalf("StartRound after Deactivate: %v", err)
			}
		})
	}
}

// A change during the final delta breaks the handoff's promise; it is a
// bug of the caller and panics rather than ship a delta that is not the
// difference to E. The gate holds every txn from FinalDelta on.
func TestFinalDeltaHoldsStill(t *testing.T) {
	src, dst := newTestPartition(t), newTestPartition(t)
	mustInsert(t, src, tabInts, intRow(1, "x"))
	s, sh := activate(t, src, dst, testConfig())
	sh.drain()
	if err := s.FinalDelta(); err != nil {
		t.Fatal(err)
	}
	if s.BeforeTxn(txnid.ID(5)) {
		t.Fatal("the gate lets a txn run during the final delta")
	}
	if m := s.Metrics(); m.TxnsHeldForHandoff != 1 || m.TxnsHeld != 0 {
		t.Fatalf("metrics %+v", m)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a change during the final delta did not panic")
		}
	}()
	_ = src.TableByName(tabInts).Update(partition.Slot(0), intRow(1, "y"))
}
