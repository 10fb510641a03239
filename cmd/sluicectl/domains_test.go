package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/admission/client/etcdmembers"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/controlplane"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/internal/server"
	"github.com/sluice-sched/sluice/internal/testwait"
)

// startSluiced runs a sluiced in-process on loopback, following etcd at
// endpoint, until the test ends.
func startSluiced(t *testing.T, endpoint string) *server.Server {
	t.Helper()
	srv, err := server.New(server.Options{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Topology: "simulated",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Etcd: server.EtcdOptions{Endpoints: endpoint, MemberTTL: time.Second,
			ProbeEvery: 50 * time.Millisecond, RetryEvery: 20 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv
}

// sluicectl runs the CLI and returns its exit code, stdout and stderr.
func sluicectl(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// eventually polls cond until it holds, for up to 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, 30*time.Second, what, cond)
}

// drain and undrain write and delete the mark (with $USER and --reason);
// the server acts on it, and domains shows both the mark and the server's
// state with its in-flight count.
func TestDrainUndrainDomains(t *testing.T) {
	etcd := etcdtest.Start(t)
	srv := startSluiced(t, etcd.Endpoint())
	addr := srv.GRPCAddr().String()
	t.Setenv("USER", "alice")
	t.Setenv("SLUICE_ETCD", "") // the flags below say where etcd is

	waitMembers(t, etcd, 1)
	code, out, errs := sluicectl("drain", "nvl72-a", "--reason", "rack swap", "--etcd", etcd.Endpoint())
	if code != 0 || !strings.Contains(out, "drained by alice") || !strings.Contains(out, "rack swap") {
		t.Fatalf("drain: %d %q %q", code, out, errs)
	}
	draining := func(want bool) func() bool {
		return func() bool {
			for _, d := range srv.Engine().Domains() {
				if d.ID == "nvl72-a" {
					return d.Draining == want
				}
			}
			return false
		}
	}
	eventually(t, "nvl72-a drained on the server", draining(true))

	code, out, errs = sluicectl("domains", "--server", addr, "--etcd", etcd.Endpoint())
	if code != 0 {
		t.Fatalf("domains: %d %q", code, errs)
	}
	var line string
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(l, "nvl72-a ") {
			line = l
		}
	}
	if f := strings.Fields(line); len(f) < 7 || f[3] != "yes" || f[4] != "0" || !strings.Contains(line, "drained by alice") {
		t.Fatalf("domains line for nvl72-a: %q\n%s", line, out)
	}
	if !strings.Contains(out, "nvl72-b ") || !strings.Contains(out, "DRAIN MARK") {
		t.Fatalf("domains output:\n%s", out)
	}
	code, out, _ = sluicectl("domains", "--server", addr, "-o", "json")
	if code != 0 || !strings.Contains(out, `"draining": true`) {
		t.Fatalf("domains -o json: %d\n%s", code, out)
	}

	code, out, errs = sluicectl("undrain", "nvl72-a", "--etcd", etcd.Endpoint())
	if code != 0 || !strings.Contains(out, "removed") {
		t.Fatalf("undrain: %d %q %q", code, out, errs)
	}
	eventually(t, "nvl72-a undrained on the server", draining(false))
	if code, out, _ = sluicectl("undrain", "nvl72-a", "--etcd", etcd.Endpoint()); code != 0 || !strings.Contains(out, "no drain mark") {
		t.Fatalf("second undrain: %d %q", code, out)
	}

	// Without etcd, --server drains the one replica directly.
	if code, out, errs = sluicectl("drain", "hgx-h200-1", "--server", addr, "--reason", "fan"); code != 0 || !strings.Contains(out, "only") {
		t.Fatalf("drain --server: %d %q %q", code, out, errs)
	}
	if code, _, errs = sluicectl("drain", "nvl72-a"); code == 0 || !strings.Contains(errs, "--etcd") {
		t.Fatalf("drain without --etcd or --server: %d %q", code, errs)
	}
	if code, _, _ = sluicectl("drain"); code == 0 {
		t.Fatal("drain without a domain succeeded")
	}
}

// waitMembers waits until n replicas are registered in etcd.
func waitMembers(t *testing.T, etcd *etcdtest.Server, n int) {
	t.Helper()
	cli := etcd.Client(t)
	eventually(t, fmt.Sprintf("%d replicas registered", n), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ms, _, err := etcdmembers.List(ctx, cli, controlplane.DefaultPrefix)
		return err == nil && len(ms) == n
	})
}

// domainsJSON runs domains -o json with args and decodes its rows by id.
func domainsJSON(t *testing.T, args ...string) map[string]domainRow {
	t.Helper()
	code, out, errs := sluicectl(append([]string{"domains", "-o", "json"}, args...)...)
	if code != 0 {
		t.Fatalf("domains %v: %d %q", args, code, errs)
	}
	var rows []domainRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("domains -o json: %v\n%s", err, out)
	}
	byID := map[string]domainRow{}
	for _, r := range rows {
		byID[r.ID] = r
	}
	return byID
}

// With --etcd and no --server, domains asks every registered replica: the
// in-flight counts are summed, and a replica that does not drain a domain
// the others drain is named. drain refuses a domain that neither the agents
// nor the replicas know, unless --force.
func TestDomainsAcrossReplicas(t *testing.T) {
	etcd := etcdtest.Start(t)
	t.Setenv("SLUICE_ETCD", "")
	t.Setenv("USER", "alice")
	s1, s2 := startSluiced(t, etcd.Endpoint()), startSluiced(t, etcd.Endpoint())
	id1, id2 := s1.GRPCAddr().String(), s2.GRPCAddr().String()
	waitMembers(t, etcd, 2)

	// Leases on both replicas.
	for _, srv := range []*server.Server{s1, s2} {
		for _, tenant := range []string{"acme", "globex", "initech"} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			d, err := srv.Engine().Admit(ctx, admission.Request{Tenant: tenant, Model: "small", PromptTokens: 100, MaxOutputTokens: 10})
			cancel()
			if err != nil || d.Outcome != admission.Admitted {
				t.Fatalf("admit %s: %+v, %v", tenant, d, err)
			}
		}
	}
	want := map[string]int64{}
	for _, srv := range []*server.Server{s1, s2} {
		for _, d := range srv.Engine().Domains() {
			want[d.ID] += int64(d.InFlight)
		}
	}

	if code, out, errs := sluicectl("drain", "nvl72-a", "--etcd", etcd.Endpoint()); code != 0 {
		t.Fatalf("drain: %d %q %q", code, out, errs)
	}
	drained := func(srv *server.Server, id string) bool {
		for _, d := range srv.Engine().Domains() {
			if d.ID == id {
				return d.Draining
			}
		}
		return false
	}
	eventually(t, "nvl72-a drained on both", func() bool { return drained(s1, "nvl72-a") && drained(s2, "nvl72-a") })
	// hgx-h200-1 drained on s1 only, through its Operator RPC.
	if code, out, errs := sluicectl("drain", "hgx-h200-1", "--server", id1, "--reason", "fan"); code != 0 {
		t.Fatalf("drain --server: %d %q %q", code, out, errs)
	}

	rows := domainsJSON(t, "--etcd", etcd.Endpoint())
	var sum int64
	for id, n := range want {
		if rows[id].InFlight != n {
			t.Fatalf("%s: %d in flight, want %d (both replicas)", id, rows[id].InFlight, n)
		}
		sum += n
	}
	if sum != 6 {
		t.Fatalf("%d leases in flight over the domains, want the 6 admitted", sum)
	}
	if r := rows["nvl72-a"]; !r.Draining || r.Mark == nil || len(r.Replicas) != 2 || !r.Replicas[0].Draining || !r.Replicas[1].Draining {
		t.Fatalf("nvl72-a: %+v", r)
	}
	r := rows["hgx-h200-1"]
	if r.Draining || len(r.Replicas) != 2 {
		t.Fatalf("hgx-h200-1: %+v; want not draining everywhere, two replicas", r)
	}
	for _, rd := range r.Replicas {
		if rd.Draining != (rd.Replica == id1) {
			t.Fatalf("hgx-h200-1 on %s: %+v; want it drained on %s only", rd.Replica, rd, id1)
		}
	}
	code, out, errs := sluicectl("domains", "--etcd", etcd.Endpoint())
	if code != 0 {
		t.Fatalf("domains: %d %q", code, errs)
	}
	var line string
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(l, "hgx-h200-1 ") {
			line = l
		}
	}
	if !strings.Contains(line, "1/2, not: "+id2) {
		t.Fatalf("hgx-h200-1's line names no replica that does not drain it: %q\n%s", line, out)
	}

	// Unknown domains.
	code, _, errs = sluicectl("drain", "nvl72-z", "--etcd", etcd.Endpoint())
	if code == 0 || !strings.Contains(errs, "unknown") || !strings.Contains(errs, "--force") || !strings.Contains(errs, "nvl72-a") {
		t.Fatalf("drain of an unknown domain: %d %q", code, errs)
	}
	if marks, err := controlplane.ListDrains(context.Background(), etcd.Client(t), controlplane.DefaultPrefix); err != nil || len(marks) != 1 {
		t.Fatalf("marks after a refused drain: %+v, %v", marks, err)
	}
	if code, out, errs := sluicectl("drain", "nvl72-z", "--etcd", etcd.Endpoint(), "--force"); code != 0 || !strings.Contains(out, "written") {
		t.Fatalf("drain --force of an unknown domain: %d %q %q", code, out, errs)
	}
}

// When no registered replica answers, domains still lists the drain marks
// and does not call a marked domain "not on the replicas" (nobody said so);
// a member entry that is not a member is warned about on stderr and the
// other members are still asked. --server "" with --etcd lists the marks
// only, asking no replica.
func TestDomainsWithoutAnsweringReplicas(t *testing.T) {
	etcd := etcdtest.Start(t)
	t.Setenv("SLUICE_ETCD", "")
	t.Setenv("USER", "alice")
	cli := etcd.Client(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String() // nothing listens there once closed
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	ghost, err := etcdmembers.Encode(client.Member{ID: "ghost", Addr: gone})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for key, value := range map[string]string{
		etcdmembers.Key(controlplane.DefaultPrefix, "ghost"):  string(ghost),
		etcdmembers.Key(controlplane.DefaultPrefix, "broken"): `{"id": "broken"}`,
	} {
		if _, err := cli.Put(ctx, key, value); err != nil {
			t.Fatal(err)
		}
	}
	if code, out, errs := sluicectl("drain", "nvl72-a", "--reason", "rack swap", "--force", "--etcd", etcd.Endpoint()); code != 0 {
		t.Fatalf("drain --force: %d %q %q", code, out, errs)
	}

	code, out, errs := sluicectl("domains", "--etcd", etcd.Endpoint())
	if code == 0 || !strings.Contains(errs, "replica ghost ("+gone+")") {
		t.Fatalf("domains with no replica answering: %d %q; want a failure naming the replica that did not answer", code, errs)
	}
	if !strings.Contains(errs, "warning: skipping a registered replica: member key "+etcdmembers.Key(controlplane.DefaultPrefix, "broken")) {
		t.Fatalf("domains stderr %q: want a warning naming the member entry that is not a member", errs)
	}
	if !strings.Contains(errs, "none of the 1 registered replicas answered") {
		t.Fatalf("domains stderr %q: want it to say no replica answered", errs)
	}
	line := lineOf(out, "nvl72-a ")
	if line == "" || strings.Contains(line, "not on the") || !strings.Contains(line, "drained by alice") {
		t.Fatalf("nvl72-a's line with no replica answering: %q; want its mark and no claim about the replicas\n%s", line, out)
	}

	code, out, errs = sluicectl("domains", "--etcd", etcd.Endpoint(), "--server", "")
	if code != 0 || errs != "" {
		t.Fatalf(`domains --server "": %d %q; want the marks without asking a replica`, code, errs)
	}
	if line := lineOf(out, "nvl72-a "); !strings.Contains(line, "drained by alice") || strings.Contains(line, "not on the") {
		t.Fatalf(`domains --server "": nvl72-a's line %q\n%s`, line, out)
	}
	if code, _, errs = sluicectl("domains", "--server", ""); code == 0 || !strings.Contains(errs, "--etcd") {
		t.Fatalf(`domains --server "" without --etcd: %d %q; want an error asking for --etcd`, code, errs)
	}
}

// lineOf returns the first line of out that starts with prefix, "" if none.
func lineOf(out, prefix string) string {
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// The FEEDBACK column says what the capacity loop does with a domain.
func TestFeedbackCell(t *testing.T) {
	for _, tc := range []struct {
		r    domainRow
		want string
	}{
		{domainRow{CapacityFactor: 1}, "model"},
		{domainRow{}, "model"}, // a server without the loop
		{domainRow{CapacityFactor: 0.8, EngineSaturated: true, EngineQueue: 12, EngineKVUsage: 0.42, engineAgeSeen: true}, "0.80×, engines SATURATED (queue 12, KV 42%)"},
		{domainRow{CapacityFactor: 1.3, EngineQueue: 1, EngineKVUsage: 0.5, engineAgeSeen: true}, "1.30×, engines (queue 1, KV 50%)"},
		{domainRow{CapacityFactor: 0.6, EngineMetricsStale: true, EngineMetricsAgeSecs: 3.04, engineAgeSeen: true}, "0.60×, engines stale (3s)"},
		{domainRow{CapacityFactor: 0.25, FloorsShort: true}, "0.25×, FLOORS SHORT"},
	} {
		if got := feedbackCell(tc.r); got != tc.want {
			t.Errorf("feedbackCell(%+v) = %q, want %q", tc.r, got, tc.want)
		}
	}
}

// The USE column sums the replicas' shares of a domain's rates: each
// replica reports what its own admissions took of the whole domain.
func TestDomainsSumTheReplicasUse(t *testing.T) {
	views := []replicaView{
		{Member: client.Member{ID: "r1"}, domains: []*admissionv1.DomainInfo{{Id: "d1", Kind: "hgx", Gpus: 8, HealthWeight: 1, CapacityFactor: 1, PrefillUse: 0.3, DecodeUse: 0.06}}},
		{Member: client.Member{ID: "r2"}, domains: []*admissionv1.DomainInfo{{Id: "d1", Kind: "hgx", Gpus: 8, HealthWeight: 1, CapacityFactor: 1, PrefillUse: 0.25, DecodeUse: 0.04}}},
	}
	rows := map[string]*domainRow{}
	addViews(rows, views, true)
	var b bytes.Buffer
	if err := writeDomains(&b, []domainRow{*rows["d1"]}, true, false, true); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "prefill 55%, decode 10%") {
		t.Errorf("d1 used 0.3 and 0.25 of its prefill rate on two replicas, 0.06 and 0.04 of its decode rate; the table:\n%s", b.String())
	}
}
