package chaos

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// regInput is a register op as the model sees it.
type regInput struct {
	write bool
	value string
}

// registerModel is a single register whose initial value is "" (no row):
// a write sets it, a read must return it.
var registerModel = porcupine.Model{
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		in := input.(regInput)
		if in.write {
			return true, in.value
		}
		return output.(string) == state.(string), state
	},
	Equal: func(a, b any) bool { return a.(string) == b.(string) },
	DescribeOperation: func(input, output any) string {
		in := input.(regInput)
		if in.write {
			return fmt.Sprintf("write %q", in.value)
		}
		return fmt.Sprintf("read %q", output)
	},
	DescribeState: func(state any) string { return fmt.Sprintf("%q", state) },
}

// KeyResult is the linearizability check of one register's history.
type KeyResult struct {
	Key string `json:"key"`
	// Result is porcupine's: Ok, Illegal, or Unknown (the check ran out
	// of time: no verdict).
	Result string `json:"result"`
	Ops    int    `json:"ops"`
	// History lists the key's ops by call time (with an Illegal result).
	History []string `json:"history,omitempty"`
	// Suspect is the index in History of the first op (by call time)
	// that porcupine's longest partial linearization leaves out: where
	// to start reading. -1 if none stands out.
	Suspect int `json:"suspect"`
	// Visualization is porcupine's HTML page of the history (Illegal).
	Visualization string `json:"visualization,omitempty"`
}

// checkTimeout bounds porcupine's search on one register.
const checkTimeout = 60 * time.Second

// historiesOf turns the recorded ops into one porcupine history per
// register. Failed ops did not happen and are left out; an uncertain write
// is open-ended (its return after every other op, as Jepsen takes an
// :info op), an uncertain read, which changed nothing, is left out.
func historiesOf(ops []Op, keys int) ([][]porcupine.Operation, [][]Op) {
	var end int64
	for _, o := range ops {
		end = max(end, o.Return, o.Call)
	}
	end += int64(time.Second)
	hist := make([][]porcupine.Operation, keys)
	kept := make([][]Op, keys)
	// Jepsen gives a caller a new process after an :info op, whose call
	// may still be in flight: porcupine's visualisation needs a lane per
	// process.
	lane := map[int]int{}
	nextLane := 0
	laneOf := func(caller int) int {
		l, ok := lane[caller]
		if !ok {
			l = nextLane
			nextLane++
			lane[caller] = l
		}
		return l
	}
	for _, o := range ops {
		if o.Key < 0 || o.Key >= keys || o.Outcome == Failed || (o.Outcome == Uncertain && !o.Write) {
			continue
		}
		po := porcupine.Operation{ClientId: laneOf(o.Caller), Input: regInput{write: o.Write, value: o.Value}, Call: o.Call, Return: o.Return}
		if !o.Write {
			po.Output = o.Value
		} else {
			po.Output = ""
		}
		if o.Outcome == Uncertain {
			po.Return = end
			delete(lane, o.Caller)
		}
		hist[o.Key] = append(hist[o.Key], po)
		kept[o.Key] = append(kept[o.Key], o)
	}
	return hist, kept
}

// checkRegisters checks each register's history; it writes porcupine's
// visualisation of a register that is not linearizable into dir.
func checkRegisters(ops []Op, keys int, dir string) ([]KeyResult, error) {
	hist, kept := historiesOf(ops, keys)
	var out []KeyResult
	for k := range keys {
		res, info := porcupine.CheckOperationsVerbose(registerModel, hist[k], checkTimeout)
		kr := KeyResult{Key: RegisterKey(k), Result: string(res), Ops: len(hist[k])}
		if res == porcupine.Illegal {
			order := make([]int, len(kept[k]))
			for i := range order {
				order[i] = i
			}
			slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(kept[k][a].Call, kept[k][b].Call) })
			for _, i := range order {
				kr.History = append(kr.History, kept[k][i].String())
			}
			kr.Suspect = stuckAt(info, order)
			kr.Visualization = filepath.Join(dir, "linearizability-"+kr.Key+".html")
			if err := porcupine.VisualizePath(registerModel, info, kr.Visualization); err != nil {
				return out, fmt.Errorf("chaos: visualise %s: %w", kr.Key, err)
			}
		}
		out = append(out, kr)
	}
	return out, nil
}

// stuckAt is the index in the call-ordered history (order: history
// indices by call time) of the first op porcupine's longest partial
// linearization leaves out: the op no order of the ones before it can
// explain. -1 if it left none out. A rule of thumb on reads alone misses
// the case that matters most, a read of an uncertain write followed by
// a read of the value before it (rejoin chaos --seed 406596625: it
// pointed 500 ops past the violation).
func stuckAt(info porcupine.LinearizationInfo, order []int) int {
	var longest []int
	for _, part := range info.PartialLinearizations() {
		for _, lin := range part {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
	}
	in := make(map[int]bool, len(longest))
	for _, i := range longest {
		in[i] = true
	}
	for at, i := range order {
		if !in[i] {
			return at
		}
	}
	return -1
}
