package client

import (
	"context"
	"strings"
	"testing"
)

func TestLoopbackTarget(t *testing.T) {
	for target, want := range map[string]bool{
		"localhost:7070": true, "LOCALHOST:7070": true, "127.0.0.1:7070": true, "127.5.6.7:1": true,
		"[::1]:7070": true, "dns:///localhost:7070": true, "passthrough:///127.0.0.1:1": true,
		"[::ffff:127.0.0.1]:1": true, "localhost": true,
		":7070": false, "0.0.0.0:7070": false, "10.0.0.1:7070": false, "sluiced:7070": false,
		"localhost.evil.example:7070": false, "dns:///sluiced.prod:7070": false,
	} {
		if got := loopbackTarget(target); got != want {
			t.Errorf("loopbackTarget(%q) = %v, want %v", target, got, want)
		}
	}
}

func TestSecurityDialOptions(t *testing.T) {
	if _, err := (Security{Token: "t"}).DialOptions("sluiced:7070"); err == nil || !strings.Contains(err.Error(), "plaintext") {
		t.Errorf("a token over plaintext beyond loopback: %v", err)
	}
	if _, err := (Security{Token: "t"}).DialOptions("127.0.0.1:7070"); err != nil {
		t.Errorf("a token over plaintext to loopback: %v", err)
	}
	if _, err := (Security{Token: "t", TLS: true}).DialOptions("sluiced:7070"); err != nil {
		t.Errorf("a token over TLS: %v", err)
	}
	if _, err := (Security{CertFile: "c.pem"}).DialOptions("sluiced:7070"); err == nil {
		t.Error("a certificate without its key is accepted")
	}
	if _, err := (Security{CAFile: "/nonexistent/ca.pem"}).DialOptions("sluiced:7070"); err == nil || !strings.Contains(err.Error(), "/nonexistent/ca.pem") {
		t.Errorf("a missing CA: %v", err)
	}
	md, err := TokenCredentials("s3cret", true).GetRequestMetadata(context.Background())
	if err != nil || md["authorization"] != "Bearer s3cret" || !TokenCredentials("x", true).RequireTransportSecurity() {
		t.Errorf("token credentials: %v %v", md, err)
	}
}
