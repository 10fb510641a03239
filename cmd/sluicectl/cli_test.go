package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/sluice-sched/sluice/admission"
)

// TestMain keeps the shell's SLUICE_SERVER out of the tests: a command
// without --server must not reach a server the developer happens to run.
func TestMain(m *testing.M) {
	os.Unsetenv("SLUICE_SERVER")
	os.Exit(m.Run())
}

// commandTree returns every command sluicectl has, hidden ones included,
// but cobra's own __complete.
func commandTree(t *testing.T) []*cobra.Command {
	t.Helper()
	root := newRoot(&globals{stdout: io.Discard, stderr: io.Discard})
	root.InitDefaultHelpCmd()
	var all []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if strings.HasPrefix(c.Name(), "__") {
			return
		}
		all = append(all, c)
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	return all
}

// Every command's --help and -h print its help on stdout, nothing on
// stderr, and exit 0, with the global flags (-o among them); an unknown
// flag is a usage error: exit 2, the error and where help is on stderr.
func TestEveryCommandsHelpAndUnknownFlag(t *testing.T) {
	cmds := commandTree(t)
	var paths []string
	for _, c := range cmds {
		path := strings.Fields(c.CommandPath())[1:]
		paths = append(paths, strings.Join(path, " "))
		for _, h := range []string{"--help", "-h"} {
			code, out, errs := sluicectl(append(slices.Clone(path), h)...)
			if code != 0 || errs != "" || !strings.Contains(out, "Usage:") || !strings.Contains(out, c.CommandPath()) {
				t.Errorf("%s %s: exit %d, stderr %q, stdout %q; want 0 and the help on stdout", c.CommandPath(), h, code, errs, out)
			}
			if !strings.Contains(out, "-o, --output-format") {
				t.Errorf("%s %s: no -o in the help:\n%s", c.CommandPath(), h, out)
			}
		}
		code, out, errs := sluicectl(append(slices.Clone(path), "--no-such-flag")...)
		if code != 2 || out != "" || !strings.Contains(errs, "unknown flag: --no-such-flag") || !strings.Contains(errs, "Run '"+c.CommandPath()+" --help' for usage.") {
			t.Errorf("%s --no-such-flag: exit %d, stdout %q, stderr %q; want 2 and the error on stderr", c.CommandPath(), code, out, errs)
		}
	}
	// The walk reached the nouns, their verbs, the shorthands and cobra's
	// own commands.
	for _, want := range []string{"", "domain list", "domain drain", "domain undrain", "tenant list", "tenant get", "credit freeze",
		"credit thaw", "config validate", "config apply", "config status", "explain", "topology", "replay", "recommend", "fleet generate", "load",
		"drill", "version", "completion bash", "completion zsh", "completion fish", "help", "domains", "drain", "undrain", "tenants"} {
		if !slices.Contains(paths, want) {
			t.Errorf("no command %q in the tree %q", want, paths)
		}
	}
}

// A command line that does not parse exits 2, with the error and where
// help is on stderr; a command that parses and fails exits 1.
func TestUsageErrorsExit2(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "want a command"},
		{[]string{"bogus"}, `unknown command "bogus" for "sluicectl"`},
		{[]string{"domian"}, "did you mean domain?"},
		{[]string{"domain"}, "sluicectl domain wants a command: drain, list, undrain"},
		{[]string{"domain", "lst"}, `unknown command "lst" for "sluicectl domain"; did you mean list?`},
		{[]string{"config"}, "wants a command"},
		{[]string{"credit"}, "wants a command"},
		{[]string{"credit", "melt"}, `unknown command "melt"`},
		{[]string{"completion"}, "wants a command"},
		{[]string{"tenant"}, "one tenant NAME"},
		{[]string{"tenant", "get"}, "want one tenant NAME"},
		{[]string{"domain", "drain"}, "want one DOMAIN"},
		{[]string{"drain", "a", "b"}, `unexpected argument "b"`},
		{[]string{"config", "status", "extra"}, `unexpected argument "extra"`},
		{[]string{"domain", "list", "--timeout", "soon"}, `invalid argument "soon" for "--timeout" flag`},
		{[]string{"tenant", "list", "--page", "two"}, `invalid argument "two" for "--page" flag`},
		{[]string{"topology", "-x"}, "unknown shorthand flag: 'x'"},
		{[]string{"fleet"}, "sluicectl fleet wants a command: generate"},
		{[]string{"fleet", "generate"}, "--dir: want the directory"},
		{[]string{"fleet", "generate", "--dir", "x", "--domains", "many"}, `invalid argument "many" for "--domains" flag`},
	} {
		code, out, errs := sluicectl(tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) || !strings.Contains(errs, "--help' for usage.") || strings.Count(errs, "sluicectl: ") != 1 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 and %q once on stderr", tc.args, code, out, errs, tc.want)
		}
	}
	code, _, errs := sluicectl("config", "validate", "-f", "/nonexistent.yaml")
	if code != 1 || !strings.HasPrefix(errs, "sluicectl: open /nonexistent.yaml") || strings.Contains(errs, "--help") {
		t.Errorf("a failing command: exit %d, %q; want 1 and its error", code, errs)
	}
}

// The server is --server, else SLUICE_SERVER, else localhost:7070, and a
// server --server did not name is said on stderr: an answer never comes
// silently from whatever listens where the command guessed.
func TestServerFromTheEnvironmentIsNamed(t *testing.T) {
	srv := startPlain(t)
	addr := srv.GRPCAddr().String()
	t.Setenv("SLUICE_SERVER", addr)
	note := "sluicectl: server " + addr + " (from SLUICE_SERVER)\n"
	if code, out, errs := sluicectl("config", "status"); code != 0 || !strings.Contains(out, "source:") || errs != note {
		t.Fatalf("config status with SLUICE_SERVER: exit %d, stdout %q, stderr %q; want the server's answer and %q", code, out, errs, note)
	}
	if code, out, errs := sluicectl("tenant", "get", "acme", "-o", "json"); code != 0 || !strings.Contains(out, `"name": "acme"`) || errs != note {
		t.Fatalf("tenant get with SLUICE_SERVER: exit %d, %q %q", code, out, errs)
	}
	// SLUICE_SERVER is --server's default: without etcd a drain acts on it.
	if code, out, errs := sluicectl("domain", "drain", "hgx-h200-2", "--reason", "env"); code != 0 || !strings.Contains(out, "on "+addr+" only") {
		t.Fatalf("domain drain with SLUICE_SERVER: exit %d, %q %q", code, out, errs)
	}
	if d := srv.Engine().Domains(); !slices.ContainsFunc(d, func(d admission.DomainInfo) bool { return d.ID == "hgx-h200-2" && d.Draining }) {
		t.Fatal("domain drain with SLUICE_SERVER drained nothing on that server")
	}
	// --server wins, and needs no note.
	if code, _, errs := sluicectl("domain", "list", "--server", addr); code != 0 || errs != "" {
		t.Fatalf("domain list --server: exit %d, stderr %q; want nothing on stderr", code, errs)
	}
	t.Setenv("SLUICE_SERVER", "")
	_, _, errs := sluicectl("config", "status", "--timeout", "2s")
	if !strings.HasPrefix(errs, "sluicectl: server localhost:7070 (the default: neither --server nor SLUICE_SERVER is set)\n") {
		t.Fatalf("config status with no server named: stderr %q; want it to say it asks the default", errs)
	}
}

// A flag's environment variable is read when the command runs, never
// shown as the flag's default: --help does not print SLUICE_TOKEN.
func TestHelpDoesNotShowTheEnvironmentsSecrets(t *testing.T) {
	t.Setenv("SLUICE_TOKEN", "s3cret-token")
	t.Setenv("SLUICE_SERVER", "10.9.8.7:7070")
	for _, args := range [][]string{{"domain", "list", "--help"}, {"config", "status", "-h"}, {"--help"}} {
		code, out, _ := sluicectl(args...)
		if code != 0 || strings.Contains(out, "s3cret-token") || strings.Contains(out, "10.9.8.7") {
			t.Errorf("%q: exit %d; the help shows the environment's values:\n%s", args, code, out)
		}
	}
}

// Dialling the HTTP port by mistake says so, naming both ports, rather
// than grpc-go's "http2: frame too large".
func TestHTTPPortByMistakeSaysSo(t *testing.T) {
	srv := startPlain(t)
	addr := srv.HTTPAddr().String()
	code, _, errs := sluicectl("config", "status", "--server", addr)
	if code != 1 || !strings.Contains(errs, "server "+addr+": Unavailable: it answers HTTP/1, not gRPC") || !strings.Contains(errs, "--grpc-addr") || strings.Contains(errs, "frame too large") {
		t.Fatalf("config status on the HTTP port: exit %d, %q", code, errs)
	}
}

// An error says each context once: one "sluicectl:", one "topology", the
// server's address once with the gRPC code and message.
func TestErrorsSayEachContextOnce(t *testing.T) {
	code, _, errs := sluicectl("topology", "--topology", "/nonexistent.yaml")
	if code != 1 || errs != "sluicectl: topology: open /nonexistent.yaml: no such file or directory\n" {
		t.Errorf("topology of a missing file: exit %d, %q", code, errs)
	}
	srv := startPlain(t)
	addr := srv.GRPCAddr().String()
	code, _, errs = sluicectl("tenant", "get", "nobody", "--server", addr)
	if code != 1 || !strings.HasPrefix(errs, "sluicectl: server "+addr+": NotFound: ") || strings.Count(errs, addr) != 1 || strings.Contains(errs, "rpc error") {
		t.Errorf("an unknown tenant: exit %d, %q; want one line naming the server once, then the code and message", code, errs)
	}
}

// The new names and the earlier ones are the same commands: domain list
// and domains, tenant list and tenants, tenant get NAME and tenant NAME
// print the same.
func TestShorthandsAreTheSameCommands(t *testing.T) {
	srv := startPlain(t)
	addr := srv.GRPCAddr().String()
	for _, pair := range [][2][]string{
		{{"domain", "list"}, {"domains"}},
		{{"tenant", "list", "--sort", "weight"}, {"tenants", "--sort", "weight"}},
		{{"tenant", "get", "acme"}, {"tenant", "acme"}},
	} {
		code1, out1, errs1 := sluicectl(append(pair[0], "--server", addr, "-o", "json")...)
		code2, out2, errs2 := sluicectl(append(pair[1], "--server", addr, "-o", "json")...)
		if code1 != 0 || code2 != 0 || out1 != out2 || out1 == "" {
			t.Errorf("%q and %q differ: %d %q %s\n%d %q %s", pair[0], pair[1], code1, errs1, out1, code2, errs2, out2)
		}
	}
}

// -o json uses one convention everywhere: lowerCamelCase keys (but those
// of maps keyed by data: refusal reasons, error codes), action results as
// objects; -o yaml is the same document.
func TestJSONAndYAMLOneConvention(t *testing.T) {
	srv := startPlain(t)
	addr := srv.GRPCAddr().String()
	cfg := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfg, []byte("tiers:\n  t: {rps: {rate: 1, burst: 1}, tokens: {rate: 100, burst: 100}}\ntenants:\n  a: {tier: t}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		same bool // the same answer twice: yaml must equal json
	}{
		{[]string{"version"}, true},
		{[]string{"topology", "--topology", "simulated"}, true},
		{[]string{"config", "validate", "-f", cfg}, true},
		{[]string{"recommend", "--trace", replayTrace, "--mix", replayMix, "--to", "2m"}, true},
		{[]string{"fleet", "generate", "--dir", t.TempDir(), "--domains", "2", "--tenants", "3"}, true},
		{[]string{"replay", "--trace", replayTrace, "--mix", replayMix, "--to", "1m"}, true},
		{[]string{"config", "status", "--server", addr}, false},
		{[]string{"domain", "list", "--server", addr}, false},
		{[]string{"tenant", "list", "--server", addr}, false},
		{[]string{"tenant", "get", "acme", "--server", addr}, false},
		{[]string{"explain", "--tenant", "acme", "--model", "small", "--server", addr}, false},
		{[]string{"domain", "drain", "hgx-h200-3", "--reason", "test", "--server", addr}, false},
		{[]string{"domain", "undrain", "hgx-h200-3", "--server", addr}, false},
		{[]string{"credit", "freeze", "--for", "1m", "--server", addr}, false},
		{[]string{"credit", "thaw", "--server", addr}, false},
		{[]string{"load", "--tenants", "acme:small:1", "--concurrency", "1", "--duration", "50ms", "--server", addr}, false},
	} {
		code, out, errs := sluicectl(append(slices.Clone(tc.args), "-o", "json")...)
		if code != 0 {
			t.Errorf("%q -o json: exit %d, %s", tc.args, code, errs)
			continue
		}
		var doc any
		dec := json.NewDecoder(strings.NewReader(out))
		dec.UseNumber()
		if err := dec.Decode(&doc); err != nil {
			t.Errorf("%q -o json: %v\n%s", tc.args, err, out)
			continue
		}
		action := tc.args[0] == "credit" || tc.args[0] == "domain" && tc.args[1] != "list" || tc.args[0] == "config" && tc.args[1] == "validate"
		if _, ok := doc.(map[string]any); action && !ok {
			t.Errorf("%q -o json: %s; want an object", tc.args, out)
		}
		if bad := badKeys(doc, ""); len(bad) > 0 {
			slices.Sort(bad)
			t.Errorf("%q -o json: keys not lowerCamelCase: %s", tc.args, strings.Join(slices.Compact(bad), ", "))
		}
		code, yout, errs := sluicectl(append(slices.Clone(tc.args), "-o", "yaml")...)
		j, err := yaml.YAMLToJSON([]byte(yout))
		if code != 0 || err != nil || bytes.HasPrefix(bytes.TrimSpace([]byte(yout)), []byte("{")) {
			t.Errorf("%q -o yaml: exit %d, %v, %s\n%s", tc.args, code, err, errs, yout)
			continue
		}
		if tc.same {
			var fromYAML, fromJSON any
			_ = json.Unmarshal(j, &fromYAML)
			_ = json.Unmarshal([]byte(out), &fromJSON)
			if !reflect.DeepEqual(fromYAML, fromJSON) {
				t.Errorf("%q: -o yaml is not -o json's document:\n%s\n%s", tc.args, yout, out)
			}
		}
	}
	// drill: a run takes a fleet and seconds a phase (the drill tests
	// check the keys of theirs); here a summary with every field set
	// prints as `drill -o json|yaml` prints it.
	sum := filledDrillSummary()
	var docs [2]any
	for i, format := range []string{formatJSON, formatYAML} {
		var buf bytes.Buffer
		if err := (output{format: format, w: &buf}).write(sum.WriteJSON, sum.WriteTable); err != nil {
			t.Fatalf("drill -o %s: %v", format, err)
		}
		j := buf.Bytes()
		if format == formatYAML {
			var err error
			if j, err = yaml.YAMLToJSON(j); err != nil || bytes.HasPrefix(bytes.TrimSpace(buf.Bytes()), []byte("{")) {
				t.Fatalf("drill -o yaml: %v\n%s", err, buf.Bytes())
			}
		}
		if err := json.Unmarshal(j, &docs[i]); err != nil {
			t.Fatalf("drill -o %s: %v\n%s", format, err, j)
		}
		if bad := badKeys(docs[i], ""); len(bad) > 0 {
			slices.Sort(bad)
			t.Errorf("drill -o %s: keys not lowerCamelCase: %s", format, strings.Join(slices.Compact(bad), ", "))
		}
	}
	if !reflect.DeepEqual(docs[0], docs[1]) {
		t.Errorf("drill: -o yaml is not -o json's document:\n%v\n%v", docs[1], docs[0])
	}
}

// dataKeyed are keys whose values, where they are objects, are maps keyed
// by data (a reason, a gRPC code, a drill's name, a broken promise), not
// by field names: their keys are not checked, what they hold is.
var dataKeyed = map[string]bool{"refusals": true, "errors": true, "releaseErrors": true, "rejected": true,
	"drills": true, "broken": true}

// badKeys lists the object keys in doc that are not lowerCamelCase, by
// path.
func badKeys(doc any, path string) []string {
	var bad []string
	switch v := doc.(type) {
	case map[string]any:
		for k, c := range v {
			if !isLowerCamel(k) {
				bad = append(bad, path+"."+k)
			}
			if m, ok := c.(map[string]any); ok && dataKeyed[k] {
				for dk, dc := range m {
					bad = append(bad, badKeys(dc, path+"."+k+"."+dk)...)
				}
				continue
			}
			bad = append(bad, badKeys(c, path+"."+k)...)
		}
	case []any:
		for _, c := range v {
			bad = append(bad, badKeys(c, path+"[]")...)
		}
	}
	return bad
}

func isLowerCamel(k string) bool {
	if k == "" || !unicode.IsLower(rune(k[0])) {
		return false
	}
	return !strings.ContainsAny(k, "_- ")
}
