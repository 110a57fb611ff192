package node

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/rejoin-db/rejoin/recovery"
)

// metrics are the node's Prometheus metrics. Counters are kept as events
// happen; the replicas' gauges are read from their published status at
// scrape time, so the replica goroutines do no metrics work.
type metrics struct {
	reg      *prometheus.Registry
	txns     prometheus.Counter
	attempts *prometheus.CounterVec
	// refused counts connections refused past ConnsMax.
	refused prometheus.Counter
	// tlsRefused counts connections refused for who the dialler is: a
	// failed TLS handshake, or a hello its certificate does not allow.
	tlsRefused prometheus.Counter
	// evicted counts connections closed before their hello to make room
	// for newer ones (Config.HandshakesMax, HandshakesPerSourceMax);
	// idleClosed client connections closed idle (ClientIdleTimeout);
	// acceptErrors failed Accepts, each retried.
	evicted, idleClosed, acceptErrors prometheus.Counter
}

func newMetrics(n *Node) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		txns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rejoin_store_txns_executed_total", Help: "Transactions executed by the node's replicas.",
		}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rejoin_attempts_total", Help: "Rejoin attempts ended, by role and outcome.",
		}, []string{"role", "outcome"}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rejoin_conns_refused_total", Help: "Connections refused after their hello because the node served ConnsMax already, or its client slots were all taken.",
		}),
		tlsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rejoin_conns_unauthorized_total", Help: "Connections refused for their dialler: a failed TLS handshake, or a hello its certificate does not allow.",
		}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rejoin_conns_evicted_total", Help: "Connections closed before their TLS handshake and hello were done, to make room for newer ones (HandshakesMax, HandshakesPerSourceMax).",
		}),
		idleClosed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rejoin_conns_idle_closed_total", Help: "Client connections closed after ClientIdleTimeout with no call.",
		}),
		acceptErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rejoin_accept_errors_total", Help: "Accepts of the node's TCP listener that failed (such as EMFILE), each retried after a backoff.",
		}),
	}
	m.reg.MustRegister(m.txns, m.attempts, m.refused, m.tlsRefused, m.evicted, m.idleClosed, m.acceptErrors, &replicaCollector{n: n},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observeRejoin counts an ended attempt (or one gone live).
func (m *metrics) observeRejoin(_ uint32, st RejoinStatus) {
	outcome := "ok"
	if st.Err != "" {
		outcome = "aborted"
	}
	m.attempts.WithLabelValues(st.Role, outcome).Inc()
}

var (
	descState = prometheus.NewDesc("rejoin_replica_live", "1 if the replica is live, 0 if it is rejoining or needs a rejoin.", []string{"partition", "state"}, nil)
	descPhase = prometheus.NewDesc("rejoin_phase", "The current or latest rejoin attempt's phase (value 1).", []string{"partition", "role", "phase"}, nil)
	descRows  = prometheus.NewDesc("rejoin_rows_streamed", "Rows sent (source) or applied (destination) by the current or latest attempt.", []string{"partition", "role"}, nil)
	descBytes = prometheus.NewDesc("rejoin_bytes_streamed", "Tuple bytes sent or applied by the current or latest attempt.", []string{"partition", "role"}, nil)
	descLog   = prometheus.NewDesc("rejoin_change_log_peak_bytes", "The source's change log peak, current or latest attempt.", []string{"partition"}, nil)
	descThr   = prometheus.NewDesc("rejoin_throttle_ms", "Time the source throttled execution, current or latest attempt.", []string{"partition"}, nil)
	descPause = prometheus.NewDesc("rejoin_handoff_pause_ms", "The source's handoff pause, current or latest attempt.", []string{"partition"}, nil)
	descRows2 = prometheus.NewDesc("rejoin_replica_rows", "Rows held by the replica when live.", []string{"partition"}, nil)
)

type replicaCollector struct{ n *Node }

func (c *replicaCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descState, descPhase, descRows, descBytes, descLog, descThr, descPause, descRows2} {
		ch <- d
	}
}

func (c *replicaCollector) Collect(ch chan<- prometheus.Metric) {
	for _, rs := range c.n.Status().Replicas {
		p := strconv.FormatUint(uint64(rs.Partition), 10)
		live := 0.0
		if rs.State == recovery.ReplicaLive {
			live = 1
		}
		ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, live, p, rs.State.String())
		ch <- prometheus.MustNewConstMetric(descRows2, prometheus.GaugeValue, float64(rs.Rows), p)
		atts := rs.Sources
		if rs.Rejoin != nil {
			atts = append(atts, *rs.Rejoin)
		}
		for _, a := range atts {
			ch <- prometheus.MustNewConstMetric(descPhase, prometheus.GaugeValue, 1, p, a.Role, a.Phase)
			ch <- prometheus.MustNewConstMetric(descRows, prometheus.GaugeValue, float64(a.Rows), p, a.Role)
			ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(a.Bytes), p, a.Role)
			if a.Role == "source" {
				ch <- prometheus.MustNewConstMetric(descLog, prometheus.GaugeValue, float64(a.LogBytesPeak), p)
				ch <- prometheus.MustNewConstMetric(descThr, prometheus.GaugeValue, a.ThrottledMs, p)
				ch <- prometheus.MustNewConstMetric(descPause, prometheus.GaugeValue, a.HandoffPauseMs, p)
			}
		}
	}
}
