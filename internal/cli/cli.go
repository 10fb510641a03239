// Package cli holds what Sluice's commands share: flags that may also come
// from the environment, and the slog logger their flags select.
package cli

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// EnvFlags sets every flag of fs that has an environment variable
// SLUICE_<NAME> (upper case, dashes as underscores) from it. Call it before
// fs.Parse, so that a command-line flag still wins. A value the flag
// refuses is an error naming the variable.
func EnvFlags(fs *flag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		env := EnvName(f.Name)
		if v, ok := os.LookupEnv(env); ok && err == nil {
			if serr := f.Value.Set(v); serr != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, serr)
			}
		}
	})
	return err
}

// EnvName is the environment variable of a flag: --grpc-addr is
// SLUICE_GRPC_ADDR.
func EnvName(flagName string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// NewLogger returns a slog logger writing to w in format ("text" or
// "json") at level ("debug", "info", "warn", "error").
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	ho := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	}
	return nil, fmt.Errorf("--log-format: want text or json, got %q", format)
}
