package clusterview

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/rejoin-db/rejoin/txnid"
)

// Render prints the view as three tables: nodes, replicas by partition,
// rejoin tasks.
func Render(w io.Writer, v View) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(v.Down) > 0 {
		fmt.Fprintf(tw, "NODES (%d registered, %d down)\n", len(v.Nodes), len(v.Down))
	} else {
		fmt.Fprintf(tw, "NODES (%d registered)\n", len(v.Nodes))
	}
	fmt.Fprintln(tw, "ID\tTCP\tHTTP\tSTATUS\tSTARTED\tLAST ACTIVE")
	for _, n := range v.Nodes {
		status := n.Status
		if n.StatusErr != "" {
			status += " (no /status: " + n.StatusErr + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.ID, n.Addr, dash(n.HTTP), status,
			stamp(n.Started), age(v.Read, n.LastActive))
	}
	for _, d := range v.Down {
		fmt.Fprintf(tw, "%s\t-\t-\tDOWN (not registered; holds %d replicas)\t-\t-\n", d.ID, d.Replicas)
	}
	fmt.Fprintln(tw)

	fmt.Fprintf(tw, "REPLICAS (%d)\n", len(v.Replicas))
	fmt.Fprintln(tw, "PARTITION\tNODE\tPLACEMENT\tSTATE\tROWS\tDIGEST\tLAST TXN")
	for _, r := range v.Replicas {
		state, rows, digest, last := "-", "-", "-", "-"
		switch {
		case !r.Alive:
			state = "failed (node down)"
		case r.Reported:
			state, rows, digest = r.State.String(), fmt.Sprint(r.Rows), fmt.Sprintf("%016x", r.Digest)
			if r.Settling {
				state += " (settling)"
			}
			if r.LastExecuted != 0 {
				last = txnid.ID(r.LastExecuted).String()
			}
		default:
			state = "?"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Partition, r.Node, r.Placement, state, rows, digest, last)
	}
	fmt.Fprintln(tw)

	var held []ReplicaRow
	for _, r := range v.Replicas {
		if r.Held != "" {
			held = append(held, r)
		}
	}
	if len(held) > 0 {
		fmt.Fprintf(tw, "HELD (%d: no other replica live; each answers again once one that holds what it missed comes back, or after rejoin accept-loss PARTITION)\n", len(held))
		fmt.Fprintln(tw, "PARTITION\tNODE\tWHY")
		for _, r := range held {
			fmt.Fprintf(tw, "%d\t%s\t%s\n", r.Partition, r.Node, r.Held)
		}
		fmt.Fprintln(tw)
	}
	if len(v.Losses) > 0 {
		fmt.Fprintf(tw, "LOSSES (%d accepted: each partition lacks what its held replica missed)\n", len(v.Losses))
		fmt.Fprintln(tw, "PARTITION\tNODE\tACCEPTED\tWHAT IT MISSED")
		for _, l := range v.Losses {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", l.Partition, l.Node, stamp(l.At), l.Held)
		}
		fmt.Fprintln(tw)
	}

	if len(v.Moves) > 0 {
		fmt.Fprintf(tw, "MOVES (%d under way: each new replica rebuilds, then the old one goes)\n", len(v.Moves))
		fmt.Fprintln(tw, "PARTITION\tFROM\tTO\tNEW REPLICA\tSTARTED")
		for _, m := range v.Moves {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", m.Partition, m.From, m.To, m.ToState, age(v.Read, m.Started))
		}
		fmt.Fprintln(tw)
	}

	fmt.Fprintf(tw, "REJOIN TASKS (%d)\n", len(v.Tasks))
	fmt.Fprintln(tw, "PARTITION\tDEST\tSOURCE\tSTATUS\tEPOCH\tATTEMPTS\tPHASE\tROWS\tMB\tPROGRESS")
	for _, t := range v.Tasks {
		phase := dash(t.Phase)
		if t.Held {
			phase += " (held)"
		}
		if t.Err != "" {
			phase += " err: " + t.Err
		}
		progress := "-"
		if p := t.Progress(); p >= 0 {
			progress = fmt.Sprintf("%.0f%%", p)
		}
		epoch := "-"
		if t.Epoch != 0 {
			epoch = fmt.Sprint(t.Epoch)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%.1f\t%s\n", t.Partition, t.Dest, dash(t.Source),
			t.Status, epoch, t.Attempts, phase, t.Rows, float64(t.Bytes)/1e6, progress)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05Z")
}

func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return now.Sub(t).Round(time.Millisecond).String() + " ago"
}
