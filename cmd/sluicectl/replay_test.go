package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/internal/replay"
)

const (
	replayTrace   = "../../testdata/traces/AzureLLMInferenceTrace_code.csv"
	replayConfig  = "../../testdata/replay/config.yaml"
	replayCluster = "../../testdata/replay/cluster.yaml"
	replayMix     = "acme:large:0.4,globex:medium:0.3,initech:small:0.2,hooli:small:0.1"
)

func TestReplayCommand(t *testing.T) {
	dir := t.TempDir()
	html := filepath.Join(dir, "r.html")
	args := []string{"replay", "--trace", replayTrace, "--mix", replayMix, "--to", "3m",
		"--burst", "acme:5x:60s-120s", "--config", replayConfig, "--topology", replayCluster,
		"--deadline", "2s", "--policy", "all", "--svg", filepath.Join(dir, "svg"), "-o", "json", "--html", html}
	var out, errw bytes.Buffer
	if code := run(args, &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	var c replay.Comparison
	if err := json.Unmarshal(out.Bytes(), &c); err != nil {
		t.Fatalf("-o json is not JSON: %v", err)
	}
	if len(c.Reports) != 4 || c.Reports[0].Policy != "sluice" || c.Seed != 1 || len(c.Reports[0].Tenants) != 4 {
		t.Errorf("reports: %d, seed %d", len(c.Reports), c.Seed)
	}
	if b, err := os.ReadFile(html); err != nil || !bytes.Contains(b, []byte("<svg")) {
		t.Errorf("--html: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "svg", "sluice-longest-queue-wait-per-second.svg")); err != nil || !bytes.HasPrefix(b, []byte("<svg")) {
		t.Errorf("--svg: %v", err)
	}
	// The table, same input: the same figures.
	out.Reset()
	args[len(args)-3] = "table"
	if code := run(args, &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	for _, want := range []string{"policy sluice", "policy tenant-buckets", "wait p50 ms", "hgx-4", "spanning two domains: 0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestReplayCommandDefaults replays on what sluiced serves with no flags:
// the embedded config on the simulated cluster.
func TestReplayCommandDefaults(t *testing.T) {
	var out, errw bytes.Buffer
	if code := run([]string{"replay", "--trace", replayTrace, "--mix", replayMix, "--to", "1m"}, &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	for _, want := range []string{"policy sluice", "policy fifo", "nvl72-a", "hgx-h200-4"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestReplayEngines replays with simulated engines: --policy all adds the
// threshold rule and the clairvoyant dispatcher, and every report carries
// the engines' measures.
func TestReplayEngines(t *testing.T) {
	args := []string{"replay", "--trace", replayTrace, "--mix", replayMix, "--to", "5m", "--speed", "10", "--config", replayConfig,
		"--topology", replayCluster, "--deadline", "2s", "--policy", "all", "--engine-capacity", "0.6", "--engine-change", "hgx-2@10s=0.3", "-o", "json"}
	var out, errw bytes.Buffer
	if code := run(args, &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	var c replay.Comparison
	if err := json.Unmarshal(out.Bytes(), &c); err != nil {
		t.Fatalf("-o json is not JSON: %v", err)
	}
	if len(c.Reports) != 6 || c.Reports[4].Policy != "threshold" || c.Reports[5].Policy != "clairvoyant" {
		t.Fatalf("%d reports", len(c.Reports))
	}
	for _, r := range c.Reports {
		if r.Engines == nil || r.Engines.Capacity != 0.6 || len(r.Engines.Changes) != 1 || r.Engines.Domains[1].Capacity != 0.3 {
			t.Errorf("%s: engines %+v", r.Policy, r.Engines)
		}
	}
	if c.Reports[0].Engines.Loop != "closed" {
		t.Errorf("sluice's loop: %q", c.Reports[0].Engines.Loop)
	}
	out.Reset()
	args = append(args[:len(args)-2], "--open-loop", "--policy", "sluice")
	if code := run(args, &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	if !strings.Contains(out.String(), "engines at 0.6× the model, loop open") {
		t.Errorf("table:\n%s", out.String())
	}
}

// TestReplayFeedbackCommand prints the capacity loop's target table for
// five minutes of the trace.
func TestReplayFeedbackCommand(t *testing.T) {
	args := []string{"replay", "feedback", "--trace", replayTrace, "--mix", replayMix, "--to", "5m", "--config", replayConfig, "--topology", replayCluster}
	var out, errw bytes.Buffer
	if code := run(append(args, "-o", "json"), &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	var tab replay.FeedbackTable
	if err := json.Unmarshal(out.Bytes(), &tab); err != nil {
		t.Fatalf("-o json is not JSON: %v", err)
	}
	if tab.Speed != 10 || tab.SpreadSpeed != 1 || len(tab.Targets) < 10 || len(tab.Runs) < 10 || tab.Deadline != "2s" {
		t.Errorf("speed %v, spread speed %v, %d targets, %d runs, deadline %s", tab.Speed, tab.SpreadSpeed, len(tab.Targets), len(tab.Runs), tab.Deadline)
	}
	out.Reset()
	if code := run(append(args, "--engine-change", "hgx-3@5s=0.25", "--engine-high", "2"), &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	for _, want := range []string{"engine 2×", "hgx-3 0.25× at 5s", "result", "met"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestReplayCommandErrors(t *testing.T) {
	base := []string{"--trace", replayTrace, "--mix", replayMix, "--config", replayConfig, "--topology", replayCluster}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"replay"}, "--trace is required"},
		{[]string{"replay", "--trace", replayTrace}, "--mix is required"},
		{append([]string{"replay", "--policy", "lifo"}, base...), `unknown policy "lifo"`},
		{append([]string{"replay", "--burst", "acme:15:1s-2s"}, base...), `invalid argument "acme:15:1s-2s" for "--burst" flag`},
		{append(append([]string{"replay"}, base...), "--mix", "acme:large"), `--mix "acme:large"`},
		{append([]string{"replay", "--speed", "0"}, base...), "--speed 0"},
		{append([]string{"replay", "-o", "xml"}, base...), `-o "xml"`},
		{append([]string{"replay", "--deadline", "-1s"}, base...), "--deadline -1s"},
		{append([]string{"replay", "--config", "nope.yaml"}, base[:4]...), "nope.yaml"},
		{append([]string{"replay", "extra"}, base...), `unexpected argument "extra"`},
		{[]string{"replay", "--trace", "nope.csv", "--mix", replayMix}, "nope.csv"},
		{append([]string{"replay", "--policy", "threshold"}, base...), "policy threshold reads the engines"},
		{append([]string{"replay", "--policy", "clairvoyant"}, base...), "policy clairvoyant reads the engines"},
		{append([]string{"replay", "--clairvoyant-budget", "-1s"}, base...), "--clairvoyant-budget -1s"},
		{append([]string{"replay", "--clairvoyant-budget", "1s"}, base...), "only the clairvoyant policy has a budget"},
		{append([]string{"replay", "--engine-capacity", "-1"}, base...), "--engine-capacity -1"},
		{append([]string{"replay", "--engine-capacity", "1", "--engine-batch", "0"}, base...), "--engine-batch 0"},
		{append([]string{"replay", "--engine-change", "hgx-1@1s"}, base...), `--engine-change "hgx-1@1s"`},
		{append([]string{"replay", "--engine-change", "hgx-1@1s=0.5"}, base...), "needs --engine-capacity"},
		{append([]string{"replay", "--engine-capacity", "1", "--engine-change", "nope@1s=0.5"}, base...), `no domain "nope"`},
		{append([]string{"replay", "feedback", "--engine-low", "0"}, base...), "--engine-low 0"},
		{append([]string{"replay", "feedback", "--spread-speed", "0"}, base...), "--spread-speed 0"},
		{append([]string{"replay", "feedback", "--engine-change", "x"}, base...), `--engine-change "x"`},
		{append([]string{"replay", "feedback", "--spread-trace", "nope.csv"}, base...), "nope.csv"},
		{append([]string{"replay", "feedback", "--spread-config", replayConfig}, base...), "--spread-config needs --spread-mix"},
		{append([]string{"replay", "feedback", "--spread-mix", "a:small"}, base...), "--spread-mix"},
		{append([]string{"replay", "feedback", "--spread-mix", "a:small:1", "--spread-config", "nope.yaml"}, base...), "--spread-config: "},
		{[]string{"replay", "feedback", "--mix", replayMix}, "--trace is required"},
		{[]string{"recommend", "--trace", replayTrace, "--mix", replayMix, "--window", "0s"}, "--window 0s"},
		{[]string{"recommend", "--trace", replayTrace}, "--mix is required"},
		{[]string{"recommend", "--trace", replayTrace, "--mix", replayMix, "-o", "html"}, `-o "html"`},
	} {
		var out, errw bytes.Buffer
		if code := run(tc.args, &out, &errw); code == 0 || !strings.Contains(errw.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want it to contain %q", tc.args, code, errw.String(), tc.want)
		}
	}
}
