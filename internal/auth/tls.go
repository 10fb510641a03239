package auth

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-sched/sluice/internal/clock"
)

// ServerTLS serves sluiced's certificate pair and, for mTLS, the CA bundle
// that client certificates are verified against, from files that are
// re-read when they change: a rotated certificate is used by the next
// handshake, without a restart. A pair that does not load (a key that does
// not match, a half-written file) is refused and the last good one keeps
// serving. It is safe for concurrent use.
type ServerTLS struct {
	certFile, keyFile, caFile string
	log                       *slog.Logger
	audit                     *Auditor
	cur                       atomic.Pointer[tlsState]

	mu      sync.Mutex // serialises reloads and guards the fields below
	loaded  [sha256.Size]byte
	lastBad [sha256.Size]byte
}

// tlsState is one loaded generation of the files.
type tlsState struct {
	cert *tls.Certificate
	pool *x509.CertPool // nil without a client CA
}

// NewServerTLS loads the pair (certFile, keyFile) and, when caFile is not
// "", the client CA bundle; any of them failing to load is an error. logger
// and audit may be nil.
func NewServerTLS(certFile, keyFile, caFile string, logger *slog.Logger, audit *Auditor) (*ServerTLS, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tls: --tls-cert and --tls-key go together")
	}
	if logger == nil {
		logger = slog.Default()
	}
	s := &ServerTLS{certFile: certFile, keyFile: keyFile, caFile: caFile, log: logger, audit: audit}
	st, sum, err := s.load()
	if err != nil {
		return nil, err
	}
	s.cur.Store(st)
	s.loaded = sum
	return s, nil
}

// MutualTLS reports whether client certificates are verified (--client-ca).
func (s *ServerTLS) MutualTLS() bool { return s.caFile != "" }

// Config returns a server tls.Config that answers each handshake with the
// files' current generation, offering nextProtos by ALPN ("h2" for gRPC;
// "h2", "http/1.1" for HTTP). With a client CA, a client certificate is
// verified when one is sent (VerifyClientCertIfGiven): bearer-token callers
// need none, and a certificate that does not verify fails the handshake.
func (s *ServerTLS) Config(nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			st := s.cur.Load()
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				NextProtos:   nextProtos,
				Certificates: []tls.Certificate{*st.cert},
			}
			if st.pool != nil {
				c.ClientCAs = st.pool
				c.ClientAuth = tls.VerifyClientCertIfGiven
			}
			return c, nil
		},
	}
}

// Reload re-reads the files at once (SIGHUP); a generation that does not
// load is refused, logged and audited, and the last good one keeps serving.
func (s *ServerTLS) Reload() error { return s.reload(true) }

// ReloadIfChanged re-reads the files and swaps them in only when their
// contents changed; a bad generation is reported once. Watch calls it.
func (s *ServerTLS) ReloadIfChanged() error { return s.reload(false) }

func (s *ServerTLS) reload(force bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	raw, sum, err := s.read()
	if err == nil && !force && sum == s.loaded {
		return nil
	}
	var st *tlsState
	if err == nil {
		st, err = s.parse(raw)
	}
	if err != nil {
		if force || sum != s.lastBad {
			s.lastBad = sum
			s.log.Error("TLS files refused; the last good certificate keeps serving", "err", err)
			s.audit.Record(context.Background(), Event{Principal: "sluiced", Action: ActionTLSReload, Target: s.certFile, Outcome: OutcomeFailed, Err: err})
		}
		return err
	}
	s.cur.Store(st)
	s.loaded, s.lastBad = sum, [sha256.Size]byte{}
	if leaf := st.cert.Leaf; leaf != nil { // nil only under GODEBUG x509keypairleaf=0
		s.log.Info("TLS certificate reloaded", "file", s.certFile, "subject", leaf.Subject.String(), "not_after", leaf.NotAfter)
	}
	s.audit.Record(context.Background(), Event{Principal: "sluiced", Action: ActionTLSReload, Target: s.certFile, Outcome: OutcomeOK})
	return nil
}

// tlsFiles are the raw contents of one generation.
type tlsFiles struct{ cert, key, ca []byte }

// read reads the files and digests their contents; a read error's digest
// is of its text, so that the same failure is reported once.
func (s *ServerTLS) read() (tlsFiles, [sha256.Size]byte, error) {
	var f tlsFiles
	var err error
	h := sha256.New()
	for _, x := range []struct {
		path string
		dst  *[]byte
	}{{s.certFile, &f.cert}, {s.keyFile, &f.key}, {s.caFile, &f.ca}} {
		if x.path == "" {
			continue
		}
		if *x.dst, err = os.ReadFile(x.path); err != nil {
			err = fmt.Errorf("tls: %w", err)
			return f, sha256.Sum256([]byte(err.Error())), err
		}
		fmt.Fprintf(h, "%d:", len(*x.dst))
		h.Write(*x.dst)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return f, sum, nil
}

// parse builds a generation from the files' contents.
func (s *ServerTLS) parse(f tlsFiles) (*tlsState, error) {
	cert, err := tls.X509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, fmt.Errorf("tls %s, %s: %w", s.certFile, s.keyFile, err)
	}
	st := &tlsState{cert: &cert}
	if s.caFile != "" {
		st.pool = x509.NewCertPool()
		if !st.pool.AppendCertsFromPEM(f.ca) {
			return nil, fmt.Errorf("tls %s: no PEM certificate in the client CA bundle", s.caFile)
		}
	}
	return st, nil
}

// load reads and parses the files once.
func (s *ServerTLS) load() (*tlsState, [sha256.Size]byte, error) {
	raw, sum, err := s.read()
	if err != nil {
		return nil, sum, err
	}
	st, err := s.parse(raw)
	return st, sum, err
}

// Reloader is a file-backed value that Watch keeps current.
type Reloader interface {
	ReloadIfChanged() error
}

// Watch calls ReloadIfChanged on each of rs every interval until ctx ends.
// Polling the contents (a few small files) needs no file-notification
// dependency and follows the symlink swaps Kubernetes uses to update a
// mounted Secret, which change no watched inode. Errors are the reloaders'
// to report.
func Watch(ctx context.Context, every time.Duration, rs ...Reloader) {
	if every <= 0 || len(rs) == 0 {
		return
	}
	clock.Every(ctx, every, func() {
		for _, r := range rs {
			_ = r.ReloadIfChanged()
		}
	})
}
