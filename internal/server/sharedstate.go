package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/state/redisstate"
)

// SharedOptions select shared state on Redis; a zero value (no URL) runs
// embedded.
type SharedOptions struct {
	// RedisURL is redis://[user:pass@]host:port[/db] (rediss:// for TLS);
	// several comma-separated host:port after the scheme make a Cluster
	// client, and SentinelMaster a Sentinel one.
	RedisURL       string
	SentinelMaster string
	// Mode is "batched", "strict" or "" (batched with more than one
	// replica or with etcd membership, strict with one).
	Mode      string
	Replicas  int           // N until etcd membership says otherwise; default 1
	ReplicaID string        // default: the etcd member id, else the host name; a random suffix is added
	Interval  time.Duration // batched reconcile period; default 100ms
	Timeout   time.Duration // per Redis call; default 50ms
	Prefix    string        // key prefix and hash tag; default "sluice"
	// BacklogTimeout is a call's timeout on the deferred backlog's own
	// client (default 2 s): its writes are durable records, not decisions,
	// and a Stream write that takes longer than a decision may not fail.
	BacklogTimeout time.Duration
}

// defaultBacklogRedisTimeout is SharedOptions.BacklogTimeout's default.
const defaultBacklogRedisTimeout = 2 * time.Second

// sharedStateOption connects to Redis and returns the engine option, or nil
// when running embedded.
func (s *Server) sharedStateOption() (admission.Option, error) {
	o := s.opts.Shared
	if o.RedisURL == "" {
		return nil, nil
	}
	mode := sharing.Strict
	switch o.Mode {
	case "":
		// Several replicas (or a membership that will say how many): batched.
		if o.Replicas > 1 || s.opts.Etcd.Endpoints != "" {
			mode = sharing.Batched
		}
	case "batched":
		mode = sharing.Batched
	case "strict":
	default:
		return nil, fmt.Errorf("--redis-mode: want batched or strict, got %q", o.Mode)
	}
	if o.Timeout <= 0 {
		o.Timeout = 50 * time.Millisecond
	}
	rdb, err := redisClient(o, o.Timeout)
	if err != nil {
		return nil, err
	}
	store := redisstate.New(rdb, o.Prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// Unreachable at start is not fatal: the breaker opens and the fail
	// modes apply until Redis answers.
	if err := store.Load(ctx); err != nil {
		s.log.Warn("redis unreachable at start; deciding from local slices until it answers", "err", err)
	}
	if o.ReplicaID == "" {
		o.ReplicaID = s.opts.Etcd.ReplicaID // its member id, where etcd names one
	}
	o.ReplicaID = incarnation(o.ReplicaID)
	s.redis = rdb
	s.replica = o.ReplicaID
	s.relaysEngines = mode == sharing.Batched
	s.log.Info("shared state on redis", "mode", mode, "replica", o.ReplicaID, "replicas", max(o.Replicas, 1))
	log := s.log
	var memberExpiry func() time.Time
	if s.opts.Etcd.Endpoints != "" {
		// The controller is made after the engine, before Serve runs the
		// reconciles that call this.
		memberExpiry = func() time.Time {
			if ctl := s.cp.ctl; ctl != nil {
				return ctl.MemberExpiry()
			}
			return time.Time{}
		}
	}
	return admission.WithSharedState(store, sharing.Options{
		Mode: mode, Replica: o.ReplicaID, Replicas: o.Replicas, Interval: o.Interval, Timeout: o.Timeout,
		MemberExpiry: memberExpiry,
		OnBreaker: func(open bool) {
			if open {
				log.Warn("redis unreachable: breaker open; deciding from local slices (fail-closed tiers refused with STATE_UNAVAILABLE)")
			} else {
				log.Info("redis reachable again: breaker closed; re-syncing")
			}
		},
	}), nil
}

// redisClient builds a UniversalClient: standalone, Cluster (several
// addresses) or Sentinel (a master name), with timeout for each call (a
// decision's are milliseconds) and no retries (the engine's breaker, and
// the backlog's own write retries, decide).
func redisClient(o SharedOptions, timeout time.Duration) (redis.UniversalClient, error) {
	scheme, rest, ok := strings.Cut(o.RedisURL, "://")
	if !ok {
		return nil, fmt.Errorf("--redis %q: want redis://host:port", o.RedisURL)
	}
	hostPart, path, _ := strings.Cut(rest, "/")
	userinfo, hosts, hasUser := strings.Cut(hostPart, "@")
	if !hasUser {
		hosts, userinfo = userinfo, ""
	}
	addrs := strings.Split(hosts, ",")
	first := scheme + "://"
	if userinfo != "" {
		first += userinfo + "@"
	}
	first += addrs[0]
	if path != "" {
		first += "/" + path
	}
	base, err := redis.ParseURL(first)
	if err != nil {
		return nil, fmt.Errorf("--redis: %w", err)
	}
	for i := range addrs {
		addrs[i] = strings.TrimSpace(addrs[i])
	}
	return redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs: addrs, MasterName: o.SentinelMaster, DB: base.DB,
		Username: base.Username, Password: base.Password, TLSConfig: base.TLSConfig,
		DialTimeout: 4 * timeout, ReadTimeout: timeout, WriteTimeout: timeout,
		MaxRetries: -1,
	}), nil
}

// incarnation names this process in Redis: the replica's id (default the
// host name) and a random suffix, so that a restarted replica's lease
// names and counters never meet its previous life's.
func incarnation(id string) string {
	if id == "" {
		id, _ = os.Hostname()
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return id + "-" + hex.EncodeToString(b)
}

// setReplicaCount sets N, the live replicas (from etcd membership).
func (s *Server) setReplicaCount(n int) {
	if s.eng != nil {
		s.eng.SetReplicas(n)
	}
}

// sharedStatus is the engine's shared-state status (ok false without
// shared state, or before the engine is built).
func (s *Server) sharedStatus() (sharing.Status, bool) {
	if s.eng == nil {
		return sharing.Status{}, false
	}
	return s.eng.SharedStatus()
}

// shardCollector exports sluice_shared_shard_up per shard of a sharded
// store: the shards come and go with the cluster's masters.
type shardCollector struct {
	status func() sharing.Status
	desc   *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c shardCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c shardCollector) Collect(ch chan<- prometheus.Metric) {
	for _, sh := range c.status().Shards {
		up := 1.0
		if sh.Down {
			up = 0
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, up, sh.Name)
	}
}

// registerSharedMetrics exports the shared-state link: breaker, fallback
// time, reconcile lag, overage applied and Redis calls per decision.
func (s *Server) registerSharedMetrics(reg *prometheus.Registry) {
	eng := s.eng
	if _, ok := eng.SharedStatus(); !ok {
		return
	}
	status := func() sharing.Status { st, _ := eng.SharedStatus(); return st }
	reg.MustRegister(
		shardCollector{status: status, desc: prometheus.NewDesc("sluice_shared_shard_up",
			"Per shard of a sharded store (a Redis Cluster master): 0 while its breaker is open (its tenants and domains decide on their fail modes), 1 otherwise.",
			[]string{"shard"}, nil)},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_shared_breaker_open", Help: "1 while the breaker around Redis (batched: around any shard) is open (decisions use the local slices and the tiers' fail modes)."},
			func() float64 {
				if status().BreakerOpen {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_shared_fallback_seconds_total", Help: "Seconds spent with the Redis breaker open."},
			func() float64 { return status().FallbackSeconds }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_shared_reconcile_lag_seconds", Help: "Seconds since the last successful Redis call."},
			func() float64 { return status().ReconcileLag.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_shared_replicas", Help: "N, the replicas the quotas are shared by."},
			func() float64 { return float64(status().Replicas) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_shared_redis_calls_total", Help: "Redis script calls."},
			func() float64 { return float64(status().Calls) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_shared_redis_failures_total", Help: "Redis script calls that failed."},
			func() float64 { return float64(status().Failures) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_shared_decisions_total", Help: "Decisions made with shared state."},
			func() float64 { return float64(status().Decisions) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_shared_redis_calls_per_decision", Help: "Redis calls per decision since start."},
			func() float64 {
				st := status()
				if st.Decisions == 0 {
					return 0
				}
				return float64(st.Calls) / float64(st.Decisions)
			}),
	)
	for k, name := range sharing.KindNames {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_shared_overage_applied_total", Help: "Units this replica gave up to global overages (backpressure), per bucket.",
			ConstLabels: prometheus.Labels{"bucket": name},
		}, func() float64 { return float64(eng.SharedOverage()[k]) }))
	}
}
