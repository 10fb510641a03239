package controlplane

import (
	"slices"
	"testing"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
)

// The agents' cluster read at start-up starts whole; a node whose agent
// returns, and a domain whose drain mark is deleted, warm up.
func TestAgentsAndMarksWarmUp(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	putRecords(t, cli, "hgx-h200-1", "hgx-h200-2")
	r := startReplica(t, cli, Options{})
	eventually(t, "synced", r.ctl.Synced)
	warming := func(id string) (admission.DomainInfo, bool) {
		for _, d := range r.eng.Domains() {
			if d.ID == id {
				return d, d.WarmupLeft > 0
			}
		}
		t.Fatalf("no domain %s", id)
		return admission.DomainInfo{}, false
	}
	if !slices.Equal(domainIDs(r.eng), []string{"hgx-h200-1", "hgx-h200-2"}) {
		t.Fatalf("start-up cluster: %v", domainIDs(r.eng))
	}
	for _, id := range []string{"hgx-h200-1", "hgx-h200-2"} {
		if d, w := warming(id); w {
			t.Fatalf("%s, present at start-up, warms up: %+v", id, d)
		}
	}

	if _, err := cli.Delete(ctxT(t), AgentKey(DefaultPrefix, "hgx-h200-2")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "hgx-h200-2 gone", func() bool { return slices.Equal(domainIDs(r.eng), []string{"hgx-h200-1"}) })
	putRecords(t, cli, "hgx-h200-2")
	eventually(t, "hgx-h200-2 back", func() bool { return len(r.eng.Domains()) == 2 })
	if d, w := warming("hgx-h200-2"); !w || d.WarmupFraction < 0.25 || d.WarmupFraction >= 1 {
		t.Fatalf("a returning agent's domain: %+v, want it warming up", d)
	}
	if d, w := warming("hgx-h200-1"); w {
		t.Fatalf("the domain that stayed warms up: %+v", d)
	}

	put(t, cli, DrainKey(DefaultPrefix, "hgx-h200-1"), `{"domain":"hgx-h200-1"}`)
	eventually(t, "hgx-h200-1 drained", func() bool { d, _ := warming("hgx-h200-1"); return d.Draining })
	if _, err := cli.Delete(ctxT(t), DrainKey(DefaultPrefix, "hgx-h200-1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "hgx-h200-1 undrained", func() bool { d, _ := warming("hgx-h200-1"); return !d.Draining })
	if d, w := warming("hgx-h200-1"); !w {
		t.Fatalf("undrained by the mark's deletion: %+v, want it warming up", d)
	}
}
