// Package authtest mints certificates for tests: a CA, server certificates
// for loopback and client certificates with URI SANs (SPIFFE ids), DNS SANs
// and CNs, written as PEM files the way sluiced and its clients read them.
package authtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// serials numbers every certificate minted in the process, so that tests
// can tell a rotated certificate from the one before.
var serials atomic.Int64

// CA is a certificate authority for one test.
type CA struct {
	Cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM []byte
	// File is the CA certificate's PEM file (for --client-ca, --tls-ca).
	File string
	dir  string
}

// NewCA mints a CA and writes its certificate under t.TempDir().
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serials.Add(1)),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{Cert: cert, key: key, CertPEM: pemBlock("CERTIFICATE", der), dir: t.TempDir()}
	ca.File = filepath.Join(ca.dir, name+"-ca.pem")
	writeFile(t, ca.File, ca.CertPEM)
	return ca
}

// Leaf is a minted certificate and its key, as PEM and as files.
type Leaf struct {
	Cert              *x509.Certificate
	CertPEM, KeyPEM   []byte
	CertFile, KeyFile string
}

// Identity is what a client certificate names.
type Identity struct {
	CN   string
	URIs []string // e.g. "spiffe://test/router"
	DNS  []string
}

// Server mints a server certificate for 127.0.0.1, ::1 and localhost,
// written to files named after name.
func (ca *CA) Server(t testing.TB, name string) *Leaf {
	t.Helper()
	return ca.mint(t, name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// Client mints a client certificate naming id, written to files named after
// name.
func (ca *CA) Client(t testing.TB, name string, id Identity) *Leaf {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: id.CN},
		DNSNames:    id.DNS,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, s := range id.URIs {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	return ca.mint(t, name, tmpl)
}

// mint signs tmpl with the CA and writes the pair.
func (ca *CA) mint(t testing.TB, name string, tmpl *x509.Certificate) *Leaf {
	t.Helper()
	key := newKey(t)
	tmpl.SerialNumber = big.NewInt(serials.Add(1))
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	l := &Leaf{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("EC PRIVATE KEY", kder),
		CertFile: filepath.Join(ca.dir, name+".pem"), KeyFile: filepath.Join(ca.dir, name+"-key.pem")}
	l.Write(t, l.CertFile, l.KeyFile)
	return l
}

// Write writes the pair to certFile and keyFile, each atomically (a rename
// over the old file), as a certificate manager rotates them.
func (l *Leaf) Write(t testing.TB, certFile, keyFile string) {
	t.Helper()
	writeFile(t, keyFile, l.KeyPEM)
	writeFile(t, certFile, l.CertPEM)
}

// TokenSHA256 is the hex digest an auth file holds for token.
func TokenSHA256(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// WriteFile writes data to path atomically: a reader sees the old contents
// or the new, never half of them.
func WriteFile(t testing.TB, path string, data []byte) {
	t.Helper()
	writeFile(t, path, data)
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
