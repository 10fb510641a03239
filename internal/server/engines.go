package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/enginemetrics"
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
// (one per rack). Every replica reads every domain: the reads grow with
// replicas × domains (docs/capacity-feedback.md, "Who reads the engines").
type EngineMetricsOptions struct {
	// Period between reads of every engine; default 100ms.
	Period time.Duration
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

// engineFeed reads every domain's engines and hands their signals to the
// engine after each pass; a domain whose engines all fail keeps its last
// signal, which ages into staleness there.
type engineFeed struct {
	reader *enginemetrics.Reader
	eng    *admission.Engine
	now    func() time.Time
	log    *slog.Logger
	sigs   []admission.EngineSignal // reused by each pass
}

func newEngineFeed(o EngineMetricsOptions, eng *admission.Engine, now func() time.Time, log *slog.Logger) (*engineFeed, error) {
	r, err := enginemetrics.NewReader(enginemetrics.Options{
		Period: o.Period, Kinds: o.Kinds, Clock: now,
		OnError: func(domain string, e enginemetrics.Endpoint, err error) {
			log.Debug("engine metrics: read failed", "domain", domain, "url", e.URL, "err", err)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("engine metrics: %w", err)
	}
	return &engineFeed{reader: r, eng: eng, now: now, log: log}, nil
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
	if err := f.reader.SetDomains(m); err != nil {
		f.log.Error("engine metrics: the topology's engines are refused; the last set keeps being read", "err", err)
	}
}

// run reads every period until ctx ends.
func (f *engineFeed) run(ctx context.Context) { f.reader.Run(ctx, f.pass) }

// pass gives the engine the signals of the pass just made.
func (f *engineFeed) pass() {
	now := f.now()
	f.sigs = f.sigs[:0]
	for id, s := range f.reader.Signals() {
		f.sigs = append(f.sigs, admission.EngineSignal{Domain: id, Queue: s.Queue, Running: s.Running, KVUsage: s.KVUsage, Age: now.Sub(s.At)})
	}
	if len(f.sigs) == 0 {
		return
	}
	if err := f.eng.ObserveEngines(f.sigs); err != nil {
		f.log.Debug("engine metrics: signals for domains the engine no longer has", "err", err)
	}
}
