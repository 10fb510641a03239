package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/controlplane/etcdtest"
)

// config validate and apply check the file first (with key and reason);
// apply writes it to etcd, where a running sluiced picks it up, and config
// status shows where the server's config came from.
func TestConfigValidateApplyStatus(t *testing.T) {
	t.Setenv("SLUICE_ETCD", "")
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	write := func(path string, edit func(doc map[string]any)) {
		var doc map[string]any
		if err := yaml.Unmarshal(config.DefaultYAML(), &doc); err != nil {
			t.Fatal(err)
		}
		doc["tenants"].(map[string]any)["newco"] = map[string]any{"tier": "free"}
		edit(doc)
		b, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(good, func(map[string]any) {})
	write(bad, func(doc map[string]any) {
		doc["tiers"].(map[string]any)["enterprise"].(map[string]any)["weight"] = "eight"
	})

	if code, out, errs := sluicectl("config", "validate", "-f", good); code != 0 || !strings.Contains(out, "valid") || !strings.Contains(out, "5 tenants") {
		t.Fatalf("validate good: %d %q %q", code, out, errs)
	}
	if code, _, errs := sluicectl("config", "validate", "-f", bad); code != 1 || !strings.Contains(errs, bad+": tiers.enterprise.weight") {
		t.Fatalf("validate bad: %d %q", code, errs)
	}

	etcd := etcdtest.Start(t)
	srv := startSluiced(t, etcd.Endpoint())
	if code, _, errs := sluicectl("config", "apply", "-f", bad, "--etcd", etcd.Endpoint()); code != 1 || !strings.Contains(errs, "tiers.enterprise.weight") {
		t.Fatalf("apply bad: %d %q", code, errs)
	}
	if code, out, errs := sluicectl("config", "apply", "-f", good, "--etcd", etcd.Endpoint()); code != 0 || !strings.Contains(out, "5 tenant documents written") {
		t.Fatalf("apply good: %d %q %q", code, out, errs)
	}
	eventually(t, "newco configured on the server", func() bool { _, ok := srv.Engine().Tenant("newco"); return ok })
	code, out, errs := sluicectl("config", "status", "--server", srv.GRPCAddr().String())
	if code != 0 || !strings.Contains(out, "source:     etcd") || !strings.Contains(out, "etcd:       connected") {
		t.Fatalf("status: %d %q %q", code, out, errs)
	}
	if code, out, _ := sluicectl("config", "apply", "-f", good, "--etcd", etcd.Endpoint()); code != 0 || !strings.Contains(out, "nothing to change") {
		t.Fatalf("apply again: %d %q", code, out)
	}
	if code, _, _ := sluicectl("config", "apply", "-f", good); code == 0 {
		t.Fatal("apply without --etcd succeeded")
	}
}

// Without etcd, config status says there is no control plane rather than
// that etcd is connected.
func TestConfigStatusWithoutEtcd(t *testing.T) {
	srv := startSluiced(t, "")
	code, out, errs := sluicectl("config", "status", "--server", srv.GRPCAddr().String())
	if code != 0 || !strings.Contains(out, "control_plane: none") || strings.Contains(out, "etcd") {
		t.Fatalf("status without etcd: %d %q %q; want control_plane: none and no etcd line", code, out, errs)
	}
}
