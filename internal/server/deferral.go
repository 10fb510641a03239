package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-sched/sluice/admission/deferral"
	"github.com/sluice-sched/sluice/internal/metrics"
	"github.com/sluice-sched/sluice/internal/state/boltbacklog"
	"github.com/sluice-sched/sluice/internal/state/redisbacklog"
)

// DeferralOptions configure where deferred tickets are kept.
type DeferralOptions struct {
	// DataDir holds the embedded backlog's file (deferred.db). Empty,
	// and without Redis, tickets live in memory and a restart loses them.
	DataDir string
	// ResetDamaged moves a damaged deferred.db aside (to
	// deferred.db.damaged-<UTC time>) and starts an empty backlog; without
	// it a damaged file stops the start with an error naming it.
	ResetDamaged bool
}

// openBacklog builds the backlog of deferrable work on its store: Redis
// Streams with --redis (every replica's tickets survive it, and a
// replica's are adopted by the others when it stops), a bbolt file under
// --data-dir otherwise, memory without either.
func (s *Server) openBacklog() error {
	var store deferral.Store
	switch {
	case s.redis != nil:
		consumer := cmp.Or(s.opts.Etcd.ReplicaID, s.hostname())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// Its own client: the decisions' has millisecond timeouts.
		rdb, err := redisClient(s.opts.Shared, cmp.Or(s.opts.Shared.BacklogTimeout, defaultBacklogRedisTimeout))
		if err != nil {
			return fmt.Errorf("deferred backlog on redis: %w", err)
		}
		rs, err := redisbacklog.Open(ctx, rdb, redisbacklog.Options{Consumer: consumer, Prefix: s.opts.Shared.Prefix, Logger: s.log})
		if err != nil {
			_ = rdb.Close()
			return fmt.Errorf("deferred backlog on redis: %w", err)
		}
		store, s.backlogRedis = rs, rdb
		s.log.Info("deferred backlog on redis streams", "consumer", consumer)
	case s.opts.Deferral.DataDir != "":
		if err := os.MkdirAll(s.opts.Deferral.DataDir, 0o750); err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
		path := filepath.Join(s.opts.Deferral.DataDir, "deferred.db")
		bs, err := boltbacklog.Open(path, boltbacklog.Options{MoveAsideDamaged: s.opts.Deferral.ResetDamaged, Logger: s.log})
		var damaged *boltbacklog.DamagedError
		if errors.As(err, &damaged) {
			return fmt.Errorf("--data-dir: %w; sluiced does not start on a damaged backlog: restore the file from a copy, or move it aside and start with an empty backlog (its tickets are lost) with --deferral-reset-damaged (docs/deferral.md)", err)
		}
		if err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
		store = bs
		s.log.Info("deferred backlog in a file", "path", path)
	default:
		store = deferral.NewMemStore()
		s.log.Warn("deferred backlog in memory: tickets do not survive a restart (start with --data-dir or --redis)")
	}
	s.backlogStore = store
	s.backlog = deferral.New(s.eng, store, s.opts.Clock, s.log)
	s.registerBacklogMetrics(s.metrics.Registry)
	return nil
}

func (s *Server) hostname() string {
	h, _ := os.Hostname()
	return cmp.Or(h, "sluiced")
}

// runBacklog takes the store's unfinished tickets back and drains the
// backlog until ctx ends; a bbolt store is swept of old final tickets.
func (s *Server) runBacklog(ctx context.Context) {
	if err := s.backlog.Start(ctx); err != nil {
		// Not fatal (Redis may be back in a moment): the backlog
		// adopts again every few seconds.
		s.log.Warn("deferred backlog: taking back unfinished tickets", "err", err)
	}
	if bs, ok := s.backlogStore.(*boltbacklog.Store); ok {
		go func() {
			t := time.NewTicker(time.Minute)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if _, err := bs.Sweep(time.Now()); err != nil {
						s.log.Warn("deferred backlog: sweeping final tickets", "err", err)
					}
				}
			}
		}()
	}
}

// registerBacklogMetrics exports the backlog: its size and oldest age per
// tier and tenant (the busiest MaxTenantSeries tenants by name, the rest
// as tenant="other"), and its events.
func (s *Server) registerBacklogMetrics(reg *prometheus.Registry) {
	max := s.opts.Metrics.MaxTenantSeries
	if max <= 0 {
		max = metrics.DefaultMaxTenantSeries
	}
	reg.MustRegister(backlogCollector{s: s, max: max})
	c := s.backlog.Counts()
	for _, ev := range []struct {
		name string
		n    interface{ Load() uint64 }
	}{
		{"deferred", &c.Deferred}, {"queue_full", &c.QueueFull}, {"claimed", &c.Claimed},
		{"redelivered", &c.Redelivered}, {"done", &c.Done}, {"expired", &c.Expired}, {"cancelled", &c.Cancelled},
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_deferred_events_total", Help: "Deferred tickets by event: deferred (issued), queue_full (refused at the backlog's bounds), claimed, redelivered (pending again after a claim: a lease ended unreleased, a failed send, a claim taken back), done, expired, cancelled.",
			ConstLabels: prometheus.Labels{"event": ev.name},
		}, func() float64 { return float64(ev.n.Load()) }))
	}
}

var (
	backlogDesc = prometheus.NewDesc("sluice_deferred_backlog",
		"Deferred tickets held, by tier, tenant and state (pending: waiting for capacity and a worker; claimed: running on a worker).",
		[]string{"tier", "tenant", "state"}, nil)
	backlogTotalDesc = prometheus.NewDesc("sluice_deferred_tickets",
		"Deferred tickets held by this replica, by state; always exported, for the workers' autoscaler.",
		[]string{"state"}, nil)
	backlogAgeDesc = prometheus.NewDesc("sluice_deferred_oldest_age_seconds",
		"Age of the oldest pending deferred ticket, by tier and tenant.",
		[]string{"tier", "tenant"}, nil)
)

// backlogCollector reads the backlog at each scrape.
type backlogCollector struct {
	s   *Server
	max int
}

func (c backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- backlogDesc
	ch <- backlogTotalDesc
	ch <- backlogAgeDesc
}

func (c backlogCollector) Collect(ch chan<- prometheus.Metric) {
	tenants := c.s.backlog.Tenants()
	// The largest backlogs get series of their own.
	slices.SortFunc(tenants, func(a, b deferral.TenantBacklog) int {
		return cmp.Or(cmp.Compare(b.Pending+b.Claimed, a.Pending+a.Claimed), cmp.Compare(a.Tenant, b.Tenant))
	})
	type key struct{ tier, tenant string }
	type sums struct {
		pending, claimed int
		oldest           time.Duration
	}
	by := map[key]*sums{}
	var order []key
	var pending, claimed int
	for i, tb := range tenants {
		pending += tb.Pending
		claimed += tb.Claimed
		tier := ""
		if info, ok := c.s.eng.Tenant(tb.Tenant); ok {
			tier = info.Tier
		}
		k := key{tier, tb.Tenant}
		if i >= c.max {
			k.tenant = metrics.OtherTenant
		}
		sm := by[k]
		if sm == nil {
			sm = &sums{}
			by[k] = sm
			order = append(order, k)
		}
		sm.pending += tb.Pending
		sm.claimed += tb.Claimed
		sm.oldest = max(sm.oldest, tb.OldestAge)
	}
	ch <- prometheus.MustNewConstMetric(backlogTotalDesc, prometheus.GaugeValue, float64(pending), "pending")
	ch <- prometheus.MustNewConstMetric(backlogTotalDesc, prometheus.GaugeValue, float64(claimed), "claimed")
	for _, k := range order {
		sm := by[k]
		ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(sm.pending), k.tier, k.tenant, "pending")
		ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(sm.claimed), k.tier, k.tenant, "claimed")
		ch <- prometheus.MustNewConstMetric(backlogAgeDesc, prometheus.GaugeValue, sm.oldest.Seconds(), k.tier, k.tenant)
	}
}
