package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The README's sluicectl table names every command `sluicectl --help`
// lists, and only commands that exist: each backquoted span of its first
// column is a command line whose words, as far as they are commands, are
// found in the tree.
func TestReadmeCommandTableMatchesHelp(t *testing.T) {
	root := newRoot(&globals{stdout: io.Discard, stderr: io.Discard})
	spans := readmeCommandSpans(t)
	named := map[string]bool{}
	for _, span := range spans {
		words := strings.Fields(span)
		c, rest, err := root.Find(words)
		if err != nil || c == root {
			t.Errorf("README's sluicectl table names `%s`, which is not a command (%v)", span, err)
			continue
		}
		if len(rest) > 0 && !placeholder(rest[0]) {
			t.Errorf("README's sluicectl table names `%s`: %q is not a command of %q", span, rest[0], c.CommandPath())
		}
		for p := c; p != root; p = p.Parent() {
			named[p.Name()] = true
		}
	}
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() && !named[c.Name()] {
			t.Errorf("sluicectl --help lists %q; the README's sluicectl table does not", c.Name())
		}
	}
	if len(named) < 10 {
		t.Fatalf("found %d commands in the README's table: the table was not found or not read", len(named))
	}
}

// placeholder is a word of a synopsis that stands for an argument: NAME,
// DOMAIN.
func placeholder(w string) bool { return w == strings.ToUpper(w) }

// readmeCommandSpans returns the backquoted spans of the first column of
// the table under the README's "## sluicectl", with the words after a "/"
// joined to the command before them (`credit freeze`/`thaw` gives
// "credit freeze" and "credit thaw").
func readmeCommandSpans(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(src), "\n## sluicectl\n")
	if !ok {
		t.Fatal("README.md has no \"## sluicectl\" section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	span := regexp.MustCompile("`([^`]+)`(/`([^`]+)`)*")
	var spans []string
	for _, line := range strings.Split(section, "\n") {
		first, _, ok := strings.Cut(strings.TrimPrefix(line, "| "), " |")
		if !ok || !strings.HasPrefix(line, "| `") {
			continue
		}
		for _, m := range span.FindAllString(first, -1) {
			parts := strings.Split(strings.Trim(m, "`"), "`/`")
			spans = append(spans, parts[0])
			prefix := strings.Fields(parts[0])
			for _, alt := range parts[1:] {
				// `domain drain`/`undrain DOMAIN`: the alternative replaces
				// the last command word of the first.
				words := slices.Clone(prefix[:commandWords(prefix)-1])
				spans = append(spans, strings.Join(append(words, strings.Fields(alt)...), " "))
			}
		}
	}
	return spans
}

// commandWords counts the leading words of a synopsis that are not
// placeholders.
func commandWords(words []string) int {
	n := 0
	for _, w := range words {
		if placeholder(w) {
			break
		}
		n++
	}
	return max(n, 1)
}
