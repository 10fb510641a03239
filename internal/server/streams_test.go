package server

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/auth"
)

// rawH2 is an HTTP/2 client connection driven frame by frame.
type rawH2 struct {
	t  *testing.T
	c  net.Conn
	fr *http2.Framer
}

// dialRawH2 opens an HTTP/2 connection over TLS (ALPN h2, no client
// certificate) to addr, trusting ca, and sends the preface and SETTINGS.
func dialRawH2(t *testing.T, addr string, ca []byte) *rawH2 {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("%s negotiated %q, want h2", addr, p)
	}
	// A guard against a server that never answers, not a measure.
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	h := &rawH2{t: t, c: c, fr: http2.NewFramer(c, c)}
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := h.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return h
}

// maxStreams reads frames until the server's SETTINGS and returns the
// MAX_CONCURRENT_STREAMS it sets; false when it sets none.
func (h *rawH2) maxStreams() (uint32, bool) {
	h.t.Helper()
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			h.t.Fatalf("reading the server's SETTINGS: %v", err)
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			_ = h.fr.WriteSettingsAck()
			return s.Value(http2.SettingMaxConcurrentStreams)
		}
	}
}

// openCall sends the HEADERS of a gRPC call to method on stream id, with
// the header fields extra, and no request message: the stream stays open.
func (h *rawH2) openCall(id uint32, method string, extra ...string) {
	h.t.Helper()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	fields := append([]string{":method", "POST", ":scheme", "https", ":path", method, ":authority", "localhost",
		"content-type", "application/grpc", "te", "trailers"}, extra...)
	for i := 0; i < len(fields); i += 2 {
		_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
		h.t.Fatal(err)
	}
}

// answer reads frames until stream id ends: its grpc-status when the
// server answers with one, or the RST_STREAM code when it resets it.
func (h *rawH2) answer(id uint32) (grpcStatus string, reset http2.ErrCode) {
	h.t.Helper()
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			h.t.Fatalf("reading the answer of stream %d: %v", id, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = h.fr.WriteSettingsAck()
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				return "", f.ErrCode
			}
		case *http2.MetaHeadersFrame:
			if v := f.PseudoValue("status"); f.StreamID == id && v != "" && v != "200" {
				return "http " + v, 0
			}
			for _, hf := range f.RegularFields() {
				if f.StreamID == id && hf.Name == "grpc-status" {
					return hf.Value, 0
				}
			}
		}
	}
}

// Each listener bounds the calls open at once on one connection
// (--max-concurrent-streams), says so in its SETTINGS, and refuses a
// stream past it; a bad bound is refused at start.
func TestEachListenerBoundsStreamsPerConnection(t *testing.T) {
	const bound = 7
	f := startSecure(t, func(o *Options) { o.Security.MaxConcurrentStreams = bound })
	for name, addr := range map[string]string{"grpc": f.srv.GRPCAddr().String(), "http": f.srv.HTTPAddr().String()} {
		if n, ok := dialRawH2(t, addr, f.ca.CertPEM).maxStreams(); !ok || n != bound {
			t.Errorf("%s listener: MAX_CONCURRENT_STREAMS %d (set %v), want %d", name, n, ok, bound)
		}
	}
	// A router's calls that wait for their request messages hold the
	// connection's streams; the next one is refused.
	h := dialRawH2(t, f.srv.GRPCAddr().String(), f.ca.CertPEM)
	h.maxStreams()
	for i := range uint32(bound + 1) {
		h.openCall(2*i+1, admissionv1.Admission_Admit_FullMethodName, "authorization", "Bearer router-acme-token")
	}
	if st, code := h.answer(2*bound + 1); code != http2.ErrCodeRefusedStream {
		t.Errorf("stream %d past the bound: grpc-status %q, reset %v; want REFUSED_STREAM", bound+1, st, code)
	}
	for _, n := range []int{-1, 1 << 31} {
		_, err := New(Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Security: SecurityOptions{MaxConcurrentStreams: n}})
		if err == nil || !strings.Contains(err.Error(), "--max-concurrent-streams") {
			t.Errorf("--max-concurrent-streams %d: %v, want an error naming the flag", n, err)
		}
	}
}

// A call that needs a principal and sends no credential is refused
// UNAUTHENTICATED at its headers, without waiting for its request message
// (which never comes): an unauthenticated stream costs its HEADERS frame.
// A refused Operator call is audited there.
func TestCallWithoutCredentialRefusedAtItsHeaders(t *testing.T) {
	f := startSecure(t, nil)
	h := dialRawH2(t, f.srv.GRPCAddr().String(), f.ca.CertPEM)
	h.openCall(1, admissionv1.Admission_Admit_FullMethodName)
	if st, code := h.answer(1); st != "16" {
		t.Fatalf("Admit's headers without a credential: grpc-status %q, reset %v; want 16 (UNAUTHENTICATED)", st, code)
	}
	h.openCall(3, admissionv1.Operator_DrainDomain_FullMethodName, "authorization", "Bearer guessed-token")
	if st, code := h.answer(3); st != "16" {
		t.Fatalf("DrainDomain's headers with an unknown token: grpc-status %q, reset %v; want 16 (UNAUTHENTICATED)", st, code)
	}
	if auth.AuditCount(f.srv.metrics.Registry, "DrainDomain", auth.OutcomeUnauthenticated) == 0 {
		t.Error("the refused DrainDomain was not audited")
	}
}
