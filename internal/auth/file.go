package auth

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-sched/sluice/internal/config"
)

// Role is what a principal may do; see the package documentation.
type Role string

// The roles an auth file may grant.
const (
	RoleRouter   Role = "router"
	RoleOperator Role = "operator"
	RoleViewer   Role = "viewer"
	// RoleGateway may call Envoy's external processing (ext_proc): a
	// gateway that authenticates its own callers and names their tenant
	// in a header Sluice trusts, for every tenant.
	RoleGateway Role = "gateway"
)

// AllTenants in a principal's tenants binds it to every tenant.
const AllTenants = "*"

// maxNameLen bounds principal, SAN and tenant names, as the engine bounds
// the names it is sent.
const maxNameLen = 256

// fileDoc is the auth file as written; its json tags are its keys.
type fileDoc struct {
	Principals []filePrincipal `json:"principals"`
	APIKeys    []fileAPIKey    `json:"api_keys,omitempty"`
}

// filePrincipal is one entry of the auth file.
type filePrincipal struct {
	Name        string   `json:"name"`
	TokenSHA256 string   `json:"token_sha256,omitempty"`
	MTLSSAN     string   `json:"mtls_san,omitempty"`
	Roles       []string `json:"roles"`
	Tenants     []string `json:"tenants,omitempty"`
}

// FileError is a refused auth file: the file, the key path inside it (when
// known) and the reason.
type FileError struct {
	File   string
	Key    string // e.g. "principals[1].token_sha256"
	Reason string
}

// Error formats the refusal as "auth FILE: KEY: REASON".
func (e *FileError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("auth %s: %s", e.File, e.Reason)
	}
	return fmt.Sprintf("auth %s: %s: %s", e.File, e.Key, e.Reason)
}

// Principal is a caller the auth file names: its roles and, for the router
// role, the tenants it serves. A Principal is immutable.
type Principal struct {
	// Name is the principal's name in the auth file; audit lines carry it.
	Name       string
	roles      [4]bool // indexed by roleIndex
	allTenants bool
	tenants    map[string]struct{}
}

// roleIndex returns r's slot in Principal.roles, or -1.
func roleIndex(r Role) int {
	switch r {
	case RoleRouter:
		return 0
	case RoleOperator:
		return 1
	case RoleViewer:
		return 2
	case RoleGateway:
		return 3
	}
	return -1
}

// Has reports whether p holds role r. The operator role holds every
// viewer right, so Has(RoleViewer) is true for an operator.
func (p *Principal) Has(r Role) bool {
	if p == nil {
		return false
	}
	if r == RoleViewer && p.roles[roleIndex(RoleOperator)] {
		return true
	}
	i := roleIndex(r)
	return i >= 0 && p.roles[i]
}

// MayServe reports whether p may act for tenant as a router: it holds the
// router role and is bound to the tenant, or to every tenant.
func (p *Principal) MayServe(tenant string) bool {
	if !p.Has(RoleRouter) {
		return false
	}
	if p.allTenants {
		return true
	}
	_, ok := p.tenants[tenant]
	return ok
}

// tokenEntry is one principal's token digest.
type tokenEntry struct {
	sum [sha256.Size]byte
	p   *Principal
}

// Policy is a parsed auth file: who the principals are and how each is
// recognised. It is immutable, so that a reload swaps it whole.
type Policy struct {
	tokens []tokenEntry
	bySAN  map[string]*Principal
	names  []string
	keys   map[[sha256.Size]byte]string // an API key's digest → its tenant (apikey.go)
}

// Principals returns the principals' names, in file order.
func (p *Policy) Principals() []string { return slices.Clone(p.names) }

// LoadFile reads and parses the auth file at path.
func LoadFile(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth %s: %w", path, err)
	}
	return Parse(path, data)
}

// Parse decodes and checks an auth file; name is used in errors. Decoding is
// as strict as the config's (unknown and duplicate keys, wrong types are
// refused); then every principal needs a unique name, a credential (a
// token digest, an mTLS SAN or both, each held by no other principal), at
// least one known role, and, with the router role, the tenants it serves.
// Every refusal is a *FileError naming the key.
func Parse(name string, data []byte) (*Policy, error) {
	var doc fileDoc
	if err := config.DecodeStrict(name, data, &doc); err != nil {
		var ce *config.Error
		if errors.As(err, &ce) {
			return nil, &FileError{File: name, Key: ce.Key, Reason: ce.Reason}
		}
		return nil, &FileError{File: name, Reason: err.Error()}
	}
	if len(doc.Principals) == 0 && len(doc.APIKeys) == 0 {
		// A file that names nobody would refuse every caller: most often it
		// is a write caught half done (truncated, not yet rewritten), so it
		// is refused and the last good file keeps serving.
		if blank(data) {
			return nil, &FileError{File: name, Reason: "the file is empty (a write in progress?): an auth file names at least one principal, or every caller would be refused"}
		}
		return nil, &FileError{File: name, Key: "principals", Reason: "empty: an auth file names at least one principal, or every caller would be refused"}
	}
	pol := &Policy{bySAN: make(map[string]*Principal)}
	names := make(map[string]bool)
	tokens := make(map[[sha256.Size]byte]string)
	for i, fp := range doc.Principals {
		key := "principals[" + strconv.Itoa(i) + "]"
		refuse := func(field, format string, args ...any) error {
			k := key
			if field != "" {
				k += "." + field
			}
			return &FileError{File: name, Key: k, Reason: fmt.Sprintf(format, args...)}
		}
		switch {
		case strings.TrimSpace(fp.Name) == "" || len(fp.Name) > maxNameLen:
			return nil, refuse("name", "required, at most %d bytes", maxNameLen)
		case names[fp.Name]:
			return nil, refuse("name", "%q names an earlier principal too", fp.Name)
		case fp.TokenSHA256 == "" && fp.MTLSSAN == "":
			return nil, refuse("", "principal %q has no credential: set token_sha256, mtls_san or both", fp.Name)
		case len(fp.MTLSSAN) > maxNameLen:
			return nil, refuse("mtls_san", "at most %d bytes", maxNameLen)
		case len(fp.Roles) == 0:
			return nil, refuse("roles", "at least one of router, operator, viewer, gateway")
		}
		names[fp.Name] = true
		p := &Principal{Name: fp.Name}
		for j, r := range fp.Roles {
			ri := roleIndex(Role(r))
			if ri < 0 {
				return nil, refuse("roles["+strconv.Itoa(j)+"]", "unknown role %q (want router, operator, viewer or gateway)", r)
			}
			p.roles[ri] = true
		}
		if err := bindTenants(p, fp.Tenants, refuse); err != nil {
			return nil, err
		}
		if fp.TokenSHA256 != "" {
			sum, err := hex.DecodeString(fp.TokenSHA256)
			if err != nil || len(sum) != sha256.Size {
				// Never echo the value: a token pasted here by mistake
				// would end up in the log.
				return nil, refuse("token_sha256", "want the 64 hex digits of sha256(token)")
			}
			var e tokenEntry
			copy(e.sum[:], sum)
			if other, dup := tokens[e.sum]; dup {
				return nil, refuse("token_sha256", "principal %q has the same token", other)
			}
			tokens[e.sum] = fp.Name
			e.p = p
			pol.tokens = append(pol.tokens, e)
		}
		if fp.MTLSSAN != "" {
			if other, dup := pol.bySAN[fp.MTLSSAN]; dup {
				return nil, refuse("mtls_san", "principal %q has the same SAN %q", other.Name, fp.MTLSSAN)
			}
			pol.bySAN[fp.MTLSSAN] = p
		}
		pol.names = append(pol.names, fp.Name)
	}
	if err := parseAPIKeys(name, doc.APIKeys, tokens, pol); err != nil {
		return nil, err
	}
	return pol, nil
}

// blank reports whether data holds no YAML but blank lines and comments.
func blank(data []byte) bool {
	for line := range bytes.Lines(data) {
		if l := bytes.TrimSpace(line); len(l) > 0 && l[0] != '#' {
			return false
		}
	}
	return true
}

// bindTenants sets p's tenants from the file's list: the router role needs
// them, and the other roles are not bound to tenants, so a list without the
// router role is refused rather than silently meaning nothing.
func bindTenants(p *Principal, list []string, refuse func(field, format string, args ...any) error) error {
	router := p.roles[roleIndex(RoleRouter)]
	switch {
	case router && len(list) == 0:
		return refuse("tenants", "the router role needs the tenants it serves (names, or [\"*\"] for all)")
	case !router && len(list) > 0:
		return refuse("tenants", "only the router role is bound to tenants")
	}
	p.tenants = make(map[string]struct{}, len(list))
	for j, t := range list {
		switch {
		case t == AllTenants && len(list) > 1:
			return refuse("tenants["+strconv.Itoa(j)+"]", "%q stands alone: it already means every tenant", AllTenants)
		case t == AllTenants:
			p.allTenants = true
		case strings.TrimSpace(t) == "" || len(t) > maxNameLen:
			return refuse("tenants["+strconv.Itoa(j)+"]", "tenant names are 1 to %d bytes", maxNameLen)
		default:
			p.tenants[t] = struct{}{}
		}
	}
	return nil
}

// byToken returns the principal whose token digest is sha256(token). Every
// entry is compared, in constant time, so that the time taken says nothing
// about which digest, or how much of one, matched.
func (p *Policy) byToken(token string) *Principal {
	sum := sha256.Sum256([]byte(token))
	var found *Principal
	for i := range p.tokens {
		if subtleEqual(&p.tokens[i].sum, &sum) {
			found = p.tokens[i].p
		}
	}
	return found
}

// bySANs returns the principal named by the first of ids the policy knows.
func (p *Policy) bySANs(ids []string) *Principal {
	for _, id := range ids {
		if pr, ok := p.bySAN[id]; ok {
			return pr
		}
	}
	return nil
}
