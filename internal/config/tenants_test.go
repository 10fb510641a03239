package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/sluice-sched/sluice/admission"
)

// tenantLines are the shapes a tenant's entry takes in a block, %s its
// name; some are mistakes, and some are cut badly by a chunk boundary.
var tenantLines = []string{
	"  %s: {tier: gold}\n",
	"  %s: {tier: bronze}\n",
	"  %s:\n    tier: gold\n    weight: 3\n",
	"  %s: {tier: gold, floor: 10}\n",
	"  %s: {tier: gold, rps: {rate: 5,\n    burst: 9}}\n",
	"  # a comment\n  %s: {tier: bronze}\n\n",
	"  %s: &shape {tier: gold, weight: 2}\n",
	"  %s: *shape\n",
	"  %s: {tier: lead}\n",
	"  %s: {tier: gold, Weight: 2}\n",
	"  %s: {tier: gold, weight: 0}\n",
	"  %s: {tier: gold, weight: two}\n",
	"  %s: {tier: gold\n",
	"  %s: \"gold\"\n",
	"  %s:\n    tier: gold\n  # indented comment\n    weight: 5\n",
	"  %s: {tier: gold}\r\n",
	"  %s: {tier: gold}", // no newline: the last line of a file
}

// Parse reads a document in chunks exactly as in one piece: the same
// config, or the same refusal, for documents of every shape, cut into
// chunks of one to three entries.
func TestChunkedParseMatchesWholeParse(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		defer func(n int) { chunkEntries = n }(chunkEntries)
		chunkEntries = rapid.IntRange(1, 3).Draw(t, "chunk")
		var b strings.Builder
		b.WriteString("tiers:\n  gold: {rps: {rate: 100, burst: 100}, tokens: {rate: 1e6, burst: 1e6}, weight: 4}\n")
		b.WriteString("  bronze: {rps: {rate: 10, burst: 10}, tokens: {rate: 1e5, burst: 1e5}}\n")
		if rapid.Bool().Draw(t, "before") {
			b.WriteString("queue: {max_total: 500}\n")
		}
		b.WriteString(rapid.SampledFrom([]string{"tenants:\n", "tenants: # who\n", "tenants: {a: {tier: gold}}\n", "tenants:\r\n"}).Draw(t, "key"))
		n := rapid.IntRange(0, 8).Draw(t, "tenants")
		last := false
		for i := range n {
			line := rapid.SampledFrom(tenantLines).Draw(t, "line")
			name := rapid.SampledFrom([]string{"t%d", "\"t%d\"", "t%d.x", "t%d"}).Draw(t, "name")
			if rapid.IntRange(0, 9).Draw(t, "dup") == 0 {
				name = "t0"
			}
			fmt.Fprintf(&b, line, fmt.Sprintf(strings.ReplaceAll(name, "%d", fmt.Sprint(i)), i))
			last = !strings.HasSuffix(line, "\n")
			if last {
				break
			}
		}
		if !last && rapid.Bool().Draw(t, "after") {
			b.WriteString(rapid.SampledFrom([]string{"leases: {ttl: 1h}\n", "# the end\n", "tenants:\n  z: {tier: gold}\n", "  stray: 1\n"}).Draw(t, "tail"))
		}
		doc := b.String()
		got, gotErr := Parse("f.yaml", []byte(doc))
		want, wantErr := parseWhole("f.yaml", []byte(doc))
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Fatalf("document:\n%s\nchunked: %v\nwhole:   %v", doc, gotErr, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("document:\n%s\nchunked: %+v\nwhole:   %+v", doc, got.Tenants, want.Tenants)
		}
	})
}

// A block of tenants is really read in chunks (not by the whole-document
// fallback), every tenant on its tier.
func TestTenantsBlockSplitsIntoChunks(t *testing.T) {
	defer func(n int) { chunkEntries = n }(chunkEntries)
	chunkEntries = 2
	doc := "tiers:\n  gold: {rps: {rate: 1, burst: 1}, tokens: {rate: 1, burst: 1}}\ntenants:\n" +
		"  a: {tier: gold}\n  b:\n    tier: gold\n  c: {tier: gold}\n  # c's note\nleases: {ttl: 1h}\n"
	base, chunks, ok := splitTenants([]byte(doc))
	if !ok || len(chunks) != 2 {
		t.Fatalf("split: ok %v, %d chunks, want 2", ok, len(chunks))
	}
	if strings.Contains(string(base), "tenants") || !strings.Contains(string(base), "leases") {
		t.Fatalf("the rest of the document:\n%s", base)
	}
	cfg, err, ok := parseSplit("f.yaml", base, chunks)
	if err != nil || !ok {
		t.Fatalf("parseSplit: %v, ok %v", err, ok)
	}
	if len(cfg.Tenants) != 3 || cfg.Tenants["b"].Tier != "gold" || cfg.Leases.TTL.Hours() != 1 {
		t.Fatalf("tenants %v, lease TTL %v", cfg.Tenants, cfg.Leases.TTL)
	}
}

// A tenant's own document is checked as its entry in a whole config is,
// its errors naming its document and its keys.
func TestParseTenantIsStrict(t *testing.T) {
	for doc, want := range map[string]string{
		"{tier: gold, weight: 3}":   "",
		"tier: gold\nweight: 3\n":   "",
		"{tier: gold, Weight: 3}":   `config /t/acme: tenants.acme: unknown key "Weight" (keys are case-sensitive: did you mean "weight"?)`,
		"{tier: gold, weight: 1.5}": "config /t/acme: tenants.acme.weight: want a whole number, got 1.5",
		"{tier: gold, tier: x}":     "config /t/acme: tenants.acme: yaml: unmarshal errors:\n  line 1: key \"tier\" already set in map",
	} {
		tc, err := ParseTenant("/t/acme", "acme", []byte(doc))
		if fmt.Sprint(err) != fmt.Sprint(want) && !(want == "" && err == nil) {
			t.Errorf("%q: got %v, want %s", doc, err, want)
		}
		if want == "" && (tc.Tier != "gold" || *tc.Overrides().Weight != 3) {
			t.Errorf("%q: got %+v", doc, tc)
		}
	}
}

// ParseParts refuses a tenant defined twice, and serves the others.
func TestParsePartsRefusesATenantInBothPlaces(t *testing.T) {
	base := []byte("tiers:\n  gold: {rps: {rate: 1, burst: 1}, tokens: {rate: 1, burst: 1}}\ntenants:\n  a: {tier: gold}\n")
	_, err := ParseParts("/p/config", base, map[string]admission.TenantConfig{"a": {Tier: "gold"}})
	if want := `config /p/config: tenants.a: tenant "a" is also defined in /p/config; define it in one place`; fmt.Sprint(err) != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	cfg, err := ParseParts("/p/config", base, map[string]admission.TenantConfig{"b": {Tier: "gold"}})
	if err != nil || len(cfg.Tenants) != 2 {
		t.Fatalf("got %v, %v", cfg.Tenants, err)
	}
}
