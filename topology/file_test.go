package topology

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestLoadExampleFile(t *testing.T) {
	c, err := LoadFile("testdata/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Domains) != 4 || c.GPUCount() != 12+72+8+2 {
		t.Fatalf("%d domains, %d GPUs", len(c.Domains), c.GPUCount())
	}
	a := c.Domains[0]
	if a.Nodes[0].GPUs[0].Peaks.Source != SourceTable || a.Nodes[0].GPUs[0].Name != "GB200" {
		t.Errorf("tray01 gpu 0 = %+v", a.Nodes[0].GPUs[0])
	}
	if p := a.Nodes[1].GPUs[3].Peaks; p.HBMBytes != 180e9 || p.FLOPS != 2.5e15 || p.Source != SourceConfig {
		t.Errorf("tray02 override = %+v", p)
	}
	if g := a.Nodes[2].GPUs[3]; g.Healthy || g.ActiveNVLinks != 0 || g.Index != 3 {
		t.Errorf("tray03 gpu 3 = %+v", g)
	}
	if a.HealthyGPUCount() != 11 {
		t.Errorf("rack-a healthy = %d", a.HealthyGPUCount())
	}
	b := c.Domains[1]
	if len(b.Nodes) != 18 || b.Nodes[17].Name != "rack-b-tray18" || b.GPUCount() != 72 {
		t.Errorf("rack-b: %d nodes, last %q", len(b.Nodes), b.Nodes[len(b.Nodes)-1].Name)
	}
	if got := c.Domains[2].GPUModel(); got != "H200" {
		t.Errorf("hgx-1 model = %q", got)
	}
	lab := c.Domains[3].Nodes[0].GPUs[1]
	want := Peaks{SMs: 142, FLOPS: 362e12, HBMBandwidth: 864e9, HBMBytes: 48e9, Source: SourceConfig}
	if lab.Peaks != want || lab.ActiveNVLinks != 0 {
		t.Errorf("lab gpu = %+v", lab)
	}
}

func TestRoundTrip(t *testing.T) {
	example, err := LoadFile("testdata/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	odd := Simulated()
	g := &odd.Domains[2].Nodes[0].GPUs[5]
	g.Healthy, g.UUID, g.ActiveNVLinks = false, "", 12
	odd.Domains[2].Nodes[0].GPUs[6].Index = 9
	odd.Domains[3].Nodes[0].GPUs[0].Peaks.Source = SourceConfig
	odd.Domains[3].Nodes[0].GPUs[0].Peaks.HBMBytes = 100e9

	for name, c := range map[string]Cluster{"simulated": Simulated(), "example": example, "odd": odd} {
		for format, encode := range map[string]func(Cluster) ([]byte, error){"yaml": EncodeYAML, "json": EncodeJSON} {
			t.Run(name+"/"+format, func(t *testing.T) {
				data, err := encode(c)
				if err != nil {
					t.Fatal(err)
				}
				if format == "json" && data[0] != '{' {
					t.Fatalf("not JSON: %.40s", data)
				}
				back, err := Parse(data)
				if err != nil {
					t.Fatalf("Parse: %v\n%s", err, data)
				}
				if !reflect.DeepEqual(back, c) {
					t.Fatalf("round trip differs:\n%s", data)
				}
			})
		}
	}
}

func TestEncodeUsesShorthand(t *testing.T) {
	data, err := EncodeYAML(Simulated())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "uuid") || !strings.Contains(string(data), "count: 4") {
		t.Errorf("simulated not written as {gpu, count}:\n%s", data)
	}
	if _, err := EncodeYAML(Cluster{}); err == nil {
		t.Error("EncodeYAML of an invalid cluster succeeded")
	}
}

func TestParseJSON(t *testing.T) {
	c, err := Parse([]byte(`{"domains":[{"id":"d","kind":"hgx","nodes":[{"name":"n","gpu":"H100 SXM","count":8}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.GPUCount() != 8 || c.Domains[0].GPUModel() != "H100" {
		t.Errorf("got %+v", c)
	}
}

func TestParseErrors(t *testing.T) {
	const head = "domains:\n  - id: a\n    kind: hgx\n    nodes:\n      - {name: a, gpu: H200, count: 8}\n"
	for _, tc := range []struct {
		name, file, want string
	}{
		{"unknown GPU", head + "  - id: b\n    kind: hgx\n    nodes:\n      - {name: b, gpu: X100, count: 8}\n",
			`domains[1].nodes[0].gpu: unknown GPU "X100" (known: B200, GB200, H100, H200)`},
		{"unknown GPU on the domain", "domains:\n  - {id: a, kind: x, gpu: X100, nodes: 2, gpus_per_node: 4}\n",
			`domains[0].gpu: unknown GPU "X100"`},
		{"unknown GPU, partial peaks", "domains:\n  - id: a\n    kind: x\n    nodes:\n      - {name: a, gpu: X100, count: 1, peaks: {sms: 10, flops: 1e15}}\n",
			`domains[0].nodes[0].peaks: unknown GPU "X100" needs every peak; missing hbm_bandwidth, hbm_bytes`},
		{"unknown key in node", "domains:\n  - id: a\n    kind: x\n    nodes:\n      - {name: a, gpu: H200, gpus_per_nod: 8}\n",
			`domains[0].nodes[0].gpus_per_nod: unknown key (want one of: name, gpu, count, peaks, gpus)`},
		{"unknown key at top", "domain: []\n", "domain: unknown key"},
		{"key in wrong case", "domains:\n  - {ID: a, kind: x, nodes: 1, gpu: H200, gpus_per_node: 8}\n", "domains[0].ID: unknown key"},
		{"unknown key in peaks", "domains:\n  - {id: a, kind: x, nodes: 1, gpu: H200, gpus_per_node: 8, peaks: {flop: 1}}\n", "domains[0].peaks.flop: unknown key"},
		{"unknown key in gpu", head + "  - id: b\n    kind: x\n    nodes:\n      - name: b\n        gpu: H200\n        gpus: [{helthy: false}]\n", "domains[1].nodes[0].gpus[0].helthy: unknown key"},
		{"duplicate key", "domains:\n  - id: a\n    id: b\n    kind: x\n    nodes: 1\n", `"id" already set`},
		{"wrong type", "domains:\n  - id: a\n    kind: x\n    nodes:\n      - {name: a, gpu: H200, count: many}\n", "domains[0].nodes[0].count: want a whole number, got string"},
		{"fractional count", head + "  - id: b\n    kind: x\n    nodes:\n      - {name: b, gpu: H200, count: 2.5}\n", "domains[1].nodes[0].count: want a whole number, got number 2.5"},
		{"zero count", head + "  - id: b\n    kind: x\n    nodes:\n      - {name: b, gpu: H200, count: 0}\n", "domains[1].nodes[0].count: must be in [1, 256], got 0"},
		{"missing count", head + "  - id: b\n    kind: x\n    nodes:\n      - {name: b, gpu: H200}\n", "domains[1].nodes[0].count: missing (or set gpus_per_node on the domain)"},
		{"count with gpus", head + "  - id: b\n    kind: x\n    nodes:\n      - {name: b, gpu: H200, count: 2, gpus: [{}]}\n", "domains[1].nodes[0].count: not allowed with gpus"},
		{"missing gpu", head + "  - id: b\n    kind: x\n    nodes:\n      - {name: b, count: 2}\n", "domains[1].nodes[0].gpu: missing"},
		{"missing node name", head + "  - id: b\n    kind: x\n    nodes:\n      - {gpu: H200, count: 2}\n", "domains[1].nodes[0].name: missing"},
		{"missing id", "domains:\n  - {kind: x, nodes: 1}\n", "domains[0].id: missing"},
		{"missing kind", "domains:\n  - {id: a, nodes: 1}\n", "domains[0].kind: missing"},
		{"missing nodes", "domains:\n  - {id: a, kind: x}\n", "domains[0].nodes: missing"},
		{"nodes a string", "domains:\n  - {id: a, kind: x, nodes: lots}\n", "domains[0].nodes: want a list of nodes or a node count, got a string"},
		{"node count too big", "domains:\n  - {id: a, kind: x, gpu: H200, gpus_per_node: 8, nodes: 1000000}\n", "domains[0].nodes: node count must be a whole number in [1, 4096]"},
		{"shorthand without gpus_per_node", "domains:\n  - {id: a, kind: x, gpu: H200, nodes: 2}\n", "domains[0].gpus_per_node: missing"},
		{"node_prefix with a list", "domains:\n  - {id: a, kind: x, node_prefix: a-, nodes: [{name: a, gpu: H200, count: 1}]}\n", "domains[0].node_prefix: only with a node count"},
		{"negative peak", "domains:\n  - {id: a, kind: x, gpu: H200, gpus_per_node: 8, nodes: 1, peaks: {hbm_bandwidth: -1}}\n", "domains[0].peaks.hbm_bandwidth: must be positive"},
		{"fractional hbm bytes", "domains:\n  - {id: a, kind: x, gpu: H200, gpus_per_node: 8, nodes: 1, peaks: {hbm_bytes: 1.5}}\n", "domains[0].peaks.hbm_bytes: must be a positive whole number"},
		{"domain not a mapping", "domains:\n  - just-a-string\n", "domains[0]: want a mapping, got a string"},
		{"no domains", "domains: []\n", "domains: missing or empty"},
		{"empty file", "", "top level: want a mapping, got nothing"},
		{"yaml syntax", "domains: [\n", "yaml:"},
		{"node in two domains", head + "  - id: b\n    kind: hgx\n    nodes:\n      - {name: a, gpu: H200, count: 8}\n",
			`domains[1] "b": node "a" is also in domain "a": a node belongs to exactly one domain`},
		{"duplicate domain id", head + "  - id: a\n    kind: hgx\n    nodes:\n      - {name: b, gpu: H200, count: 8}\n",
			`domains[1] "a": duplicate domain id (also domains[0])`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			if err == nil {
				t.Fatalf("Parse succeeded on:\n%s", tc.file)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error:\n  %v\nwant it to contain:\n  %s", err, tc.want)
			}
		})
	}
}

func TestLoadFileErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(path, []byte("domains:\n  - {id: a, kind: x, nodes: [{name: a, gpu: X100, count: 1}]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadFile(path)
	want := path + `: domains[0].nodes[0].gpu: unknown GPU "X100" (known: B200, GB200, H100, H200)`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error = %v, want prefix %s", err, want)
	}
	if _, err := LoadFile(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file error = %v", err)
	}
}

// A domain's engines are read, written back, and checked: a URL with a
// host and a kind.
func TestDomainEngines(t *testing.T) {
	const doc = `
domains:
  - id: d1
    kind: hgx
    gpu: H200
    gpus_per_node: 8
    nodes: 1
    engines:
      - {metrics: "http://10.0.0.1:8000/metrics", kind: vllm}
      - {metrics: "https://10.0.0.2:30000/metrics", kind: sglang}
`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := []Engine{{Metrics: "http://10.0.0.1:8000/metrics", Kind: "vllm"}, {Metrics: "https://10.0.0.2:30000/metrics", Kind: "sglang"}}
	if !slices.EqualFunc(c.Domains[0].Engines, want, Engine.Equal) {
		t.Errorf("engines %+v, want %+v", c.Domains[0].Engines, want)
	}
	out, err := EncodeYAML(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out)
	if err != nil || !slices.EqualFunc(back.Domains[0].Engines, want, Engine.Equal) {
		t.Errorf("written and read back: %+v, %v", back.Domains, err)
	}
	for bad, wantErr := range map[string]string{
		`{metrics: "ftp://x/metrics", kind: vllm}`:     "domains[0].engines[0].metrics: want an http(s) URL",
		`{metrics: "http://x:1/metrics"}`:              "domains[0].engines[0].kind: missing",
		`{kind: vllm}`:                                 "domains[0].engines[0].metrics: missing",
		`{metrics: "http://x/m", kind: vllm, port: 1}`: "port",
	} {
		doc := strings.Replace(doc, `- {metrics: "http://10.0.0.1:8000/metrics", kind: vllm}`, "- "+bad, 1)
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("engine %s: %v, want an error with %q", bad, err, wantErr)
		}
	}
}

// A domain's engines may name the address a gateway routes to and the
// model names they serve: both are read, written back and checked, and an
// engine without them stays valid (metrics only).
func TestDomainEngineEndpoints(t *testing.T) {
	const doc = `
domains:
  - id: d1
    kind: hgx
    gpu: H200
    gpus_per_node: 8
    nodes: 1
    engines:
      - {metrics: "http://10.0.0.1:8000/metrics", kind: vllm, address: "10.0.0.1:8000", models: [meta-llama/Llama-3.1-70B-Instruct, llama-70b]}
      - {metrics: "http://10.0.0.2:8000/metrics", kind: vllm}
`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := []Engine{
		{Metrics: "http://10.0.0.1:8000/metrics", Kind: "vllm", Address: "10.0.0.1:8000", Models: []string{"meta-llama/Llama-3.1-70B-Instruct", "llama-70b"}},
		{Metrics: "http://10.0.0.2:8000/metrics", Kind: "vllm"},
	}
	if !slices.EqualFunc(c.Domains[0].Engines, want, Engine.Equal) {
		t.Errorf("engines %+v, want %+v", c.Domains[0].Engines, want)
	}
	for _, enc := range []func(Cluster) ([]byte, error){EncodeYAML, EncodeJSON} {
		out, err := enc(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(out)
		if err != nil || !slices.EqualFunc(back.Domains[0].Engines, want, Engine.Equal) {
			t.Errorf("written and read back: %+v, %v\n%s", back.Domains, err, out)
		}
	}
	for bad, wantErr := range map[string]string{
		`address: "10.0.0.1"`:      "domains[0].engines[0].address: want host:port",
		`address: ":8000"`:         "domains[0].engines[0].address: want host:port with a host",
		`address: "10.0.0.1:0"`:    "domains[0].engines[0].address: want a port in 1..65535",
		`address: "10.0.0.1:http"`: "domains[0].engines[0].address: want a port in 1..65535",
		`models: [""]`:             "domains[0].engines[0].models[0]: empty",
		`models: [a, b, a]`:        `domains[0].engines[0].models[2]: "a" named twice`,
	} {
		doc := strings.Replace(doc, `address: "10.0.0.1:8000", models: [meta-llama/Llama-3.1-70B-Instruct, llama-70b]`, bad, 1)
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("engine with %s: %v, want an error with %q", bad, err, wantErr)
		}
	}
}
