package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/sluice-sched/sluice/admission/client"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/config"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

func init() {
	register(command{
		name:    "config",
		summary: "validate a config file, apply it to etcd, or show a server's config status",
		run:     func(args []string, out, _ io.Writer) error { return runConfig(args, out) },
	})
}

// etcdFlags reach etcd: the same flags as sluiced's, each defaulting to its
// SLUICE_* environment variable, so that a shell set up for sluiced works.
type etcdFlags struct {
	endpoints, ca, cert, key, prefix string
	timeout                          time.Duration
}

// register adds the flags to fs.
func (e *etcdFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&e.endpoints, "etcd", os.Getenv("SLUICE_ETCD"), "etcd endpoints, comma-separated (env SLUICE_ETCD)")
	fs.StringVar(&e.ca, "etcd-ca", os.Getenv("SLUICE_ETCD_CA"), "CA bundle for etcd's TLS (env SLUICE_ETCD_CA)")
	fs.StringVar(&e.cert, "etcd-cert", os.Getenv("SLUICE_ETCD_CERT"), "client certificate for etcd (env SLUICE_ETCD_CERT)")
	fs.StringVar(&e.key, "etcd-key", os.Getenv("SLUICE_ETCD_KEY"), "client key for etcd (env SLUICE_ETCD_KEY)")
	prefix := os.Getenv("SLUICE_ETCD_PREFIX")
	if prefix == "" {
		prefix = controlplane.DefaultPrefix
	}
	fs.StringVar(&e.prefix, "etcd-prefix", prefix, "key prefix of the control plane (env SLUICE_ETCD_PREFIX)")
	fs.DurationVar(&e.timeout, "timeout", 10*time.Second, "how long to wait for etcd or the server")
}

// client connects to etcd; it is an error when no endpoint was given.
func (e *etcdFlags) client() (*clientv3.Client, error) {
	if e.endpoints == "" {
		return nil, errors.New("--etcd (or SLUICE_ETCD) is required")
	}
	return controlplane.NewClient(controlplane.ClientOptions{Endpoints: e.endpoints, CAFile: e.ca, CertFile: e.cert, KeyFile: e.key})
}

// call connects to etcd and runs do within the timeout, with the control
// plane's key prefix, as operatorFlags.call does for one server.
func (e *etcdFlags) call(do func(ctx context.Context, cli *clientv3.Client, prefix string) error) error {
	cli, err := e.client()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
	defer cancel()
	return do(ctx, cli, controlplane.NormalizePrefix(e.prefix))
}

// parseInterspersed parses args with fs allowing flags after positional
// arguments ("drain nvl72-a --reason x"), and returns the positionals.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// serverFlags reach sluiced's gRPC API: TLS files and a bearer token. The
// token and the CA default to SLUICE_TOKEN and SLUICE_TLS_CA; the client
// certificate has no variable, so that a shell set up for sluiced (whose
// SLUICE_TLS_CERT is the server's certificate) does not send it.
type serverFlags struct {
	sec client.Security
}

// register adds the flags to fs.
func (f *serverFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.sec.CAFile, "tls-ca", os.Getenv("SLUICE_TLS_CA"), "CA bundle (PEM) sluiced's certificate is verified against; turns TLS on (env SLUICE_TLS_CA)")
	fs.StringVar(&f.sec.CertFile, "tls-cert", "", "client certificate (PEM) for mTLS; turns TLS on")
	fs.StringVar(&f.sec.KeyFile, "tls-key", "", "the client certificate's key (PEM)")
	fs.StringVar(&f.sec.ServerName, "tls-server-name", "", "the name sluiced's certificate must hold (default: the --server host); turns TLS on")
	fs.BoolVar(&f.sec.TLS, "tls", false, "TLS with the system roots")
	fs.StringVar(&f.sec.Token, "token", os.Getenv("SLUICE_TOKEN"), "bearer token (env SLUICE_TOKEN, which keeps it out of ps); sent over plaintext only to loopback")
}

// operatorFlags are what a command making one Operator call needs: the
// server, how long to wait for it, and how to reach it.
type operatorFlags struct {
	server  string
	timeout time.Duration
	serverFlags
}

// register adds the flags to fs.
func (f *operatorFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.server, "server", "localhost:7070", "sluiced gRPC address")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "how long to wait for the server")
	f.serverFlags.register(fs)
}

// call dials the server and runs do within the timeout; do's error is
// returned naming the server.
func (f *operatorFlags) call(do func(context.Context, admissionv1.OperatorClient) error) error {
	conn, err := dialServer(f.server, f.sec)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	if err := do(ctx, admissionv1.NewOperatorClient(conn)); err != nil {
		return fmt.Errorf("server %s: %w", f.server, err)
	}
	return nil
}

// dialServer connects to a sluiced's gRPC address.
func dialServer(addr string, sec client.Security) (*grpc.ClientConn, error) {
	conn, err := client.Dial(addr, sec)
	if err != nil {
		return nil, fmt.Errorf("server %s: %w", addr, err)
	}
	return conn, nil
}

// runConfig dispatches config's subcommands.
func runConfig(args []string, out io.Writer) error {
	const usage = "usage: sluicectl config validate -f FILE | apply -f FILE [--etcd URLS] | status [--server ADDR]"
	if len(args) == 0 {
		return errors.New(usage)
	}
	fs := flag.NewFlagSet("sluicectl config "+args[0], flag.ContinueOnError)
	fs.SetOutput(out)
	var ef etcdFlags
	file := fs.String("f", "", "config file (YAML or JSON)")
	format := fs.String("o", "table", "output format: table or json")
	switch args[0] {
	case "validate":
	case "apply":
		ef.register(fs)
	case "status":
		var of operatorFlags
		of.register(fs)
		if err := parseNoArgs(fs, args[1:]); err != nil {
			return err
		}
		if err := checkFormat(*format); err != nil {
			return err
		}
		return configStatus(&of, *format, out)
	default:
		return fmt.Errorf("unknown subcommand %q; %s", args[0], usage)
	}
	if err := parseNoArgs(fs, args[1:]); err != nil {
		return err
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	if *file == "" {
		return errors.New("-f FILE is required")
	}
	data, err := os.ReadFile(*file)
	if err != nil {
		return err
	}
	if args[0] == "validate" {
		cfg, err := config.Parse(*file, data)
		if err != nil {
			return err
		}
		if *format == "json" {
			return writeJSON(out, map[string]any{"file": *file, "valid": true, "tiers": len(cfg.Tiers), "tenants": len(cfg.Tenants), "models": len(cfg.Models)})
		}
		fmt.Fprintf(out, "%s: valid (%d tiers, %d tenants, %d models)\n", *file, len(cfg.Tiers), len(cfg.Tenants), len(cfg.Models))
		return nil
	}
	// ApplyConfig validates the file as sluiced parses it before writing
	// anything: apply writes nothing that sluiced would refuse for its own
	// reasons (a floor too large for the cluster is the exception: only a
	// replica knows its cluster).
	var res controlplane.ApplyResult
	if err := ef.call(func(ctx context.Context, cli *clientv3.Client, prefix string) error {
		var err error
		res, err = controlplane.ApplyConfig(ctx, cli, prefix, *file, data)
		return err
	}); err != nil {
		return err
	}
	if *format == "json" {
		return writeJSON(out, map[string]any{"file": *file, "policy_unchanged": res.PolicyUnchanged, "tenants_written": res.TenantsWritten,
			"tenants_deleted": res.TenantsDeleted, "transactions": res.Transactions, "attempts": res.Attempts, "revision": res.Revision})
	}
	policy := "written"
	if res.PolicyUnchanged {
		policy = "unchanged"
	}
	fmt.Fprintf(out, "%s: valid; policy %s, %d tenant documents written, %d deleted", *file, policy, res.TenantsWritten, res.TenantsDeleted)
	if res.Attempts > 1 {
		fmt.Fprintf(out, " (read %d times: another writer changed the documents meanwhile)", res.Attempts)
	}
	switch res.Transactions {
	case 0:
		fmt.Fprintln(out, "; nothing to change")
	case 1:
		fmt.Fprintf(out, " at revision %d\n", res.Revision)
	default:
		fmt.Fprintf(out, " in %d transactions, the last at revision %d\n", res.Transactions, res.Revision)
	}
	return nil
}

// parseNoArgs parses flags and refuses positional arguments.
func parseNoArgs(fs *flag.FlagSet, args []string) error {
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("unexpected argument %q", pos[0])
	}
	return nil
}

// configStatus prints a server's GetConfigStatus.
func configStatus(of *operatorFlags, format string, out io.Writer) error {
	var st *admissionv1.GetConfigStatusResponse
	err := of.call(func(ctx context.Context, op admissionv1.OperatorClient) (err error) {
		st, err = op.GetConfigStatus(ctx, &admissionv1.GetConfigStatusRequest{})
		return err
	})
	if err != nil {
		return err
	}
	if format == "json" {
		return writeProto(out, st)
	}
	fmt.Fprintf(out, "source:     %s\n", st.GetSource())
	if st.GetRevision() != 0 {
		fmt.Fprintf(out, "revision:   %d\n", st.GetRevision())
	}
	if st.GetAppliedAt() != nil {
		fmt.Fprintf(out, "applied at: %s\n", st.GetAppliedAt().AsTime().UTC().Format(time.RFC3339))
	}
	switch {
	case st.GetControlPlane() == "none":
		// No etcd: nothing is connected (an older server leaves the field
		// empty and is read as before).
		fmt.Fprintf(out, "control_plane: none\n")
	case st.GetControlPlaneConnected():
		fmt.Fprintf(out, "etcd:       connected\n")
	default:
		fmt.Fprintf(out, "etcd:       UNREACHABLE (serving the last good config)\n")
	}
	if f := st.GetCreditFreeze(); f != nil {
		until := f.GetUntil().AsTime()
		fmt.Fprintf(out, "burst credit: FROZEN until %s (%s left)", until.UTC().Format(time.RFC3339), time.Until(until).Round(time.Second))
		if f.GetReason() != "" {
			fmt.Fprintf(out, ": %s", f.GetReason())
		}
		fmt.Fprintln(out)
	}
	if r := st.GetLastRefusal(); r != nil {
		where := r.GetSource()
		if r.GetKey() != "" {
			where += ": " + r.GetKey()
		}
		fmt.Fprintf(out, "refused:    %s: %s", where, strings.TrimSpace(r.GetReason()))
		if r.GetRevision() != 0 {
			fmt.Fprintf(out, " (revision %d)", r.GetRevision())
		}
		fmt.Fprintln(out)
	}
	return nil
}
