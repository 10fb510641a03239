// Command sluicectl is the operator CLI for Sluice: it shows topology and
// domains, drains and undrains domains, and applies config. Each subcommand
// lives in its own file and registers itself in init.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	// run parses args (everything after the subcommand name), writes its
	// output to out and warnings to errw.
	run func(args []string, out, errw io.Writer) error
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
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "sluicectl: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	if err := c.run(args[1:], stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "sluicectl %s: %v\n", c.name, err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: sluicectl <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'sluicectl <command> -h' for a command's flags.")
}
