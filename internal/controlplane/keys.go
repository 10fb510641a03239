package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/admission/client/etcdmembers"
)

// DefaultPrefix is the key prefix the control plane uses unless told otherwise.
const DefaultPrefix = "/sluice/"

// Directories and keys under the prefix; see the package documentation.
const (
	configKey  = "config"
	tenantsDir = "tenants/"
	drainsDir  = "drains/"
	agentsDir  = "agents/"
)

// NormalizePrefix returns prefix ending in exactly one "/" ("" gives
// DefaultPrefix), so that "/sluice" and "/sluice/" name the same keys.
func NormalizePrefix(prefix string) string {
	if prefix == "" {
		return DefaultPrefix
	}
	return strings.TrimRight(prefix, "/") + "/"
}

// ConfigKey returns the key of the policy document.
func ConfigKey(prefix string) string { return prefix + configKey }

// TenantKey returns the key of a tenant's document.
func TenantKey(prefix, name string) string { return prefix + tenantsDir + name }

// DrainKey returns the key of a domain's drain mark.
func DrainKey(prefix, domain string) string { return prefix + drainsDir + domain }

// AgentKey returns the key under which a node's agent publishes.
func AgentKey(prefix, node string) string { return prefix + agentsDir + node }

// kind is what a key under the prefix holds.
type kind int

const (
	kindOther kind = iota
	kindConfig
	kindTenant
	kindDrain
	kindAgent
	kindMember
	kindFreeze
)

// classify returns what key holds and the name after its directory.
func classify(prefix, key string) (kind, string) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return kindOther, ""
	}
	switch rest {
	case configKey:
		return kindConfig, ""
	case creditFreezeKey:
		return kindFreeze, ""
	}
	for _, d := range []struct {
		dir string
		k   kind
	}{{tenantsDir, kindTenant}, {drainsDir, kindDrain}, {agentsDir, kindAgent}, {etcdmembers.Dir, kindMember}} {
		if name, ok := strings.CutPrefix(rest, d.dir); ok {
			return d.k, name
		}
	}
	return kindOther, ""
}

// DrainMark is an operator's request that no replica place new work on a
// domain; its leases run to completion.
type DrainMark struct {
	Domain string    `json:"domain"`
	Reason string    `json:"reason,omitempty"`
	By     string    `json:"by,omitempty"`
	At     time.Time `json:"at"`
}

// Describe is the drain reason replicas show for the mark (ListDomains'
// drain_reason): who, when and why.
func (m DrainMark) Describe() string { return describeMark("drained", m.By, m.At, m.Reason) }

// describeMark says what an operator's mark did, by whom, when and why:
// "drained by alice at 2026-03-10T12:00:00Z: swap".
func describeMark(did, by string, at time.Time, reason string) string {
	var b strings.Builder
	b.WriteString(did)
	if by != "" {
		b.WriteString(" by " + by)
	}
	if !at.IsZero() {
		b.WriteString(" at " + at.UTC().Format(time.RFC3339))
	}
	if reason != "" {
		b.WriteString(": " + reason)
	}
	return b.String()
}

// decodeDrain reads the mark under the drain key of domain. A value that is
// not a mark still drains: the key's existence is the operator's intent.
func decodeDrain(domain string, value []byte) (DrainMark, error) {
	var m DrainMark
	if err := json.Unmarshal(value, &m); err != nil {
		return DrainMark{Domain: domain, Reason: "unreadable drain mark"}, fmt.Errorf("drain mark %s: %w", domain, err)
	}
	if m.Domain != domain {
		err := fmt.Errorf("drain mark %s: names domain %q", domain, m.Domain)
		m.Domain = domain
		return m, err
	}
	return m, nil
}

// validName reports whether s can be the last segment of a key.
func validName(s string) bool { return s != "" && !strings.Contains(s, "/") }

// PutDrain writes a drain mark; every replica stops placing on the domain
// when its watch delivers it. It returns the revision of the write.
func PutDrain(ctx context.Context, cli *clientv3.Client, prefix string, m DrainMark) (int64, error) {
	if !validName(m.Domain) {
		return 0, fmt.Errorf("drain: domain %q: want a non-empty id without '/'", m.Domain)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return 0, fmt.Errorf("drain %s: %w", m.Domain, err)
	}
	resp, err := cli.Put(ctx, DrainKey(prefix, m.Domain), string(b))
	if err != nil {
		return 0, fmt.Errorf("drain %s: write %s: %w", m.Domain, DrainKey(prefix, m.Domain), err)
	}
	return resp.Header.Revision, nil
}

// DeleteDrain removes a domain's drain mark. It reports whether there was one.
func DeleteDrain(ctx context.Context, cli *clientv3.Client, prefix, domain string) (bool, error) {
	if !validName(domain) {
		return false, fmt.Errorf("undrain: domain %q: want a non-empty id without '/'", domain)
	}
	resp, err := cli.Delete(ctx, DrainKey(prefix, domain))
	if err != nil {
		return false, fmt.Errorf("undrain %s: delete %s: %w", domain, DrainKey(prefix, domain), err)
	}
	return resp.Deleted > 0, nil
}

// ListDrains returns every drain mark, sorted by domain.
func ListDrains(ctx context.Context, cli *clientv3.Client, prefix string) ([]DrainMark, error) {
	resp, err := cli.Get(ctx, prefix+drainsDir, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", prefix+drainsDir, err)
	}
	out := make([]DrainMark, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		_, domain := classify(prefix, string(kv.Key))
		m, _ := decodeDrain(domain, kv.Value) // an unreadable mark is listed as such
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b DrainMark) int { return strings.Compare(a.Domain, b.Domain) })
	return out, nil
}
