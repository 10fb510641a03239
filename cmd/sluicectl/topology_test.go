package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/topology"
)

func TestTopologyCommand(t *testing.T) {
	const file = "../../topology/testdata/cluster.yaml"
	var out, errw bytes.Buffer
	if code := run([]string{"topology", "--topology", file, "-o", "json"}, &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	var r topology.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("-o json is not JSON: %v\n%s", err, out.String())
	}
	if r.Source != file || len(r.Domains) != 4 || r.Domains[0].ID != "rack-a" || r.Domains[0].HealthyGPUs != 11 {
		t.Errorf("report: source %q, %d domains, first %+v", r.Source, len(r.Domains), r.Domains[0])
	}

	out.Reset()
	if code := run([]string{"topology", "--topology=simulated"}, &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	for _, want := range []string{"source: simulated", "6 domains, 176 GPUs", "nvl72-a", "hgx-h200-4"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
}

func TestTopologyCommandErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"topology", "-o", "yaml"}, `-o "yaml": want table or json`},
		{[]string{"topology", "--topology", "/nonexistent.yaml"}, "/nonexistent.yaml"},
		{[]string{"topology", "extra"}, `unexpected argument "extra"`},
		{[]string{"topology", "--bogus"}, "flag provided but not defined"},
	} {
		var out, errw bytes.Buffer
		if code := run(tc.args, &out, &errw); code != 1 || !strings.Contains(errw.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 1 and %q", tc.args, code, errw.String(), tc.want)
		}
	}
}
