package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
)

// Authenticator identifies callers against the auth file in force and
// re-reads that file when it changes. Without a file it is open: every
// caller is allowed and audited as "anonymous", which sluiced permits only
// on loopback (or with --insecure). It is safe for concurrent use.
type Authenticator struct {
	file   string // "" when open
	log    *slog.Logger
	audit  *Auditor
	policy atomic.Pointer[Policy]

	mu       sync.Mutex // serialises reloads and guards the fields below
	loaded   [sha256.Size]byte
	lastBad  [sha256.Size]byte
	loadedOK bool
}

// New returns an Authenticator over the auth file at path, loaded now: a bad
// or missing file is an error. path "" returns an open Authenticator. logger
// and audit may be nil (slog.Default(), no audit).
func New(path string, logger *slog.Logger, audit *Auditor) (*Authenticator, error) {
	if logger == nil {
		logger = slog.Default()
	}
	a := &Authenticator{file: path, log: logger, audit: audit}
	if path == "" {
		return a, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth %s: %w", path, err)
	}
	pol, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	a.policy.Store(pol)
	a.loaded, a.loadedOK = sha256.Sum256(data), true
	return a, nil
}

// Open reports whether no auth file is in use: every caller is allowed.
func (a *Authenticator) Open() bool { return a.file == "" }

// File returns the auth file's path; "" when open.
func (a *Authenticator) File() string { return a.file }

// Reload re-reads the auth file at once (SIGHUP). A file that cannot be read
// or parsed is refused, logged and audited with its key path and reason, and
// the last good one keeps serving. An open Authenticator has nothing to
// reload.
func (a *Authenticator) Reload() error { return a.reload(true) }

// ReloadIfChanged re-reads the auth file and applies it only when its
// contents differ from the file in force; a bad file is refused as by
// Reload, but logged once per distinct content so that polling does not
// repeat it. Watch calls it.
func (a *Authenticator) ReloadIfChanged() error { return a.reload(false) }

func (a *Authenticator) reload(force bool) error {
	if a.file == "" {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	data, err := os.ReadFile(a.file)
	if err != nil {
		err = fmt.Errorf("auth %s: %w", a.file, err)
		sum := sha256.Sum256([]byte(err.Error())) // one report per distinct failure
		if force || sum != a.lastBad {
			a.lastBad = sum
			a.refused(err)
		}
		return err
	}
	sum := sha256.Sum256(data)
	if !force && a.loadedOK && sum == a.loaded {
		return nil
	}
	pol, err := Parse(a.file, data)
	if err != nil {
		if force || sum != a.lastBad {
			a.lastBad = sum
			a.refused(err)
		}
		return err
	}
	a.policy.Store(pol)
	a.loaded, a.loadedOK, a.lastBad = sum, true, [sha256.Size]byte{}
	a.log.Info("auth file reloaded", "file", a.file, "principals", len(pol.names))
	a.audit.Record(context.Background(), Event{Principal: "sluiced", Action: ActionAuthReload, Target: a.file, Outcome: OutcomeOK})
	return nil
}

// refused logs and audits a refused auth file.
func (a *Authenticator) refused(err error) {
	a.log.Error("auth file refused; the last good one keeps serving", "err", err)
	a.audit.Record(context.Background(), Event{Principal: "sluiced", Action: ActionAuthReload, Target: a.file, Outcome: OutcomeFailed, Err: err})
}

// Credentials are what a caller presented on one connection or request.
type Credentials struct {
	// Bearer is the token of an "authorization: Bearer" header; "" when none.
	Bearer string
	// HasAuthorization is whether an authorization header was sent at all,
	// so that a malformed one is refused rather than ignored.
	HasAuthorization bool
	// TLS is whether the connection is TLS.
	TLS bool
	// Loopback is whether the peer's address is a loopback address.
	Loopback bool
	// Cert is the verified client certificate; nil when none was sent.
	Cert *x509.Certificate
}

// Errors of Identify. ErrUnauthenticated wraps each of them, so that callers
// map them all to UNAUTHENTICATED (HTTP 401); the texts are safe to send.
var (
	ErrUnauthenticated = errors.New("unauthenticated")
	errNoCredential    = fmt.Errorf("%w: no credential: send \"authorization: Bearer <token>\" or a client certificate", ErrUnauthenticated)
	errPlaintextBearer = fmt.Errorf("%w: bearer tokens need TLS: they are accepted over plaintext only from loopback", ErrUnauthenticated)
	errBadHeader       = fmt.Errorf("%w: the authorization header must be \"Bearer <token>\"", ErrUnauthenticated)
	errUnknownToken    = fmt.Errorf("%w: unknown bearer token", ErrUnauthenticated)
)

// Identify returns the principal c names. A bearer token, when sent, decides
// (an unknown one is refused even beside a good certificate: a caller that
// sends a wrong token has made a mistake worth hearing about); otherwise the
// client certificate's URI SANs, DNS SANs and CN are tried in that order.
// An open Authenticator returns nil, nil. Errors wrap ErrUnauthenticated.
func (a *Authenticator) Identify(c Credentials) (*Principal, error) {
	pol := a.policy.Load()
	if pol == nil {
		return nil, nil
	}
	if c.HasAuthorization {
		if c.Bearer == "" {
			return nil, errBadHeader
		}
		if !c.TLS && !c.Loopback {
			return nil, errPlaintextBearer
		}
		if p := pol.byToken(c.Bearer); p != nil {
			return p, nil
		}
		return nil, errUnknownToken
	}
	if c.Cert != nil {
		ids := certIdentities(c.Cert)
		if p := pol.bySANs(ids); p != nil {
			return p, nil
		}
		return nil, fmt.Errorf("%w: the client certificate (%s) names no principal", ErrUnauthenticated, clip(strings.Join(ids, ", "), 256))
	}
	return nil, errNoCredential
}

// certIdentities lists what an auth file's mtls_san may match in cert: its
// URI SANs (SPIFFE ids), its DNS SANs, then its subject CN.
func certIdentities(cert *x509.Certificate) []string {
	ids := make([]string, 0, len(cert.URIs)+len(cert.DNSNames)+1)
	for _, u := range cert.URIs {
		ids = append(ids, u.String())
	}
	ids = append(ids, cert.DNSNames...)
	if cert.Subject.CommonName != "" {
		ids = append(ids, cert.Subject.CommonName)
	}
	return ids
}

// parseBearer splits an authorization header value; the scheme is
// case-insensitive (RFC 9110).
func parseBearer(v string) string {
	scheme, token, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// isLoopback reports whether addr (a net.Addr or "host:port") is a loopback
// address.
func isLoopback(addr net.Addr) bool {
	if addr == nil {
		return false
	}
	if tcp, ok := addr.(*net.TCPAddr); ok {
		return tcp.IP.IsLoopback()
	}
	return isLoopbackHostPort(addr.String())
}

// isLoopbackHostPort reports whether a "host:port" string is a loopback IP.
func isLoopbackHostPort(hostport string) bool {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return false
	}
	return ap.Addr().Unmap().IsLoopback()
}

// subtleEqual compares two digests in constant time.
func subtleEqual(a, b *[sha256.Size]byte) bool { return subtle.ConstantTimeCompare(a[:], b[:]) == 1 }

// clip cuts s to at most n bytes (on a rune boundary where it can), so that
// a hostile name echoed in an error or a log line stays small.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && cut > n-4 && !utf8Start(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// utf8Start reports whether b starts a UTF-8 sequence.
func utf8Start(b byte) bool { return b&0xC0 != 0x80 }
