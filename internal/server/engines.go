package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/enginemetrics"
	"github.com/sluice-sched/sluice/internal/rendezvous"
	"github.com/sluice-sched/sluice/topology"
)

// EngineMetricsOptions configure how sluiced reads the serving engines'
// metrics that the domains' topology names (topology.Domain.Engines).
//
// sluiced reads them itself rather than through the node agents: the
// capacity loop wants signals a few hundred milliseconds old at most, and
// a read straight from the engine adds no hop and no write to etcd (a
// fleet's engines, 10 times a second, would be the busiest keys it has).
// An engine's URL may as well name an aggregator serving the same text
// (one per rack).
//
// Where the replicas share batched state under an etcd membership, each
// domain's engines are read by Readers replicas, the first in the
// domain's rendezvous order of the live members, and the shared state
// relays their readings to the others: the reads grow with the domains,
// not with replicas × domains (docs/capacity-feedback.md, "Who reads the
// engines"). Otherwise every replica reads every domain.
type EngineMetricsOptions struct {
	// Period between reads of every engine; default 100ms.
	Period time.Duration
	// Readers is how many replicas read each domain's engines where their
	// readings are relayed; default 2 (one may be gone until the
	// membership says so).
	Readers int
	// Kinds adds engine kinds (or overrides vllm and sglang): their
	// metrics' names.
	Kinds map[string]enginemetrics.Names
}

// ParseEngineKind reads a --engine-kind flag: name=queue_metric,kv_metric[,running_metric].
func ParseEngineKind(v string) (string, enginemetrics.Names, error) {
	name, rest, ok := strings.Cut(v, "=")
	parts := strings.Split(rest, ",")
	if !ok || name == "" || len(parts) < 2 || len(parts) > 3 {
		return "", enginemetrics.Names{}, fmt.Errorf("want name=queue_metric,kv_metric[,running_metric], got %q", v)
	}
	n := enginemetrics.Names{Queue: parts[0], KVUsage: parts[1]}
	if len(parts) == 3 {
		n.Running = parts[2]
	}
	return name, n, nil
}

// engineFeed reads the engines of the domains this replica reads and hands
// their new signals to the engine after each pass; a domain whose engines
// all fail keeps its last signal, which ages into staleness there.
//
// Where readings are relayed (membersChanged), this replica reads the
// domains whose first readers it is among, and relays those; and it reads
// for a while, without relaying, the domains placement wants readings of
// and has had none fresh from the relay (starved): their readers are gone,
// of another version, or the shared state is unreachable.
type engineFeed struct {
	reader  *enginemetrics.Reader
	invalid *prometheus.CounterVec // reads whose values are no readings, by reason
	eng     *admission.Engine
	now     func() time.Time
	log     *slog.Logger
	readers int
	sigs    []admission.EngineSignal // reused by each pass
	last    map[string]time.Time     // when each domain's last signal handed over was read
	starved []string                 // reused by each pass

	mu      sync.Mutex
	engines map[string][]enginemetrics.Endpoint // every domain's, as the topology names them
	self    string
	members []string        // the live replicas, where readings are relayed; nil: every domain is read here
	relayed map[string]bool // the domains read here for all; nil where nothing is relayed
	// fallback: starved domains read here, and since when.
	fallback map[string]time.Time
	read     []string // the domains read here, sorted
}

// fallbackFor is how long a starved domain is read here before the relay
// is given another chance: reads that outlast a cause (a shared state back
// from an outage, a reader upgraded) are stopped within it.
const fallbackFor = 30 * time.Second

func newEngineFeed(o EngineMetricsOptions, eng *admission.Engine, now func() time.Time, log *slog.Logger) (*engineFeed, error) {
	invalid := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_engine_readings_invalid_total",
		Help: "Engine metrics reads refused for a value that is no reading (reason: negative, nan, infinite, too_large); the engine counts for nothing in its domain's signal that pass."},
		[]string{"reason"})
	for _, reason := range []string{enginemetrics.ReasonNegative, enginemetrics.ReasonNaN, enginemetrics.ReasonInfinite, enginemetrics.ReasonTooLarge} {
		invalid.WithLabelValues(reason) // every reason exported from the start, at 0
	}
	r, err := enginemetrics.NewReader(enginemetrics.Options{
		Period: o.Period, Kinds: o.Kinds, Clock: now,
		OnError: func(domain string, e enginemetrics.Endpoint, err error) {
			if inv := (*enginemetrics.InvalidReadingError)(nil); errors.As(err, &inv) {
				invalid.WithLabelValues(inv.Reason).Inc()
			}
			log.Debug("engine metrics: read failed", "domain", domain, "url", e.URL, "err", err)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("engine metrics: %w", err)
	}
	if o.Readers <= 0 {
		o.Readers = 2
	}
	return &engineFeed{reader: r, invalid: invalid, eng: eng, now: now, log: log, readers: o.Readers,
		last: make(map[string]time.Time), fallback: make(map[string]time.Time)}, nil
}

// topologyChanged reads the engines the cluster names from now on; a
// cluster naming an engine kind the reader does not know keeps the old
// set, loudly.
func (f *engineFeed) topologyChanged(c topology.Cluster) {
	m := make(map[string][]enginemetrics.Endpoint)
	for _, d := range c.Domains {
		for _, e := range d.Engines {
			m[d.ID] = append(m[d.ID], enginemetrics.Endpoint{URL: e.Metrics, Kind: e.Kind})
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	old := f.engines
	f.engines = m
	if err := f.applyLocked(true); err != nil {
		f.engines = old
		f.log.Error("engine metrics: the topology's engines are refused; the last set keeps being read", "err", err)
	}
}

// membersChanged makes this replica (self) read the domains whose first
// readers in rendezvous order of the live members it is among, and relay
// their readings through the shared state. With no more members than
// readers every member reads every domain, and nothing is relayed.
func (f *engineFeed) membersChanged(self string, members []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.self, f.members = self, members
	if err := f.applyLocked(true); err != nil { // the set was accepted before
		f.log.Error("engine metrics: the domains to read are refused", "err", err)
	}
	f.log.Info("engine metrics: domains read here", "domains", len(f.read), "of", len(f.engines), "readers", f.readers, "replicas", len(members))
}

// applyLocked reads, from now on, the engines of the domains this replica
// reads: where readings are relayed, its rendezvous share (chosen again
// when choose is set: the members or the domains changed) and the
// starved domains it falls back on; otherwise every domain.
func (f *engineFeed) applyLocked(choose bool) error {
	relayed := f.relayed
	if choose {
		relayed = nil
		if len(f.members) > f.readers {
			relayed = make(map[string]bool)
			for id := range f.engines {
				if readsDomain(id, f.self, f.members, f.readers) {
					relayed[id] = true
				}
			}
		}
	}
	m := f.engines
	if relayed != nil {
		m = make(map[string][]enginemetrics.Endpoint)
		for id, e := range f.engines {
			if _, ok := f.fallback[id]; ok || relayed[id] {
				m[id] = e
			}
		}
	}
	if err := f.reader.SetDomains(m); err != nil {
		return err
	}
	if f.eng != nil && (relayed == nil) != (f.relayed == nil) {
		f.eng.RelayEngineReadings(relayed != nil)
	}
	f.relayed = relayed
	f.read = slices.Sorted(maps.Keys(m))
	return nil
}

// readsDomain reports whether self is among the first readers of members
// (self among them) in domain id's rendezvous order: the members agree on
// it without a word, and a member leaving moves only the domains it read.
func readsDomain(id, self string, members []string, readers int) bool {
	h := rendezvous.Hash(id)
	mine := rendezvous.Score(h, self, 1)
	ahead := 0
	for _, m := range members {
		if m != self && rendezvous.Score(h, m, 1) > mine {
			if ahead++; ahead >= readers {
				return false
			}
		}
	}
	return true
}

// register exports how many domains' engines this replica reads, how
// many of them for want of a relay, and the reads refused for values
// that are no readings.
func (f *engineFeed) register(reg *prometheus.Registry) {
	count := func(starved bool) float64 {
		f.mu.Lock()
		defer f.mu.Unlock()
		if starved {
			return float64(len(f.fallback))
		}
		return float64(len(f.read))
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_engine_domains_read",
			Help: "Domains whose serving engines this replica reads: its rendezvous share where readings are relayed (and the starved ones), else every domain naming engines."},
			func() float64 { return count(false) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_engine_domains_starved",
			Help: "Domains read here for want of a relayed reading: their readers do not publish (gone, another version, Redis unreachable)."},
			func() float64 { return count(true) }),
		f.invalid,
	)
}

// domainsRead returns the domains whose engines this replica reads, sorted.
func (f *engineFeed) domainsRead() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.read
}

// run reads every period until ctx ends.
func (f *engineFeed) run(ctx context.Context) { f.reader.Run(ctx, f.pass) }

// pass gives the engine the new signals of the pass just made (a signal
// kept from an earlier pass is the engine's already, aging there), then
// reads the domains the relay starves.
func (f *engineFeed) pass() {
	now := f.now()
	f.mu.Lock()
	relayed := f.relayed
	f.mu.Unlock()
	f.sigs = f.sigs[:0]
	signals := f.reader.Signals()
	for id, s := range signals {
		if last, ok := f.last[id]; ok && !s.At.After(last) {
			continue
		}
		f.last[id] = s.At
		f.sigs = append(f.sigs, admission.EngineSignal{Domain: id, Queue: s.Queue, Running: s.Running, KVUsage: s.KVUsage, Age: now.Sub(s.At), Relay: relayed[id]})
	}
	for id := range f.last {
		if _, ok := signals[id]; !ok {
			delete(f.last, id) // no longer read here
		}
	}
	if len(f.sigs) > 0 {
		if err := f.eng.ObserveEngines(f.sigs); err != nil {
			f.log.Debug("engine metrics: signals not taken (domains the engine no longer has, or no readings)", "err", err)
		}
	}
	if relayed != nil {
		f.starved = f.eng.StarvedEngineDomains(f.starved[:0])
		f.readStarved(now, f.starved)
	}
}

// readStarved reads the starved domains here from now, and stops reading
// those read so for fallbackFor.
func (f *engineFeed) readStarved(now time.Time, starved []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	expired, added := 0, 0
	for id, since := range f.fallback {
		if now.Sub(since) >= fallbackFor {
			delete(f.fallback, id)
			expired++
		}
	}
	for _, id := range starved {
		if _, ok := f.fallback[id]; !ok && !f.relayed[id] && f.engines[id] != nil {
			f.fallback[id] = now
			added++
		}
	}
	if added > 0 {
		f.log.Info("engine metrics: no fresh readings relayed; reading those domains' engines here", "domains", added, "for", fallbackFor)
	}
	if added+expired > 0 {
		if err := f.applyLocked(false); err != nil {
			f.log.Error("engine metrics: the domains to read are refused", "err", err)
		}
	}
}
