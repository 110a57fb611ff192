package partition

import (
	"fmt"
	"slices"
	"testing"

	"github.com/rejoin-db/rejoin/wire"
)

// recorder is an Observer that writes each event as a line of text. It
// also checks, during each call, what the observer contract promises about
// the table's state at that moment.
type recorder struct {
	p      *Partition
	events []string
	errs   []string
}

func (r *recorder) OnInsert(t TableID, s Slot) {
	r.events = append(r.events, fmt.Sprintf("ins %d %d", t, s))
	if !r.p.Table(t).Live(s) {
		r.errs = append(r.errs, fmt.Sprintf("OnInsert(%d, %d): slot not live during the call", t, s))
	}
}

func (r *recorder) OnUpdate(t TableID, s Slot) {
	r.events = append(r.events, fmt.Sprintf("upd %d %d", t, s))
	if !r.p.Table(t).Live(s) {
		r.errs = append(r.errs, fmt.Sprintf("OnUpdate(%d, %d): slot not live during the call", t, s))
	}
}

func (r *recorder) OnDelete(t TableID, s Slot, key []byte) {
	r.events = append(r.events, fmt.Sprintf("del %d %d %x", t, s, key))
	tab := r.p.Table(t)
	if ls, ok := tab.Lookup(key); ok && ls == s {
		r.errs = append(r.errs, fmt.Sprintf("OnDelete(%d, %d): old key still maps to the slot during the call", t, s))
	}
}

// take returns the events recorded since the last take.
func (r *recorder) take() []string {
	ev := r.events
	r.events = nil
	return ev
}

func TestObserverEvents(t *testing.T) {
	p := New()
	tab, err := p.CreateTable(kvSchema())
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{p: p}
	p.SetObserver(rec)
	enc := wire.NewTupleEncoder()
	key := func(k int64) []byte {
		b, _ := enc.AppendTuple(nil, []wire.Value{wire.Int64(k)})
		return b
	}
	expect := func(step string, want ...string) {
		t.Helper()
		if got := rec.take(); !slices.Equal(got, want) {
			t.Fatalf("%s: events %q, want %q", step, got, want)
		}
		if len(rec.errs) > 0 {
			t.Fatalf("%s: %v", step, rec.errs)
		}
	}

	s0, _ := tab.Insert(kvRow(1, "a"))
	expect("insert", fmt.Sprintf("ins 1 %d", s0))
	_ = tab.Update(s0, kvRow(1, "bb"))
	expect("update", fmt.Sprintf("upd 1 %d", s0))
	_ = tab.Update(s0, kvRow(1, "bb"))
	expect("update to the same tuple", fmt.Sprintf("upd 1 %d", s0))
	_ = tab.Update(s0, kvRow(2, "bb"))
	expect("key change", fmt.Sprintf("del 1 %d %x", s0, key(1)), fmt.Sprintf("ins 1 %d", s0))
	s1, _ := tab.Insert(kvRow(3, "c"))
	expect("insert", fmt.Sprintf("ins 1 %d", s1))
	if _, err := tab.Insert(kvRow(3, "dup")); err == nil {
		t.Fatal("duplicate insert succeeded")
	}
	expect("failed insert")
	if err := tab.Update(s0, kvRow(3, "dup")); err == nil {
		t.Fatal("key change onto a live key succeeded")
	}
	expect("failed key change")
	tup, _ := enc.AppendTuple(nil, kvRow(3, "upserted"))
	if _, err := tab.Upsert(tup); err != nil {
		t.Fatal(err)
	}
	expect("upsert of a live key", fmt.Sprintf("upd 1 %d", s1))
	tup, _ = enc.AppendTuple(nil, kvRow(4, "new"))
	s2, _ := tab.Upsert(tup)
	expect("upsert of a new key", fmt.Sprintf("ins 1 %d", s2))
	_ = tab.Delete(s1)
	expect("delete", fmt.Sprintf("del 1 %d %x", s1, key(3)))
	if ok, _ := tab.DeleteKey(key(4)); !ok {
		t.Fatal("DeleteKey missed")
	}
	expect("delete by key", fmt.Sprintf("del 1 %d %x", s2, key(4)))
	if ok, _ := tab.DeleteKey(key(4)); ok {
		t.Fatal("DeleteKey of a deleted key")
	}
	expect("delete of an absent key")
	tup, _ = enc.AppendTuple(nil, kvRow(4, "back"))
	if err := tab.InsertTupleAt(s2, tup); err != nil {
		t.Fatal(err)
	}
	expect("insert at", fmt.Sprintf("ins 1 %d", s2))
	p.Clear()
	expect("clear")
	p.SetObserver(nil)
	_, _ = tab.Insert(kvRow(1, "a"))
	expect("no observer")
}
