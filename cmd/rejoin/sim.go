package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"sync"

	"github.com/rejoin-db/rejoin/recovery/sim"
)

// simOptions returns the simulator options for a seed. Tests replace it to
// inject a broken invariant and watch the command report it.
var simOptions = func(seed uint64) sim.Options { return sim.Options{} }

const simUsage = `usage: rejoin sim --seeds N [--start S] [--workers W] [-v]
       rejoin sim --seed S [-v]

Runs the deterministic rejoin simulator (package recovery/sim): one
partition rebuilt on a new replica while initiators, joined to it on
each feed, keep sending txns, by the product's initiator and replica
cores, claim guard, task record rules, supervisor (Decide) and health
task, with aborts, cuts, restarts, late messages, claim holders paused
past their lease, coordinator outages and cut-offs, feeds broken and
resumed, source node deaths, initiators silenced and fenced (their
tails repaired) and supervisor failovers injected, every invariant
checked. Each
seed replays exactly. For every failing seed it prints the
failure and the command that replays it, and it ends with one line,
"N seeds, F failures"; the exit status is 1 if F > 0.

flags:
`

// runSim binds the simulator to flags: it runs seeds and reports; the work
// is sim.Run's.
func runSim(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim", stderr)
	seeds := fs.Uint64("seeds", 0, "run `N` seeds: --start, --start+1, ...")
	start := fs.Uint64("start", 1, "the first `seed` of --seeds")
	seed := fs.Uint64("seed", 0, "run one `seed` (replay a failure)")
	workers := fs.Int("workers", runtime.GOMAXPROCS(0), "seeds run at once (each seed runs on one goroutine)")
	verbose := fs.Bool("v", false, "with --seed, print the run's trace; with --seeds, a line per seed")
	fs.Usage = func() {
		fmt.Fprint(stderr, simUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err // asked for: exit 0
		}
		return errUsage
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "rejoin sim: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	case (*seeds == 0) == (*seed == 0):
		fmt.Fprintln(stderr, "rejoin sim: give either --seeds N or --seed S (both > 0)")
		return errUsage
	case *workers < 1:
		fmt.Fprintln(stderr, "rejoin sim: --workers must be at least 1")
		return errUsage
	}
	first, n := *start, *seeds
	if *seed != 0 {
		first, n = *seed, 1
	}
	if first+n < first {
		fmt.Fprintln(stderr, "rejoin sim: seed range overflows")
		return errUsage
	}
	failures := 0
	report := func(r sim.Result) {
		if *verbose && *seed != 0 {
			for _, l := range r.Trace {
				fmt.Fprintln(stdout, l)
			}
		}
		if r.Err != nil {
			failures++
			fmt.Fprintf(stdout, "seed %d: FAIL %v\n", r.Seed, r.Err)
			fmt.Fprintf(stdout, "  replay: rejoin sim --seed %d -v\n", r.Seed)
			return
		}
		if *verbose {
			fmt.Fprintf(stdout, "seed %d: ok in %d ticks, %d attempts, %d faults, final txn %v digest %016x\n",
				r.Seed, r.Ticks, r.Attempts, r.Stats.FaultsFired, r.FinalTxn, r.FinalDigest)
		}
	}
	runSeeds(first, n, *workers, *verbose && *seed != 0, report)
	fmt.Fprintf(stdout, "%d seeds, %d failures\n", n, failures)
	if failures > 0 {
		return fmt.Errorf("%d of %d seeds failed", failures, n)
	}
	return nil
}

// runSeeds runs seeds first..first+n-1 on up to workers goroutines and
// hands each result to report in seed order, as soon as it and every
// earlier one are done. Each seed is one sim.Run: the simulator itself
// has no goroutines; running seeds side by side is the driver's business.
func runSeeds(first, n uint64, workers int, trace bool, report func(sim.Result)) {
	workers = int(min(uint64(workers), n))
	results := make([]sim.Result, n)
	done := make([]chan struct{}, n)
	for i := range done {
		done[i] = make(chan struct{})
	}
	next := make(chan uint64)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				s := first + i
				o := simOptions(s)
				o.Trace = o.Trace || trace
				results[i] = sim.Run(s, o)
				close(done[i])
			}
		})
	}
	go func() {
		for i := range n {
			next <- i
		}
		close(next)
	}()
	for i := range n {
		<-done[i]
		report(results[i])
		results[i] = sim.Result{} // let its trace go
	}
	wg.Wait()
}
