package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// fileAPIKey is one entry of the auth file's api_keys: an OpenAI-style API
// key (the bearer token an OpenAI client sends) and the tenant whose quota
// it spends on the OpenAI-compatible front.
//
//	api_keys:
//	  - tenant: acme
//	    key_sha256: "<hex of sha256(sk-...)>"
type fileAPIKey struct {
	Tenant    string `json:"tenant"`
	KeySHA256 string `json:"key_sha256"`
}

// parseAPIKeys checks the api_keys entries and indexes them in pol: each
// names a tenant and the digest of a key that no other key and no
// principal's token has (tokens: the principals' digests, by name).
func parseAPIKeys(file string, keys []fileAPIKey, tokens map[[sha256.Size]byte]string, pol *Policy) error {
	pol.keys = make(map[[sha256.Size]byte]string, len(keys))
	for i, k := range keys {
		key := "api_keys[" + strconv.Itoa(i) + "]"
		refuse := func(field, format string, args ...any) error {
			return &FileError{File: file, Key: key + "." + field, Reason: fmt.Sprintf(format, args...)}
		}
		if strings.TrimSpace(k.Tenant) == "" || len(k.Tenant) > maxNameLen || k.Tenant == AllTenants {
			return refuse("tenant", "required: the tenant the key spends, 1 to %d bytes (not %q)", maxNameLen, AllTenants)
		}
		raw, err := hex.DecodeString(k.KeySHA256)
		if err != nil || len(raw) != sha256.Size {
			// Never echo the value: a key pasted here by mistake would
			// end up in the log.
			return refuse("key_sha256", "want the 64 hex digits of sha256(key)")
		}
		var sum [sha256.Size]byte
		copy(sum[:], raw)
		if other, dup := tokens[sum]; dup {
			return refuse("key_sha256", "principal %q has it as its token: a bearer token is either a principal or an API key", other)
		}
		if other, dup := pol.keys[sum]; dup {
			return refuse("key_sha256", "an earlier key (tenant %q) is the same", other)
		}
		pol.keys[sum] = k.Tenant
	}
	return nil
}

// Client is who called the OpenAI-compatible front: an API key's tenant,
// or a principal (a gateway naming the tenant in its trusted header).
// Both are zero when the Authenticator is open.
type Client struct {
	// Tenant is the tenant of the API key the caller sent; "" for a
	// principal.
	Tenant string
	// Principal is the principal the caller's token or certificate names;
	// nil for an API key.
	Principal *Principal
}

// IdentifyClient returns who an HTTP request to the OpenAI-compatible
// front presents: a bearer token that is an API key (its tenant), else one
// that is a principal's token, else a verified client certificate's
// principal. A bearer token travels in the clear without TLS, so, as
// everywhere, it is accepted over plaintext only from loopback. An open
// Authenticator returns the zero Client and no error; no credential, or
// an unknown one, is an error wrapping ErrUnauthenticated.
//
// The key is found by its SHA-256 in a map, not compared with every digest
// in constant time as principals' tokens are: there are as many keys as
// tenants, and a lookup's timing tells about the digest, which a caller
// cannot steer without the key.
func (a *Authenticator) IdentifyClient(r *http.Request) (Client, error) {
	pol := a.policy.Load()
	if a.Open() || pol == nil {
		return Client{}, nil
	}
	c := httpCredentials(r)
	if c.HasAuthorization && c.Bearer != "" && (c.TLS || c.Loopback) {
		if tenant, ok := pol.keys[sha256.Sum256([]byte(c.Bearer))]; ok {
			return Client{Tenant: tenant}, nil
		}
	}
	p, err := a.Identify(c)
	if err != nil {
		return Client{}, err
	}
	return Client{Principal: p}, nil
}

// APIKeys returns how many API keys the auth file in force maps.
func (a *Authenticator) APIKeys() int {
	if pol := a.policy.Load(); pol != nil {
		return len(pol.keys)
	}
	return 0
}
