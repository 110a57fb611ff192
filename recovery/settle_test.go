package recovery

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

// settleBase is a node hosting partitions 1, 2 and 3 that lost its
// registration while n1 (process 10) and n3 (process 30) had feeds into
// it, each on a connection of its own; n1 and n3 are alive with the same
// processes.
func settleBase() *SettleInput {
	before := []SettleFeed{{Node: "n1", Inc: 10, Conn: 1}, {Node: "n3", Inc: 30, Conn: 3}}
	return &SettleInput{
		Lapsed:     true,
		Before:     before,
		Now:        slices.Clone(before),
		Alive:      map[string]uint64{"n1": 10, "n3": 30},
		Told:       map[string]map[uint64]SettleTold{},
		Expired:    map[string]bool{},
		Partitions: []uint32{1, 2, 3},
	}
}

func failed(o SettleOutcome) []uint32 {
	return slices.Sorted(maps.Keys(o.Fail))
}

func wantVerdict(t *testing.T, o SettleOutcome, v SettleVerdict, fail ...uint32) {
	t.Helper()
	if o.Verdict != v || !slices.Equal(failed(o), fail) {
		t.Fatalf("settled %s failing %v (gaps %v, unknown %v, wait %q); want %s failing %v", o.Verdict, failed(o), o.Gaps, o.Unknown, o.WaitFor, v, fail)
	}
}

// TestSettleNoLapse: a registration resumed on its lease missed nothing,
// whatever happened to the feeds: no node took this one for dead.
func TestSettleNoLapse(t *testing.T) {
	in := settleBase()
	in.Lapsed = false
	in.Now = []SettleFeed{{Node: "n1", Inc: 10, Conn: 7}} // n1 redialled, n3's feed gone
	in.Alive["n4"] = 40                                   // a new node, no feed
	wantVerdict(t, Settle(in), SettleKeep)
}

// TestSettleFeedsStayedOpen: after a lapse, every node alive kept the
// very feed it had open: every txn reached the node.
func TestSettleFeedsStayedOpen(t *testing.T) {
	o := Settle(settleBase())
	wantVerdict(t, o, SettleKeep)
	if len(o.Gaps) != 0 {
		t.Fatalf("gaps %v, want none: every feed stayed open", o.Gaps)
	}
}

// TestSettleReopenedFeedNamesPartitions: a feed that broke and opened
// again (another connection of the same process) is a gap; its hello
// names what the process sent without it, and only those replicas fail.
func TestSettleReopenedFeedNamesPartitions(t *testing.T) {
	in := settleBase()
	in.Now[0] = SettleFeed{Node: "n1", Inc: 10, Conn: 11}
	in.Told["n1"] = map[uint64]SettleTold{10: {Since: true, Missed: []uint32{2}}}
	o := Settle(in)
	wantVerdict(t, o, SettleFail, 2)
	if !slices.Equal(o.Gaps, []string{"n1"}) || !strings.Contains(o.Fail[2], "[n1] sequenced txns of partition 2") {
		t.Fatalf("gaps %v, why %q", o.Gaps, o.Fail[2])
	}
	// Named nothing: it sequenced nothing without the feed.
	in.Told["n1"][10] = SettleTold{Since: true}
	wantVerdict(t, Settle(in), SettleKeep)
	// Named before the outage only: of an earlier time, it counts not.
	in.Told["n1"][10] = SettleTold{Missed: nil}
	wantVerdict(t, Settle(in), SettleKeep)
}

// TestSettleWaitsForNewProcess: a node alive with a new process and no
// feed here yet: the settlement waits for its feed; once open, its hello
// says what it missed; if it never opens within the driver's bound, it
// cannot say, and every replica fails.
func TestSettleWaitsForNewProcess(t *testing.T) {
	in := settleBase()
	in.Alive["n4"] = 40
	in.Meanwhile = []SettleProcess{{Node: "n4", Inc: 40}}
	o := Settle(in)
	if o.Verdict != SettleWait || o.WaitFor != "n4" {
		t.Fatalf("settled %s (wait %q), want a wait for n4", o.Verdict, o.WaitFor)
	}
	in.Now = append(in.Now, SettleFeed{Node: "n4", Inc: 40, Conn: 4})
	in.Told["n4"] = map[uint64]SettleTold{40: {Since: true, Missed: []uint32{1, 3}}}
	wantVerdict(t, Settle(in), SettleFail, 1, 3)
	in.Now = in.Now[:2]
	in.Expired["n4"] = true
	o = Settle(in)
	wantVerdict(t, o, SettleFail, 1, 2, 3)
	if !slices.Equal(o.Unknown, []string{"n4"}) {
		t.Fatalf("unknown %v, want [n4]", o.Unknown)
	}
}

// TestSettleFeedOfOldProcess: a node alive with a new process whose feed
// here is the old process's (not closed yet) is waited for too: only the
// live process's hello counts.
func TestSettleFeedOfOldProcess(t *testing.T) {
	in := settleBase()
	in.Alive["n1"] = 11
	in.Meanwhile = []SettleProcess{{Node: "n1", Inc: 11}}
	if o := Settle(in); o.Verdict != SettleWait || o.WaitFor != "n1" {
		t.Fatalf("settled %s (wait %q), want a wait for n1", o.Verdict, o.WaitFor)
	}
}

// TestSettleProcessGoneMeanwhile: a process that registered meanwhile
// and is gone counts by what its hellos since the outage said; one whose
// hellos all came before it (its feed here opened and ended before the
// outage) sent everything while open; one that never opened a feed here
// cannot say, and every replica fails.
func TestSettleProcessGoneMeanwhile(t *testing.T) {
	in := settleBase()
	in.Meanwhile = []SettleProcess{{Node: "n5", Inc: 50}}
	in.Told["n5"] = map[uint64]SettleTold{50: {Since: true, Missed: []uint32{3}}}
	wantVerdict(t, Settle(in), SettleFail, 3)
	in.Told["n5"] = map[uint64]SettleTold{50: {Since: true}}
	wantVerdict(t, Settle(in), SettleKeep)
	in.Told["n5"] = map[uint64]SettleTold{50: {}}
	wantVerdict(t, Settle(in), SettleKeep)
	delete(in.Told, "n5")
	o := Settle(in)
	wantVerdict(t, o, SettleFail, 1, 2, 3)
	if !slices.Equal(o.Unknown, []string{"n5"}) {
		t.Fatalf("unknown %v, want [n5]", o.Unknown)
	}
}

// TestSettleRestartedMeanwhile: n1 restarted twice while the node was
// away: process 11 registered and died, 12 lives. 11 counts by what it
// told, 12 by its feed's hello; the process whose feed was open before
// (10) sent everything on it and needs no word.
func TestSettleRestartedMeanwhile(t *testing.T) {
	in := settleBase()
	in.Alive["n1"] = 12
	in.Meanwhile = []SettleProcess{{Node: "n1", Inc: 10}, {Node: "n1", Inc: 11}, {Node: "n1", Inc: 12}}
	in.Told["n1"] = map[uint64]SettleTold{11: {Since: true, Missed: []uint32{1}}, 12: {Since: true, Missed: []uint32{3}}}
	in.Now[0] = SettleFeed{Node: "n1", Inc: 12, Conn: 12}
	wantVerdict(t, Settle(in), SettleFail, 1, 3)
}

// TestSettleCompacted: a history that could not be read cannot say who
// registered meanwhile: every replica fails.
func TestSettleCompacted(t *testing.T) {
	in := settleBase()
	in.Compacted = true
	o := Settle(in)
	wantVerdict(t, o, SettleFail, 1, 2, 3)
	if !slices.Equal(o.Unknown, []string{CompactedNode}) {
		t.Fatalf("unknown %v, want [%s]", o.Unknown, CompactedNode)
	}
}

// TestSettleGoneWithFeedBefore: a node gone since, whose feed was open
// when the registration was lost, sent everything on it until it ended
// (its tail is repaired as any dead initiator's): nothing missed.
func TestSettleGoneWithFeedBefore(t *testing.T) {
	in := settleBase()
	delete(in.Alive, "n3")
	in.Now = in.Now[:1]
	in.Meanwhile = []SettleProcess{{Node: "n3", Inc: 30}}
	wantVerdict(t, Settle(in), SettleKeep)
}

// TestSettleScopedByHolders: with the partitions' holders known, a gap
// settles only the partitions it holds. n4, alive with no feed open here
// yet, holds a replica of partition 3 alone: only 3 waits for it, and a
// cut-off n4 no longer holds the other partitions' results until it is
// fenced (rejoin chaos --seed 20261128, +81.84 s). n5, registered
// meanwhile and never heard from here, fails only partition 2, which it
// holds. What a gap names missed fails its partition, holder or not.
func TestSettleScopedByHolders(t *testing.T) {
	in := settleBase()
	in.Alive["n4"] = 40
	in.Meanwhile = []SettleProcess{{Node: "n4", Inc: 40}, {Node: "n5", Inc: 50}}
	in.Holders = map[uint32][]string{1: {"n1", "n3"}, 2: {"n1", "n5"}, 3: {"n3", "n4"}}
	o := Settle(in)
	wantVerdict(t, o, SettleWait, 2)
	if o.WaitFor != "n4" || !maps.Equal(o.Pending, map[uint32]bool{3: true}) {
		t.Fatalf("waits for %q with %v pending, want n4 with partition 3", o.WaitFor, o.Pending)
	}
	if !strings.Contains(o.Fail[2], "[n5] cannot say") {
		t.Fatalf("partition 2 fails for %q, want n5 named", o.Fail[2])
	}

	in.Expired["n4"] = true
	wantVerdict(t, Settle(in), SettleFail, 2, 3)

	delete(in.Expired, "n4")
	in.Now = append(in.Now, SettleFeed{Node: "n4", Inc: 40, Conn: 4})
	in.Told["n4"] = map[uint64]SettleTold{40: {Since: true, Missed: []uint32{1}}}
	wantVerdict(t, Settle(in), SettleFail, 1, 2)

	// Unscoped, the same gaps fail every partition.
	in.Holders = nil
	wantVerdict(t, Settle(in), SettleFail, 1, 2, 3)

	// A partition a gap named missed fails at once, even while another
	// of its holders is waited for: what that one says adds nothing. A
	// gap that holds nothing else is not waited for at all.
	in.Holders = map[uint32][]string{1: {"n1", "n3", "n6"}, 2: {"n1", "n3"}, 3: {"n3", "n4", "n6"}}
	in.Meanwhile = []SettleProcess{{Node: "n4", Inc: 40}, {Node: "n6", Inc: 60}}
	in.Alive["n6"] = 60
	o = Settle(in)
	wantVerdict(t, o, SettleWait, 1)
	if o.WaitFor != "n6" || !maps.Equal(o.Pending, map[uint32]bool{3: true}) {
		t.Fatalf("waits for %q with %v pending, want n6 with partition 3", o.WaitFor, o.Pending)
	}
	in.Holders[3] = []string{"n3", "n4"}
	wantVerdict(t, Settle(in), SettleFail, 1)
}

// TestSettleAlone: a partition none of whose other replicas was live at
// any moment of the outage had no txn acknowledged without the replica
// here, so a gap that cannot say what it sent, or that is waited for,
// does not fail it: it is the partition's last live copy (rejoin chaos
// --net-faults on --seed 1129202611, 10m: three partitions lost so). A
// partition a gap names missed still fails, and so does one whose other
// replicas may have been live, or whose others are not known.
func TestSettleAlone(t *testing.T) {
	in := settleBase()
	in.Meanwhile = []SettleProcess{{Node: "n5", Inc: 50}} // never heard from here
	in.Alive["n4"] = 40                                   // no feed open here yet
	in.Others = map[uint32][]string{1: nil, 2: {"n5"}, 3: {}}
	o := Settle(in)
	wantVerdict(t, o, SettleFail, 2)
	if len(o.Pending) != 0 || !slices.Equal(o.Alone, []uint32{1, 3}) {
		t.Fatalf("pending %v, alone %v; want none pending, 1 and 3 kept alone, 2 failed", o.Pending, o.Alone)
	}

	// Unknown others: every partition may have had a live copy elsewhere.
	in.Others = nil
	wantVerdict(t, Settle(in), SettleFail, 1, 2, 3)

	// Alone, a gap that can say: only what it names fails.
	in.Others = map[uint32][]string{1: nil, 2: nil, 3: nil}
	in.Meanwhile = nil
	in.Now = append(in.Now, SettleFeed{Node: "n4", Inc: 40, Conn: 4})
	in.Told["n4"] = map[uint64]SettleTold{40: {Since: true, Missed: []uint32{3}}}
	wantVerdict(t, Settle(in), SettleFail, 3)

	// Alone everywhere and nothing named: kept, though gaps remain.
	in.Told["n4"] = map[uint64]SettleTold{40: {Since: true}}
	in.Now = in.Now[:2]
	o = Settle(in)
	wantVerdict(t, o, SettleKeep)
	if !slices.Equal(o.Gaps, []string{"n4"}) || !slices.Equal(o.Unknown, nil) {
		t.Fatalf("gaps %v unknown %v, want n4 waited for and nothing unknown", o.Gaps, o.Unknown)
	}
}

// TestSettleMuteProcess: a process that registered meanwhile and never
// opened a feed here cannot say only for the partitions another replica
// of which was live for some view of it (SettleProcess.Others): for the
// others it needed a feed here to sequence anything. Unknown others: it
// cannot say for any (rule 3).
func TestSettleMuteProcess(t *testing.T) {
	in := settleBase()
	in.Meanwhile = []SettleProcess{{Node: "n5", Inc: 50, Others: map[uint32][]string{2: {"n4"}, 3: {}}}}
	o := Settle(in)
	wantVerdict(t, o, SettleFail, 2)
	if !slices.Equal(o.Unknown, []string{"n5"}) || len(o.Alone) != 0 {
		t.Fatalf("unknown %v, alone %v; want n5 unknown, none kept alone", o.Unknown, o.Alone)
	}

	// rejoin chaos --seed 20261202's shape: a process of the third holder
	// registered while this node and the second were out, cut off and
	// fenced unheard. For the node that registered again first, no other
	// replica was live for any view of it: kept. For the second, the
	// first was: failed, and the partition keeps one replica.
	in.Meanwhile[0].Others = map[uint32][]string{}
	wantVerdict(t, Settle(in), SettleKeep)
	in.Meanwhile[0].Others = map[uint32][]string{1: {"n1"}, 2: {"n1"}, 3: {"n1"}}
	wantVerdict(t, Settle(in), SettleFail, 1, 2, 3)

	in.Meanwhile[0].Others = nil
	wantVerdict(t, Settle(in), SettleFail, 1, 2, 3)

	// What a process heard here names missed still fails, with one
	// that cannot say for its partition beside it.
	in.Meanwhile = []SettleProcess{{Node: "n5", Inc: 50, Others: map[uint32][]string{}}, {Node: "n5", Inc: 51}}
	in.Told["n5"] = map[uint64]SettleTold{51: {Since: true, Missed: []uint32{3}}}
	wantVerdict(t, Settle(in), SettleFail, 3)
}
