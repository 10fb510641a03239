package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/admission/client/etcdmembers"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/controlplane"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/internal/state/redistest"
	"github.com/sluice-sched/sluice/topology"
)

// vllmEngine serves vLLM's metrics with a waiting queue the test sets.
type vllmEngine struct {
	waiting atomic.Int64
	reads   atomic.Int64
	srv     *httptest.Server
}

func newVLLMEngine(t *testing.T) *vllmEngine {
	e := &vllmEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		e.reads.Add(1)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 24.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} %d.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 0.42
`, e.waiting.Load())
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// engineCluster writes a config (feedback.stale 5s) and a topology of two
// domains, d1 and d2, each naming one engine that serves vLLM's metrics;
// it returns their paths and the engines.
func engineCluster(t *testing.T) (cfgPath, topoPath string, engines map[string]*vllmEngine) {
	return engineClusterStale(t, "5s")
}

// engineClusterStale is engineCluster with feedback.stale given.
func engineClusterStale(t *testing.T, stale string) (cfgPath, topoPath string, engines map[string]*vllmEngine) {
	dir := t.TempDir()
	engines = map[string]*vllmEngine{"d1": newVLLMEngine(t), "d2": newVLLMEngine(t)}
	topo := "domains:\n"
	for _, id := range []string{"d1", "d2"} {
		topo += fmt.Sprintf("  - {id: %s, kind: hgx, gpu: H200, gpus_per_node: 8, nodes: 1, engines: [{metrics: %q, kind: vllm}]}\n", id, engines[id].srv.URL+"/metrics")
	}
	cfg := "feedback: {stale: " + stale + ", spread_choices: 1}\ntiers:\n  std: {rps: {rate: 1000, burst: 1000}, tokens: {rate: 1e9, burst: 1e9}, weight: 1}\ntenants:\n  acme: {tier: std}\n"
	topoPath, cfgPath = filepath.Join(dir, "cluster.yaml"), filepath.Join(dir, "sluice.yaml")
	for path, body := range map[string]string{topoPath: topo, cfgPath: cfg} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cfgPath, topoPath, engines
}

// placedOn admits one medium request of acme's on c, releases it, and
// returns its domain.
func placedOn(t *testing.T, c *client.Client) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme", Model: "medium", PromptTokens: 1000, MaxOutputTokens: 100})
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	if resp.GetDecision() != admissionv1.Decision_ADMITTED {
		t.Fatalf("Admit: %v", resp)
	}
	releaseLease(t, c, resp.GetLeaseId())
	return resp.GetDomain()
}

// saturatedOn reports whether srv's guard holds domain id.
func saturatedOn(srv *Server, id string) bool {
	for _, d := range srv.Engine().Domains() {
		if d.ID == id {
			return d.EngineSaturated
		}
	}
	return false
}

// sluiced reads the engines the topology names over HTTP: one domain's
// engines saying "saturated" move placement off it, and it comes back once
// they clear.
func TestEngineMetricsMovePlacement(t *testing.T) {
	cfgPath, topoPath, engines := engineCluster(t)
	srv, c, _, _ := start(t, Options{ConfigPath: cfgPath, Topology: topoPath, Engines: EngineMetricsOptions{Period: 20 * time.Millisecond}})
	first := placedOn(t, c)
	other := map[string]string{"d1": "d2", "d2": "d1"}[first]

	engines[first].waiting.Store(12)
	eventually(t, func() bool { return saturatedOn(srv, first) })
	fams := scrape(t, srv)
	for _, c := range []struct {
		name, domain string
		want         float64
	}{{"sluice_domain_engine_saturated", first, 1}, {"sluice_domain_engine_queue", first, 12}, {"sluice_domain_engine_saturated", other, 0}} {
		if got := value(t, fams, c.name, map[string]string{"domain": c.domain}); got != c.want {
			t.Errorf("%s{domain=%q} = %v, want %v", c.name, c.domain, got, c.want)
		}
	}
	for range 10 {
		if got := placedOn(t, c); got != other {
			t.Fatalf("%s's engines wait 12 requests: placed on %s, want %s", first, got, other)
		}
	}
	engines[first].waiting.Store(0)
	eventually(t, func() bool { return !saturatedOn(srv, first) })
	if got := placedOn(t, c); got != first {
		t.Errorf("%s's engines clear again: placed on %s, want back on %s", first, got, first)
	}
}

// Two replicas sharing batched state under an etcd membership, one reader
// per domain: each domain's engines are read by one replica only, and the
// other, which never reads them, moves placement off a domain whose
// engines say "saturated" (the reader's reading, relayed through Redis)
// and back once they clear.
func TestEngineReadingsRelayBetweenReplicas(t *testing.T) {
	cfgPath, topoPath, engines := engineCluster(t)
	rs, etcd := redistest.Start(t), etcdtest.Start(t)
	servers := make(map[string]*Server)
	clients := make(map[string]*client.Client)
	for _, id := range []string{"r-a", "r-b"} {
		eo := etcdOpts(etcd.Endpoint())
		eo.ReplicaID = id
		srv, c, _, _ := start(t, Options{ConfigPath: cfgPath, Topology: topoPath, Etcd: eo,
			Shared:  SharedOptions{RedisURL: rs.URL(), Mode: "batched", Prefix: "relay"},
			Engines: EngineMetricsOptions{Period: 20 * time.Millisecond, Readers: 1}})
		servers[id], clients[id] = srv, c
	}
	reads := func(id, domain string) bool { return slices.Contains(servers[id].state.feed.domainsRead(), domain) }
	eventually(t, func() bool { // both members known to both: each domain read once
		for _, d := range []string{"d1", "d2"} {
			if reads("r-a", d) == reads("r-b", d) {
				return false
			}
		}
		return true
	})
	// acme's first domain as r-b places, and the replica that does not read it.
	first := placedOn(t, clients["r-b"])
	other := map[string]string{"d1": "d2", "d2": "d1"}[first]
	blind := map[bool]string{true: "r-b", false: "r-a"}[reads("r-a", first)]
	reader := map[string]string{"r-a": "r-b", "r-b": "r-a"}[blind]
	if first != placedOn(t, clients[blind]) {
		t.Fatalf("acme's first domain differs between the replicas")
	}

	engines[first].waiting.Store(12)
	eventually(t, func() bool { return saturatedOn(servers[reader], first) })
	// Each placement looks at the domain, so the blind replica asks for
	// its engines' reading at its next round, and its guard acts on it.
	// (One spread choice: nothing but the guard moves placement.)
	eventually(t, func() bool { placedOn(t, clients[blind]); return saturatedOn(servers[blind], first) })
	for range 10 {
		if got := placedOn(t, clients[blind]); got != other {
			t.Fatalf("%s's engines wait 12 requests (read by %s): %s placed on %s, want %s", first, reader, blind, got, other)
		}
	}
	engines[first].waiting.Store(0)
	eventually(t, func() bool { return placedOn(t, clients[blind]) == first && !saturatedOn(servers[blind], first) })
	if !reads(reader, first) || reads(blind, first) {
		t.Errorf("%s read by %s: %v, by %s: %v; want by %s only", first, reader, reads(reader, first), blind, reads(blind, first), reader)
	}
}

// A domain whose reader never relays (a member of another version, here a
// member key with no sluiced behind it) starves the others of readings
// while placement weighs it: each reads it itself for a while, and its
// guard acts on what it reads.
func TestStarvedDomainsAreReadHere(t *testing.T) {
	cfgPath, topoPath, engines := engineClusterStale(t, "1s")
	rs, etcd := redistest.Start(t), etcdtest.Start(t)
	// Ghost members that read both domains before r-b, one reader each.
	var ghosts []string
	for i := 0; len(ghosts) == 0; i++ {
		g := []string{fmt.Sprintf("ghost-%d", i)}
		members := append([]string{"r-b"}, g...)
		if !readsDomain("d1", "r-b", members, 1) && !readsDomain("d2", "r-b", members, 1) {
			ghosts = g
		}
	}
	cli := etcd.Client(t)
	for _, g := range ghosts {
		v, err := etcdmembers.Encode(client.Member{ID: g, Addr: g + ":7070"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(context.Background(), etcdmembers.Key(controlplane.DefaultPrefix, g), string(v)); err != nil {
			t.Fatal(err)
		}
	}
	eo := etcdOpts(etcd.Endpoint())
	eo.ReplicaID = "r-b"
	srv, c, _, _ := start(t, Options{ConfigPath: cfgPath, Topology: topoPath, Etcd: eo,
		Shared:  SharedOptions{RedisURL: rs.URL(), Mode: "batched", Prefix: "starved"},
		Engines: EngineMetricsOptions{Period: 20 * time.Millisecond, Readers: 1}})
	reads := func(d string) bool { return slices.Contains(srv.state.feed.domainsRead(), d) }
	eventually(t, func() bool { return !reads("d1") && !reads("d2") }) // the ghosts are its members
	first := placedOn(t, c)
	other := map[string]string{"d1": "d2", "d2": "d1"}[first]
	engines[first].waiting.Store(12)
	eventually(t, func() bool { placedOn(t, c); return saturatedOn(srv, first) })
	if !reads(first) || reads(other) {
		t.Errorf("reads d1 %v, d2 %v: want only %s, the domain placement weighs", reads("d1"), reads("d2"), first)
	}
	fams := scrape(t, srv)
	for name, want := range map[string]float64{"sluice_engine_domains_read": 1, "sluice_engine_domains_starved": 1} {
		if got := value(t, fams, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	for range 10 {
		if got := placedOn(t, c); got != other {
			t.Fatalf("%s's engines wait 12 requests (read here for want of a relay): placed on %s, want %s", first, got, other)
		}
	}
}

// Each domain is read by exactly Readers of the live members; a member
// leaving moves only the domains it read, each to one other member.
func TestEngineReadersByRendezvous(t *testing.T) {
	members := []string{"r-0", "r-1", "r-2", "r-3", "r-4"}
	readersOf := func(domain string, members []string) []string {
		var out []string
		for _, m := range members {
			if readsDomain(domain, m, members, 2) {
				out = append(out, m)
			}
		}
		return out
	}
	perMember := make(map[string]int)
	for i := range 200 {
		d := fmt.Sprintf("rack-%d", i)
		before := readersOf(d, members)
		if len(before) != 2 {
			t.Fatalf("%s read by %v, want 2 members", d, before)
		}
		for _, m := range before {
			perMember[m]++
		}
		after := readersOf(d, slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == "r-2" }))
		switch {
		case !slices.Contains(before, "r-2") && !slices.Equal(before, after):
			t.Errorf("%s: readers %v became %v when r-2, not one of them, left", d, before, after)
		case slices.Contains(before, "r-2") && (len(after) != 2 || !slices.Contains(after, slices.DeleteFunc(slices.Clone(before), func(m string) bool { return m == "r-2" })[0])):
			t.Errorf("%s: readers %v became %v when r-2 left, want the other kept and one added", d, before, after)
		}
	}
	for m, n := range perMember {
		if n < 50 || n > 110 { // 80 each on average
			t.Errorf("%s reads %d of 200 domains (all: %v), want about 80", m, n, perMember)
		}
	}
}

// releaseLease releases a lease of 1000 prompt and 100 output tokens.
func releaseLease(t *testing.T, c *client.Client, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Release(ctx, &admissionv1.ReleaseRequest{LeaseId: id, PromptTokens: 1000, OutputTokens: 100, Outcome: admissionv1.Outcome_OUTCOME_OK}); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// BenchmarkEngineReaders is what one replica does when the membership
// changes: it picks the domains whose engines it reads (2 readers each)
// and hands the reader the new set. It reports how many domains this
// replica reads, and the most any member reads, against every domain.
func BenchmarkEngineReaders(b *testing.B) {
	for _, c := range []struct{ domains, members int }{{6, 3}, {1400, 1000}} {
		b.Run(fmt.Sprintf("%d-domains-%d-replicas", c.domains, c.members), func(b *testing.B) {
			f, err := newEngineFeed(EngineMetricsOptions{}, nil, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				b.Fatal(err)
			}
			var cluster topology.Cluster
			for i := range c.domains {
				cluster.Domains = append(cluster.Domains, topology.Domain{ID: fmt.Sprintf("rack-%d", i),
					Engines: []topology.Engine{{Metrics: fmt.Sprintf("http://rack-%d:9400/metrics", i), Kind: "vllm"}}})
			}
			f.topologyChanged(cluster)
			members := make([]string, c.members)
			for i := range members {
				members[i] = fmt.Sprintf("sluiced-%d", i)
			}
			most := make(map[string]int)
			for _, d := range cluster.Domains {
				for _, m := range members {
					if readsDomain(d.ID, m, members, f.readers) {
						most[m]++
					}
				}
			}
			b.ResetTimer()
			for b.Loop() {
				f.membersChanged(members[0], members)
			}
			b.ReportMetric(float64(len(f.domainsRead())), "domains-read")
			b.ReportMetric(float64(slices.Max(slices.Collect(maps.Values(most)))), "max-domains-read")
			b.ReportMetric(float64(c.domains), "every-domain")
		})
	}
}
