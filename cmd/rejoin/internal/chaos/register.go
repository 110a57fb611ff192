package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/wire"
)

// Outcome is how an operation of the register workload ended.
type Outcome string

// The outcomes, as Jepsen names them :ok, :fail and :info.
const (
	// OK: the call was answered with success.
	OK Outcome = "ok"
	// Failed: the call definitely did not take effect (the node answered
	// with an error, or it was never sent).
	Failed Outcome = "failed"
	// Uncertain: the call may or may not have taken effect (no answer, a
	// timeout, an answer that says the outcome is unknown).
	Uncertain Outcome = "uncertain"
)

// Op is one operation of the register workload: a write of a unique value
// or a read of one register. Call and Return are nanoseconds from the
// workload's start; an uncertain op's Return is meaningless (the checker
// takes it as open-ended).
type Op struct {
	Key     int     `json:"key"`
	Caller  int     `json:"caller"`
	Write   bool    `json:"write"`
	Value   string  `json:"value"` // written, or read ("" for no row)
	Call    int64   `json:"call_ns"`
	Return  int64   `json:"return_ns"`
	Outcome Outcome `json:"outcome"`
	Err     string  `json:"err,omitempty"`
	// Node is the node the call went to; Txn the txn ID it ran as, when
	// answered: where and in which order each op ran, for a history that
	// is not linearizable.
	Node string `json:"node,omitempty"`
	Txn  string `json:"txn,omitempty"`
}

func (o Op) String() string {
	v := o.Value
	if v == "" {
		v = "<none>"
	}
	verb := "read"
	if o.Write {
		verb = "write"
	}
	s := fmt.Sprintf("caller %d %s %s [%.3fs", o.Caller, verb, v, float64(o.Call)/1e9)
	if o.Outcome == Uncertain {
		s += ", open)"
	} else {
		s += fmt.Sprintf(", %.3fs]", float64(o.Return)/1e9)
	}
	s += " " + string(o.Outcome)
	if o.Node != "" {
		s += " via " + o.Node
	}
	if o.Txn != "" {
		s += " as " + o.Txn
	}
	if o.Err != "" {
		s += ": " + o.Err
	}
	return s
}

// registerTable is where the registers live: rows of table kv (layout.KV)
// whose keys RegisterKey makes, apart from the volume writer's.
const registerTable = "kv"

// RegisterKey is the row key of register i.
func RegisterKey(i int) string { return fmt.Sprintf("chaos-register-%03d", i) }

// registers runs the register workload: callers doing writes of unique
// values and reads on a few registers, every op recorded.
type registers struct {
	c      *lanes
	keys   int
	start  time.Time
	mu     sync.Mutex
	ops    []Op
	opsMax int
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// opPause spaces a caller's ops, keeping the histories small enough for
// the linearizability check.
const (
	opPauseMax = 40 * time.Millisecond
	// registerOpsMax bounds the recorded ops (about 25 ops/s per caller).
	registerOpsMax = 400_000
)

// startRegisters starts callers callers on keys registers through c.
// Each caller follows its writes with a read of the same register, so a
// lost acknowledged write is seen by the next read unless another write
// overtakes it.
func startRegisters(ctx context.Context, c *lanes, keys, callers int, seed int64) *registers {
	rg := &registers{c: c, keys: keys, start: time.Now(), opsMax: registerOpsMax}
	ctx, rg.cancel = context.WithCancel(ctx)
	for i := range callers {
		rng := rand.New(rand.NewPCG(uint64(seed), uint64(i)+1))
		rg.wg.Go(func() { rg.caller(ctx, i, rng) })
	}
	return rg
}

func (rg *registers) caller(ctx context.Context, id int, rng *rand.Rand) {
	seq := 0
	readNext := -1
	for ctx.Err() == nil {
		key, write := readNext, false
		readNext = -1
		if key < 0 {
			key, write = rng.IntN(rg.keys), rng.IntN(2) == 0
		}
		var op Op
		if write {
			seq++
			op = rg.write(ctx, id, key, fmt.Sprintf("c%d-%d", id, seq))
			readNext = key
		} else {
			op = rg.read(ctx, id, key)
		}
		if ctx.Err() != nil && op.Outcome != OK {
			// Cut short by the end of the workload, not by the cluster:
			// a write may still have been sent, so it stays (uncertain);
			// a read has no effect and goes.
			if !write {
				return
			}
			op.Outcome, op.Err = Uncertain, "the workload ended before the answer"
		}
		if !rg.record(op) {
			return
		}
		if !sleepCtx(ctx, time.Duration(rng.Int64N(int64(opPauseMax)))) {
			return
		}
	}
}

func (rg *registers) now() int64 { return int64(time.Since(rg.start)) }

func (rg *registers) write(ctx context.Context, caller, key int, value string) Op {
	op := Op{Key: key, Caller: caller, Write: true, Value: value, Call: rg.now()}
	res, err := rg.c.upsert(ctx, registerTable, []byte(RegisterKey(key)), []byte(value))
	op.Return = rg.now()
	op.Outcome, op.Err = classify(err)
	op.Node = res.Node
	if err == nil {
		op.Txn = res.ID.String()
	}
	return op
}

func (rg *registers) read(ctx context.Context, caller, key int) Op {
	op := Op{Key: key, Caller: caller, Call: rg.now()}
	res, err := rg.c.read(ctx, registerTable, []byte(RegisterKey(key)))
	op.Return = rg.now()
	op.Node = res.Node
	if err == nil {
		op.Txn = res.ID.String()
	}
	row := res.Out
	switch {
	case err == nil && len(row) == 2 && row[1].Type == wire.TypeBytes:
		op.Outcome, op.Value = OK, string(row[1].Bytes)
	case err == nil:
		op.Outcome, op.Err = Uncertain, fmt.Sprintf("unexpected row %v", row)
	case isNotFound(err):
		op.Outcome = OK // the register was never written: its initial value
	default:
		op.Outcome, op.Err = classify(err)
	}
	return op
}

func isNotFound(err error) bool { return errors.Is(err, client.ErrNotFound) }

// classify maps a call's error to its outcome: only the client's
// "definitely not" answers fail; everything else may have happened.
func classify(err error) (Outcome, string) {
	switch {
	case err == nil:
		return OK, ""
	case errors.Is(err, client.ErrUncertain):
		return Uncertain, err.Error()
	case errors.Is(err, client.ErrProcedure), errors.Is(err, client.ErrNoNode), errors.Is(err, client.ErrClosed),
		errors.Is(err, client.ErrRefused), errors.Is(err, client.ErrInvalid):
		return Failed, err.Error()
	case strings.Contains(err.Error(), " not sent: "):
		return Failed, err.Error()
	}
	return Uncertain, err.Error()
}

func (rg *registers) record(op Op) bool {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	if len(rg.ops) >= rg.opsMax {
		return false
	}
	rg.ops = append(rg.ops, op)
	return true
}

// stop ends the callers and returns every recorded op.
func (rg *registers) stop() []Op {
	rg.cancel()
	rg.wg.Wait()
	rg.mu.Lock()
	defer rg.mu.Unlock()
	return rg.ops
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
