package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-sched/sluice/admission/client"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/controlplane"
)

// defaultServer is the server a command that calls one asks when neither
// --server nor SLUICE_SERVER names one: sluiced's own default gRPC address.
const defaultServer = "localhost:7070"

// globals are the root's flags, which every command shares, and where the
// command writes.
type globals struct {
	stdout, stderr io.Writer

	server  string
	etcd    etcdFlags
	sec     client.Security
	format  string
	timeout time.Duration

	// parsed is set once cobra has parsed the command line and checked its
	// arguments: an error before it is a usage error.
	parsed bool
	// serverFrom says where server came from: "--server", "SLUICE_SERVER"
	// or "" (neither: the command picks, usually defaultServer).
	serverFrom string
}

// etcdFlags reach etcd: the same flags as sluiced's.
type etcdFlags struct {
	endpoints, ca, cert, key, prefix string
}

// envFlags are the root's flags that default to an environment variable,
// as sluiced's do: a shell set up for sluiced works. The client
// certificate has none, so that sluiced's SLUICE_TLS_CERT (its own
// certificate) is not sent.
var envFlags = []struct{ flag, env string }{
	{"server", "SLUICE_SERVER"},
	{"etcd", "SLUICE_ETCD"},
	{"etcd-ca", "SLUICE_ETCD_CA"},
	{"etcd-cert", "SLUICE_ETCD_CERT"},
	{"etcd-key", "SLUICE_ETCD_KEY"},
	{"etcd-prefix", "SLUICE_ETCD_PREFIX"},
	{"tls-ca", "SLUICE_TLS_CA"},
	{"token", "SLUICE_TOKEN"},
}

// register declares the root's flags, once for every command.
func (g *globals) register(root *cobra.Command) {
	pf := root.PersistentFlags()
	pf.StringVar(&g.server, "server", "", `sluiced's gRPC address (env SLUICE_SERVER; default `+defaultServer+`; with --etcd, commands that act on every replica ask them all unless --server names one)`)
	pf.StringVar(&g.etcd.endpoints, "etcd", "", "etcd endpoints, comma-separated (env SLUICE_ETCD)")
	pf.StringVar(&g.etcd.ca, "etcd-ca", "", "CA bundle for etcd's TLS (env SLUICE_ETCD_CA)")
	pf.StringVar(&g.etcd.cert, "etcd-cert", "", "client certificate for etcd (env SLUICE_ETCD_CERT)")
	pf.StringVar(&g.etcd.key, "etcd-key", "", "client key for etcd (env SLUICE_ETCD_KEY)")
	pf.StringVar(&g.etcd.prefix, "etcd-prefix", controlplane.DefaultPrefix, "key prefix of the control plane (env SLUICE_ETCD_PREFIX)")
	pf.StringVar(&g.sec.CAFile, "tls-ca", "", "CA bundle (PEM) sluiced's certificate is verified against; turns TLS on (env SLUICE_TLS_CA)")
	pf.StringVar(&g.sec.CertFile, "tls-cert", "", "client certificate (PEM) for mTLS; turns TLS on")
	pf.StringVar(&g.sec.KeyFile, "tls-key", "", "the client certificate's key (PEM)")
	pf.StringVar(&g.sec.ServerName, "tls-server-name", "", "the name sluiced's certificate must hold (default: the --server host); turns TLS on")
	pf.BoolVar(&g.sec.TLS, "tls", false, "TLS with the system roots")
	pf.StringVar(&g.sec.Token, "token", "", "bearer token (env SLUICE_TOKEN, which keeps it out of ps); sent over plaintext only to loopback")
	pf.DurationVar(&g.timeout, "timeout", 10*time.Second, "how long to wait for etcd or the server")
	pf.StringVarP(&g.format, "output-format", "o", "table", "output format: table, json or yaml (replay: also html)")
	// --output is -o's long name where a command has no --output of its
	// own (explain, load and drill count output tokens with theirs).
	pf.StringVar(&g.format, "output", "table", "output format (as -o)")
	_ = pf.MarkHidden("output")
	_ = root.RegisterFlagCompletionFunc("output-format", func(c *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
		return formatsOf(c), cobra.ShellCompDirectiveNoFileComp
	})
}

// resolve fills the flags not given on the command line from their
// environment variables and checks -o for command c.
func (g *globals) resolve(c *cobra.Command) error {
	for _, e := range envFlags {
		f := c.Flags().Lookup(e.flag)
		v := os.Getenv(e.env)
		if f == nil || f.Changed || v == "" {
			continue
		}
		if err := f.Value.Set(v); err != nil {
			return fmt.Errorf("%s=%q: %w", e.env, v, err)
		}
	}
	switch {
	case c.Flags().Changed("server"):
		g.serverFrom = "--server"
	case g.server != "":
		g.serverFrom = "SLUICE_SERVER"
	}
	return checkFormat(c, g.format)
}

// serverSet says whether a server was named, by --server or SLUICE_SERVER.
func (g *globals) serverSet() bool { return g.serverFrom != "" }

// oneServer is the server a command that calls exactly one asks: the one
// named, else defaultServer.
func (g *globals) oneServer() string {
	if !g.serverSet() {
		return defaultServer
	}
	return g.server
}

// dial connects to the sluiced at addr, the one server the command calls.
// A server that --server did not name is said on stderr (note), so that an
// answer from whatever listens on localhost:7070 is never taken for the
// one meant.
func (g *globals) dial(addr string) (*grpc.ClientConn, error) {
	g.note(addr)
	return dialServer(addr, g.sec)
}

// note says on stderr where addr came from, unless --server named it.
func (g *globals) note(addr string) {
	switch {
	case g.serverFrom == "SLUICE_SERVER" && addr == g.server:
		fmt.Fprintf(g.stderr, "sluicectl: server %s (from SLUICE_SERVER)\n", addr)
	case !g.serverSet() && addr == defaultServer:
		fmt.Fprintf(g.stderr, "sluicectl: server %s (the default: neither --server nor SLUICE_SERVER is set)\n", addr)
	}
}

// dialServer connects to a sluiced's gRPC address with sec.
func dialServer(addr string, sec client.Security) (*grpc.ClientConn, error) {
	conn, err := client.Dial(addr, sec)
	if err != nil {
		return nil, &serverError{addr: addr, err: err}
	}
	return conn, nil
}

// call dials addr and runs do within --timeout; do's error comes back
// naming the server.
func (g *globals) call(addr string, do func(context.Context, admissionv1.OperatorClient) error) error {
	conn, err := g.dial(addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	if err := do(ctx, admissionv1.NewOperatorClient(conn)); err != nil {
		return serverErr(addr, err)
	}
	return nil
}

// etcdClient connects to etcd; it is an error when no endpoint was given.
func (g *globals) etcdClient() (*clientv3.Client, error) {
	if g.etcd.endpoints == "" {
		return nil, errors.New("--etcd (or SLUICE_ETCD) is required")
	}
	e := g.etcd
	return controlplane.NewClient(controlplane.ClientOptions{Endpoints: e.endpoints, CAFile: e.ca, CertFile: e.cert, KeyFile: e.key})
}

// etcdPrefix is the control plane's key prefix, normalised.
func (g *globals) etcdPrefix() string { return controlplane.NormalizePrefix(g.etcd.prefix) }

// callEtcd connects to etcd and runs do within --timeout, with the control
// plane's key prefix, as call does for one server.
func (g *globals) callEtcd(do func(ctx context.Context, cli *clientv3.Client, prefix string) error) error {
	cli, err := g.etcdClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	return do(ctx, cli, g.etcdPrefix())
}

// serverError is an error from one server, in the one form every command
// prints: "server ADDR: CODE: message" for a gRPC status.
type serverError struct {
	addr string
	err  error
}

// serverErr wraps err as addr's, unless it already names a server.
func serverErr(addr string, err error) error {
	var se *serverError
	if errors.As(err, &se) {
		return err
	}
	return &serverError{addr: addr, err: err}
}

func (e *serverError) Error() string {
	st, ok := status.FromError(e.err)
	if !ok {
		return fmt.Sprintf("server %s: %v", e.addr, e.err)
	}
	if st.Code() == codes.Unavailable && isHTTP1Answer(st.Message()) {
		return fmt.Sprintf("server %s: Unavailable: it answers HTTP/1, not gRPC: is it sluiced's HTTP port (--http-addr, the dashboard and /metrics, 7071 by default)? --server wants the gRPC address (--grpc-addr, 7070 by default)", e.addr)
	}
	return fmt.Sprintf("server %s: %s: %s", e.addr, st.Code(), st.Message())
}

func (e *serverError) Unwrap() error { return e.err }

// isHTTP1Answer says whether a connection error is grpc-go reading an
// HTTP/1 response as HTTP/2 frames: an HTTP server's "HTTP/1.1 400" read
// as a frame header is a frame of several megabytes.
func isHTTP1Answer(msg string) bool {
	return strings.Contains(msg, "http2: frame too large") || strings.Contains(msg, "HTTP/1")
}
