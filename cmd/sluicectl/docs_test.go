package main

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// repoRoot is where the README and docs/ are, from this package.
const repoRoot = "../.."

// example is one sluicectl command line of the docs.
type example struct {
	where string   // file:line
	args  []string // after "sluicectl"
	// synopsis: an inline `sluicectl …` span, which may hold placeholders
	// (NAME, [--flag X], a|b); only its command and flag names are checked.
	synopsis bool
	// unbound names the shell variables it uses that its code block does
	// not set; such an example is parsed but not run.
	unbound []string
}

// The README's and the docs' sluicectl examples name commands and flags
// that exist, and parse as written: each line of a code block in full
// (flags, their values' types, the arguments), each inline `sluicectl …`
// span by its command and flag names. The ones that need no server, etcd or
// GPU run, from the repository root, and exit 0. Files are found when the
// test runs (README.md and every docs/**/*.md), so that pages may move.
func TestDocsExamplesRunAsWritten(t *testing.T) {
	examples := docExamples(t, docFiles(t))
	blocks := 0
	for _, ex := range examples {
		if !ex.synopsis {
			blocks++
		}
	}
	if blocks < 5 {
		t.Fatalf("%d sluicectl examples in code blocks (%d in all): the docs were not found or not read", blocks, len(examples))
	}
	var ran []string
	for _, ex := range examples {
		cmd, err := parseExample(ex)
		if err != nil {
			t.Errorf("%s: sluicectl %s: %v", ex.where, strings.Join(ex.args, " "), err)
			continue
		}
		if ex.synopsis || len(ex.unbound) > 0 || !offline(cmd, ex.args) {
			continue
		}
		t.Run(ex.where, func(t *testing.T) {
			t.Chdir(repoRoot)
			args := redirectOutputs(t, ex.args)
			if code, _, errs := sluicectl(args...); code != 0 {
				t.Errorf("%s: sluicectl %s: exit %d\n%s", ex.where, strings.Join(ex.args, " "), code, errs)
			}
		})
		ran = append(ran, ex.where)
	}
	t.Logf("%d examples parsed, %d run: %s", len(examples), len(ran), strings.Join(ran, " "))
}

// The checker itself: a page's mistakes are each found, and its good
// lines pass.
func TestDocsExampleCheckerFindsMistakes(t *testing.T) {
	page := filepath.Join(t.TempDir(), "page.md")
	doc := "Drain with `sluicectl domain drain DOMAIN [--reason R] --etcd URLS`, not `sluicectl domain drian X`\n" +
		"nor `sluicectl tenant list --sorted name`.\n\n" +
		"```sh\nT=testdata/traces/AzureLLMInferenceTrace_code.csv\n" +
		"sluicectl domain list --server $S -o json     # fine: S is a placeholder\n" +
		"go run ./cmd/sluicectl recommend --trace $T \\\n  --mix acme:small:1 --window 2s\n" +
		"sluicectl domain list --servr x\n" +
		"sluicectl tenant get\n" +
		"sluicectl credit\n" +
		"sluicectl load --duration soon\n" +
		"$ sluicectl drill all --self-contained | tee out\n" +
		"sluicectl drill: starting the self-contained fleet…\n```\n"
	if err := os.WriteFile(page, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ex := range docExamples(t, []string{page}) {
		_, err := parseExample(ex)
		got = append(got, fmt.Sprintf("%s %q %v", ex.where, ex.args, err != nil))
	}
	want := []string{
		`page.md:6 ["domain" "list" "--server" "VALUE" "-o" "json"] false`,
		`page.md:7 ["recommend" "--trace" "testdata/traces/AzureLLMInferenceTrace_code.csv" "--mix" "acme:small:1" "--window" "2s"] false`,
		`page.md:9 ["domain" "list" "--servr" "x"] true`,
		`page.md:10 ["tenant" "get"] true`,
		`page.md:11 ["credit"] true`,
		`page.md:12 ["load" "--duration" "soon"] true`,
		`page.md:13 ["drill" "all" "--self-contained"] false`,
		`page.md:1 ["domain" "drain" "DOMAIN" "[--reason" "R]" "--etcd" "URLS"] false`,
		`page.md:1 ["domain" "drian" "X"] true`,
		`page.md:2 ["tenant" "list" "--sorted" "name"] true`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("examples and whether each is refused:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// docFiles are README.md and every Markdown file under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{filepath.Join(repoRoot, "README.md")}
	err := filepath.WalkDir(filepath.Join(repoRoot, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return err
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return files
}

var (
	fence      = regexp.MustCompile("^\\s*(```|~~~)")
	inlineCode = regexp.MustCompile("`(sluicectl [^`]+)`")
	assignment = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)=(.*)$`)
)

// docExamples reads every sluicectl example of files.
func docExamples(t *testing.T, files []string) []example {
	t.Helper()
	var out []example
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(repoRoot, path)
		if err != nil || strings.HasPrefix(rel, "..") {
			rel = filepath.Base(path)
		}
		lines := strings.Split(string(b), "\n")
		var prose strings.Builder // the text outside code blocks, lines kept
		// Variables hold over the file: a page sets T=… in one block and
		// uses $T in the next.
		inBlock, vars := false, map[string]string{}
		for i := 0; i < len(lines); i++ {
			line := lines[i]
			if fence.MatchString(line) {
				inBlock = !inBlock
				prose.WriteString("\n")
				continue
			}
			if !inBlock {
				prose.WriteString(line + "\n")
				continue
			}
			prose.WriteString("\n")
			at := i + 1
			for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
				i++
				line = strings.TrimSuffix(line, "\\") + " " + lines[i]
				prose.WriteString("\n")
			}
			ex, ok := blockExample(strings.TrimPrefix(strings.TrimSpace(line), "$ "), vars)
			if ok {
				ex.where = fmt.Sprintf("%s:%d", rel, at)
				out = append(out, ex)
			}
		}
		// Inline spans may wrap across lines: match over the prose with
		// its newlines as spaces, and find the line by counting.
		text := prose.String()
		for _, m := range inlineCode.FindAllStringSubmatchIndex(strings.ReplaceAll(text, "\n", " "), -1) {
			span := strings.ReplaceAll(text[m[2]:m[3]], "\n", " ")
			out = append(out, example{
				where:    fmt.Sprintf("%s:%d", rel, 1+strings.Count(text[:m[0]], "\n")),
				args:     strings.Fields(strings.ReplaceAll(span, `\|`, "|"))[1:],
				synopsis: true,
			})
		}
	}
	return out
}

// blockExample reads a code block's line: a variable assignment is noted
// in vars; a sluicectl command (sluicectl, a path ending in /sluicectl, or
// go run ./cmd/sluicectl, after any VAR=value prefixes) is an example.
func blockExample(line string, vars map[string]string) (example, bool) {
	words, unbound := shellWords(line, vars)
	if len(words) == 1 {
		if m := assignment.FindStringSubmatch(words[0]); m != nil {
			vars[m[1]] = m[2]
			return example{}, false
		}
	}
	for len(words) > 0 && assignment.MatchString(words[0]) {
		words = words[1:]
	}
	switch {
	case len(words) >= 3 && words[0] == "go" && words[1] == "run" && words[2] == "./cmd/sluicectl":
		words = words[3:]
	case len(words) >= 1 && (words[0] == "sluicectl" || strings.HasSuffix(words[0], "/sluicectl")):
		words = words[1:]
	default:
		return example{}, false
	}
	if len(words) > 0 && strings.HasSuffix(words[0], ":") {
		return example{}, false // a line of output ("sluicectl drill: …"), not a command
	}
	return example{args: words, unbound: unbound}, true
}

// shellWords splits a command line as sh would, far enough for the docs:
// quotes, backslashes, $VAR and ${VAR} from vars, a comment, and the first
// command of a pipeline or list. Variables vars lacks become VALUE and are
// returned.
func shellWords(line string, vars map[string]string) (words, unbound []string) {
	var (
		cur     strings.Builder
		inWord  bool
		quote   rune
		runes   = []rune(line)
		flush   = func() { words, inWord = append(words, cur.String()), false; cur.Reset() }
		varName = regexp.MustCompile(`^\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)
	)
	for i := 0; i < len(runes); i++ {
		r := runes[i]
		switch {
		case quote == '\'' && r != '\'':
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			if quote == 0 {
				quote, inWord = r, true
			} else if quote == r {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\\' && i+1 < len(runes):
			i++
			cur.WriteRune(runes[i])
			inWord = true
		case r == '$':
			m := varName.FindStringSubmatch(string(runes[i+1:]))
			if m == nil {
				cur.WriteRune(r)
				continue
			}
			i += len([]rune(m[0]))
			v, ok := vars[m[1]]
			if !ok {
				unbound, v = append(unbound, m[1]), "VALUE"
			}
			cur.WriteString(v)
			inWord = true
		case quote != 0:
			cur.WriteRune(r)
		case r == ' ' || r == '\t':
			if inWord {
				flush()
			}
		case r == '#' && !inWord:
			return words, unbound
		case r == '|' || r == ';' || r == '&' || r == '>' || r == '<':
			if inWord {
				flush()
			}
			return words, unbound
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		flush()
	}
	return words, unbound
}

// parseExample resolves an example's command on a fresh tree and checks
// its flags and arguments; a synopsis only by its command and flag names.
func parseExample(ex example) (*cobra.Command, error) {
	root := newRoot(&globals{stdout: io.Discard, stderr: io.Discard})
	root.InitDefaultHelpCmd()
	root.InitDefaultVersionFlag()
	if ex.synopsis {
		return parseSynopsis(root, ex.args)
	}
	cmd, rest, err := root.Find(ex.args)
	if err != nil {
		return nil, err
	}
	if err := cmd.ParseFlags(rest); err != nil {
		return nil, err
	}
	for _, f := range []string{"help", "version"} {
		if set, _ := cmd.Flags().GetBool(f); set {
			return cmd, nil
		}
	}
	pos := cmd.Flags().Args()
	if cmd == root || cmd.Annotations[nounAnnotation] != "" {
		if len(pos) > 0 {
			return nil, unknownCommand(cmd, pos[0])
		}
		return nil, fmt.Errorf("%s wants a command", cmd.CommandPath())
	}
	if err := cmd.ValidateArgs(pos); err != nil {
		return nil, err
	}
	return cmd, nil
}

// parseSynopsis follows a synopsis' words down the command tree while they
// name commands, then checks every flag it names exists there. Words with
// alternatives (a|b) stand for their first.
func parseSynopsis(root *cobra.Command, words []string) (*cobra.Command, error) {
	cmd := root
	i := 0
	for ; i < len(words); i++ {
		w := strings.Trim(words[i], "[](),.;:")
		w, _, _ = strings.Cut(w, "|")
		next, _, err := cmd.Find([]string{w})
		if err != nil || next == cmd || strings.HasPrefix(w, "-") {
			break
		}
		cmd = next
	}
	if cmd == root && (i == len(words) || !strings.HasPrefix(words[i], "-")) {
		return nil, fmt.Errorf("names no command")
	}
	if cmd.Annotations[nounAnnotation] != "" && i < len(words) && !strings.HasPrefix(words[i], "-") {
		return nil, unknownCommand(cmd, words[i]) // a noun takes verbs only
	}
	cmd.InitDefaultHelpFlag()
	flags := cmd.Flags()
	flags.AddFlagSet(cmd.InheritedFlags())
	for _, w := range words[i:] {
		for _, alt := range strings.Split(strings.Trim(w, "[](),.;:`"), "|") {
			alt = strings.Trim(alt, "[]()")
			name, _, _ := strings.Cut(alt, "=")
			switch {
			case strings.HasPrefix(name, "--") && len(name) > 2:
				if flags.Lookup(name[2:]) == nil {
					return nil, fmt.Errorf("%s has no flag %s", cmd.CommandPath(), name)
				}
			case strings.HasPrefix(name, "-") && len(name) == 2:
				if flags.ShorthandLookup(name[1:]) == nil {
					return nil, fmt.Errorf("%s has no flag %s", cmd.CommandPath(), name)
				}
			}
		}
	}
	return cmd, nil
}

// offline says whether an example needs no server, etcd or GPU: it may run
// in a test.
func offline(cmd *cobra.Command, args []string) bool {
	if slices.ContainsFunc(args, func(a string) bool {
		return strings.Contains(a, "nvml") || strings.HasPrefix(a, "--etcd") || strings.HasPrefix(a, "--server")
	}) {
		return false
	}
	path := strings.TrimPrefix(cmd.CommandPath(), "sluicectl")
	for _, p := range []string{"", " topology", " replay", " recommend", " version", " help", " config validate", " fleet generate"} {
		if path == p {
			return true
		}
	}
	return strings.HasPrefix(path, " completion")
}

// redirectOutputs points the files an example writes (--html, --svg, a
// directory --dir) into the test's directory, not the repository's.
func redirectOutputs(t *testing.T, args []string) []string {
	out := slices.Clone(args)
	dir := t.TempDir()
	for i, a := range out {
		for _, f := range []string{"--html", "--svg", "--dir"} {
			switch {
			case a == f && i+1 < len(out):
				out[i+1] = filepath.Join(dir, filepath.Base(out[i+1]))
			case strings.HasPrefix(a, f+"="):
				out[i] = f + "=" + filepath.Join(dir, filepath.Base(strings.TrimPrefix(a, f+"=")))
			}
		}
	}
	return out
}
