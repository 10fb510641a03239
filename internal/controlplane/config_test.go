package controlplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	t.Cleanup(cancel)
	return ctx
}

// A config written with ApplyConfig reaches a running replica; later writes
// of single tenant documents are hot-reloaded, visible to the next Admit,
// while a lease taken before every reload stays valid.
func TestConfigRoundTripAndHotReload(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	res, err := ApplyConfig(ctxT(t), cli, DefaultPrefix, "sluice.yaml", config.DefaultYAML())
	if err != nil {
		t.Fatal(err)
	}
	if res.TenantsWritten != 4 || res.Transactions != 1 || res.PolicyUnchanged {
		t.Fatalf("first apply: %+v", res)
	}
	// Writing the same file again changes nothing.
	if again, err := ApplyConfig(ctxT(t), cli, DefaultPrefix, "sluice.yaml", config.DefaultYAML()); err != nil ||
		again.Transactions != 0 || !again.PolicyUnchanged || again.TenantsWritten != 0 {
		t.Fatalf("second apply: %+v, %v", again, err)
	}

	r := startReplica(t, cli, Options{})
	st := r.ctl.Status()
	eventually(t, "serving etcd's config", func() bool { return st.View().Source == SourceEtcd })
	if v := st.View(); v.Revision != res.Revision || v.LastRefusal != nil || !v.Connected {
		t.Fatalf("status after the first sync: %+v (want revision %d)", v, res.Revision)
	}

	held := admit(t, r.eng, "acme", "large")
	if held.Outcome != admission.Admitted {
		t.Fatalf("acme: %+v", held)
	}
	if d := admit(t, r.eng, "newco", "small"); d.Reason != admission.ReasonUnknownTenant {
		t.Fatalf("newco before it exists: %+v", d)
	}

	rev := put(t, cli, TenantKey(DefaultPrefix, "newco"), "tier: free\nweight: 3\n")
	eventually(t, "newco applied", func() bool { return r.ctl.Revision() >= rev })
	if d := admit(t, r.eng, "newco", "small"); d.Outcome != admission.Admitted {
		t.Fatalf("newco after its document was written: %+v", d)
	}
	if ti, ok := r.eng.Tenant("newco"); !ok || ti.Weight != 3 || ti.Tier != "free" {
		t.Fatalf("newco: %+v, %v", ti, ok)
	}
	if v := st.View(); v.Source != SourceEtcd || v.Revision != rev {
		t.Fatalf("status: %+v, want revision %d", v, rev)
	}

	// An override of a tenant that the policy document defined moves too.
	rev = put(t, cli, TenantKey(DefaultPrefix, "acme"), `{"tier": "enterprise", "weight": 9}`)
	eventually(t, "acme's override applied", func() bool { return r.ctl.Revision() >= rev })
	if ti, _ := r.eng.Tenant("acme"); ti.Weight != 9 {
		t.Fatalf("acme's weight: %d, want 9", ti.Weight)
	}

	// Deleting a tenant document removes the tenant.
	dr, err := cli.Delete(ctxT(t), TenantKey(DefaultPrefix, "newco"))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "newco removed", func() bool { return r.ctl.Revision() >= dr.Header.Revision })
	if _, ok := r.eng.Tenant("newco"); ok {
		t.Fatal("newco still configured after its document was deleted")
	}
	if v := st.View(); v.Revision != dr.Header.Revision {
		t.Fatalf("status revision %d, want the deletion's %d", v.Revision, dr.Header.Revision)
	}

	// The lease taken before all of that settles normally.
	if _, err := r.eng.Release(context.Background(), admission.Release{LeaseID: held.LeaseID, OutputTokens: 5}); err != nil {
		t.Fatalf("release of the lease held across reloads: %v", err)
	}
}

// Bad config written to etcd is refused with its key, the key path and the
// reason; the last good config keeps serving; a later good write is applied
// and clears the refusal.
func TestInvalidConfigRefusedLastGoodKept(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	if _, err := ApplyConfig(ctxT(t), cli, DefaultPrefix, "sluice.yaml", config.DefaultYAML()); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, cli, Options{Status: NewStatus(SourceEmbedded, time.Now(), m), Metrics: m})
	st := r.ctl.Status()
	eventually(t, "serving etcd's config", func() bool { return st.View().Source == SourceEtcd })
	good := st.View().Revision

	cases := []struct {
		name, key, value string
		wantSource       string
		wantKey          string
		wantReason       string
	}{
		{"unknown key in a tenant", TenantKey(DefaultPrefix, "oops"), "tier: free\nweigth: 3\n",
			TenantKey(DefaultPrefix, "oops"), "tenants.oops", `unknown key "weigth"`},
		{"wrong type in a tenant", TenantKey(DefaultPrefix, "oops"), "tier: free\nweight: heavy\n",
			TenantKey(DefaultPrefix, "oops"), "tenants.oops.weight", "want a whole number"},
		{"unknown tier", TenantKey(DefaultPrefix, "oops"), "tier: platinum\n",
			TenantKey(DefaultPrefix, "oops"), "tenants.oops.tier", "platinum"},
		{"tenant defined twice", TenantKey(DefaultPrefix, "hooli"), "tier: free\n",
			TenantKey(DefaultPrefix, "hooli"), "tenants.hooli", "also defined"},
		{"broken policy document", ConfigKey(DefaultPrefix), "tiers: [\n",
			ConfigKey(DefaultPrefix), "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := gauge(t, reg, "sluice_config_refusals_total", "source", SourceEtcd)
			if tc.key == TenantKey(DefaultPrefix, "hooli") {
				// ApplyConfig gave hooli a document of its own; define it in
				// the policy document too.
				putPolicyWithTenant(t, cli, "hooli")
				t.Cleanup(func() { restorePolicy(t, cli) })
			}
			rev := put(t, cli, tc.key, tc.value)
			eventually(t, "the write processed", func() bool { return r.ctl.Revision() >= rev })
			v := st.View()
			if v.LastRefusal == nil {
				t.Fatalf("not refused: %+v", v)
			}
			ref := v.LastRefusal
			if ref.Source != tc.wantSource || ref.Key != tc.wantKey || !strings.Contains(ref.Reason, tc.wantReason) || ref.Revision != rev {
				t.Fatalf("refusal %+v; want source %s, key %q, reason with %q, revision %d", ref, tc.wantSource, tc.wantKey, tc.wantReason, rev)
			}
			if v.Source != SourceEtcd || v.Revision < good {
				t.Fatalf("serving %+v", v)
			}
			if _, ok := r.eng.Tenant("oops"); ok {
				t.Fatal("the refused tenant is configured")
			}
			if d := admit(t, r.eng, "globex", "small"); d.Outcome != admission.Admitted {
				t.Fatalf("the last good config stopped serving: %+v", d)
			}
			if got := gauge(t, reg, "sluice_config_refusals_total", "source", SourceEtcd); got <= before {
				t.Fatalf("sluice_config_refusals_total{source=etcd} = %v, was %v", got, before)
			}
		})
	}
	restorePolicy(t, cli)
	if _, err := cli.Delete(ctxT(t), TenantKey(DefaultPrefix, "oops")); err != nil {
		t.Fatal(err)
	}
	// The good state again: applied, the refusal cleared.
	eventually(t, "applied again", func() bool { v := st.View(); return v.LastRefusal == nil && v.Revision > good })
	if got := gauge(t, reg, "sluice_config_revision"); got != float64(st.View().Revision) {
		t.Fatalf("sluice_config_revision = %v, want %d", got, st.View().Revision)
	}
}

// putPolicyWithTenant rewrites the policy document with a tenants map that
// holds name.
func putPolicyWithTenant(t *testing.T, cli *clientv3.Client, name string) {
	t.Helper()
	base, _, err := split(config.DefaultYAML())
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(string(base), "{", `{"tenants": {"`+name+`": {"tier": "free"}},`, 1)
	put(t, cli, ConfigKey(DefaultPrefix), doc)
}

// restorePolicy writes the default policy document back.
func restorePolicy(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	base, _, err := split(config.DefaultYAML())
	if err != nil {
		t.Fatal(err)
	}
	put(t, cli, ConfigKey(DefaultPrefix), string(base))
}

// ApplyConfig validates locally first: a bad file is refused with its name,
// key and reason, and nothing is written.
func TestApplyConfigValidatesFirst(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	before, err := cli.Get(ctxT(t), "x")
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(config.DefaultYAML()), "weight: 8", "weight: eight", 1)
	_, err = ApplyConfig(ctxT(t), cli, DefaultPrefix, "bad.yaml", []byte(bad))
	var ce *config.Error
	if !errors.As(err, &ce) || ce.File != "bad.yaml" || ce.Key != "tiers.enterprise.weight" {
		t.Fatalf("ApplyConfig(bad) = %v; want a *config.Error on bad.yaml, tiers.enterprise.weight", err)
	}
	after, err := cli.Get(ctxT(t), "x")
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision {
		t.Fatalf("a refused file wrote to etcd: revision %d → %d", before.Header.Revision, after.Header.Revision)
	}
}

// ParseDocuments attributes a problem inside a tenant to that tenant's key,
// and refuses tenant documents without a policy document's context.
func TestParseDocumentsAttribution(t *testing.T) {
	base, tenants, err := split(config.DefaultYAML())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseDocuments("/p/", base, tenants)
	if err != nil || len(cfg.Tenants) != 4 {
		t.Fatalf("the default split and joined: %d tenants, %v", len(cfg.Tenants), err)
	}
	tenants["bad/name"] = []byte("tier: free")
	_, err = ParseDocuments("/p/", base, tenants)
	var ce *config.Error
	if !errors.As(err, &ce) || ce.File != "/p/tenants/bad/name" {
		t.Fatalf("a tenant name with a slash: %v", err)
	}
	delete(tenants, "bad/name")
	tenants["x"] = []byte("tier: free\nrps: {rate: -1, burst: 1}\n")
	_, err = ParseDocuments("/p/", base, tenants)
	if !errors.As(err, &ce) || ce.File != "/p/tenants/x" || !strings.HasPrefix(ce.Key, "tenants.x") {
		t.Fatalf("a bad rate in tenant x: %v", err)
	}
	for _, doc := range []string{"", "null", "[1, 2]", "7"} {
		if _, err := ParseDocuments("/p/", []byte(doc), nil); !errors.As(err, &ce) || ce.File != "/p/config" {
			t.Fatalf("policy document %q: %v", doc, err)
		}
	}
}

// attribute picks the longest tenant name a refusal's key path falls under,
// whatever the map's order: tenant names may hold dots.
func TestAttributeLongestTenant(t *testing.T) {
	tenants := map[string][]byte{"a": nil, "a.b": nil, "a.bc": nil, "ab": nil}
	cases := map[string]string{
		"tenants.a.b.weight":    "a.b",
		"tenants.a.b":           "a.b",
		"tenants.a.bc.rps.rate": "a.bc",
		"tenants.a.weight":      "a",
		"tenants.ab[0]":         "ab",
	}
	for range 20 { // map order varies between iterations
		for key, want := range cases {
			err := attribute("/p/", maps.Keys(tenants), &config.Error{File: "/p/config", Key: key, Reason: "r"})
			var ce *config.Error
			if !errors.As(err, &ce) || ce.File != TenantKey("/p/", want) || ce.Key != key {
				t.Fatalf("%s: %v; want it on tenant %s", key, err, want)
			}
		}
	}
	err := attribute("/p/", maps.Keys(tenants), &config.Error{File: "/p/config", Key: "tenants.zed.weight", Reason: "r"})
	var ce *config.Error
	if !errors.As(err, &ce) || ce.File != "/p/config" {
		t.Fatalf("a tenant without a document: %v", err)
	}
}

// ApplyConfig's write is guarded: when another writer changes a config
// document between its read and its write, nothing is written on that
// attempt; it reads again and writes what the file says (last writer
// wins). A tenant deleted in that window, which leaves no revision to
// compare, is seen too and written back. A writer that keeps racing makes
// it fail with a clear error.
func TestApplyConfigGuardsReadModifyWrite(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	if _, err := ApplyConfig(ctxT(t), cli, DefaultPrefix, "sluice.yaml", config.DefaultYAML()); err != nil {
		t.Fatal(err)
	}
	file := []byte(strings.Replace(string(config.DefaultYAML()), "hooli: {tier: free}", "hooli: {tier: standard}", 1))
	if string(file) == string(config.DefaultYAML()) {
		t.Fatal("the edit did not apply; the default changed")
	}
	_, want, err := split(file)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		_, got, _, err := ReadDocuments(ctxT(t), cli, DefaultPrefix)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: tenants %v, want the file's %d", what, slices.Sorted(maps.Keys(got)), len(want))
		}
		for n, v := range want {
			if string(got[n]) != string(v) {
				t.Fatalf("%s: tenant %s is %s, want %s", what, n, got[n], v)
			}
		}
	}
	race := func(n int, write func()) {
		left := n
		afterApplyRead = func() {
			if left > 0 {
				left--
				write()
			}
		}
		t.Cleanup(func() { afterApplyRead = nil })
	}

	// A tenant changed (and one created) in the window.
	race(1, func() {
		put(t, cli, TenantKey(DefaultPrefix, "hooli"), `{"tier": "premium"}`)
		put(t, cli, TenantKey(DefaultPrefix, "newco"), `{"tier": "free"}`)
	})
	res, err := ApplyConfig(ctxT(t), cli, DefaultPrefix, "edit.yaml", file)
	if err != nil || res.Attempts != 2 || res.Transactions != 1 || res.TenantsWritten != 1 || res.TenantsDeleted != 1 {
		t.Fatalf("apply raced by a write: %+v, %v; want 2 attempts, one transaction writing hooli and deleting newco", res, err)
	}
	check("after a raced write")

	// An unchanged tenant deleted in the window.
	race(1, func() {
		if _, err := cli.Delete(ctxT(t), TenantKey(DefaultPrefix, "acme")); err != nil {
			t.Error(err)
		}
	})
	put(t, cli, TenantKey(DefaultPrefix, "hooli"), `{"tier": "free"}`)
	res, err = ApplyConfig(ctxT(t), cli, DefaultPrefix, "edit.yaml", file)
	if err != nil || res.Attempts != 2 || res.TenantsWritten != 2 {
		t.Fatalf("apply raced by a deletion: %+v, %v; want 2 attempts writing hooli, then acme back", res, err)
	}
	check("after a raced deletion")

	// The unchanged policy document deleted in the window.
	race(1, func() {
		if _, err := cli.Delete(ctxT(t), ConfigKey(DefaultPrefix)); err != nil {
			t.Error(err)
		}
	})
	put(t, cli, TenantKey(DefaultPrefix, "hooli"), `{"tier": "free"}`)
	res, err = ApplyConfig(ctxT(t), cli, DefaultPrefix, "edit.yaml", file)
	if err != nil || res.Attempts != 2 || res.PolicyUnchanged || res.TenantsWritten != 1 {
		t.Fatalf("apply raced by the policy's deletion: %+v, %v; want 2 attempts, the policy written back", res, err)
	}
	if base, _, _, err := ReadDocuments(ctxT(t), cli, DefaultPrefix); err != nil || base == nil {
		t.Fatalf("policy document after the apply: %q, %v", base, err)
	}
	check("after the policy's deletion")

	// A tenant rewritten in the window every time.
	race(applyAttempts, func() { put(t, cli, TenantKey(DefaultPrefix, "hooli"), `{"tier": "premium"}`) })
	put(t, cli, TenantKey(DefaultPrefix, "hooli"), `{"tier": "premium"}`)
	before, err := cli.Get(ctxT(t), ConfigKey(DefaultPrefix))
	if err != nil {
		t.Fatal(err)
	}
	_, applyErr := ApplyConfig(ctxT(t), cli, DefaultPrefix, "edit.yaml", file)
	if applyErr == nil || !strings.Contains(applyErr.Error(), "another writer") || !strings.Contains(applyErr.Error(), "nothing was written") {
		t.Fatalf("apply raced on every attempt: %v; want an error naming another writer, saying nothing was written", applyErr)
	}
	after, err := cli.Get(ctxT(t), ConfigKey(DefaultPrefix))
	if err != nil {
		t.Fatal(err)
	}
	if writes := after.Header.Revision - before.Header.Revision; writes != applyAttempts {
		t.Fatalf("%d writes during the failed apply, want only the racing writer's %d", writes, applyAttempts)
	}

	// A tenant deleted in the window every time: the guard cannot see a
	// deletion, so each attempt's writes land before the count shows it,
	// and the error says so.
	put(t, cli, TenantKey(DefaultPrefix, "hooli"), `{"tier": "premium"}`)
	victims := []string{"acme", "globex"}
	n := 0
	race(applyAttempts, func() {
		if _, err := cli.Delete(ctxT(t), TenantKey(DefaultPrefix, victims[n%2])); err != nil {
			t.Error(err)
		}
		n++
	})
	res, err = ApplyConfig(ctxT(t), cli, DefaultPrefix, "edit.yaml", file)
	if err == nil || !strings.Contains(err.Error(), "another writer") || !strings.Contains(err.Error(), "landed") {
		t.Fatalf("apply raced by a deletion on every attempt: %+v, %v; want an error saying its writes landed", res, err)
	}
	if res.Transactions != applyAttempts || !strings.Contains(err.Error(), fmt.Sprintf("last at revision %d", res.Revision)) {
		t.Fatalf("apply raced by a deletion on every attempt: %+v, %v; want one transaction per attempt, the last named", res, err)
	}
	last := victims[(applyAttempts-1)%2]
	if _, got, _, err := ReadDocuments(ctxT(t), cli, DefaultPrefix); err != nil || string(got["hooli"]) != string(want["hooli"]) || got[last] != nil {
		t.Fatalf("documents after the failed apply: %v, %v; want the file's hooli written and the last deletion (%s) standing", got, err, last)
	}
}

// A change of tenant documents alone reaches the engine as a change of
// those tenants (UpdateTenants), not as the whole config re-read: written,
// deleted, or refused with the tenant's key while the rest keeps serving.
// After a refusal, changes take the whole path until the documents are
// good again.
func TestTenantDocumentsChangeOnlyTheirTenants(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	if _, err := ApplyConfig(ctxT(t), cli, DefaultPrefix, "sluice.yaml", config.DefaultYAML()); err != nil {
		t.Fatal(err)
	}
	eng := &recordingEngine{Engine: newEngine(t)}
	r := startReplica(t, cli, Options{Engine: eng})
	st := r.ctl.Status()
	eventually(t, "serving etcd's config", func() bool { return st.View().Source == SourceEtcd })
	// step writes (or deletes, value "") tenant documents and returns the
	// engine's calls that applied them.
	step := func(what string, docs map[string]string) []string {
		t.Helper()
		before := len(eng.log())
		var ops []clientv3.Op
		for _, name := range slices.Sorted(maps.Keys(docs)) {
			if docs[name] == "" {
				ops = append(ops, clientv3.OpDelete(TenantKey(DefaultPrefix, name)))
			} else {
				ops = append(ops, clientv3.OpPut(TenantKey(DefaultPrefix, name), docs[name]))
			}
		}
		resp, err := cli.Txn(ctxT(t)).Then(ops...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, what, func() bool { return r.ctl.Revision() >= resp.Header.Revision })
		return eng.log()[before:]
	}

	if calls := step("newco written", map[string]string{"newco": "tier: free\nweight: 3\n"}); !slices.Equal(calls, []string{"update newco"}) {
		t.Fatalf("newco's document applied by %q, want its update alone", calls)
	}
	if ti, ok := eng.Tenant("newco"); !ok || ti.Weight != 3 {
		t.Fatalf("newco: %+v, %v", ti, ok)
	}
	calls := step("hooli deleted, newco changed", map[string]string{"hooli": "", "newco": "tier: premium\n"})
	if !slices.Equal(calls, []string{"update hooli,newco"}) {
		t.Fatalf("applied by %q, want one update of both", calls)
	}
	if _, ok := eng.Tenant("hooli"); ok {
		t.Fatal("hooli still configured after its document was deleted")
	}
	if ti, _ := eng.Tenant("newco"); ti.Tier != "premium" {
		t.Fatalf("newco's tier %q, want premium", ti.Tier)
	}

	// The engine refuses a weight of 0 (the document decodes); the refusal
	// names the tenant's key and nothing changes.
	step("a refused tenant", map[string]string{"oops": "tier: free\nweight: 0\n"})
	if v := st.View(); v.LastRefusal == nil || v.LastRefusal.Source != TenantKey(DefaultPrefix, "oops") || v.LastRefusal.Key != "tenants.oops.weight" {
		t.Fatalf("refusal: %+v", v.LastRefusal)
	}
	if _, ok := eng.Tenant("oops"); ok {
		t.Fatal("a refused tenant was configured")
	}
	// While oops stands refused, another change re-reads everything and
	// is refused with it (by the config's validation, before the engine);
	// once oops is mended, the whole config applies, and the next change is
	// a tenant's again.
	if calls := step("another tenant while oops is refused", map[string]string{"later": "tier: free\n"}); len(calls) != 0 {
		t.Fatalf("applied by %q, want the whole config refused", calls)
	}
	if _, ok := eng.Tenant("later"); ok {
		t.Fatal("a change applied beside a refused document")
	}
	if calls := step("oops mended", map[string]string{"oops": "tier: free\n"}); !slices.Equal(calls, []string{"apply"}) {
		t.Fatalf("applied by %q, want the whole config", calls)
	}
	if _, ok := eng.Tenant("later"); !ok {
		t.Fatal("later not configured once oops was mended")
	}
	if calls := step("one more", map[string]string{"last": "tier: free\n"}); !slices.Equal(calls, []string{"update last"}) {
		t.Fatalf("applied by %q, want its update alone", calls)
	}
	if v := st.View(); v.LastRefusal != nil && v.Revision < v.LastRefusal.Revision {
		t.Fatalf("status after the mend: %+v", v)
	}
}
