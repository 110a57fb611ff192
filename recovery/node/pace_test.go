package node

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// TestPaceCtl: a window with more than one txn in paceSlowShare over the
// target halves the rate, starting from what the stream shipped unpaced,
// down to the floor; a window without starts nothing; a calm window
// raises the rate by a fifth until it is back at the unpaced rate, and
// one with no txns at all lifts the pace at once. A stream that shipped
// next to nothing unpaced is not what slowed the txns and is not paced.
func TestPaceCtl(t *testing.T) {
	const mb = 1 << 20
	p := paceCtl{target: 2 * time.Millisecond}
	win := func(fast, slow int, sent int64) (float64, bool) {
		for range fast {
			p.observe(time.Millisecond)
		}
		for range slow {
			p.observe(3 * time.Millisecond)
		}
		return p.window(500*time.Millisecond, sent)
	}
	if r, ch := win(98, 2, 50*mb); r != 0 || ch {
		t.Fatalf("2 slow txns of 100, unpaced: rate %v (changed %v), want unlimited", r, ch)
	}
	if r, ch := win(97, 3, paceFloorBytes/2); r != 0 || ch {
		t.Fatalf("3 slow of 100 with %d bytes shipped: rate %v (changed %v), want unlimited", paceFloorBytes/2, r, ch)
	}
	if r, ch := win(97, 3, 50*mb); r != 50*mb || !ch || p.starts != 1 {
		t.Fatalf("3 slow of 100 at 100 MiB/s unpaced: rate %v (changed %v, starts %d), want 50 MiB/s", r/mb, ch, p.starts)
	}
	if r, _ := win(0, 10, 25*mb); r != 25*mb {
		t.Fatalf("slow again: %v MiB/s, want 25", r/mb)
	}
	for range 10 {
		win(0, 10, 0)
	}
	if p.rate != paceFloorBytes {
		t.Fatalf("slow windows on end: %v MiB/s, want the floor", p.rate/mb)
	}
	prev := p.rate
	for i := 0; p.rate != 0; i++ {
		if i > 30 {
			t.Fatalf("calm windows: still paced at %v MiB/s", p.rate/mb)
		}
		r, ch := win(100, 0, 0)
		if !ch || (r != 0 && r != prev*1.2) {
			t.Fatalf("a calm window at %v MiB/s: %v (changed %v), want a fifth more or unlimited", prev/mb, r/mb, ch)
		}
		if r == 0 && prev*1.2 < 100*mb {
			t.Fatalf("unlimited from %v MiB/s, below the unpaced 100", prev/mb)
		}
		prev = r
	}
	win(0, 5, 50*mb) // paced again: it starts over from what it shipped
	if p.rate != 50*mb || p.starts != 2 {
		t.Fatalf("paced again at %v MiB/s (starts %d), want 50 and 2", p.rate/mb, p.starts)
	}
	if r, ch := win(0, 0, 0); r != 0 || !ch {
		t.Fatalf("a window without txns: %v MiB/s (changed %v), want unlimited", r/mb, ch)
	}

	// Ticks: a window ends every paceWindowTicks, over the link's bytes
	// and the time since it began.
	t0 := time.Unix(1000, 0)
	p.begin(t0, 1000)
	for i := 1; i < paceWindowTicks; i++ {
		p.observe(3 * time.Millisecond)
		if _, ch := p.tick(t0.Add(time.Duration(i)*10*time.Millisecond), 1000+int64(i)*mb); ch {
			t.Fatalf("tick %d of a window of %d changed the rate", i, paceWindowTicks)
		}
	}
	end := t0.Add(paceWindowTicks * 10 * time.Millisecond)
	if r, ch := p.tick(end, 1000+20*mb); !ch || r != 200*mb {
		t.Fatalf("a slow window of 20 MiB in 50 ms: %v MiB/s (changed %v), want half of 400", r/mb, ch)
	}
	if p.ticks != 0 || p.at != end || p.sent != 1000+20*mb {
		t.Fatalf("the next window begins at tick %d, %v, %d bytes; want 0, %v, %d", p.ticks, p.at, p.sent, end, 1000+20*mb)
	}
}

// TestLinkPace: a paced link spaces its frames at the rate, with at most
// its credit at once; unpaced again, it waits for nothing.
func TestLinkPace(t *testing.T) {
	l, sender, receiver := pipeLink(t, 20*time.Second)
	block := benchBlock() // about 256 KiB
	const rate = 2 << 20
	l.setPace(rate)
	const blocks = 6
	start := time.Now()
	for seq := uint64(1); seq <= blocks; seq++ {
		m := *block
		m.Seq = seq
		if err := l.queue([]wire.Message{&m}); err != nil {
			t.Fatal(err)
		}
	}
	for seq := uint64(1); seq <= blocks; seq++ {
		got, err := receiver.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if gb, ok := got.(*wire.Block); !ok || gb.Seq != seq || !bytes.Equal(gb.Tuples, block.Tuples) {
			t.Fatalf("block %d arrived as %v", seq, got.Type())
		}
	}
	// All but the credit waits for the rate: a lower bound, which only a
	// pace that does not hold can miss.
	total := blocks * len(block.Tuples)
	if least := time.Duration(float64(total-l.pace.Burst()) / rate * 0.9 * float64(time.Second)); time.Since(start) < least {
		t.Fatalf("%d bytes paced at %d B/s went out in %v, want at least %v", total, rate, time.Since(start), least)
	}
	l.setPace(0)
	if err := stream.WaitBytes(context.Background(), l.pace, 1<<30, nil, sender.Flush); err != nil {
		t.Fatalf("unpaced: %v", err)
	}
}

// TestPaceWaits: a txn's wait runs from when it could have run. One held
// for another holder's heartbeat waited for the sequencing, not for the
// stream: its wait starts at that heartbeat's arrival. One that could run
// on arrival waits from its arrival. A txn that came before the pacing
// began is not measured, and with nothing queued no rise is kept.
func TestPaceWaits(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	id := func(ms int64, in txnid.Initiator) txnid.ID { return txnid.Make(ms, 0, in) }
	w := newPaceWaits()

	// a of initiator 1 waits for initiator 2, whose heartbeat comes 3 ms
	// later; it runs half a millisecond after that.
	a := id(100, 1)
	w.txn(a, ms(0))
	w.look(id(90, 2), true, ms(0))
	w.took(ms(3))
	w.look(id(110, 2), true, ms(3))
	if got, ok := w.ran(a, ms(3).Add(500*time.Microsecond)); !ok || got != 500*time.Microsecond {
		t.Fatalf("a held 3 ms for a heartbeat, run 0.5 ms after it: wait %v (%v), want 0.5ms", got, ok)
	}

	// b could run on arrival (the safe point is past it) and waited 4 ms
	// for the replica to come to it.
	b := id(105, 1)
	w.txn(b, ms(4))
	w.look(id(110, 2), true, ms(4))
	if got, ok := w.ran(b, ms(8)); !ok || got != 4*time.Millisecond {
		t.Fatalf("b ready on arrival, run 4 ms later: wait %v (%v), want 4ms", got, ok)
	}

	// A rise with no arrival since the last look (an initiator no longer
	// waited for) is owed to the look's time.
	c := id(200, 1)
	w.txn(c, ms(10))
	w.look(id(110, 2), true, ms(10))
	w.look(id(300, 1), true, ms(12))
	if got, _ := w.ran(c, ms(13)); got != time.Millisecond {
		t.Fatalf("c let run by a look at 12 ms, run at 13: wait %v, want 1ms", got)
	}

	if _, ok := w.ran(id(250, 2), ms(14)); ok {
		t.Fatal("a txn that came before the pacing was measured")
	}
	w.took(ms(15))
	w.look(id(400, 2), false, ms(15))
	if len(w.marks) != 0 {
		t.Fatalf("marks kept with nothing queued: %v", w.marks)
	}
}
