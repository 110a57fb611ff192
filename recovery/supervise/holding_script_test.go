package supervise

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/rejoin-db/rejoin/recovery/claim"
)

// TestHoldingScripts runs the scenario scripts of testdata/holding/*.txt
// against the attempt core: a driver's answers as commands, and what the
// Holding asked since the last command, one action a line, then its state
// (and its outcome once released). Every command may give the tick it
// happens at (t=<n>); the tick stays where it was otherwise. Commands:
//
//	new [grace=<n>] [hold=<n>] [redial=<n>] [retry=<n>]  the claim acquired
//	task-started [err=<text>]
//	connected [err=<text>]
//	source-started [err=<text>]
//	broke
//	tick [holds]                   holds: the source holds its partition
//	claim-lost why=<text>
//	source-ended [err=<text>]      no err: the source is done
//	stop
//	finished [err=<text>|err=final] final: claim.ErrTaskFinal
func TestHoldingScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/holding", func(t *testing.T, path string) {
		var h *Holding
		var now int64
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			d.MaybeScanArgs(t, "t", &now)
			errArg := func() error {
				var text string
				d.MaybeScanArgs(t, "err", &text)
				switch text {
				case "":
					return nil
				case "final":
					return fmt.Errorf("requeue: %w", claim.ErrTaskFinal)
				}
				return errors.New(text)
			}
			if d.Cmd != "new" && h == nil {
				d.Fatalf(t, "%s before new", d.Cmd)
			}
			switch d.Cmd {
			case "new":
				cfg := HoldingConfig{ResumeGrace: 50, BrokenHoldMax: 10, RedialEvery: 2, RetryAfter: 5}
				d.MaybeScanArgs(t, "grace", &cfg.ResumeGrace)
				d.MaybeScanArgs(t, "hold", &cfg.BrokenHoldMax)
				d.MaybeScanArgs(t, "redial", &cfg.RedialEvery)
				d.MaybeScanArgs(t, "retry", &cfg.RetryAfter)
				var err error
				if h, err = NewHolding(cfg, now); err != nil {
					return err.Error()
				}
			case "task-started":
				h.TaskStarted(now, errArg())
			case "connected":
				h.Connected(now, errArg())
			case "source-started":
				h.SourceStarted(now, errArg())
			case "broke":
				h.Broke(now)
			case "tick":
				h.Tick(now, d.HasArg("holds"))
			case "claim-lost":
				var why string
				d.ScanArgs(t, "why", &why)
				h.ClaimLost(now, why)
			case "source-ended":
				h.SourceEnded(now, errArg())
			case "stop":
				h.Stop(now)
			case "finished":
				h.Finished(now, errArg())
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			var b strings.Builder
			for _, a := range h.Outbox() {
				fmt.Fprintln(&b, a)
			}
			fmt.Fprintf(&b, "-> %s", h.State())
			if h.Released() {
				fmt.Fprintf(&b, " (%s)", h.Outcome())
			}
			return b.String()
		})
	})
}

// TestHoldingConfig: timing out of range is refused, with ErrConfig.
func TestHoldingConfig(t *testing.T) {
	for _, cfg := range []HoldingConfig{
		{RedialEvery: 0},
		{RedialEvery: 1, ResumeGrace: -1},
		{RedialEvery: 1, BrokenHoldMax: -1},
		{RedialEvery: 1, RetryAfter: -1},
	} {
		if _, err := NewHolding(cfg, 0); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: err %v, want ErrConfig", cfg, err)
		}
	}
}

// TestHoldingRun: answers fed back from inside Run are worked in the same
// call, to the attempt's end. A driver that worked one batch of the
// outbox and then looked at Released never released its claim, nor
// retried, after a failed first dial (recovery/node's first driver did).
func TestHoldingRun(t *testing.T) {
	h, err := NewHolding(HoldingConfig{RedialEvery: 1, RetryAfter: 3}, 10)
	if err != nil {
		t.Fatal(err)
	}
	var did []string
	h.Run(func(a HoldAction) {
		did = append(did, a.String())
		switch a.Kind {
		case HoldStartTask:
			h.TaskStarted(10, nil)
		case HoldDial:
			h.Connected(11, errors.New("refused"))
		case HoldRequeue:
			h.Finished(12, nil)
		}
	})
	want := "start-task, dial, requeue: no connection to the destination: refused, release, retry at 15"
	if got := strings.Join(did, ", "); got != want || !h.Released() || h.Outcome() != HoldRequeued {
		t.Fatalf("did %q (released %v, %s), want %q", got, h.Released(), h.Outcome(), want)
	}
	if acts := h.Outbox(); len(acts) != 0 {
		t.Fatalf("left in the outbox: %v", acts)
	}
}
