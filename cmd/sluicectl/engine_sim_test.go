package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/topology"
)

// engine-sim serves the topology's engines and writes the topology that
// names them, which sluiced reads; an engine it names answers a chat
// completion with usage; the command ends when its context does.
func TestEngineSimServesAndWritesTopology(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sim.yaml")
	var stdout, stderr bytes.Buffer
	root := newRoot(&globals{stdout: &stdout, stderr: &stderr})
	root.SetArgs([]string{"engine-sim", "--listen", "127.0.0.1:0", "--per-domain", "2", "--capacity", "0.6", "--write-topology", path})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	eventually(t, "the topology written", func() bool {
		_, err := os.Stat(path)
		return err == nil
	})
	cl, err := topology.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(cl.Domains) != 6 {
		t.Fatalf("%d domains, want the simulated cluster's 6", len(cl.Domains))
	}
	e := cl.Domains[0].Engines[1]
	if len(cl.Domains[0].Engines) != 2 || e.Kind != "vllm" || e.Address == "" || len(e.Models) == 0 {
		t.Fatalf("domain %s engines %+v", cl.Domains[0].ID, cl.Domains[0].Engines)
	}
	body := `{"model":"medium","messages":[{"role":"user","content":"hello"}]}`
	resp, err := http.Post("http://"+e.Address+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var answer struct {
		Usage struct {
			PromptTokens int64 `json:"prompt_tokens"`
		} `json:"usage"`
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &answer) != nil || answer.Usage.PromptTokens != 3 {
		t.Errorf("%d %s: want 200 with 3 prompt tokens", resp.StatusCode, b)
	}
	resp, err = http.Get(e.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "vllm:num_requests_waiting") {
		t.Errorf("metrics %s: no vllm:num_requests_waiting", b)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("engine-sim ended with %v", err)
	}
	if !strings.Contains(stderr.String(), "engine 1 on "+e.Address) {
		t.Errorf("stderr does not name the engine on %s:\n%s", e.Address, stderr.String())
	}
}

// Bad flags are usage errors that name the value.
func TestEngineSimFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--capacity", "0"}, "capacity 0"},
		{[]string{"--per-domain", "-1"}, "engines per domain -1"},
		{[]string{"--listen", "localhost"}, `listen "localhost"`},
		{[]string{"--listen", "127.0.0.1:9000-9001"}, "more engines than ports"},
	} {
		code, _, errs := sluicectl(append([]string{"engine-sim"}, c.args...)...)
		if code != exitUsage || !strings.Contains(errs, c.want) {
			t.Errorf("engine-sim %s: exit %d, %q; want %d naming %q", strings.Join(c.args, " "), code, errs, exitUsage, c.want)
		}
	}
}
