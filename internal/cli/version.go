package cli

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Version describes the running binary for --version: the command's name,
// the main module's version (a tag when built with `go install
// module@version`, "(devel)" from a checkout), the VCS revision and time
// Go stamps into a build from a git checkout (absent with -buildvcs=false
// or without .git), whether the tree was modified, and the Go version.
func Version(command string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return command + " (no build information)"
	}
	return version(command, bi)
}

// Build is what the binary was built from, for sluice_build_info: the
// main module's version, the VCS revision ("unknown" without one, with
// "-modified" when the tree was) and the Go version.
type Build struct {
	Version, Revision, GoVersion string
}

// ReadBuild reads the running binary's Build.
func ReadBuild() Build {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Build{Version: "unknown", Revision: "unknown", GoVersion: "unknown"}
	}
	return buildOf(bi)
}

func buildOf(bi *debug.BuildInfo) Build {
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	b := Build{Version: bi.Main.Version, Revision: settings["vcs.revision"], GoVersion: bi.GoVersion}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	if b.Revision == "" {
		b.Revision = "unknown"
	}
	if settings["vcs.modified"] == "true" {
		b.Revision += "-modified"
	}
	return b
}

func version(command string, bi *debug.BuildInfo) string {
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	build := buildOf(bi)
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", command, build.Version)
	fmt.Fprintf(&b, " revision %s", strings.TrimSuffix(build.Revision, "-modified"))
	if t := settings["vcs.time"]; t != "" {
		fmt.Fprintf(&b, " (%s)", t)
	}
	if settings["vcs.modified"] == "true" {
		b.WriteString(" modified")
	}
	fmt.Fprintf(&b, " %s", bi.GoVersion)
	return b.String()
}
