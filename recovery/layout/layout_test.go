package layout

import (
	"errors"
	"slices"
	"testing"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/wire"
)

func TestTableOfSchemaRoundTrip(t *testing.T) {
	s := partition.Schema{Name: "acct", Columns: []partition.Column{
		{Name: "id", Type: wire.TypeInt64}, {Name: "owner", Type: wire.TypeString},
		{Name: "balance", Type: wire.TypeFloat64}, {Name: "blob", Type: wire.TypeBytes},
	}, Key: []int{0, 1}}
	got, err := TableOf(s).Schema()
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != s.Name || len(got.Columns) != 4 || len(got.Key) != 2 || got.Key[1] != 1 {
		t.Fatalf("round trip: %+v", got)
	}
	for i, c := range got.Columns {
		if c != s.Columns[i] {
			t.Fatalf("column %d: %+v, want %+v", i, c, s.Columns[i])
		}
	}
	if _, err := KV().Schema(); err != nil {
		t.Fatalf("KV: %v", err)
	}
}

func TestValidate(t *testing.T) {
	ok := Config{Partitions: 4, Replicas: 2, Tables: []Table{KV()}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := map[string]Config{
		"no partitions": {Partitions: 0, Replicas: 2, Tables: []Table{KV()}},
		"no replicas":   {Partitions: 4, Replicas: 0, Tables: []Table{KV()}},
		"no tables":     {Partitions: 4, Replicas: 2},
		"bad type":      {Partitions: 4, Replicas: 2, Tables: []Table{{Name: "t", Columns: []Column{{Name: "k", Type: "uuid"}}, Key: []int{0}}}},
		"bad key":       {Partitions: 4, Replicas: 2, Tables: []Table{{Name: "t", Columns: []Column{{Name: "k", Type: "bytes"}}, Key: []int{3}}}},
	}
	for name, c := range bad {
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}

func TestSequencerOrder(t *testing.T) {
	hs := []string{"n1", "n2", "n3"}
	for p, want := range map[uint32][]string{0: {"n1", "n2", "n3"}, 1: {"n2", "n3", "n1"}, 5: {"n3", "n1", "n2"}} {
		if got := SequencerOrder(p, hs); !slices.Equal(got, want) {
			t.Errorf("SequencerOrder(%d) = %v, want %v", p, got, want)
		}
	}
	if got := SequencerOrder(3, nil); len(got) != 0 {
		t.Errorf("no holders: %v", got)
	}
}
