package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// rewrite makes TestArchitectureDocMatchesCode write the imports the code
// has into the doc's table instead of failing on a difference.
var rewrite = flag.Bool("rewrite", false, "write the packages' imports into docs/architecture.md's table")

const (
	module   = "github.com/sluice-sched/sluice"
	repoRoot = "../.."
	docPath  = "docs/architecture.md"
)

// kind is a package's place in the layering (see doc.go).
type kind string

const (
	foundation  kind = "foundation"
	core        kind = "core"
	contract    kind = "contract"
	adapter     kind = "adapter"
	testSupport kind = "test support"
	tooling     kind = "tooling"
	command     kind = "command"
	docsOnly    kind = "docs"
)

// kinds is every package of the module, by its path under the module. A
// new package is added here and to docs/architecture.md's table.
var kinds = map[string]kind{
	"topology":           core,
	"wfq":                core,
	"pd":                 core,
	"admission/sharing":  core,
	"admission":          core,
	"admission/deferral": core,

	"internal/tokenbucket": foundation,
	"internal/clock":       foundation,
	"internal/rendezvous":  foundation,
	"internal/indexheap":   foundation,
	"internal/cli":         foundation,
	"internal/cputime":     foundation,

	"admission/v1": contract,

	"admission/grpcserver":         adapter,
	"admission/rlsserver":          adapter,
	"admission/client":             adapter,
	"admission/client/etcdmembers": adapter,
	"internal/auth":                adapter,
	"internal/config":              adapter,
	"internal/controlplane":        adapter,
	"internal/dashboard":           adapter,
	"internal/enginemetrics":       adapter,
	"internal/extproc":             adapter,
	"internal/gateway":             adapter,
	"internal/metrics":             adapter,
	"internal/openai":              adapter,
	"internal/server":              adapter,
	"internal/state/boltbacklog":   adapter,
	"internal/state/memstate":      adapter,
	"internal/state/redisbacklog":  adapter,
	"internal/state/redisstate":    adapter,
	"topology/nvml":                adapter,

	"admission/admissiontest":             testSupport,
	"admission/deferral/deferraltest":     testSupport,
	"internal/archtest":                   testSupport,
	"internal/auth/authtest":              testSupport,
	"internal/controlplane/etcdtest":      testSupport,
	"internal/deployfiles":                testSupport,
	"internal/grpctest":                   testSupport,
	"internal/openai/openaitest":          testSupport,
	"internal/state/redistest":            testSupport,
	"internal/state/boltbacklog/bolttest": testSupport,
	"internal/state/statetest":            testSupport,
	"internal/testdep":                    testSupport,
	"internal/testwait":                   testSupport,
	"topology/topologytest":               testSupport,

	"internal/drill":     tooling,
	"internal/enginesim": tooling,
	"internal/etcdembed": tooling,
	"internal/fleetgen":  tooling,
	"internal/fleetsim":  tooling,
	"internal/load":      tooling,
	"internal/replay":    tooling,

	"cmd/sluiced":      command,
	"cmd/sluice-agent": command,
	"cmd/sluicectl":    command,

	"internal/state": docsOnly,
}

// coreOrder ranks the core: a core package imports only core packages of
// a lower rank.
var coreOrder = map[string]int{
	"topology": 0, "wfq": 0, "pd": 1, "admission/sharing": 2, "admission": 3, "admission/deferral": 4,
}

// productCommands are the commands that run in production; the tooling is
// sluicectl's alone.
var productCommands = []string{"cmd/sluiced", "cmd/sluice-agent"}

// graph maps each package (its path under the module) to the module's
// packages its non-test files import.
type graph map[string][]string

// violations lists every import of g that breaks the rule, and every
// package with no kind, sorted.
func violations(g graph, kinds map[string]kind, coreOrder map[string]int) []string {
	var out []string
	for _, pkg := range slices.Sorted(maps.Keys(g)) {
		k, ok := kinds[pkg]
		if !ok {
			out = append(out, fmt.Sprintf("%s: no kind; give it one in internal/archtest and a row in %s", pkg, docPath))
			continue
		}
		for _, imp := range g[pkg] {
			ik, ok := kinds[imp]
			if !ok {
				continue // reported as a package of its own
			}
			if why := forbidden(pkg, k, imp, ik, coreOrder); why != "" {
				out = append(out, fmt.Sprintf("%s (%s) imports %s (%s): %s", pkg, k, imp, ik, why))
			}
		}
	}
	return out
}

// forbidden says why pkg, of kind k, may not import imp, of kind ik; ""
// when it may.
func forbidden(pkg string, k kind, imp string, ik kind, coreOrder map[string]int) string {
	product := k == foundation || k == core || k == contract || k == adapter || slices.Contains(productCommands, pkg)
	switch {
	case ik == command:
		return "nothing imports a command"
	case k == foundation || k == contract || k == docsOnly:
		return fmt.Sprintf("a %s imports no Sluice package", k)
	case k == core && ik == core && coreOrder[imp] >= coreOrder[pkg]:
		return "the core imports only core packages below it"
	case k == core && ik != core && ik != foundation:
		return "the core imports only foundations and the core below it"
	case product && ik == tooling:
		return "no product package imports the tooling"
	case product && ik == testSupport:
		return "no product package imports test support"
	}
	return ""
}

// The module's packages follow the dependency rule.
func TestDependencyRule(t *testing.T) {
	g := loadGraph(t)
	for _, v := range violations(g, kinds, coreOrder) {
		t.Error(v)
	}
	for pkg := range kinds {
		if _, ok := g[pkg]; !ok {
			t.Errorf("%s has a kind but is not a package of the module: remove it from kinds", pkg)
		}
	}
}

// The rule catches each kind of bad import planted in the real graph, and
// only it.
func TestDependencyRuleCatchesBadImports(t *testing.T) {
	real := loadGraph(t)
	for _, c := range []struct{ from, to, want string }{
		{"wfq", "internal/server", "the core imports only foundations"},
		{"pd", "admission", "the core imports only core packages below it"},
		{"admission", "admission/v1", "the core imports only foundations"},
		{"internal/clock", "topology", "a foundation imports no Sluice package"},
		{"admission/v1", "internal/clock", "a contract imports no Sluice package"},
		{"internal/server", "internal/replay", "no product package imports the tooling"},
		{"cmd/sluiced", "internal/load", "no product package imports the tooling"},
		{"internal/metrics", "internal/testwait", "no product package imports test support"},
		{"internal/load", "cmd/sluiced", "nothing imports a command"},
	} {
		g := maps.Clone(real)
		g[c.from] = append(slices.Clone(g[c.from]), c.to)
		got := violations(g, kinds, coreOrder)
		if len(got) != 1 || !strings.Contains(got[0], c.from+" (") || !strings.Contains(got[0], " imports "+c.to+" (") || !strings.Contains(got[0], c.want) {
			t.Errorf("%s importing %s: violations %q, want one saying %q", c.from, c.to, got, c.want)
		}
	}
	g := maps.Clone(real)
	g["internal/newthing"] = nil
	if got := violations(g, kinds, coreOrder); len(got) != 1 || !strings.Contains(got[0], "internal/newthing: no kind") {
		t.Errorf("an unclassified package: violations %q, want one naming it", got)
	}
}

// docs/architecture.md's package table has a row for every package, with
// its kind and the Sluice packages its non-test files import, and no row
// for a package that does not exist. With -rewrite the imports column is
// written from the code.
func TestArchitectureDocMatchesCode(t *testing.T) {
	g := loadGraph(t)
	path := filepath.Join(repoRoot, docPath)
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(src), "\n")
	seen := map[string]bool{}
	changed := false
	for i, line := range lines {
		row, ok := parseRow(line)
		if !ok {
			continue
		}
		where := fmt.Sprintf("%s:%d", docPath, i+1)
		imports, inModule := g[row.pkg]
		switch {
		case !inModule:
			t.Errorf("%s: a row for %s, which is not a package of the module", where, row.pkg)
			continue
		case seen[row.pkg]:
			t.Errorf("%s: a second row for %s", where, row.pkg)
		}
		seen[row.pkg] = true
		if kind(row.kind) != kinds[row.pkg] {
			t.Errorf("%s: %s is a %q in the doc and a %q in internal/archtest", where, row.pkg, row.kind, kinds[row.pkg])
		}
		if slices.Equal(row.imports, imports) {
			continue
		}
		if *rewrite {
			lines[i] = row.withImports(imports)
			changed = true
			continue
		}
		t.Errorf("%s: %s imports %s, the doc says %s (go test ./internal/archtest -rewrite writes it)", where, row.pkg, importList(imports), importList(row.imports))
	}
	for _, pkg := range slices.Sorted(maps.Keys(g)) {
		if !seen[pkg] {
			t.Errorf("%s has no row in %s's package table", pkg, docPath)
		}
	}
	if changed {
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the imports column of %s", docPath)
	}
}

// docRow is one row of the doc's package table:
// | `pkg` | kind | owns | imports |.
type docRow struct {
	cells   []string // as written, without the outer bars
	pkg     string
	kind    string
	imports []string // the backquoted packages of the last cell, sorted
	rest    string   // the last cell's text after the packages ("; …"), kept by a rewrite
}

var backquoted = regexp.MustCompile("`([^`]+)`")

// parseRow reads a package row; ok is false for any other line.
func parseRow(line string) (docRow, bool) {
	if !strings.HasPrefix(line, "| `") || !strings.HasSuffix(line, " |") {
		return docRow{}, false
	}
	cells := strings.Split(strings.TrimSuffix(strings.TrimPrefix(line, "| "), " |"), " | ")
	if len(cells) != 4 {
		return docRow{}, false
	}
	m := backquoted.FindStringSubmatch(cells[0])
	if m == nil || m[0] != cells[0] {
		return docRow{}, false
	}
	r := docRow{cells: cells, pkg: m[1], kind: cells[1]}
	list, rest, _ := strings.Cut(cells[3], ";")
	r.rest = rest
	for _, m := range backquoted.FindAllStringSubmatch(list, -1) {
		r.imports = append(r.imports, m[1])
	}
	slices.Sort(r.imports)
	return r, true
}

// withImports is the row with its imports column replaced.
func (r docRow) withImports(imports []string) string {
	cells := slices.Clone(r.cells)
	cells[3] = importList(imports)
	if r.rest != "" {
		cells[3] += ";" + r.rest
	}
	return "| " + strings.Join(cells, " | ") + " |"
}

// importList writes packages as the doc's imports column does.
func importList(pkgs []string) string {
	if len(pkgs) == 0 {
		return "—"
	}
	quoted := make([]string, len(pkgs))
	for i, p := range pkgs {
		quoted[i] = "`" + p + "`"
	}
	return strings.Join(quoted, ", ")
}

// loadGraph reads the module's packages and their non-test imports with
// go list.
func loadGraph(t *testing.T) graph {
	t.Helper()
	cmd := exec.Command(goTool(t), "list", "-e", "-json=ImportPath,Imports,Error", "./...")
	cmd.Dir = repoRoot
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	g := graph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
			Error      *struct{ Err string }
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list's output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		pkg, ok := underModule(p.ImportPath)
		if !ok {
			continue
		}
		g[pkg] = []string{}
		for _, imp := range p.Imports {
			if rel, ok := underModule(imp); ok {
				g[pkg] = append(g[pkg], rel)
			}
		}
		slices.Sort(g[pkg])
	}
	if len(g) < 20 {
		t.Fatalf("go list found %d packages: not the module", len(g))
	}
	return g
}

// underModule is path relative to the module, if it is the module's.
func underModule(path string) (string, bool) {
	return strings.CutPrefix(path, module+"/")
}

// goTool is the go command: the one on PATH, else the one in GOROOT/bin
// (go test sets GOROOT in the test's environment).
func goTool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	t.Fatal("no go command on PATH or in $GOROOT/bin")
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
