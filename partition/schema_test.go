package partition

import (
	"errors"
	"slices"
	"testing"

	"github.com/rejoin-db/rejoin/wire"
)

func TestSchemaValidate(t *testing.T) {
	cols := func(n int) []Column {
		c := make([]Column, n)
		for i := range c {
			c[i] = Column{Name: string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676)), Type: wire.TypeInt64}
		}
		return c
	}
	for _, tc := range []struct {
		name string
		s    Schema
		ok   bool
	}{
		{"ok", kvSchema(), true},
		{"ok composite key", compSchema(), true},
		{"ok widest", Schema{Name: "w", Columns: cols(wire.TupleFieldsMax), Key: []int{wire.TupleFieldsMax - 1}}, true},
		{"no name", Schema{Columns: cols(1), Key: []int{0}}, false},
		{"no columns", Schema{Name: "t", Key: []int{0}}, false},
		{"too many columns", Schema{Name: "t", Columns: cols(wire.TupleFieldsMax + 1), Key: []int{0}}, false},
		{"unnamed column", Schema{Name: "t", Columns: []Column{{"", wire.TypeInt64}}, Key: []int{0}}, false},
		{"duplicate column", Schema{Name: "t", Columns: []Column{{"a", wire.TypeInt64}, {"a", wire.TypeString}}, Key: []int{0}}, false},
		{"invalid type", Schema{Name: "t", Columns: []Column{{"a", 0}}, Key: []int{0}}, false},
		{"unknown type", Schema{Name: "t", Columns: []Column{{"a", 9}}, Key: []int{0}}, false},
		{"no key", Schema{Name: "t", Columns: cols(2)}, false},
		{"key out of range", Schema{Name: "t", Columns: cols(2), Key: []int{2}}, false},
		{"negative key", Schema{Name: "t", Columns: cols(2), Key: []int{-1}}, false},
		{"repeated key", Schema{Name: "t", Columns: cols(2), Key: []int{1, 1}}, false},
	} {
		err := tc.s.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v", tc.name, err)
		}
		if err != nil && !errors.Is(err, ErrInvalidSchema) {
			t.Errorf("%s: %v is not ErrInvalidSchema", tc.name, err)
		}
	}
	if got := compSchema().Types(); !slices.Equal(got, []wire.Type{wire.TypeBytes, wire.TypeInt64, wire.TypeFloat64, wire.TypeString}) {
		t.Errorf("Types() = %v", got)
	}
	if !kvSchema().keyIsPrefix() || compSchema().keyIsPrefix() {
		t.Error("keyIsPrefix is wrong")
	}
}

// A wide table whose key is its last column: the index has to skip many
// fields to find the key, and tuple headers are 3 bytes.
func TestWideTable(t *testing.T) {
	const n = 40
	s := Schema{Name: "wide", Key: []int{n - 1, 0}}
	for i := range n {
		s.Columns = append(s.Columns, Column{Name: string(rune('A' + i)), Type: wire.TypeString})
	}
	_, tab := newTestTable(t, s)
	row := func(k int) []wire.Value {
		r := make([]wire.Value, n)
		for i := range r {
			r[i] = wire.String(string(rune('a' + (k+i)%26)))
		}
		r[n-1] = wire.String(string(rune('a'+k%26)) + string(rune('a'+k/26)))
		return r
	}
	for k := range 300 {
		if _, err := tab.Insert(row(k)); err != nil {
			t.Fatal(err)
		}
	}
	for k := range 300 {
		r := row(k)
		if s, ok := tab.LookupValues([]wire.Value{r[n-1], r[0]}); !ok || s != Slot(k) {
			t.Fatalf("key %d: slot %d, %v", k, s, ok)
		}
	}
	if _, err := tab.Insert(row(7)); !errors.Is(err, ErrDuplicateKey) {
		t.Fatalf("duplicate: %v", err)
	}
	mustVerify(t, tab)
}
