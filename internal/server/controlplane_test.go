package server

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/controlplane"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
	"github.com/sluice-sched/sluice/internal/grpctest"
)

// etcdOpts are the control-plane options of the tests: short lease and
// probe periods.
func etcdOpts(endpoint string) EtcdOptions {
	return EtcdOptions{Endpoints: endpoint, MemberTTL: time.Second, ProbeEvery: 50 * time.Millisecond,
		RetryEvery: 20 * time.Millisecond, SyncTimeout: time.Second}
}

// dial returns a connection to srv's gRPC port.
func dial(t *testing.T, srv *Server) *grpc.ClientConn {
	t.Helper()
	return grpctest.Dial(t, srv.GRPCAddr().String())
}

// get returns the body of an HTTP GET on srv.
func get(t *testing.T, srv *Server, path string) string {
	t.Helper()
	resp, err := http.Get("http://" + srv.HTTPAddr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// With --etcd, sluiced serves etcd's config from its first request,
// registers itself, reports a refused etcd write through GetConfigStatus and
// /metrics while the last good config keeps serving, and leaves the
// membership at shutdown.
func TestEtcdConfigStatusAndMembership(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	ctx, cancelCtx := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelCtx()
	if _, err := controlplane.ApplyConfig(ctx, cli, controlplane.DefaultPrefix, "sluice.yaml", config.DefaultYAML()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, controlplane.TenantKey(controlplane.DefaultPrefix, "newco"), "tier: free\n"); err != nil {
		t.Fatal(err)
	}
	srv, c, stop, done := start(t, Options{Etcd: etcdOpts(etcd.Endpoint())})
	conn := dial(t, srv)
	op := admissionv1.NewOperatorClient(conn)

	resp, err := c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "newco", Model: "small", PromptTokens: 10, MaxOutputTokens: 10})
	if err != nil || resp.GetDecision() != admissionv1.Decision_ADMITTED {
		t.Fatalf("newco, defined only in etcd: %v, %v", resp, err)
	}
	st, err := op.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
	if err != nil || st.GetSource() != "etcd" || st.GetRevision() == 0 || st.GetControlPlane() != "etcd" || !st.GetControlPlaneConnected() || st.GetLastRefusal() != nil {
		t.Fatalf("GetConfigStatus = %v, %v", st, err)
	}
	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: controlPlaneHealthService})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("control-plane health: %v, %v", hc, err)
	}

	bad, err := cli.Put(ctx, controlplane.TenantKey(controlplane.DefaultPrefix, "bad"), "tier: free\nweigth: 2\n")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool {
		st, err = op.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
		return err == nil && st.GetLastRefusal() != nil
	})
	ref := st.GetLastRefusal()
	if ref.GetSource() != "/sluice/tenants/bad" || ref.GetKey() != "tenants.bad" || !strings.Contains(ref.GetReason(), `unknown key "weigth"`) ||
		ref.GetRevision() != bad.Header.Revision || ref.GetAt() == nil || st.GetSource() != "etcd" {
		t.Fatalf("refusal: %v", st)
	}
	resp, err = c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "newco", Model: "small", PromptTokens: 10, MaxOutputTokens: 10})
	if err != nil || resp.GetDecision() != admissionv1.Decision_ADMITTED {
		t.Fatalf("the last good config stopped serving: %v, %v", resp, err)
	}
	if m := get(t, srv, "/metrics"); !strings.Contains(m, `sluice_config_refusals_total{source="etcd"} 1`) ||
		!strings.Contains(m, "sluice_control_plane_connected 1") {
		t.Fatalf("metrics lack the refusal or the connected gauge")
	}
	if err := srv.Reload(); err == nil {
		t.Fatal("a file reload was accepted while etcd serves the config")
	}

	members, err := cli.Get(ctx, "/sluice/members/", clientv3.WithPrefix())
	if err != nil || len(members.Kvs) != 1 || !strings.Contains(string(members.Kvs[0].Value), srv.GRPCAddr().String()) {
		t.Fatalf("members: %v, %v", members, err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	members, err = cli.Get(ctx, "/sluice/members/", clientv3.WithPrefix())
	if err != nil || len(members.Kvs) != 0 {
		t.Fatalf("members after shutdown: %v, %v (want the lease revoked)", members.Kvs, err)
	}
}

// etcd down when sluiced starts: it serves its local config, says so in
// /healthz and GetConfigStatus, and follows etcd once it answers.
func TestEtcdDownAtStart(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	ctx, cancelCtx := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelCtx()
	if _, err := controlplane.ApplyConfig(ctx, cli, controlplane.DefaultPrefix, "sluice.yaml", config.DefaultYAML()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, controlplane.TenantKey(controlplane.DefaultPrefix, "newco"), "tier: free\n"); err != nil {
		t.Fatal(err)
	}
	etcd.Stop()
	srv, c, _, _ := start(t, Options{Etcd: etcdOpts(etcd.Endpoint())})
	op := admissionv1.NewOperatorClient(dial(t, srv))
	st, err := op.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
	if err != nil || st.GetSource() != "embedded" || st.GetControlPlane() != "etcd" || st.GetControlPlaneConnected() {
		t.Fatalf("GetConfigStatus with etcd down: %v, %v", st, err)
	}
	if h := get(t, srv, "/healthz"); !strings.HasPrefix(h, "ok (control plane: etcd unreachable") {
		t.Fatalf("/healthz = %q", h)
	}
	resp, err := c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "acme", Model: "small", PromptTokens: 10, MaxOutputTokens: 10})
	if err != nil || resp.GetDecision() != admissionv1.Decision_ADMITTED {
		t.Fatalf("admission with etcd down: %v, %v", resp, err)
	}
	etcd.Restart()
	eventually(t, func() bool {
		st, err = op.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
		return err == nil && st.GetSource() == "etcd" && st.GetControlPlaneConnected()
	})
	if h := get(t, srv, "/healthz"); h != "ok\n" {
		t.Fatalf("/healthz after etcd returned = %q", h)
	}
	resp, err = c.Admit(ctx, &admissionv1.AdmitRequest{Tenant: "newco", Model: "small", PromptTokens: 10, MaxOutputTokens: 10})
	if err != nil || resp.GetDecision() != admissionv1.Decision_ADMITTED {
		t.Fatalf("newco after etcd returned: %v, %v", resp, err)
	}
}

// A SIGHUP reload that is refused shows in GetConfigStatus with the file,
// key and reason; the next good reload clears it.
func TestFileReloadRefusalInConfigStatus(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, config.DefaultYAML(), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, _, _, _ := start(t, Options{ConfigPath: path})
	op := admissionv1.NewOperatorClient(dial(t, srv))
	ctx := context.Background()
	st, err := op.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
	// No etcd: no control plane, and nothing connected to.
	if err != nil || st.GetSource() != path || st.GetControlPlane() != "none" || st.GetControlPlaneConnected() || st.GetLastRefusal() != nil {
		t.Fatalf("GetConfigStatus = %v, %v; want control plane none, not connected", st, err)
	}
	if m := get(t, srv, "/metrics"); strings.Contains(m, "sluice_control_plane_connected") {
		t.Fatal("sluice_control_plane_connected is exported without etcd")
	}
	bad := strings.Replace(string(config.DefaultYAML()), "weight: 8", "weight: eight", 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err == nil {
		t.Fatal("bad file accepted")
	}
	st, err = op.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r := st.GetLastRefusal(); r.GetSource() != path || r.GetKey() != "tiers.enterprise.weight" || r.GetReason() == "" || r.GetRevision() != 0 {
		t.Fatalf("refusal: %v", st)
	}
	if m := get(t, srv, "/metrics"); !strings.Contains(m, `sluice_config_refusals_total{source="file"} 1`) {
		t.Fatal("metrics lack the file refusal")
	}
	if err := os.WriteFile(path, config.DefaultYAML(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if st, _ = op.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{}); st.GetLastRefusal() != nil || st.GetSource() != path {
		t.Fatalf("after a good reload: %v", st)
	}
}

// FreezeBurstCredit on one replica of a fleet writes the freeze to etcd,
// every replica applies it (the same absolute end), and ThawBurstCredit on
// another ends it everywhere.
func TestCreditFreezeAcrossReplicas(t *testing.T) {
	etcd := etcdtest.Start(t)
	a, _, _, _ := start(t, Options{Etcd: etcdOpts(etcd.Endpoint())})
	b, _, _, _ := start(t, Options{Etcd: etcdOpts(etcd.Endpoint())})
	opA, opB := admissionv1.NewOperatorClient(dial(t, a)), admissionv1.NewOperatorClient(dial(t, b))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	fr, err := opA.FreezeBurstCredit(ctx, &admissionv1.FreezeBurstCreditRequest{Duration: durationpb.New(5 * time.Minute), Reason: "incident 42"})
	if err != nil {
		t.Fatal(err)
	}
	until := fr.GetFreeze().GetUntil().AsTime()
	if d := time.Until(until); d <= 4*time.Minute || d > 5*time.Minute || !strings.Contains(fr.GetFreeze().GetReason(), "incident 42") {
		t.Fatalf("FreezeBurstCredit = %v", fr)
	}
	eventually(t, func() bool {
		ld, err := opB.ListDomains(ctx, &admissionv1.ListDomainsRequest{})
		return err == nil && ld.GetCreditFreeze().GetUntil().AsTime().Equal(until)
	})
	st, err := opB.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
	if err != nil || !st.GetCreditFreeze().GetUntil().AsTime().Equal(until) {
		t.Fatalf("GetConfigStatus on the other replica = %v, %v", st, err)
	}

	th, err := opB.ThawBurstCredit(ctx, &admissionv1.ThawBurstCreditRequest{})
	if err != nil || !th.GetWasFrozen() {
		t.Fatalf("ThawBurstCredit = %v, %v", th, err)
	}
	eventually(t, func() bool {
		ld, err := opA.ListDomains(ctx, &admissionv1.ListDomainsRequest{})
		return err == nil && ld.GetCreditFreeze() == nil
	})
}
