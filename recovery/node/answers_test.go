package node

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/stream/faultnet"
	"github.com/rejoin-db/rejoin/wire"
)

// TestAnswersThatDifferAreUncertain: a partition on nodes a and b; b's
// feeds into the others go silent (b reaches etcd, and a's feed into b
// still works). A write through b runs on b's replica alone and waits
// for a's answer; a read through a runs on b's replica after it (b's
// answer comes back on a's feed) and on a's only once b is fenced and a
// ran on without b's write. The two answers differ: the read's outcome
// is unknown. The reply was b's answer, the write's value, and the next
// read through a returned the value before: not linearizable (rejoin
// chaos --net-faults on --seed 406596625, register 006).
func TestAnswersThatDifferAreUncertain(t *testing.T) {
	const parts = 3
	c := newClusterWith(t, 3, 3, layout.Config{Partitions: parts, Replicas: 2, Tables: []layout.Table{layout.KV()}}, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
	})
	on := map[int]map[uint32]bool{}
	for id := 1; id <= 3; id++ {
		on[id] = partitionsOn(t, c, NodeName(id))
	}
	p, a, b, x := uint32(parts), 0, 0, 0
	for q := range uint32(parts) {
		for i := 1; i <= 3 && p == parts; i++ {
			for j := 1; j <= 3; j++ {
				if i != j && on[i][q] && on[j][q] {
					p, a, b, x = q, i, j, 6-i-j
					break
				}
			}
		}
	}
	if p == parts {
		t.Fatalf("no partition on two nodes: %v", on)
	}
	ca, cb := dialClient(t, c.direct(a)), dialClient(t, c.direct(b))
	waitWritable(t, ca, parts)
	key := wire.Bytes([]byte("answers"))
	write := func(cl *rawClient, v string) (*wire.Reply, error) {
		return cl.call(p, partition.ProcUpsert, false, wire.String("kv"), key, wire.Bytes([]byte(v)))
	}
	read := func(cl *rawClient) (*wire.Reply, error) {
		r, err := cl.call(p, partition.ProcRead, false, wire.String("kv"), key)
		if r != nil {
			r.Out = bytes.Clone(r.Out) // the connection's buffer until its next Recv
		}
		return r, err
	}
	if _, err := write(ca, "before"); err != nil {
		t.Fatal(err)
	}
	r0, err := read(ca)
	if err != nil {
		t.Fatal(err)
	}
	// Sequenced by b: b's join of p on its feed into a is answered, so
	// a's replica tracks b's initiator before the feed goes silent.
	if _, err := read(cb); err != nil {
		t.Fatal(err)
	}

	thaw := freezeAll([]*faultnet.Proxy{c.pairs[[2]int{b, a}], c.pairs[[2]int{b, x}]})
	defer thaw()
	written := make(chan error, 1)
	go func() {
		_, err := write(cb, "cut off")
		written <- err
	}()
	// Past the lead of a's heartbeats (Config.BeatLead), so the read
	// through a comes after the write in ID order, and b ran the write.
	time.Sleep(500 * time.Millisecond)
	type answer struct {
		r   *wire.Reply
		err error
	}
	got := make(chan answer, 1)
	go func() {
		r, err := read(ca)
		got <- answer{r, err}
	}()
	var r1 answer
	select {
	case r1 = <-got:
	case <-time.After(30 * time.Second):
		t.Fatalf("the read through n%d not answered once n%d's feeds went silent", a, b)
	}
	waitUntil(t, 15*time.Second, fmt.Sprintf("n%d fenced", b), func() bool { return fenceStands(c, NodeName(b)) })
	// Until a's view has b dead, a read still runs on b's replica too
	// and its answer differs: unknown, and asked again.
	var r2 *wire.Reply
	waitUntil(t, 10*time.Second, fmt.Sprintf("a read through n%d with a known outcome after n%d's fence", a, b), func() bool {
		r, err := read(ca)
		if err != nil && (r == nil || !r.Uncertain) {
			t.Fatalf("the read after n%d's fence: %v", b, err)
		}
		r2 = r
		return err == nil
	})
	if !bytes.Equal(r2.Out, r0.Out) {
		t.Fatalf("n%d kept the write of n%d cut off (%x, before it %x): the scenario did not play out", a, b, r2.Out, r0.Out)
	}
	switch {
	case r1.err == nil && !bytes.Equal(r1.r.Out, r2.Out):
		t.Fatalf("the read through n%d returned %x, written through n%d cut off, and the next read %x, the value before: not linearizable", a, r1.r.Out, b, r2.Out)
	case r1.err == nil:
		t.Fatalf("the read through n%d returned %x: n%d's replica did not run the cut-off write before it, so the scenario did not play out", a, r1.r.Out, b)
	case r1.r == nil || !r1.r.Uncertain || !strings.Contains(r1.r.Err, "answered differently"):
		t.Fatalf("the read through n%d: %v (reply %+v), want an uncertain outcome for answers that differ", a, r1.err, r1.r)
	}
	t.Logf("read through n%d: %v", a, r1.err)
	thaw()
	select {
	case err := <-written:
		t.Logf("the write through n%d cut off: %v", b, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("the write through n%d cut off not answered after the heal", b)
	}
	waitSettled(t, c, ca, parts, 2)
	checkDigests(t, ca, parts, 2)
}
