package replay

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/topology"
)

// The repository's copies: tests never read ../shared.
const (
	codeTrace   = "../../testdata/traces/AzureLLMInferenceTrace_code.csv"
	testConfig  = "../../testdata/replay/config.yaml"
	testCluster = "../../testdata/replay/cluster.yaml"
	testMix     = "acme:large:0.4,globex:medium:0.3,initech:small:0.2,hooli:small:0.1"
)

func setup(t testing.TB) (admission.Config, topology.Cluster) {
	t.Helper()
	cfg, cl, err := Setup(testConfig, testCluster, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, cl
}

func codeRows(t testing.TB, opts TraceOptions) []Row {
	t.Helper()
	mix, err := ParseMix(testMix)
	if err != nil {
		t.Fatal(err)
	}
	opts.Mix = mix
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	rows, err := LoadTrace(codeTrace, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// compareJSON returns the JSON and the HTML reports of a comparison.
func compareJSON(t testing.TB, rows []Row, opts Options, policies ...string) []byte {
	t.Helper()
	return compareReports(t, rows, opts, policies, (*Comparison).WriteJSON, (*Comparison).WriteHTML)
}

// compareReports returns a comparison of the code trace's rows under
// policies, written by each of writes in turn.
func compareReports(t testing.TB, rows []Row, opts Options, policies []string, writes ...func(*Comparison, io.Writer) error) []byte {
	t.Helper()
	c, err := Compare("code", 1, rows, opts, policies)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, write := range writes {
		if err := write(c, &b); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

func TestReplayIsDeterministic(t *testing.T) {
	cfg, cl := setup(t)
	burst, _ := ParseBurst("acme:15x:240s-300s")
	load := func() []Row {
		return codeRows(t, TraceOptions{To: 8 * time.Minute, Bursts: []Burst{burst}})
	}
	opts := Options{Config: cfg, Cluster: cl, Deadline: 2 * time.Second, Downgrade: true}
	a := compareJSON(t, load(), opts, Policies...)
	b := compareJSON(t, load(), opts, Policies...)
	if !bytes.Equal(a, b) {
		t.Fatal("two replays of the same input and seed differ")
	}
	// Another seed draws another mix: the seed is what varies.
	rows := codeRows(t, TraceOptions{To: 8 * time.Minute, Bursts: []Burst{burst}, Seed: 2})
	if c := compareJSON(t, rows, opts, Policies...); bytes.Equal(a, c) {
		t.Error("seeds 1 and 2 gave the same report")
	}
}

// TestSliceCounts replays a hand-written trace on the test cluster: six
// requests that all fit at once, one that no domain can ever hold, and a
// tenant the config does not know refused before the replay starts.
func TestSliceCounts(t *testing.T) {
	cfg, cl := setup(t)
	trace := `at,tenant,model,prompt_tokens,output_tokens
0,acme,large,1000,100
0.1,globex,medium,2000,50
0.2,initech,small,500,20
0.3,hooli,small,300,10
0.4,acme,large,1000,100
1.5,globex,medium,2000,50
2,acme,large,900000,10
`
	rows, err := ReadTrace(strings.NewReader(trace), "slice.csv", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Policies {
		r, err := Run(rows, Options{Policy: p, Config: cfg, Cluster: cl})
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		got := map[string][3]int{}
		for _, tr := range r.Tenants {
			got[tr.Name] = [3]int{tr.Admitted, tr.Degraded, tr.Refused()}
		}
		want := map[string][3]int{"acme": {2, 0, 1}, "globex": {2, 0, 0}, "initech": {1, 0, 0}, "hooli": {1, 0, 0}}
		for name, w := range want {
			if got[name] != w {
				t.Errorf("%s: %s admitted/degraded/refused = %v, want %v", p, name, got[name], w)
			}
		}
		acme := r.Tenants[0]
		if acme.Rejected["CAPACITY_EXCEEDED"] != 1 && acme.Rejected["QUOTA_EXCEEDED"] != 1 && acme.Rejected["REQUEST_TOO_LARGE"] != 1 {
			t.Errorf("%s: the 900k-token prompt was refused for %v", p, acme.Rejected)
		}
		if r.Spanning != 0 || r.Requests != 7 {
			t.Errorf("%s: %d requests, %d spanning", p, r.Requests, r.Spanning)
		}
		if acme.WaitP99 != 0 {
			t.Errorf("%s: acme waited %v ms on an idle cluster", p, acme.WaitP99)
		}
	}
	rows[0].Tenant = "nobody"
	if _, err := Run(rows, Options{Policy: PolicySluice, Config: cfg, Cluster: cl}); err == nil || !strings.Contains(err.Error(), `tenant "nobody" is not in the config`) {
		t.Errorf("unknown tenant: %v", err)
	}
}

// TestServiceModel checks the processor sharing on one request: alone in
// its domain, its prefill takes FLOPs / rate and its decode bytes / rate.
func TestServiceModel(t *testing.T) {
	cfg, cl := setup(t)
	rows := []Row{{Tenant: "acme", Model: "large", Prompt: 2000, Output: 100, Line: 2}}
	r, err := Run(rows, Options{Policy: PolicyFIFO, Config: cfg, Cluster: cl})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newSim(rows, Options{Policy: PolicyFIFO, Config: cfg, Cluster: cl})
	m, _ := s.cat.Get("large")
	d := s.domains[0]
	c, _ := d.cap.Cost(m, 2000, 100)
	want := float64(c.PrefillFLOP)/float64(d.prefillRate) + float64(c.DecodeBytes)/float64(d.decodeRate)
	if diff := r.Seconds - want; diff < 0 || diff > 2e-9 {
		t.Errorf("one request took %.9f s, want prefill+decode %.9f s", r.Seconds, want)
	}
}

func TestHTMLReportParsesAndHasItsPlots(t *testing.T) {
	cfg, cl := setup(t)
	rows := codeRows(t, TraceOptions{To: 4 * time.Minute})
	c, err := Compare("code", 1, rows, Options{Config: cfg, Cluster: cl, Deadline: 2 * time.Second}, []string{PolicySluice, PolicyFIFO})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := c.WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	doc, err := html.Parse(&b)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	var titles []string
	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			counts[n.Data]++
			for _, a := range n.Attr {
				if (a.Key == "src" || a.Key == "href") && !strings.HasPrefix(a.Val, "#") {
					t.Errorf("<%s %s=%q>: the report must be self-contained", n.Data, a.Key, a.Val)
				}
			}
			if n.Data == "title" && n.Parent != nil && n.Parent.Data == "svg" && n.FirstChild != nil {
				titles = append(titles, n.FirstChild.Data)
			}
		}
		for ch := n.FirstChild; ch != nil; ch = ch.NextSibling {
			walk(ch)
		}
	}
	walk(doc)
	// Per policy: a chart per tenant, one of waits and one of the
	// domains; two bar charts comparing the policies.
	if want := 2*(4+2) + 2; counts["svg"] != want {
		t.Errorf("%d svg plots, want %d: %q", counts["svg"], want, titles)
	}
	if counts["polyline"] < 2*(4*3+4) || counts["rect"] == 0 {
		t.Errorf("plots without lines or bars: %v", counts)
	}
	if counts["script"] != 0 || counts["link"] != 0 {
		t.Errorf("scripts or links in the report: %v", counts)
	}
	for _, want := range []string{"sluice: globex tokens/s", "fifo: prefill utilization per domain", "sluice: longest queue wait per second", "queue wait p99 by tenant"} {
		found := false
		for _, ti := range titles {
			found = found || ti == want
		}
		if !found {
			t.Errorf("no plot titled %q among %q", want, titles)
		}
	}
}

func TestBadTraceRowsNameTheLine(t *testing.T) {
	mix, _ := ParseMix("a:large:1")
	for _, c := range []struct {
		name, format, body string
		mix                []MixEntry
		want               string
	}{
		{"azure.csv", "", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,1\n2023-11-16 18:17:04,abc,1\n", mix, "line 3: ContextTokens \"abc\""},
		{"azure.csv", "", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,1\n", mix, "line 2: TIMESTAMP \"yesterday\""},
		{"azure.csv", "", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,0\n", mix, "line 2: GeneratedTokens \"0\""},
		{"azure.csv", "", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,1\n", nil, "--mix is required"},
		{"azure.csv", "", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10\n", mix, "line 2: no GeneratedTokens field"},
		{"t.csv", "", "at,tenant,model,prompt_tokens\n", nil, `no column "output_tokens"`},
		{"t.csv", "", "at,tenant,model,prompt_tokens,output_tokens\n-1,a,large,1,1\n", nil, "line 2: at \"-1\""},
		{"t.csv", "", "at,tenant,model,prompt_tokens,output_tokens\n1,,large,1,1\n", nil, "line 2: empty tenant"},
		{"t.csv", "", "at,tenant,model,prompt_tokens,output_tokens\n", nil, "no rows"},
		{"t.csv", "", "at,tenant,model,prompt_tokens,output_tokens\n1,a,large,\"1,1\n", nil, "line 2"},
		{"t.jsonl", FormatJSONL, "{\"at\":1,\"tenant\":\"a\",\"model\":\"large\",\"prompt_tokens\":1,\"output_tokens\":1}\n{\"at\":2,\"tenant\":\"a\"\n", nil, "line 2"},
		{"t.jsonl", FormatJSONL, "{\"at\":1,\"tenant\":\"a\",\"model\":\"large\",\"prompt_tokens\":-5,\"output_tokens\":1}\n", nil, "line 1: prompt_tokens"},
		{"t.jsonl", FormatJSONL, "{\"at\":1,\"tenant\":\"a\",\"model\":\"large\",\"prompt\":5,\"output_tokens\":1}\n", nil, "line 1: json: unknown field \"prompt\""},
		{"t.csv", "xml", "x\n", nil, "--format \"xml\""},
	} {
		_, err := ReadTrace(strings.NewReader(c.body), c.name, TraceOptions{Format: c.format, Mix: c.mix})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want it to contain %q", c.body, err, c.want)
		}
	}
	// A model the catalog lacks is named with its line.
	rows, err := ReadTrace(strings.NewReader("at,tenant,model,prompt_tokens,output_tokens\n0,acme,huge,1,1\n"), "t.csv", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, cl := setup(t)
	if _, err := Run(rows, Options{Policy: PolicySluice, Config: cfg, Cluster: cl}); err == nil || !strings.Contains(err.Error(), `trace line 2: model "huge"`) {
		t.Errorf("unknown model: %v", err)
	}
}

func TestBadFlagValues(t *testing.T) {
	for _, c := range []struct {
		parse func() error
		want  string
	}{
		{func() error { _, err := ParseMix("acme:large"); return err }, `"acme:large": want tenant:model:share`},
		{func() error { _, err := ParseMix("acme:large:-1"); return err }, "share must be a positive number"},
		{func() error { _, err := ParseMix(""); return err }, "--mix: empty"},
		{func() error { _, err := ParseBurst("acme:15:1s-2s"); return err }, `factor "15"`},
		{func() error { _, err := ParseBurst("acme:0.5x:1s-2s"); return err }, `factor "0.5x"`},
		{func() error { _, err := ParseBurst("acme:2x:5s"); return err }, `window "5s"`},
		{func() error { _, err := ParseBurst("acme:2x:5s-1s"); return err }, "0 ≤ FROM < TO"},
		{func() error { _, err := ParseBurst("acme:2x:5q-6s"); return err }, "window start"},
		{func() error { _, err := ParsePolicies("sluice,lifo"); return err }, `unknown policy "lifo"`},
		{func() error {
			_, err := ReadTrace(strings.NewReader("at,tenant,model,prompt_tokens,output_tokens\n0,a,large,1,1\n"), "t", TraceOptions{Speed: -1})
			return err
		}, "--speed -1"},
		{func() error {
			_, err := ReadTrace(strings.NewReader("at,tenant,model,prompt_tokens,output_tokens\n0,a,large,1,1\n"), "t", TraceOptions{From: 2 * time.Second, To: time.Second})
			return err
		}, "--from 2s --to 1s"},
		{func() error {
			_, err := ReadTrace(strings.NewReader("at,tenant,model,prompt_tokens,output_tokens\n0,a,large,1,1\n"), "t", TraceOptions{From: time.Minute})
			return err
		}, "no rows between --from 1m0s"},
		{func() error { _, err := ParseBurst("acme:5000x:1s-2s"); return err }, "from 1 to 1000"},
		{func() error {
			_, err := ReadTrace(strings.NewReader("at,tenant,model,prompt_tokens,output_tokens\n0,a,large,1,1\n"), "t", TraceOptions{Bursts: []Burst{{Tenant: "b", Factor: 2, To: time.Second}}})
			return err
		}, `--burst b:2x:0s-1s: trace t has no rows of tenant "b"`},
		{func() error {
			_, err := ReadTrace(strings.NewReader("at,tenant,model,prompt_tokens,output_tokens\n0,a,large,1,1\n1000000,a,large,1,1\n"), "t", TraceOptions{})
			return err
		}, "line 3 arrives 277h46m40s after the replay's start"},
		{func() error {
			_, err := ReadTrace(strings.NewReader("at,tenant,model,prompt_tokens,output_tokens\n0,a,large,1,1\n100,a,large,1,1\n"), "t", TraceOptions{Speed: 1e-9})
			return err
		}, "at --speed 1e-09"},
		{func() error { _, _, err := Setup("no-such.yaml", "simulated", nil); return err }, "no-such.yaml"},
		{func() error { _, _, err := Setup(testConfig, "no-such-cluster.yaml", nil); return err }, "no-such-cluster.yaml"},
	} {
		if err := c.parse(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("err = %v, want it to contain %q", err, c.want)
		}
	}
}

func TestTraceTransforms(t *testing.T) {
	body := "at,tenant,model,prompt_tokens,output_tokens\n0,a,large,1,1\n1,b,large,1,1\n2,a,large,1,1\n3,a,large,1,1\n4,b,large,1,1\n"
	read := func(o TraceOptions) []Row {
		rows, err := ReadTrace(strings.NewReader(body), "t.csv", o)
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	rows := read(TraceOptions{From: time.Second, To: 4 * time.Second, Speed: 2})
	if len(rows) != 3 || rows[0].At != 0 || rows[2].At != time.Second {
		t.Errorf("--from 1s --to 4s --speed 2: %+v", rows)
	}
	// 3x on a in [2s, 4s): rows at 2 and 3 become three each, placed
	// before the tenant's next row.
	rows = read(TraceOptions{Bursts: []Burst{{Tenant: "a", Factor: 3, From: 2 * time.Second, To: 4 * time.Second}}})
	n := map[string]int{}
	for _, r := range rows {
		n[r.Tenant]++
		if r.Tenant == "a" && r.Line == 0 && (r.At < 2*time.Second || r.At >= 4*time.Second) {
			t.Errorf("burst copy at %v, outside its window", r.At)
		}
	}
	if n["a"] != 3+4 || n["b"] != 2 {
		t.Errorf("burst 3x on a: %v", n)
	}
	// The mix is per row, by seed: the same row gets the same tenant
	// whatever the window.
	mix, _ := ParseMix("x:large:1,y:small:1")
	az := "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	for i := range 200 {
		az += "2023-11-16 18:17:" + twoDigits(i/10) + "." + twoDigits(i%10) + "00000,10,1\n"
	}
	all, err := ReadTrace(strings.NewReader(az), "az.csv", TraceOptions{Mix: mix, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	late, err := ReadTrace(strings.NewReader(az), "az.csv", TraceOptions{Mix: mix, Seed: 7, From: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	byLine := map[int]string{}
	x := 0
	for _, r := range all {
		byLine[r.Line] = r.Tenant
		if r.Tenant == "x" {
			x++
		}
	}
	for _, r := range late {
		if byLine[r.Line] != r.Tenant {
			t.Fatalf("line %d: %s with --from, %s without", r.Line, r.Tenant, byLine[r.Line])
		}
	}
	if x < 70 || x > 130 {
		t.Errorf("a 1:1 mix gave x %d of 200 rows", x)
	}
}

func TestReadJSONLAndCSV(t *testing.T) {
	jl := `{"at": 0.5, "tenant": "acme", "model": "large", "prompt_tokens": 100, "output_tokens": 10}

{"at": "1.5s", "tenant": "hooli", "model": "small", "prompt_tokens": 7, "output_tokens": 3}
`
	rows, err := ReadTrace(strings.NewReader(jl), "t.jsonl", TraceOptions{Format: FormatJSONL})
	if err != nil {
		t.Fatal(err)
	}
	want := []Row{
		{At: 0, Tenant: "acme", Model: "large", Prompt: 100, Output: 10, Line: 1},
		{At: time.Second, Tenant: "hooli", Model: "small", Prompt: 7, Output: 3, Line: 3},
	}
	if !slices.Equal(rows, want) {
		t.Errorf("jsonl rows %+v, want %+v", rows, want)
	}
	csv := "tenant,model,at,output_tokens,prompt_tokens\nhooli,small,2m,3,7\nacme,large,60,10,100\n"
	rows, err = ReadTrace(strings.NewReader(csv), "t.csv", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want = []Row{
		{At: 0, Tenant: "acme", Model: "large", Prompt: 100, Output: 10, Line: 3},
		{At: time.Minute, Tenant: "hooli", Model: "small", Prompt: 7, Output: 3, Line: 2},
	}
	if !slices.Equal(rows, want) {
		t.Errorf("csv rows (columns in any order, sorted by arrival) %+v, want %+v", rows, want)
	}
}

func twoDigits(i int) string { return string([]byte{byte('0' + i/10), byte('0' + i%10)}) }

func TestRecommend(t *testing.T) {
	// A tenant sending 1000 weighted tokens every second, and once 20
	// such requests in one instant: R is above its mean, C covers the
	// spike.
	var rows []Row
	for i := range 100 {
		rows = append(rows, Row{At: time.Duration(i) * time.Second, Tenant: "a", Model: "large", Prompt: 600, Output: 100})
	}
	for range 19 {
		rows = append(rows, Row{At: 50 * time.Second, Tenant: "a", Model: "large", Prompt: 600, Output: 100})
	}
	recs := Recommend(rows, 4, 5*time.Second)
	if len(recs) != 1 {
		t.Fatal(recs)
	}
	r := recs[0]
	if r.Rate < int64(r.MeanRate) || r.RateP99 >= r.Sweep[0].P99Ms {
		t.Errorf("R = %d (p99 %v ms) against mean %v (p99 %v ms)", r.Rate, r.RateP99, r.MeanRate, r.Sweep[0].P99Ms)
	}
	if r.WindowTokens != 24*1000 || r.LargestReq != 1000 {
		t.Errorf("largest 5 s window %d tokens, largest request %d", r.WindowTokens, r.LargestReq)
	}
	if want := max(r.WindowTokens-5*r.Rate, r.LargestReq); r.Burst != want {
		t.Errorf("C = %d, want %d", r.Burst, want)
	}
	var b bytes.Buffer
	if err := WriteRecommendations(&b, recs, "table"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "capacity sweep") || !strings.Contains(b.String(), "*") {
		t.Errorf("no evidence printed:\n%s", b.String())
	}
}

// BenchmarkReplayCodeHour replays the whole code trace (one hour, 8,819
// requests) under the engine, beside BenchmarkReadCodeTrace, the cost of
// reading and mixing the trace alone, measured in the same run.
func BenchmarkReplayCodeHour(b *testing.B) {
	cfg, cl := setup(b)
	rows := codeRows(b, TraceOptions{})
	b.ResetTimer()
	for b.Loop() {
		if _, err := Run(rows, Options{Policy: PolicySluice, Config: cfg, Cluster: cl, Deadline: 2 * time.Second}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplayCodeHourBurst is the hour with acme bursting 15× for a
// minute, the replay the done-criteria test runs.
func BenchmarkReplayCodeHourBurst(b *testing.B) {
	cfg, cl := setup(b)
	burst, _ := ParseBurst("acme:15x:300s-360s")
	rows := codeRows(b, TraceOptions{Bursts: []Burst{burst}})
	b.ResetTimer()
	for b.Loop() {
		if _, err := Run(rows, Options{Policy: PolicySluice, Config: cfg, Cluster: cl, Deadline: 2 * time.Second}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadCodeTrace(b *testing.B) {
	for b.Loop() {
		codeRows(b, TraceOptions{})
	}
}

func TestMain(m *testing.M) {
	if _, err := os.Stat(filepath.FromSlash(codeTrace)); err != nil {
		panic("the code trace is missing from testdata/traces: " + err.Error())
	}
	os.Exit(m.Run())
}
