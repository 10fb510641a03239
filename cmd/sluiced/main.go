// Command sluiced is the Sluice admission server: gRPC on :7070 (Admission,
// Operator, health, reflection) and HTTP on :7071 (/healthz, /metrics).
// With no flags it serves the embedded default config on the simulated
// cluster, with no external service.
//
// Every flag can also be set from the environment: --grpc-addr is
// SLUICE_GRPC_ADDR, and so on (upper case, dashes as underscores). SIGHUP
// reloads --config; SIGINT/SIGTERM shut down gracefully, answering every
// queued request first.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/server"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "sluiced:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	// Take SIGHUP before anything slow: its default action would kill the
	// process during startup (a log rotation, say).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	fs := flag.NewFlagSet("sluiced", flag.ContinueOnError)
	var opts server.Options
	fs.StringVar(&opts.GRPCAddr, "grpc-addr", ":7070", "gRPC listen address")
	fs.StringVar(&opts.HTTPAddr, "http-addr", ":7071", "HTTP listen address (/healthz, /metrics)")
	fs.StringVar(&opts.ConfigPath, "config", "", "config file (YAML or JSON); empty serves the embedded default")
	fs.StringVar(&opts.Topology, "topology", "simulated", `topology source: "simulated" or a topology file path`)
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	printConfig := fs.Bool("print-default-config", false, "print the embedded default config and exit")
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		env := "SLUICE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok && envErr == nil {
			if err := f.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", env, v, err)
			}
		}
	})
	if envErr != nil {
		return envErr
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *printConfig {
		_, err := os.Stdout.Write(config.DefaultYAML())
		return err
	}
	logger, err := newLogger(*logFormat, *logLevel)
	if err != nil {
		return err
	}
	opts.Logger = logger
	srv, err := server.New(opts)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		for range hup {
			_ = srv.Reload() // logged; a bad file leaves the last good config serving
		}
	}()
	return srv.Serve(ctx)
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	ho := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, ho)), nil
	}
	return nil, fmt.Errorf("--log-format: want text or json, got %q", format)
}
