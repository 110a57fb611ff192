package node

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// httpHandler serves the admin endpoints: status and metrics always; Go's
// profiles with Config.Pprof, and the fault points the demo and the tests
// use with Config.FaultPoints, both to the admin identity only
// (adminOnly). What is not enabled is not routed: 404.
func (n *Node) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(n.Status())
	})
	mux.HandleFunc("GET /timeline", n.serveTimeline)
	mux.Handle("GET /metrics", promhttp.HandlerFor(n.metrics.reg, promhttp.HandlerOpts{}))
	if n.cfg.Pprof {
		n.pprofRoutes(mux)
	}
	if n.cfg.FaultPoints {
		n.log.Warn("fault points enabled: POST /fault/* on the admin HTTP can hold, cut and pause rejoins (--fault-points)")
		n.faultRoutes(mux)
	}
	return mux
}

// serveTimeline serves the node's rejoin timelines (timeline.go):
// ?partition=P keeps that partition's, ?last=N the latest N of them.
func (n *Node) serveTimeline(w http.ResponseWriter, req *http.Request) {
	p, last := int64(-1), 0
	if q := req.URL.Query().Get("partition"); q != "" {
		v, err := strconv.ParseUint(q, 10, 32)
		if err != nil {
			http.Error(w, fmt.Sprintf("partition=%q: want a partition number", q), http.StatusBadRequest)
			return
		}
		p = int64(v)
	}
	if q := req.URL.Query().Get("last"); q != "" {
		v, err := strconv.Atoi(q)
		if err != nil || v < 1 {
			http.Error(w, fmt.Sprintf("last=%q: want a positive count", q), http.StatusBadRequest)
			return
		}
		last = v
	}
	tls := Timelines{Node: n.id, EveryMs: float64(TimelineEvery) / float64(time.Millisecond)}
	tls.Rejoins, tls.Untracked = n.timeline.snapshotUntracked(p, last)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(tls)
}

// pprofRoutes serves Go's profiles, so a slow rejoin or write path can be
// profiled on the node that shows it, under its real load. Not by
// default: cmdline shows the node's flags, a profile costs CPU.
func (n *Node) pprofRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", n.adminOnly(pprof.Index))
	mux.HandleFunc("GET /debug/pprof/cmdline", n.adminOnly(pprof.Cmdline))
	mux.HandleFunc("GET /debug/pprof/profile", n.adminOnly(pprof.Profile))
	mux.HandleFunc("GET /debug/pprof/symbol", n.adminOnly(pprof.Symbol))
	mux.HandleFunc("GET /debug/pprof/trace", n.adminOnly(pprof.Trace))
}

// faultRoutes serves the fault points (the demo's faults, the tests').
func (n *Node) faultRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /fault/hold", n.fault(func(r *replica, q map[string]string) error {
		rows, err := strconv.ParseInt(q["rows"], 10, 64)
		if err != nil || rows < 1 {
			return fmt.Errorf("rows=%q: want a positive count", q["rows"])
		}
		r.holdRows = rows
		if r.src != nil && !r.src.held {
			r.src.holdRows = rows
		}
		return nil
	}))
	mux.HandleFunc("POST /fault/release", n.fault(func(r *replica, _ map[string]string) error {
		r.holdRows = 0
		r.releaseHold()
		return nil
	}))
	mux.HandleFunc("POST /fault/cut-link", n.fault(func(r *replica, _ map[string]string) error {
		switch {
		case r.src != nil:
			r.src.link.cut()
		case r.dst != nil && !r.dst.live:
			r.dst.link.cut()
		default:
			return fmt.Errorf("partition %d has no rejoin under way here", r.p)
		}
		return nil
	}))
	mux.HandleFunc("POST /fault/pause-holder", n.fault(func(r *replica, q map[string]string) error {
		d, err := time.ParseDuration(q["for"])
		if err != nil || d <= 0 || d > time.Minute {
			return fmt.Errorf("for=%q: want a duration up to 1m", q["for"])
		}
		if r.src == nil {
			return fmt.Errorf("partition %d serves no rejoin here", r.p)
		}
		// As a process stalled past its TTL: no keepalive, no I/O. The
		// lease guard stops the attempt once the claim may have expired.
		r.src.pauseUntil.Store(time.Now().Add(d).UnixNano())
		r.src.claim.StopKeepAlive()
		return nil
	}))
}

// fault runs f on the replica named by ?partition=, on its goroutine.
func (n *Node) fault(f func(r *replica, q map[string]string) error) http.HandlerFunc {
	return n.adminOnly(func(w http.ResponseWriter, req *http.Request) {
		q := map[string]string{}
		for k, v := range req.URL.Query() {
			q[k] = v[0]
		}
		p, err := strconv.ParseUint(q["partition"], 10, 32)
		r := n.hosted()[uint32(p)]
		if err != nil || r == nil {
			http.Error(w, fmt.Sprintf("partition=%q: not hosted here", q["partition"]), http.StatusNotFound)
			return
		}
		err, ok := ask(r, func(r *replica) error { return f(r, q) })
		if !ok {
			http.Error(w, "node stopping", http.StatusServiceUnavailable)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		n.log.Warn("fault injected", "path", req.URL.Path, "query", req.URL.RawQuery)
		fmt.Fprintln(w, "ok")
	})
}
