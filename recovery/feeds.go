package recovery

// The rule that keeps every txn on every replica whatever order an
// initiator's feeds open in (docs/DESIGN.md "Feeds that open late").
//
// An initiator sends a txn of a partition to the replicas on the nodes it
// has a feed to. A replica on a node it has no feed to never gets the
// txn, and does not even track the initiator, so nothing holds it back:
// it runs later txns past the one it lacks. So an initiator sequences a
// txn only once it has a feed to every node holding a replica of the
// partition that its membership view has alive, whatever the replica's
// state: a live replica must get every txn, and a rejoining one buffers
// every txn from its start (a rejoin's coverage needs it; a needs-rejoin
// one drops it). The rejoin's own check at the handoff (Coverage.Covers)
// covers what a stale view lets through.

// ReplicaFeed is what an initiator knows of one replica of a partition.
type ReplicaFeed struct {
	Node string
	// Alive: the initiator's membership view has the node alive.
	Alive bool
	// Fed: a txn sent now reaches the node's replicas or fails them. An
	// open feed does; so does one that broke while the node's process
	// lives: the feed's log keeps the txn until the feed resumes, and the
	// replicas there still track the initiator and run nothing past what
	// they lack meanwhile; if the feed cannot resume, they fail.
	Fed bool
	// Dialing: a feed to the node is being opened. Its hello named what
	// the node missed so far; a txn sent before the feed opens would be
	// missed and unnamed, so it waits as for a live node.
	Dialing bool
}

// Missed returns the nodes of rs that a txn sequenced now does not reach:
// their replicas lack it. The initiator names the txn's partition to each
// when its feed to it opens (wire.Hello.Missed), so that a node that was
// taken for dead meanwhile fails only those replicas (docs/DESIGN.md
// "Without the coordinator").
func Missed(rs []ReplicaFeed) []string {
	var out []string
	for _, r := range rs {
		if !r.Fed {
			out = append(out, r.Node)
		}
	}
	return out
}

// Unfed returns, in order, the nodes an initiator must have a feed to
// before it sequences a txn of the partition whose replicas are rs, and
// has not. The initiator sequences the txn only if there are none;
// otherwise it sends it nowhere and the call fails, definitely.
func Unfed(rs []ReplicaFeed) []string {
	var out []string
	for _, r := range rs {
		if (r.Alive || r.Dialing) && !r.Fed {
			out = append(out, r.Node)
		}
	}
	return out
}
