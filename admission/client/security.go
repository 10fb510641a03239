package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Security is how a client proves itself to a sluiced that serves TLS or
// requires a principal (sluiced --auth): TLS files and a bearer token. The
// zero value dials plaintext with no credential, which a sluiced without
// --auth accepts on loopback.
type Security struct {
	// CAFile is the CA bundle (PEM) the server's certificate is verified
	// against; "" with TLS on uses the system roots.
	CAFile string
	// CertFile and KeyFile are a client certificate (PEM) for mTLS; both or
	// neither.
	CertFile, KeyFile string
	// ServerName overrides the name the server's certificate must hold
	// (default: the dialled host).
	ServerName string
	// TLS turns TLS on with none of the files above (system roots).
	TLS bool
	// Token is a bearer token, sent on every call as
	// "authorization: Bearer <token>".
	Token string
}

// usesTLS reports whether s dials TLS: any TLS field turns it on.
func (s Security) usesTLS() bool {
	return s.TLS || s.CAFile != "" || s.CertFile != "" || s.KeyFile != "" || s.ServerName != ""
}

// TLSConfig returns the client TLS configuration s describes; nil when s
// dials plaintext.
func (s Security) TLSConfig() (*tls.Config, error) {
	if !s.usesTLS() {
		return nil, nil
	}
	if (s.CertFile == "") != (s.KeyFile == "") {
		return nil, errors.New("tls: a client certificate and its key go together")
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: s.ServerName}
	if s.CAFile != "" {
		pem, err := os.ReadFile(s.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls CA: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls CA %s: no PEM certificate", s.CAFile)
		}
	}
	if s.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// DialOptions returns the dial options that give a connection to addr s's
// transport and token. A token is refused over plaintext to an address that
// is not loopback: it would cross the network readable by anyone on the
// path (and sluiced would refuse it anyway).
func (s Security) DialOptions(addr string) ([]grpc.DialOption, error) {
	tc, err := s.TLSConfig()
	if err != nil {
		return nil, err
	}
	var opts []grpc.DialOption
	if tc != nil {
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if s.Token != "" {
		if tc == nil && !loopbackTarget(addr) {
			return nil, fmt.Errorf("a bearer token is sent over plaintext only to a loopback address, not %s: turn TLS on (a CA file, or TLS)", addr)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(TokenCredentials(s.Token, tc != nil)))
	}
	return opts, nil
}

// reconnect is how a connection to a replica retries after it broke: from
// 100 ms, ×1.6, capped at 1 s (grpc-go's default: from 1 s, capped at
// 120 s). A replica
// that restarts on its address is back in seconds, and a router must not
// wait out a backoff meant for far-away servers meanwhile: its tenants'
// Admits would fail over to the next replica for that long.
var reconnect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 20 * time.Second, // grpc-go's default
})

// Dial returns a connection to addr with s's transport and token, a
// reconnection backoff capped at 1 s, and any further options (which may
// override it). Like grpc.NewClient it does not connect at once.
func Dial(addr string, s Security, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	sec, err := s.DialOptions(addr)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, append(append(sec, reconnect), opts...)...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}

// Dialer returns a Router Dialer that dials every replica with s.
func (s Security) Dialer(opts ...grpc.DialOption) Dialer {
	return func(addr string) (Conn, error) { return Dial(addr, s, opts...) }
}

// tokenCredentials sends a bearer token on every call.
type tokenCredentials struct {
	header     map[string]string
	requireTLS bool
}

// TokenCredentials returns per-RPC credentials that send
// "authorization: Bearer <token>". With requireTLS, gRPC refuses to send it
// on a connection without transport security.
func TokenCredentials(token string, requireTLS bool) credentials.PerRPCCredentials {
	return tokenCredentials{header: map[string]string{"authorization": "Bearer " + token}, requireTLS: requireTLS}
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (t tokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return t.header, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (t tokenCredentials) RequireTransportSecurity() bool { return t.requireTLS }

// loopbackTarget reports whether a dial target names a loopback host:
// "localhost", a loopback IP, either with a port and optionally a
// "dns:///" or "passthrough:///" scheme.
func loopbackTarget(target string) bool {
	for _, scheme := range []string{"dns:///", "passthrough:///"} {
		target = strings.TrimPrefix(target, scheme)
	}
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		host = target
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
