package node

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/cow"
	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"
)

// readBlocks runs readRejoinInto with bufs on the receiving end of a pipe
// and returns the sending end, the delivered messages, and a wait for the
// reader's end (after the sender closed).
func readBlocks(t *testing.T, bufs freeBufs, inFlight int) (*stream.Conn, chan wire.Message, func()) {
	t.Helper()
	a, b := net.Pipe()
	sender := stream.NewConn(a, stream.Config{Codec: wire.CodecNone})
	receiver := stream.NewConn(b, stream.Config{Codec: wire.CodecNone, StallWindow: 10 * time.Second})
	got := make(chan wire.Message, inFlight)
	done := make(chan struct{})
	n := &Node{log: testLog(t)}
	go func() {
		defer close(done)
		defer close(got)
		defer receiver.Close()
		n.readRejoinInto(context.Background(), receiver, bufs, func(context.Context) {}, func(m wire.Message) { got <- m })
	}()
	return sender, got, func() {
		sender.Close()
		for range got { // a reader blocked on a full channel must end too
		}
		<-done
	}
}

// blockFrames encodes blocks into frames before any is sent, so a test's
// sends allocate nothing of their own.
func blockFrames(t *testing.T, blocks []*wire.Block) [][]byte {
	t.Helper()
	var frames [][]byte
	for _, b := range blocks {
		f, err := wire.AppendFrame(nil, b, wire.CodecNone)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, f)
	}
	return frames
}

// TestReadRejoinReusesBlockBuffers: the destination's read loop copies
// each block into a buffer given back after the block before it was
// applied, so a stream of blocks allocates no block-sized buffer per
// block, and each block arrives intact in a reused buffer.
func TestReadRejoinReusesBlockBuffers(t *testing.T) {
	const blocks = 20
	block := benchBlock()
	var sent []*wire.Block
	for seq := uint64(1); seq <= blocks+1; seq++ {
		m := *block
		m.Seq = seq
		m.Tuples = bytes.Clone(block.Tuples)
		m.Tuples[len(m.Tuples)-1] += byte(seq) // blocks that differ in their tuples
		sent = append(sent, &m)
	}
	frames := blockFrames(t, sent)
	bufs := newFreeBufs()
	sender, got, wait := readBlocks(t, bufs, 1)
	defer wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recv := func(i int) {
		t.Helper()
		if err := sender.SendFrame(ctx, frames[i]); err != nil {
			t.Fatal(err)
		}
		var m wire.Message
		select {
		case m = <-got:
		case <-ctx.Done():
			t.Fatalf("block %d not delivered", i+1)
		}
		gb, ok := m.(*wire.Block)
		if !ok || gb.Seq != sent[i].Seq || !bytes.Equal(gb.Tuples, sent[i].Tuples) {
			t.Fatalf("block %d arrived as %v", i+1, m.Type())
		}
		giveBlock(bufs, m) // applied
	}
	recv(0) // the first block has no buffer to reuse
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 1; i <= blocks; i++ {
		recv(i)
	}
	runtime.ReadMemStats(&after)
	// A fresh buffer per block would be a block's worth each.
	blockBytes := len(block.Tuples)
	if got := after.TotalAlloc - before.TotalAlloc; got > uint64(blocks*blockBytes/4) {
		t.Fatalf("%d blocks of %d bytes allocated %d bytes: %.2f blocks' worth each, want none", blocks, blockBytes, got, float64(got)/float64(blocks*blockBytes))
	}
}

// TestReadRejoinBlockBuffersKeepContent: blocks of different rows and
// sizes, applied in turn while several more wait behind them (each in a
// buffer of its own, many of them reused), build the same table as the
// blocks applied straight from the sender's copies: no buffer is reused
// while a block in it waits to be applied.
func TestReadRejoinBlockBuffersKeepContent(t *testing.T) {
	schema := partition.Schema{Name: "kv", Columns: []partition.Column{{Name: "k", Type: wire.TypeBytes}, {Name: "v", Type: wire.TypeBytes}}, Key: []int{0}}
	newPart := func() *partition.Partition {
		p := partition.New()
		if _, err := p.CreateTable(schema); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const (
		blocks = 4 * linkFreeFramesMax
		behind = 8 // blocks delivered and not yet applied
	)
	var sent []*wire.Block
	row := 0
	for seq := uint64(1); seq <= blocks; seq++ {
		var w wire.BlockWriter
		w.Reset(wire.MsgHeader{Epoch: 7, Partition: 3}, wire.BlockSnapshot, 1, seq)
		val := make([]byte, 100)
		// From a few rows to about 64 KiB, so a reused buffer holds a
		// longer block before a shorter one and the other way round.
		for range 1 + int(seq*37%97)*6 {
			for j := range val {
				val[j] = byte(row*31 + j)
			}
			if err := w.AppendTuple([]wire.Value{wire.Bytes(fmt.Appendf(nil, "key-%012d", row)), wire.Bytes(val)}); err != nil {
				t.Fatal(err)
			}
			row++
		}
		b := *w.Block()
		b.Tuples = bytes.Clone(b.Tuples) // the writer reuses its buffer
		sent = append(sent, &b)
	}
	want := newPart()
	var wa cow.Applier
	for _, b := range sent {
		if err := wa.Apply(want, cow.Block{Kind: b.Kind, Table: partition.TableID(b.Table), Count: b.Count, Tuples: b.Tuples}); err != nil {
			t.Fatal(err)
		}
	}
	frames := blockFrames(t, sent)
	bufs := newFreeBufs()
	sender, got, wait := readBlocks(t, bufs, behind)
	defer wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sendErr := make(chan error, 1)
	go func() {
		for _, f := range frames {
			if err := sender.SendFrame(ctx, f); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- nil
	}()
	have := newPart()
	var ha cow.Applier
	var queue []*wire.Block
	apply := func() {
		t.Helper()
		b := queue[0]
		queue = queue[1:]
		if err := ha.Apply(have, cow.Block{Kind: b.Kind, Table: partition.TableID(b.Table), Count: b.Count, Tuples: b.Tuples}); err != nil {
			t.Fatalf("block %d: %v", b.Seq, err)
		}
		giveBlock(bufs, b)
	}
	bufsSeen := map[*byte]bool{}
	for range blocks {
		var m wire.Message
		select {
		case m = <-got:
		case <-ctx.Done():
			t.Fatalf("%d blocks applied, %d waiting: the rest not delivered", len(sent)-len(queue), len(queue))
		}
		b := m.(*wire.Block)
		bufsSeen[&b.Tuples[:1][0]] = true
		queue = append(queue, b)
		if len(queue) > behind {
			apply()
		}
	}
	for len(queue) > 0 {
		apply()
	}
	if err := <-sendErr; err != nil {
		t.Fatal(err)
	}
	reused := blocks - len(bufsSeen)
	if reused == 0 {
		t.Fatalf("no block was read into a reused buffer")
	}
	if g, w := have.Digest(), want.Digest(); g != w || have.Table(1).Len() != want.Table(1).Len() {
		t.Fatalf("digest %016x with %d rows, want %016x with %d rows", g, have.Table(1).Len(), w, want.Table(1).Len())
	}
	t.Logf("%d blocks, %d rows, %d read into a reused buffer", blocks, row, reused)
}

// A destination node applies at most ApplyMax rejoin blocks at once,
// across its rejoins: four partitions rejoining into n2 together, each
// block's apply made to last 20 ms, never overlap with ApplyMax 1, where
// without the bound all four arrive within a few milliseconds and apply
// side by side.
func TestApplyMaxBounds(t *testing.T) {
	const parts = 4
	c := newCluster(t, 2, layout.Config{Partitions: parts, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, parts)
	for i := range 400 {
		upsert(t, cl, parts, i)
	}
	c.stop(2)
	var mu sync.Mutex
	var now, most int
	applied := map[uint32]bool{}
	c.startCfg(2, func(cfg *Config) {
		cfg.IncomingMax = parts
		cfg.ApplyMax = 1
		cfg.knobs.applying = func(p uint32) {
			mu.Lock()
			now++
			most = max(most, now)
			applied[p] = true
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			now--
			mu.Unlock()
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !allLive(t, c) {
		if time.Now().After(deadline) {
			t.Fatal("n2's replicas not live in 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkDigests(t, cl, parts, 2)
	mu.Lock()
	defer mu.Unlock()
	if len(applied) != parts || most != 1 {
		t.Fatalf("blocks of %d partitions applied, at most %d at once; want %d partitions, 1 at once", len(applied), most, parts)
	}
}
