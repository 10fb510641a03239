package server

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/internal/auth/authtest"
	"github.com/sluice-sched/sluice/internal/enginesim"
	"github.com/sluice-sched/sluice/internal/openai/openaitest"
	"github.com/sluice-sched/sluice/internal/testdep"
	"github.com/sluice-sched/sluice/internal/testwait"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// openaiNodeDir holds the Node client's package.json and lock; npm ci
// fills its node_modules when they are missing.
const openaiNodeDir = "testdata/openai-node"

// nodeResult is one line of client.mjs's output.
type nodeResult struct {
	Tenant, Kind string
	Status       int
	Text         string
	Finish       string
	Usage        *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	}
	Chunks     int
	RetryAfter *string
	Message    string
}

// The official OpenAI client for Node, through the front to the engine
// simulator, for two tenants named by their API keys: the one over its
// quota gets 429 with Retry-After, the other's stream arrives whole (the
// same answer as the whole one), and each tenant is charged the usage the
// engine reported.
func TestOpenAINodeClient(t *testing.T) {
	node := testdep.Binary(t, "apt-get install -y nodejs npm", "node", "nodejs")
	npm := testdep.Binary(t, "apt-get install -y nodejs npm", "npm")
	dir, err := filepath.Abs(openaiNodeDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			testdep.Missing(t, "npm ci in %s (the openai package from the npm registry): %v\n%s", openaiNodeDir, err, out)
		}
	}

	srv, models := startOpenAISim(t, true)

	cmd := exec.Command(node, "client.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SLUICE_OPENAI_URL=http://"+srv.OpenAIAddr().String()+"/v1", "SLUICE_MODEL=llama-405b",
		"SLUICE_KEY_OK=sk-acme", "SLUICE_KEY_OVER=sk-tiny")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node client.mjs: %v\n%s\n%s", err, out, stderr.Bytes())
	}
	results := map[string]nodeResult{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r nodeResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("client line %q: %v", line, err)
		}
		results[r.Tenant+"/"+r.Kind] = r
	}
	t.Logf("client: %s", out)

	okWhole, okStream, overWhole, overStream := results["ok/whole"], results["ok/stream"], results["over/whole"], results["over/stream"]
	for _, r := range []nodeResult{okWhole, okStream, overWhole} {
		if r.Status != 200 || r.Usage == nil || r.Text == "" || r.Finish == "" {
			t.Fatalf("%s/%s: %+v, want an answer with its usage", r.Tenant, r.Kind, r)
		}
	}
	if okStream.Text != okWhole.Text || okStream.Finish != okWhole.Finish || *okStream.Usage != *okWhole.Usage || okStream.Chunks < 2 {
		t.Errorf("the stream (%d chunks) %q %s %+v is not the whole answer %q %s %+v", okStream.Chunks, okStream.Text, okStream.Finish, *okStream.Usage,
			okWhole.Text, okWhole.Finish, *okWhole.Usage)
	}
	if overStream.Status != 429 || overStream.RetryAfter == nil || *overStream.RetryAfter == "" {
		t.Errorf("over quota: %+v, want 429 with Retry-After", overStream)
	}

	// Each tenant is charged what the engine reported, priced by the
	// catalog, once the front has released every lease.
	testwait.Until(t, 10*time.Second, "every lease released", func() bool { return srv.Engine().LeaseCount() == 0 })
	cat, err := pd.NewCatalog(models)
	if err != nil {
		t.Fatal(err)
	}
	large, _ := cat.Get("large")
	price := func(rs ...nodeResult) (sum int64) {
		for _, r := range rs {
			sum += cat.PriceMicros(large, r.Usage.PromptTokens, r.Usage.CompletionTokens)
		}
		return sum
	}
	for tenant, want := range map[string]int64{"acme": price(okWhole, okStream), "tiny": price(overWhole)} {
		info, _ := srv.Engine().Tenant(tenant)
		if info.SpentTodayMicros != want {
			t.Errorf("%s spent %d µUSD, want %d (the usage the engine reported, priced)", tenant, info.SpentTodayMicros, want)
		}
	}
}

// startOpenAISim runs the engine simulator (one HGX domain, one engine)
// and sluiced's OpenAI front over it, with two tenants: acme with room,
// tiny with one request per 100 s. With keys, the auth file maps sk-acme
// and sk-tiny to them.
func startOpenAISim(t *testing.T, keys bool) (*Server, []pd.Model) {
	t.Helper()
	setup := openaitest.TwoTenants(t)
	cluster, err := topology.Parse([]byte("domains:\n  - {id: d1, kind: hgx, gpu: H200, gpus_per_node: 8, nodes: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := enginesim.Plan(cluster, setup.Config.Models, setup.Config.Capacity, enginesim.PlanOptions{Capacity: 1, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	sim, err := enginesim.Start(plan, cluster, 1, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	topo, err := topology.EncodeYAML(sim.Topology())
	if err != nil {
		t.Fatal(err)
	}

	tmp := t.TempDir()
	paths := map[string][]byte{
		"config.json":   setup.Raw,
		"topology.yaml": topo,
		"auth.yaml": []byte("api_keys:\n" +
			"  - {tenant: acme, key_sha256: \"" + authtest.TokenSHA256("sk-acme") + "\"}\n" +
			"  - {tenant: tiny, key_sha256: \"" + authtest.TokenSHA256("sk-tiny") + "\"}\n"),
	}
	for name, data := range paths {
		if err := os.WriteFile(filepath.Join(tmp, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	opts := Options{ConfigPath: filepath.Join(tmp, "config.json"), Topology: filepath.Join(tmp, "topology.yaml"),
		Gateway: GatewayOptions{OpenAIAddr: "127.0.0.1:0"}}
	if keys {
		opts.Security.AuthFile = filepath.Join(tmp, "auth.yaml")
	}
	srv, _, _, _ := start(t, opts)
	return srv, setup.Models
}
