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
		code int
	}{
		{[]string{"topology", "-o", "xml"}, `-o "xml": want table, json or yaml`, 1},
		{[]string{"topology", "--topology", "/nonexistent.yaml"}, "/nonexistent.yaml", 1},
		{[]string{"topology", "extra"}, `unexpected argument "extra"`, 2},
		{[]string{"topology", "--bogus"}, "unknown flag: --bogus", 2},
	} {
		var out, errw bytes.Buffer
		if code := run(tc.args, &out, &errw); code != tc.code || !strings.Contains(errw.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errw.String(), tc.code, tc.want)
		}
	}
}
