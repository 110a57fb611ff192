package chaos

import (
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
	// Suspect is the index in History of the first read that returned
	// neither the last value acknowledged before it nor one written
	// concurrently: where to start reading. -1 if none stands out.
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
			sorted := slices.Clone(kept[k])
			slices.SortStableFunc(sorted, func(a, b Op) int { return int(a.Call - b.Call) })
			for _, o := range sorted {
				kr.History = append(kr.History, o.String())
			}
			kr.Suspect = firstSuspect(sorted)
			kr.Visualization = filepath.Join(dir, "linearizability-"+kr.Key+".html")
			if err := porcupine.VisualizePath(registerModel, info, kr.Visualization); err != nil {
				return out, fmt.Errorf("chaos: visualise %s: %w", kr.Key, err)
			}
		}
		out = append(out, kr)
	}
	return out, nil
}

// firstSuspect returns the index of the first ok read in ops (sorted by
// call time) whose value no write could explain: not the value of the
// latest ok write that returned before the read's call, nor of a write
// invoked before the read returned that is uncertain or returned after
// that latest write. -1 if none.
func firstSuspect(ops []Op) int {
	for i, rd := range ops {
		if rd.Write || rd.Outcome != OK {
			continue
		}
		var last *Op
		for j := range ops {
			w := &ops[j]
			if w.Write && w.Outcome == OK && w.Return < rd.Call && (last == nil || w.Return > last.Return) {
				last = w
			}
		}
		explained := (last == nil && rd.Value == "") || (last != nil && last.Value == rd.Value)
		for j := range ops {
			w := ops[j]
			if explained || !w.Write || w.Call > rd.Return || w.Outcome == Failed {
				continue
			}
			if w.Value == rd.Value && (w.Outcome == Uncertain || last == nil || w.Return > last.Return || w.Return >= rd.Call) {
				explained = true
			}
		}
		if !explained {
			return i
		}
	}
	return -1
}
