package supervise

import (
	"errors"
	"reflect"
	"testing"
)

func TestPlace(t *testing.T) {
	nodes := []string{"n3", "n1", "n2", "n4", "n5"}
	for _, tc := range []struct {
		partitions uint32
		replicas   int
	}{{4, 2}, {7, 3}, {1, 1}, {10, 5}} {
		got, err := Place(nodes, tc.partitions, tc.replicas)
		if err != nil {
			t.Fatal(err)
		}
		load := map[string]int{}
		for p := range tc.partitions {
			rs := got[p]
			if len(rs) != tc.replicas {
				t.Fatalf("%+v: partition %d has %d replicas", tc, p, len(rs))
			}
			seen := map[string]bool{}
			for _, n := range rs {
				if seen[n] {
					t.Fatalf("%+v: partition %d has two replicas on %s", tc, p, n)
				}
				seen[n] = true
				load[n]++
			}
		}
		total := int(tc.partitions) * tc.replicas
		for _, n := range nodes {
			if l := load[n]; l < total/len(nodes) || l > (total+len(nodes)-1)/len(nodes) {
				t.Errorf("%+v: %s hosts %d of %d replicas on %d nodes", tc, n, l, total, len(nodes))
			}
		}
		// The order the nodes come in does not matter.
		again, _ := Place([]string{"n5", "n4", "n3", "n2", "n1"}, tc.partitions, tc.replicas)
		if !reflect.DeepEqual(got, again) {
			t.Fatalf("%+v: placement depends on the order of the nodes", tc)
		}
	}
	for _, bad := range []struct {
		nodes      []string
		partitions uint32
		replicas   int
	}{{nil, 4, 1}, {[]string{"a", ""}, 4, 1}, {[]string{"a", "a"}, 4, 1}, {[]string{"a"}, 0, 1}, {[]string{"a", "b"}, 4, 3}, {[]string{"a"}, 4, 0}} {
		if _, err := Place(bad.nodes, bad.partitions, bad.replicas); !errors.Is(err, ErrPlacement) {
			t.Errorf("Place(%v, %d, %d) = %v, want ErrPlacement", bad.nodes, bad.partitions, bad.replicas, err)
		}
	}
}
