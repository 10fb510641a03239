package auth

import (
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/internal/auth/authtest"
)

func apiKeyFile(principalToken string, keys map[string]string) []byte {
	var b strings.Builder
	b.WriteString("principals:\n  - name: envoy\n    token_sha256: \"" + authtest.TokenSHA256(principalToken) + "\"\n    roles: [gateway]\napi_keys:\n")
	for key, tenant := range keys {
		b.WriteString("  - tenant: " + tenant + "\n    key_sha256: \"" + authtest.TokenSHA256(key) + "\"\n")
	}
	return []byte(b.String())
}

func TestAPIKeyNamesItsTenant(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	authtest.WriteFile(t, path, apiKeyFile("gw-token", map[string]string{"sk-acme-1": "acme", "sk-globex-1": "globex"}))
	a, err := New(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.APIKeys() != 2 {
		t.Fatalf("keys %d, want 2", a.APIKeys())
	}
	for _, tc := range []struct {
		name, remote, authz string
		tenant, principal   string
		err                 bool
	}{
		{"acme's key", "127.0.0.1:5000", "Bearer sk-acme-1", "acme", "", false},
		{"globex's key", "127.0.0.1:5000", "bearer sk-globex-1", "globex", "", false},
		{"a gateway's token", "127.0.0.1:5000", "Bearer gw-token", "", "envoy", false},
		{"an unknown key", "127.0.0.1:5000", "Bearer sk-nobody", "", "", true},
		{"no credential", "127.0.0.1:5000", "", "", "", true},
		{"a key over plaintext from afar", "10.1.2.3:5000", "Bearer sk-acme-1", "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
			r.RemoteAddr = tc.remote
			if tc.authz != "" {
				r.Header.Set("Authorization", tc.authz)
			}
			c, err := a.IdentifyClient(r)
			if tc.err {
				if !errors.Is(err, ErrUnauthenticated) {
					t.Fatalf("err %v, want unauthenticated", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			name := ""
			if c.Principal != nil {
				name = c.Principal.Name
			}
			if c.Tenant != tc.tenant || name != tc.principal {
				t.Fatalf("tenant %q principal %q, want %q %q", c.Tenant, name, tc.tenant, tc.principal)
			}
		})
	}
}

func TestOpenAuthenticatorKnowsNoClient(t *testing.T) {
	a, err := New("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	r.Header.Set("Authorization", "Bearer sk-anything")
	if c, err := a.IdentifyClient(r); err != nil || c != (Client{}) {
		t.Fatalf("client %+v, err %v: want none", c, err)
	}
}

func TestBadAPIKeysAreRefused(t *testing.T) {
	digest := authtest.TokenSHA256("sk-1")
	for _, tc := range []struct{ name, file, key string }{
		{"no tenant", "api_keys:\n  - key_sha256: \"" + digest + "\"\n", "api_keys[0].tenant"},
		{"every tenant", "api_keys:\n  - tenant: \"*\"\n    key_sha256: \"" + digest + "\"\n", "api_keys[0].tenant"},
		{"not a digest", "api_keys:\n  - tenant: acme\n    key_sha256: sk-1\n", "api_keys[0].key_sha256"},
		{"the same key twice", "api_keys:\n  - tenant: acme\n    key_sha256: \"" + digest + "\"\n  - tenant: globex\n    key_sha256: \"" + digest + "\"\n", "api_keys[1].key_sha256"},
		{"a principal's token", "principals:\n  - name: gw\n    token_sha256: \"" + digest + "\"\n    roles: [gateway]\napi_keys:\n  - tenant: acme\n    key_sha256: \"" + digest + "\"\n", "api_keys[0].key_sha256"},
		{"an unknown field", "api_keys:\n  - tenant: acme\n    key: sk-1\n", "api_keys[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("auth.yaml", []byte(tc.file))
			var fe *FileError
			if !errors.As(err, &fe) || fe.Key != tc.key {
				t.Fatalf("err %v, want a refusal at %s", err, tc.key)
			}
			if strings.Contains(err.Error(), "sk-1") {
				t.Fatalf("the refusal echoes the key: %v", err)
			}
		})
	}
}

func TestAFileOfAPIKeysAloneIsGood(t *testing.T) {
	pol, err := Parse("auth.yaml", []byte("api_keys:\n  - tenant: acme\n    key_sha256: \""+authtest.TokenSHA256("sk-1")+"\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pol.keys) != 1 || len(pol.Principals()) != 0 {
		t.Fatalf("keys %d principals %v", len(pol.keys), pol.Principals())
	}
}
