// Command sluicectl is the operator CLI for Sluice: it lists domains and
// tenants, drains and undrains domains, freezes burst credit, applies
// config, explains an Admit, prints topology, replays traces, offers live
// gRPC load to a running server (load), and runs chaos drills under that
// load (drill).
//
// It is built on cobra, as kubectl and etcdctl are: nouns with verbs
// (`sluicectl domain drain X`, `sluicectl tenant list`), the flags that say
// where and how to connect declared once on the root (--server, --etcd,
// TLS, --token, --timeout, -o), help on stdout with exit status 0, and
// usage errors (an unknown command or flag, a flag value that does not
// parse, a missing or extra argument) with exit status 2. Any other error
// exits 1. Each noun lives in its own file.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-sched/sluice/internal/cli"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed
	exitUsage = 2 // the command line does not parse
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command line and returns the process exit status. Each
// call builds its own command tree, so that no flag value outlives it.
func run(args []string, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout, stderr: stderr}
	root := newRoot(g)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "sluicectl: %v\n", err)
	// Cobra parses flags and checks arguments before the root's
	// PersistentPreRunE: an error from before it is the command line's.
	var ue usageError
	if !g.parsed || errors.As(err, &ue) {
		if cmd == nil {
			cmd = root
		}
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return exitUsage
	}
	return exitError
}

// usageError marks an error of the command line, which exits 2.
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

// usagef returns a usage error.
func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// newRoot builds the command tree on g.
func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "sluicectl",
		Short: "Operate Sluice: domains, tenants, config, burst credit, topology, replay, load and drills",
		Long: `sluicectl operates Sluice, the GPU-topology-aware admission scheduler.

The server is --server, else $SLUICE_SERVER, else localhost:7070; a command
that calls a server not named by --server says which on stderr. etcd is
--etcd, else $SLUICE_ETCD. -o table|json|yaml picks the output: JSON keys are
lowerCamelCase everywhere, and a gRPC message prints as protojson prints it
(64-bit integers as strings, as grpcurl shows them).

Exit status: 0 on success (and for --help), 1 when the command fails, 2 when
the command line does not parse (unknown command or flag, a flag value that
does not parse, a missing or extra argument).

The earlier names go on working: domains (domain list), drain and undrain
DOMAIN (domain drain, domain undrain), tenants (tenant list), tenant NAME
(tenant get NAME).`,
		Version:       cli.Version("sluicectl"),
		Args:          cobra.ArbitraryArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				c.SetOut(g.stderr) // nothing asked: the usage is an error's
				_ = c.Usage()
				return usagef("want a command")
			}
			return unknownCommand(c, args[0])
		},
		PersistentPreRunE: func(c *cobra.Command, _ []string) error {
			g.parsed = true
			return g.resolve(c)
		},
		// Completion scripts for bash, zsh, fish and powershell are
		// cobra's: `sluicectl completion SHELL`.
		CompletionOptions: cobra.CompletionOptions{},
	}
	root.SetOut(g.stdout)
	root.SetErr(g.stderr)
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	g.register(root)

	root.AddGroup(&cobra.Group{ID: "cluster", Title: "Operating a cluster:"},
		&cobra.Group{ID: "offline", Title: "Without a server:"},
		&cobra.Group{ID: "traffic", Title: "Load and drills:"})
	for _, c := range []*cobra.Command{newDomainCmd(g), newTenantCmd(g), newCreditCmd(g), newConfigCmd(g), newExplainCmd(g), newBacklogCmd(g)} {
		c.GroupID = "cluster"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{newTopologyCmd(g), newReplayCmd(g), newRecommendCmd(g), newFleetCmd(g), newFleetSimCmd(g), newEngineSimCmd(g)} {
		c.GroupID = "offline"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{newLoadCmd(g), newDrillCmd(g)} {
		c.GroupID = "traffic"
		root.AddCommand(c)
	}
	root.AddCommand(newVersionCmd(g))
	root.AddCommand(shorthands(g)...)
	// Cobra's completion command, made here rather than at Execute so that
	// it is a noun like the others: without a shell, or with one cobra has
	// no script for, a usage error.
	root.InitDefaultCompletionCmd()
	if c, _, err := root.Find([]string{"completion"}); err == nil && c != root {
		c.Args, c.RunE = cobra.ArbitraryArgs, nounRun
		c.Annotations = map[string]string{nounAnnotation: "true"}
	}
	return root
}

// shorthands are the commands' earlier top-level names, kept so that
// scripts written for them go on working: `drain X` is `domain drain X`,
// `domains` is `domain list`, `tenants` is `tenant list`. They are hidden
// from the command list; each new command's help names its shorthand.
// `tenant NAME` needs none: tenant itself takes a NAME (newTenantCmd).
func shorthands(g *globals) []*cobra.Command {
	short := []*cobra.Command{
		withUse(newDomainListCmd(g), "domains"),
		withUse(newDrainCmd(g, true), "drain DOMAIN"),
		withUse(newDrainCmd(g, false), "undrain DOMAIN"),
		withUse(newTenantListCmd(g), "tenants"),
	}
	for _, c := range short {
		c.Hidden = true
	}
	return short
}

// withUse renames a command.
func withUse(c *cobra.Command, use string) *cobra.Command {
	c.Use = use
	return c
}

// group returns a noun: a command that only holds its verbs. Without one,
// or with a verb it does not have, it is a usage error.
func group(use, short, long string, verbs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{Use: use, Short: short, Long: long, Args: cobra.ArbitraryArgs, RunE: nounRun,
		Annotations: map[string]string{nounAnnotation: "true"}}
	c.AddCommand(verbs...)
	return c
}

// nounAnnotation marks a noun: a command that only holds its verbs.
const nounAnnotation = "sluicectl/noun"

// nounRun is a noun's RunE: it runs only when no verb was named, or one it
// does not have.
func nounRun(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return usagef("%s wants a command: %s", c.CommandPath(), strings.Join(verbNames(c), ", "))
	}
	return unknownCommand(c, args[0])
}

// verbNames lists c's visible subcommands.
func verbNames(c *cobra.Command) []string {
	var names []string
	for _, s := range c.Commands() {
		if s.IsAvailableCommand() {
			names = append(names, s.Name())
		}
	}
	return names
}

// unknownCommand is the usage error for a command c does not have, with
// cobra's suggestions.
func unknownCommand(c *cobra.Command, name string) error {
	msg := fmt.Sprintf("unknown command %q for %q", name, c.CommandPath())
	c.SuggestionsMinimumDistance = 2 // cobra's default, set where it suggests itself
	if s := c.SuggestionsFor(name); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return usageError{errors.New(msg)}
}

// args returns a validator wanting between lo and hi positional arguments
// (hi < 0: any number), named by what in its message.
func args(lo, hi int, what string) cobra.PositionalArgs {
	return func(c *cobra.Command, a []string) error {
		switch {
		case len(a) < lo:
			return usagef("want %s", what)
		case hi >= 0 && len(a) > hi:
			if hi == 0 {
				return usagef("unexpected argument %q", a[0])
			}
			return usagef("want %s; unexpected argument %q", what, a[hi])
		}
		return nil
	}
}

// noArgs refuses positional arguments.
var noArgs = args(0, 0, "no argument")

// newVersionCmd is `sluicectl version` (also `sluicectl --version`).
func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version: module version, VCS revision, Go (also --version)",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			v := cli.Version("sluicectl")
			return g.out().value(map[string]string{"version": v}, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, v)
				return err
			})
		},
	}
}
