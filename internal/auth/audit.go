package auth

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// Audited actions that are not gRPC methods. A gRPC action is named by its
// method ("DrainDomain").
const (
	ActionConfigReload = "config_reload"
	ActionAuthReload   = "auth_reload"
	ActionTLSReload    = "tls_reload"
)

// Outcomes of an audited action, the outcome label's only values.
const (
	OutcomeOK              = "ok"
	OutcomeUnauthenticated = "unauthenticated"
	OutcomeDenied          = "denied"
	OutcomeFailed          = "failed"
)

// maxAuditField bounds each text field of an audit line: the fields come
// from callers, and a refused 3 MB drain reason must not become a 3 MB log
// line.
const maxAuditField = 1024

// Event is one audited action.
type Event struct {
	Principal string // who: a principal's name, "anonymous" (no auth file) or "sluiced"
	Peer      string // the caller's address, when known
	Action    string // e.g. "DrainDomain", ActionConfigReload
	Target    string // what it acted on: a domain, a file
	Reason    string // the reason the caller gave (a drain's), if any
	Outcome   string // one of the Outcome constants
	Err       error  // why it was refused or failed; nil when OK
}

// Auditor writes one structured log line per audited action and counts it
// in sluice_audit_actions_total{action,outcome}. A nil *Auditor records
// nothing, so that tests and tools may leave it out.
type Auditor struct {
	log     *slog.Logger
	actions *prometheus.CounterVec
}

// NewAuditor returns an Auditor logging to logger (slog.Default() when nil)
// and registering its counter on reg (none when nil).
func NewAuditor(logger *slog.Logger, reg prometheus.Registerer) (*Auditor, error) {
	if logger == nil {
		logger = slog.Default()
	}
	a := &Auditor{log: logger, actions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_audit_actions_total",
		Help: "Audited operator actions (drains, undrains, config and auth reloads, refused Operator calls) by action and outcome.",
	}, []string{"action", "outcome"})}
	if reg != nil {
		if err := reg.Register(a.actions); err != nil {
			return nil, fmt.Errorf("audit metrics: %w", err)
		}
	}
	return a, nil
}

// Record logs and counts e: one line, message "audit", at INFO when it
// succeeded and WARN otherwise.
func (a *Auditor) Record(ctx context.Context, e Event) {
	if a == nil {
		return
	}
	a.actions.WithLabelValues(e.Action, e.Outcome).Inc()
	attrs := []slog.Attr{
		slog.String("principal", clip(e.Principal, maxAuditField)),
		slog.String("action", e.Action),
		slog.String("target", clip(e.Target, maxAuditField)),
		slog.String("reason", clip(e.Reason, maxAuditField)),
		slog.String("outcome", e.Outcome),
	}
	if e.Peer != "" {
		attrs = append(attrs, slog.String("peer", e.Peer))
	}
	level := slog.LevelInfo
	if e.Err != nil {
		attrs = append(attrs, slog.String("err", clip(e.Err.Error(), maxAuditField)))
	}
	if e.Outcome != OutcomeOK {
		level = slog.LevelWarn
	}
	a.log.LogAttrs(ctx, level, "audit", attrs...)
}

// AuditCount returns sluice_audit_actions_total{action,outcome} as gathered
// from g; 0 when it has not been counted. Tests and tools read it without a
// Prometheus server.
func AuditCount(g prometheus.Gatherer, action, outcome string) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_audit_actions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var a, o string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "action":
					a = l.GetValue()
				case "outcome":
					o = l.GetValue()
				}
			}
			if a == action && o == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
