package chaos

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/rejoin-db/rejoin/recovery/client"
)

// op builds a register op of key 0; times in ms.
func op(caller int, write bool, value string, call, ret int64, out Outcome) Op {
	return Op{Caller: caller, Write: write, Value: value, Call: call * 1e6, Return: ret * 1e6, Outcome: out}
}

func TestCheckRegisters(t *testing.T) {
	tests := []struct {
		name    string
		ops     []Op
		want    string
		suspect int
	}{
		{name: "sequential", want: "Ok", suspect: -1, ops: []Op{
			op(0, false, "", 0, 1, OK), op(0, true, "a", 2, 3, OK), op(1, false, "a", 4, 5, OK)}},
		{name: "stale read after an acknowledged write", want: "Illegal", suspect: 2, ops: []Op{
			op(0, true, "a", 0, 1, OK), op(0, true, "b", 2, 3, OK), op(1, false, "a", 4, 5, OK)}},
		{name: "a read of a concurrent write", want: "Ok", suspect: -1, ops: []Op{
			op(0, true, "a", 0, 1, OK), op(0, true, "b", 2, 10, OK), op(1, false, "b", 4, 5, OK), op(1, false, "b", 6, 7, OK)}},
		// Each read alone has a write to explain it; no order explains
		// the second after the first.
		{name: "flip back to the older value", want: "Illegal", suspect: 3, ops: []Op{
			op(0, true, "a", 0, 1, OK), op(0, true, "b", 2, 10, OK), op(1, false, "b", 4, 5, OK), op(1, false, "a", 6, 7, OK)}},
		// An uncertain write read back, then the value before it
		// (rejoin chaos --seed 406596625, register 006).
		{name: "an uncertain write read back, then lost", want: "Illegal", suspect: 3, ops: []Op{
			op(0, true, "a", 0, 1, OK), op(1, true, "b", 2, 3, Uncertain), op(2, false, "b", 4, 5, OK), op(3, false, "a", 6, 7, OK),
			op(0, true, "c", 8, 9, OK), op(0, false, "c", 10, 11, OK)}},
		{name: "an uncertain write seen much later", want: "Ok", suspect: -1, ops: []Op{
			op(0, true, "a", 0, 1, Uncertain), op(1, false, "", 2, 3, OK), op(1, false, "a", 50, 51, OK)}},
		// The history leaves the failed write out: the read is op 0.
		{name: "a failed write did not happen", want: "Illegal", suspect: 0, ops: []Op{
			op(0, true, "a", 0, 1, Failed), op(1, false, "a", 2, 3, OK)}},
		{name: "an uncertain read is left out", want: "Ok", suspect: -1, ops: []Op{
			op(0, true, "a", 0, 1, OK), op(1, false, "zzz", 2, 3, Uncertain)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			res, err := checkRegisters(tt.ops, 1, dir)
			if err != nil {
				t.Fatal(err)
			}
			got := res[0]
			if got.Result != tt.want || got.Key != RegisterKey(0) {
				t.Fatalf("%s: %s, want %s", got.Key, got.Result, tt.want)
			}
			if tt.want != "Illegal" {
				if got.Visualization != "" || got.History != nil {
					t.Fatalf("a linearizable register got a visualisation %q and history %q", got.Visualization, got.History)
				}
				return
			}
			if got.Suspect != tt.suspect {
				t.Fatalf("suspect %d, want %d in %q", got.Suspect, tt.suspect, got.History)
			}
			if fi, err := os.Stat(got.Visualization); err != nil || fi.Size() == 0 {
				t.Fatalf("visualisation %q: %v", got.Visualization, err)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want Outcome
	}{
		{nil, OK},
		{errUncertainForTest, Uncertain},
		{errProcedureForTest, Failed},
		{errOtherForTest, Uncertain},
	} {
		if got, _ := classify(tt.err); got != tt.want {
			t.Errorf("classify(%v) = %s, want %s", tt.err, got, tt.want)
		}
	}
}

var (
	errUncertainForTest = fmt.Errorf("%w: upsert via node n1: no live replica answered", client.ErrUncertain)
	errProcedureForTest = fmt.Errorf("%w: upsert: partition 3 has no live replica", client.ErrProcedure)
	errOtherForTest     = errors.New("something the client did not classify")
)
