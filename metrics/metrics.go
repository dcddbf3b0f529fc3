// Package metrics declares every Prometheus metric idemkv exports, in one place, so
// names and labels stay consistent across the API, the node and the sweeper.
//
// It must never import the server packages: they import it.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds the collectors. Every component takes a *Metrics; tests make their own
// with New, so registries never clash.
type Metrics struct {
	Registry *prometheus.Registry

	// Decisions counts reserve decisions by tool and decision.
	Decisions *prometheus.CounterVec
	// Requests times API requests by endpoint and status code.
	Requests *prometheus.HistogramVec
	// ApplyLatency times a proposal from Raft Apply to the state machine's answer.
	ApplyLatency prometheus.Histogram
	// ApplyBatch is the number of log entries the state machine applied in one batch.
	ApplyBatch prometheus.Histogram
	// LeaderChanges counts observed leadership changes.
	LeaderChanges prometheus.Counter

	// Sweeper figures.
	Swept         prometheus.Counter
	SweepDuration prometheus.Histogram
	SweepBacklog  prometheus.Gauge
	OldestOverdue prometheus.Gauge
}

const namespace = "idemkv"

// New creates the collectors and registers them, with the Go and process collectors,
// in a fresh registry.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		Registry: reg,
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "decisions_total",
			Help: "Reserve decisions by tool and decision.",
		}, []string{"tool", "decision"}),
		Requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "http_request_duration_seconds",
			Help:    "API request latency by endpoint and status code.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}, []string{"endpoint", "code"}),
		ApplyLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "raft_apply_duration_seconds",
			Help:    "Time from proposing a command to Raft until the state machine answered.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}),
		ApplyBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "fsm_apply_batch_entries",
			Help:    "Log entries applied by the state machine in one Pebble batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		LeaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "raft_leader_changes_total",
			Help: "Leadership changes observed by this node.",
		}),
		Swept: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "expiry_swept_records_total",
			Help: "Records deleted by the expiry sweeper.",
		}),
		SweepDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "expiry_sweep_duration_seconds",
			Help:    "Duration of one sweep round (until the backlog is gone).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		SweepBacklog: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "expiry_backlog_records",
			Help: "Records past expires_at that are not swept yet.",
		}),
		OldestOverdue: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "expiry_oldest_overdue_seconds",
			Help: "How long the oldest expired, unswept record has been overdue.",
		}),
	}
	reg.MustRegister(m.Decisions, m.Requests, m.ApplyLatency, m.ApplyBatch, m.LeaderChanges,
		m.Swept, m.SweepDuration, m.SweepBacklog, m.OldestOverdue,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
