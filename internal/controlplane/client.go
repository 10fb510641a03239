package controlplane

import (
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// reconnectBackoff is how the client redials a lost etcd. gRPC's default
// grows to two minutes, which would leave a replica on stale config that
// long after etcd returned; capped at 2 s it notices within a probe or two.
var reconnectBackoff = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
	MinConnectTimeout: 2 * time.Second,
}

// ClientOptions say how to reach etcd: the flags --etcd, --etcd-ca,
// --etcd-cert and --etcd-key of sluiced, sluicectl and sluice-agent.
type ClientOptions struct {
	// Endpoints is a comma-separated list of URLs, e.g.
	// "https://etcd-0:2379,https://etcd-1:2379".
	Endpoints string
	CAFile    string // CA bundle that signs the servers' certificates
	CertFile  string // client certificate, for servers that require one
	KeyFile   string // its key
	// DialTimeout bounds the first connection; default 5 s. An unreachable
	// etcd does not fail NewClient: requests fail (and are retried) later.
	DialTimeout time.Duration
}

// NewClient returns an etcd client for opts. TLS is used when any of the
// files is given or an endpoint is https.
func NewClient(opts ClientOptions) (*clientv3.Client, error) {
	var eps []string
	for e := range strings.SplitSeq(opts.Endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("etcd: no endpoints in %q", opts.Endpoints)
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 5 * time.Second
	}
	cfg := clientv3.Config{
		Endpoints:   eps,
		DialTimeout: opts.DialTimeout,
		// The client's own logger is zap; its reconnection chatter during an
		// outage would drown sluiced's one line per transition.
		Logger: zap.NewNop(),
		// Keepalive probes notice a dead connection long before TCP does.
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		DialOptions:          []grpc.DialOption{grpc.WithConnectParams(reconnectBackoff)},
	}
	https := false
	for _, e := range eps {
		https = https || strings.HasPrefix(e, "https://")
	}
	if opts.CAFile != "" || opts.CertFile != "" || opts.KeyFile != "" || https {
		if (opts.CertFile == "") != (opts.KeyFile == "") {
			return nil, fmt.Errorf("etcd: --etcd-cert and --etcd-key go together")
		}
		info := transport.TLSInfo{CertFile: opts.CertFile, KeyFile: opts.KeyFile, TrustedCAFile: opts.CAFile}
		var tc *tls.Config
		var err error
		if opts.CertFile == "" && opts.CAFile == "" {
			tc = &tls.Config{MinVersion: tls.VersionTLS12} // system roots
		} else if tc, err = info.ClientConfig(); err != nil {
			return nil, fmt.Errorf("etcd: TLS: %w", err)
		}
		cfg.TLS = tc
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", opts.Endpoints, err)
	}
	return cli, nil
}
