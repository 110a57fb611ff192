package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/supervise"
)

const drainUsage = `usage: rejoin drain --etcd ENDPOINTS [flags] NODE

Moves every replica off a running node before a planned removal, while
writes go on. Each move adds a replica of the partition on the running
node with the fewest replicas that holds none of it; that node rebuilds
it by a rejoin (the same claims, fencing and supervision as a restart;
the drained node may be its source); once it is live, the drained node's
replica is removed in one etcd transaction that checks it, and the
drained node drops it. No partition ever has fewer live replicas than
before its move. When drain returns, stop the node, or give --stop:
drain then asks it to stop through etcd and waits until it has; it stops
as on SIGTERM, refusing new calls (its clients send them to other nodes)
and answering those in flight first.

While a move is under way it prints what the move waits for (the new
replica's rejoin task, or the partition's other replicas), when that
changes and every --say-every. A move whose new holder opens no rejoin
task within --stall is undone, and drain fails naming it.

An interrupted drain (Ctrl-C: exit status 130) says which moves are under
way and goes on where it stopped when run again; 'rejoin undo-move P'
takes back a move whose new replica is not live yet.

NODE is a node id: n3 or 3.

flags:
`

// moveFlags are the flags drain and rebalance share.
type moveFlags struct {
	etcd     *etcdFlags
	inFlight *int
	incoming *int
	timeout  *time.Duration
	every    *time.Duration
	stall    *time.Duration
	say      *time.Duration
}

func newMoveFlags(fs *flag.FlagSet) *moveFlags {
	etcd := newEtcdFlags(fs)
	newClientCertsFlags(fs, etcd, etcdCertsDirUsage, supervise.AdminClient)
	return &moveFlags{
		etcd:     etcd,
		inFlight: fs.Int("moves-max", supervise.MoveInFlightMaxDefault, "moves under way at once (1: one partition at a time)"),
		incoming: fs.Int("incoming-max", supervise.MoveIncomingMaxDefault, "moves under way onto one node at once"),
		timeout:  fs.Duration("timeout", 30*time.Minute, "bound of the whole command"),
		every:    fs.Duration("poll", 250*time.Millisecond, "how often the moves are looked at"),
		stall:    fs.Duration("stall", 2*time.Minute, "undo a move, and fail, whose new replica's node opens no rejoin task for it within this"),
		say:      fs.Duration("say-every", 10*time.Second, "how often what a move waits for is printed again while it does not change"),
	}
}

func (f *moveFlags) check() error {
	switch {
	case *f.inFlight < 1:
		return fmt.Errorf("--moves-max %d: want 1 or more", *f.inFlight)
	case *f.incoming < 1:
		return fmt.Errorf("--incoming-max %d: want 1 or more", *f.incoming)
	case *f.timeout <= 0:
		return fmt.Errorf("--timeout %s: want more than 0", *f.timeout)
	case *f.every <= 0:
		return fmt.Errorf("--poll %s: want more than 0", *f.every)
	case *f.stall <= 0:
		return fmt.Errorf("--stall %s: want more than 0", *f.stall)
	case *f.say <= 0:
		return fmt.Errorf("--say-every %s: want more than 0", *f.say)
	}
	return nil
}

func (f *moveFlags) limits() supervise.MoveLimits {
	return supervise.MoveLimits{InFlightMax: *f.inFlight, IncomingMax: *f.incoming}
}

// parseOneNode parses the flags and the one NODE argument among them:
// `drain n5 --etcd ...` is as good as `drain --etcd ... n5`.
func parseOneNode(fs *flag.FlagSet, name string, args []string, stderr io.Writer) (string, error) {
	pos, err := parseInterspersed(fs, name, "one NODE argument", args, 1, stderr)
	if err != nil {
		return "", err
	}
	id, err := parseNodeID("node", pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "rejoin %s: %v\n", name, err)
		return "", errUsage
	}
	return id, nil
}

func runDrain(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("drain", stderr)
	mf := newMoveFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, drainUsage)
		fs.PrintDefaults()
	}
	stop := fs.Bool("stop", false, "once the node holds nothing, ask it to stop gracefully (it refuses new calls, answers those in flight, and goes) and wait until it has")
	id, err := parseOneNode(fs, "drain", args, stderr)
	if err != nil {
		return err
	}
	if err := mf.check(); err != nil {
		fmt.Fprintf(stderr, "rejoin drain: %s\n", userMessage("drain", err, nil))
		return errUsage
	}
	lim := mf.limits()
	doneMsg := fmt.Sprintf("%s holds no replica: stop it (SIGTERM, or drain --stop)", id)
	var after func(context.Context, *clientv3.Client) error
	if *stop {
		doneMsg = fmt.Sprintf("%s holds no replica", id)
		after = func(ctx context.Context, cli *clientv3.Client) error { return stopNode(ctx, cli, id, *mf.say, stdout) }
	}
	return runMoves("drain", mf, stdout, stderr, func(s supervise.MoveState) ([]supervise.Move, bool, error) {
		return supervise.PlanDrain(s, id, lim)
	}, doneMsg, "rejoin drain "+id, after)
}

// stopNode asks node id's process to stop gracefully and waits until its
// registration is gone, saying so every say.
func stopNode(ctx context.Context, cli *clientv3.Client, id string, say time.Duration, stdout io.Writer) error {
	rec, ok, err := nodeRecord(ctx, cli, id)
	switch {
	case err != nil:
		return err
	case !ok:
		fmt.Fprintf(stdout, "stopped  %s: it is not running\n", id)
		return nil
	}
	if err := supervise.AskStop(ctx, cli, rec); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "stopping %s: asked through etcd; it refuses new calls (its clients go to other nodes), answers those in flight, and goes\n", id)
	start, said := time.Now(), time.Now()
	for {
		cur, ok, err := nodeRecord(ctx, cli, id)
		if err != nil {
			return err
		}
		if !ok || !cur.Started.Equal(rec.Started) {
			fmt.Fprintf(stdout, "stopped  %s after %s\n", id, time.Since(start).Round(time.Millisecond))
			return nil
		}
		if time.Since(said) >= say {
			said = time.Now()
			fmt.Fprintf(stdout, "waiting  for %s to stop: it is still registered (%s); a node stops within about 8 s of the request, unless it does not run this version\n", id, time.Since(start).Round(time.Second))
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("%s did not stop: still registered when the command's time ran out (%w); stop it with SIGTERM", id, ctx.Err())
		}
	}
}

func nodeRecord(ctx context.Context, cli *clientv3.Client, id string) (supervise.NodeRecord, bool, error) {
	nodes, err := supervise.Nodes(ctx, cli)
	if err != nil {
		return supervise.NodeRecord{}, false, err
	}
	for _, n := range nodes {
		if n.ID == id {
			return n, true, nil
		}
	}
	return supervise.NodeRecord{}, false, nil
}

// runMoves runs move passes of plan until it says done, printing each
// move as it starts and ends, and what a move under way waits for. name
// and args say how to run the command again.
func runMoves(name string, mf *moveFlags, stdout, stderr io.Writer, plan supervise.Planner, doneMsg, again string, after func(context.Context, *clientv3.Client) error) error {
	cli, ctx, done, err := openEtcd(name, mf.etcd, *mf.timeout, stderr)
	if err != nil {
		return err
	}
	defer done()
	mp := &movePasser{cli: cli, plan: plan, every: *mf.every, stall: *mf.stall, say: *mf.say, out: stdout}
	err = mp.run(ctx)
	var ee *exitError
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "done: %d moves; %s\n", mp.finished, doneMsg)
		if after != nil {
			if err := after(ctx, cli); err != nil {
				return mf.etcd.explain(err)
			}
		}
		return nil
	case errors.As(err, &ee):
		return err
	case errors.Is(err, supervise.ErrMove) || errors.Is(err, supervise.ErrConfig):
		return fmt.Errorf("%w (moves started %d, finished %d; run it again to go on)", err, mp.started, mp.finished)
	case errors.Is(ctx.Err(), context.Canceled):
		return &exitError{exitInterrupted, fmt.Errorf("interrupted (moves started %d, finished %d)%s", mp.started, mp.finished, mp.next(again))}
	case errors.Is(ctx.Err(), context.DeadlineExceeded) && mp.answered():
		return fmt.Errorf("--timeout %s passed (moves started %d, finished %d; etcd last answered %s ago)%s", *mf.timeout, mp.started, mp.finished,
			time.Since(mp.lastAnswer).Round(time.Millisecond), mp.next(again))
	}
	return mf.etcd.explain(etcdErr(ctx, mf.etcd.endpoints, *mf.timeout, err))
}

// movePasser runs supervise.MovePass every every until plan is done,
// keeping what each move under way waits for, so that neither a long
// wait nor its end leaves the operator without a word.
type movePasser struct {
	cli   *clientv3.Client
	plan  supervise.Planner
	every time.Duration
	// stall bounds how long a move's new replica may go without a rejoin
	// task: past it the move is undone (its new holder never asked for
	// the rejoin, so it would wait forever). say is how often an
	// unchanged wait is said again.
	stall, say time.Duration
	out        io.Writer

	started, finished int
	// waits are the moves under way, by partition, as the last pass saw
	// them; lastAnswer is when etcd last answered a whole pass.
	waits      map[uint32]*moveWait
	lastAnswer time.Time
}

type moveWait struct {
	ev supervise.MoveEvent
	// said is when the wait was last printed; noTask since when the new
	// replica has had no rejoin task (zero: it has one).
	said, noTask time.Time
}

func (mp *movePasser) answered() bool { return !mp.lastAnswer.IsZero() }

// next says what is under way and what to run next, after an interrupt
// or a timeout: the move records stay, and the new replicas go on being
// rebuilt, but nothing removes the old ones until a move command runs.
func (mp *movePasser) next(again string) string {
	if len(mp.waits) == 0 {
		return fmt.Sprintf("; no move is under way: run '%s' (with the same flags) to go on", again)
	}
	var b strings.Builder
	ps := make([]uint32, 0, len(mp.waits))
	for p := range mp.waits {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	fmt.Fprintf(&b, "; under way:")
	for _, p := range ps {
		w := mp.waits[p]
		fmt.Fprintf(&b, "\n  %s: %s", w.ev.Move, w.ev.Waiting)
	}
	or := ""
	if again != "rejoin rebalance" {
		or = " (or 'rejoin rebalance', to even the nodes out instead)"
	}
	fmt.Fprintf(&b, "\nThe new replicas go on rebuilding, and the old ones stay until a move command finishes the moves: run '%s' (with the same flags) to go on%s;", again, or)
	fmt.Fprintf(&b, " 'rejoin undo-move %d' takes back a move whose new replica is not live yet", ps[0])
	return b.String()
}

func (mp *movePasser) run(ctx context.Context) error {
	mp.waits = map[uint32]*moveWait{}
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		evs, done, err := supervise.MovePass(pctx, mp.cli, mp.plan, time.Now())
		cancel()
		if err == nil {
			mp.lastAnswer = time.Now()
		}
		seen := map[uint32]bool{}
		for _, ev := range evs {
			m := ev.Move
			switch {
			case ev.Waiting != "":
				seen[m.Partition] = true
				if err := mp.wait(ctx, ev); err != nil {
					return err
				}
				continue
			case ev.Cancelled:
				fmt.Fprintf(mp.out, "dropped  %s: %s's replica record is gone (replaced?); planned again\n", m, m.To)
			case ev.Finished:
				mp.finished++
				fmt.Fprintf(mp.out, "moved    %s: the replica on %s is live; %s's removed\n", m, m.To, m.From)
			default:
				mp.started++
				seen[m.Partition] = true
				mp.waits[m.Partition] = &moveWait{ev: supervise.MoveEvent{Move: m, Waiting: fmt.Sprintf("just started: %s creates its replica and asks for a rejoin", m.To)}, said: time.Now()}
				fmt.Fprintf(mp.out, "moving   %s: %s rebuilds it by a rejoin\n", m, m.To)
			}
		}
		if err == nil {
			for p := range mp.waits {
				if !seen[p] {
					delete(mp.waits, p)
				}
			}
		}
		if err != nil || done {
			return err
		}
		select {
		case <-time.After(mp.every):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// wait keeps what a move under way waits for, prints it when it changes
// (past the move's first second) and every say while it does not, and undoes a move whose new replica
// has had no rejoin task for stall.
func (mp *movePasser) wait(ctx context.Context, ev supervise.MoveEvent) error {
	now := time.Now()
	m := ev.Move
	w := mp.waits[m.Partition]
	if w == nil || w.ev.Move.To != m.To || w.ev.Move.From != m.From {
		w = &moveWait{}
		mp.waits[m.Partition] = w
	}
	changed := w.ev.Waiting != ev.Waiting
	switch {
	case !ev.NoTask:
		w.noTask = time.Time{}
	case w.noTask.IsZero():
		w.noTask = now
	}
	w.ev = ev
	// A change within a move's first second (its task opened, claimed)
	// is the normal course, not a wait worth a line.
	if changed && now.Sub(m.Started) >= time.Second || now.Sub(w.said) >= mp.say {
		w.said = now
		fmt.Fprintf(mp.out, "waiting  %s: %s (%s since the move started)\n", m, ev.Waiting, now.Sub(m.Started).Round(time.Second))
	}
	if w.noTask.IsZero() || now.Sub(w.noTask) < mp.stall {
		return nil
	}
	v, err := supervise.ReadMoves(ctx, mp.cli)
	if err == nil {
		_, err = supervise.UndoMove(ctx, mp.cli, v, m.Partition)
	}
	if err != nil {
		return fmt.Errorf("undo %s, whose new replica had no rejoin task for %s (--stall): %w", m, mp.stall, err)
	}
	delete(mp.waits, m.Partition)
	fmt.Fprintf(mp.out, "undone   %s: %s opened no rejoin task for it within %s (--stall); %s keeps its replica\n", m, m.To, mp.stall, m.From)
	return &exitError{1, fmt.Errorf("%s undone: %s never asked for the rejoin of its new replica within %s (--stall); its log says why (is it running this version?); run the command again to retry", m, m.To, mp.stall)}
}
