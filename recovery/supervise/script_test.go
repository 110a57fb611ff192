package supervise

import (
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
)

// TestDecideScripts runs the scenario scripts of testdata/decide/*.txt
// against Decide, without etcd: each command changes the snapshot as a
// node, an executor or etcd would, and decide prints the actions of a
// pass. Commands:
//
//	node id=<n> [max=<outgoing>] [status=not-responding]
//	kill id=<n>                          the node's lease is gone
//	replica p=<P> node=<n> state=<live|needs-rejoin>
//	task p=<P> dest=<D> opened=<rev>     a pending task
//	claim p=<P> dest=<D> epoch=<e>       an executor claims it
//	unclaim p=<P> dest=<D>               the claim key goes (expiry)
//	start p=<P> dest=<D> epoch=<e>       the record goes to running
//	done p=<P> dest=<D>
//	decline p=<P> dest=<D>               the current source refuses
//	decide now=<dur> [max=<n>]           one pass at t0+now
//	apply                                write the last pass's actions
func TestDecideScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/decide", func(t *testing.T, path string) {
		s := Snapshot{Nodes: map[string]NodeRecord{}, Replicas: map[uint32][]Replica{},
			Claims: map[claim.Task]uint64{}, Assignments: map[claim.Task]Assignment{}}
		var last []Action
		var rev int64 = 1000 // stands for etcd's ModRevision of writes
		taskOf := func(d *datadriven.TestData) (claim.Task, int) {
			var p uint64
			var dest string
			d.ScanArgs(t, "p", &p)
			d.ScanArgs(t, "dest", &dest)
			task := claim.Task{Partition: uint32(p), Dest: dest}
			for i, tr := range s.Tasks {
				if tr.Task == task {
					return task, i
				}
			}
			return task, -1
		}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "node":
				var id, status string
				var max int
				d.ScanArgs(t, "id", &id)
				d.MaybeScanArgs(t, "max", &max)
				d.MaybeScanArgs(t, "status", &status)
				st := NodeReady
				if status != "" {
					st = NodeStatus(status)
				}
				s.Nodes[id] = NodeRecord{ID: id, Status: st, OutgoingMax: max, LastActive: t0}
			case "kill":
				var id string
				d.ScanArgs(t, "id", &id)
				delete(s.Nodes, id)
			case "replica":
				var p uint64
				var node, state string
				d.ScanArgs(t, "p", &p)
				d.ScanArgs(t, "node", &node)
				d.ScanArgs(t, "state", &state)
				var st recovery.ReplicaState
				if err := st.UnmarshalText([]byte(state)); err != nil {
					d.Fatalf(t, "%v", err)
				}
				s.Replicas[uint32(p)] = append(s.Replicas[uint32(p)], Replica{Partition: uint32(p), Node: node, State: st})
			case "task":
				task, _ := taskOf(d)
				var opened uint64
				d.ScanArgs(t, "opened", &opened)
				s.Tasks = append(s.Tasks, claim.TaskRecord{Task: task, Record: claim.Record{Status: claim.StatusPending, Opened: opened}})
			case "claim":
				task, _ := taskOf(d)
				var epoch uint64
				d.ScanArgs(t, "epoch", &epoch)
				s.Claims[task] = epoch
			case "unclaim":
				task, _ := taskOf(d)
				delete(s.Claims, task)
			case "start":
				_, i := taskOf(d)
				var epoch uint64
				d.ScanArgs(t, "epoch", &epoch)
				r := &s.Tasks[i].Record
				r.Status, r.Epoch, r.Executor = claim.StatusRunning, epoch, "x"
				r.Attempts++
			case "done":
				_, i := taskOf(d)
				s.Tasks[i].Status = claim.StatusDone
			case "decline":
				task, _ := taskOf(d)
				a := s.Assignments[task]
				a.Declined = append(a.Declined, a.Source)
				rev++
				a.ModRevision = rev
				s.Assignments[task] = a
			case "decide":
				var now time.Duration
				var nowArg string
				d.ScanArgs(t, "now", &nowArg)
				now, err := time.ParseDuration(nowArg)
				if err != nil {
					t.Fatal(err)
				}
				lim := Limits{PassActionsMax: 16, ClaimWithin: 10 * time.Second}
				d.MaybeScanArgs(t, "max", &lim.PassActionsMax)
				last = Decide(s, t0.Add(now), lim)
				if len(last) == 0 {
					return "(none)\n"
				}
				return show(last)
			case "apply":
				var b strings.Builder
				for _, a := range last {
					switch a.Kind {
					case ActAssign:
						rev++
						na := a.Assignment
						na.ModRevision = rev
						s.Assignments[a.Task] = na
						if a.RevokeEpoch != 0 && s.Claims[a.Task] == a.RevokeEpoch {
							delete(s.Claims, a.Task)
							b.WriteString("revoked claim of " + a.Task.String() + "\n")
						}
					case ActUnassign:
						delete(s.Assignments, a.Task)
					}
				}
				last = nil
				return b.String()
			default:
				t.Fatalf("unknown command %q", d.Cmd)
			}
			return ""
		})
	})
}
