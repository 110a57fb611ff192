package recovery

import (
	"slices"
	"testing"
)

// TestUnfed: an initiator may sequence a txn only with a feed to every
// node its view has alive that holds a replica of the partition, whatever
// the replica's state; a dead node does not count.
func TestUnfed(t *testing.T) {
	rs := []ReplicaFeed{
		{Node: "n1", Alive: true, Fed: true},
		{Node: "n2", Alive: true, Fed: false},
		{Node: "n3", Alive: false, Fed: false},
		{Node: "n4", Alive: true, Fed: false},
	}
	if got := Unfed(rs); !slices.Equal(got, []string{"n2", "n4"}) {
		t.Fatalf("Unfed = %v, want [n2 n4]", got)
	}
	if got := Unfed(rs[:1]); got != nil {
		t.Fatalf("Unfed with every feed open = %v", got)
	}
}
