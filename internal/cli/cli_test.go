package cli

import (
	"bytes"
	"flag"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

func TestEnvFlagsSetAndCommandLineWins(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	addr := fs.String("grpc-addr", ":7070", "")
	ttl := fs.Duration("member-ttl", time.Second, "")
	t.Setenv("SLUICE_GRPC_ADDR", ":9000")
	t.Setenv("SLUICE_MEMBER_TTL", "5s")
	if err := EnvFlags(fs); err != nil {
		t.Fatal(err)
	}
	if *addr != ":9000" || *ttl != 5*time.Second {
		t.Errorf("from the environment: %q %v", *addr, *ttl)
	}
	if err := fs.Parse([]string{"--grpc-addr", ":1"}); err != nil || *addr != ":1" {
		t.Errorf("the command line did not win: %q %v", *addr, err)
	}
}

func TestEnvFlagsNamesTheBadVariable(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Duration("member-ttl", time.Second, "")
	t.Setenv("SLUICE_MEMBER_TTL", "soon")
	if err := EnvFlags(fs); err == nil || !strings.Contains(err.Error(), `SLUICE_MEMBER_TTL="soon"`) {
		t.Errorf("err = %v, want it to name the variable and value", err)
	}
}

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	l, err := NewLogger(&buf, "json", "warn")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hidden")
	l.Warn("shown")
	if out := buf.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) {
		t.Errorf("json at warn wrote %q", out)
	}
	for _, c := range [][2]string{{"xml", "info"}, {"text", "loud"}} {
		if _, err := NewLogger(&buf, c[0], c[1]); err == nil {
			t.Errorf("NewLogger(%q, %q) accepted", c[0], c[1])
		}
	}
}

func TestVersionNamesModuleRevisionAndGo(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/sluice-sched/sluice", Version: "v0.4.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "72a6808"}, {Key: "vcs.time", Value: "2026-12-01T17:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	if got, want := version("sluiced", bi), "sluiced v0.4.0 revision 72a6808 (2026-12-01T17:00:00Z) modified go1.26.8"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := version("sluicectl", &debug.BuildInfo{GoVersion: "go1.26.8"}), "sluicectl (devel) revision unknown go1.26.8"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := Version("sluice-agent"); !strings.HasPrefix(got, "sluice-agent ") {
		t.Errorf("Version: %q", got)
	}
	if got, want := buildOf(bi), (Build{Version: "v0.4.0", Revision: "72a6808-modified", GoVersion: "go1.26.8"}); got != want {
		t.Errorf("buildOf = %+v, want %+v", got, want)
	}
	if got := ReadBuild(); got.GoVersion == "" || got.Revision == "" || got.Version == "" {
		t.Errorf("ReadBuild = %+v, want every field named", got)
	}
}
