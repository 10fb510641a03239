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

func version(command string, bi *debug.BuildInfo) string {
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	mod := bi.Main.Version
	if mod == "" {
		mod = "(devel)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", command, mod)
	rev := settings["vcs.revision"]
	if rev == "" {
		rev = "unknown"
	}
	fmt.Fprintf(&b, " revision %s", rev)
	if t := settings["vcs.time"]; t != "" {
		fmt.Fprintf(&b, " (%s)", t)
	}
	if settings["vcs.modified"] == "true" {
		b.WriteString(" modified")
	}
	fmt.Fprintf(&b, " %s", bi.GoVersion)
	return b.String()
}
