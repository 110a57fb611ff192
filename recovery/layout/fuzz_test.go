package layout

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// FuzzParse feeds parse, the decoding of what Read finds under Key, any
// bytes. It must refuse with a clear error and the zero Config, or give a
// config that validates, whose tables convert to schemas and back
// (Table.Schema, TableOf), and that survives its own re-encoding
// (json.Marshal, as Init writes it). encoding/json takes more than one
// spelling of a config (field names in any case, unknown fields,
// whitespace), so what round-trips is the Config, not the bytes. Seeds
// live in testdata/fuzz/FuzzParse/.
//
//	go test -run='^$' -fuzz='^FuzzParse$' -fuzztime=250000x ./recovery/layout/
func FuzzParse(f *testing.F) {
	kv, err := json.Marshal(Config{Partitions: 4, Replicas: 2, Tables: []Table{KV()}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(kv)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parse(b)
		if err != nil {
			if !errors.Is(err, ErrConfig) && !strings.HasPrefix(err.Error(), "layout: "+Key+": ") {
				t.Fatalf("unclassified error: %v", err)
			}
			if !reflect.DeepEqual(c, Config{}) {
				t.Fatalf("error %v with config %+v", err, c)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted config fails Validate: %v", err)
		}
		for _, tbl := range c.Tables {
			s, err := tbl.Schema()
			if err != nil {
				t.Fatalf("table %q of an accepted config: %v", tbl.Name, err)
			}
			if back := TableOf(s); !reflect.DeepEqual(back, tbl) {
				t.Fatalf("table %+v comes back from its schema as %+v", tbl, back)
			}
		}
		again, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("re-encoding %+v: %v", c, err)
		}
		c2, err := parse(again)
		if err != nil || !reflect.DeepEqual(c, c2) {
			t.Fatalf("round trip through %s: %+v became %+v, %v", again, c, c2, err)
		}
	})
}
