// Command sluicectl is the operator CLI for Sluice: it shows topology,
// domains and tenants, drains and undrains domains, applies config, replays
// traces, offers live gRPC load to a running server (load), and runs chaos
// drills under that load (drill).
// Each subcommand lives in its own file and registers itself in init; every
// one that prints takes -o table|json.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/sluice-sched/sluice/internal/cli"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	// run parses args (everything after the subcommand name), writes its
	// output to out and warnings to errw.
	run func(args []string, out, errw io.Writer) error
	// hidden commands are for the completion scripts, not for people.
	hidden bool
}

var commands = map[string]command{}

// register adds a subcommand; called from init in the subcommand's file.
func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("sluicectl: duplicate command " + c.name)
	}
	commands[c.name] = c
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one subcommand and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		if len(args) == 0 {
			usage(stderr)
			return 2
		}
		usage(stdout) // asked for: the usage is the output
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args[0] = "version"
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "sluicectl: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	if err := c.run(args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0 // -h: flag printed the command's usage
		}
		fmt.Fprintf(stderr, "sluicectl %s: %v\n", c.name, err)
		return 1
	}
	return 0
}

func init() {
	register(command{
		name:    "version",
		summary: "print the version: module version, VCS revision, Go (also --version)",
		run: func(args []string, out, errw io.Writer) error {
			fs := flag.NewFlagSet("sluicectl version", flag.ContinueOnError)
			fs.SetOutput(errw)
			format := fs.String("o", "table", "output format: table or json")
			if err := parseNoArgs(fs, args); err != nil {
				return err
			}
			if err := checkFormat(*format); err != nil {
				return err
			}
			if *format == "json" {
				return writeJSON(out, map[string]string{"version": cli.Version("sluicectl")})
			}
			_, err := fmt.Fprintln(out, cli.Version("sluicectl"))
			return err
		},
	})
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: sluicectl <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !commands[n].hidden {
			fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
		}
	}
	fmt.Fprintln(w, "\nRun 'sluicectl <command> -h' for a command's flags.")
}
