package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"sigs.k8s.io/yaml"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/config"
)

// ParseDocuments builds the config that the policy document base and the
// tenant documents (tenant name → its entry) stored under prefix describe:
// the tenants are merged into base's tenants map and the whole is parsed by
// config.Parse, strictly, defaulted and validated. A refusal is a
// *config.Error whose File is the etcd key at fault: the tenant's key when
// the problem is inside one tenant's entry, the policy key otherwise.
func ParseDocuments(prefix string, base []byte, tenants map[string][]byte) (admission.Config, error) {
	baseKey := ConfigKey(prefix)
	var doc map[string]json.RawMessage
	js, err := yaml.YAMLToJSONStrict(base)
	if err == nil {
		err = json.Unmarshal(js, &doc)
	}
	if err != nil || doc == nil {
		if err == nil {
			err = errors.New("want a mapping of keys, got none")
		}
		return admission.Config{}, &config.Error{File: baseKey, Reason: err.Error()}
	}
	if len(tenants) > 0 {
		merged := make(map[string]json.RawMessage)
		if raw, ok := doc["tenants"]; ok && !isNull(raw) {
			if err := json.Unmarshal(raw, &merged); err != nil {
				return admission.Config{}, &config.Error{File: baseKey, Key: "tenants", Reason: "want a mapping of keys: " + err.Error()}
			}
		}
		for _, name := range slices.Sorted(maps.Keys(tenants)) {
			key := TenantKey(prefix, name)
			if !validName(name) {
				return admission.Config{}, &config.Error{File: key, Reason: "a tenant name must be non-empty and without '/'"}
			}
			if _, dup := merged[name]; dup {
				return admission.Config{}, &config.Error{File: key, Key: "tenants." + name,
					Reason: fmt.Sprintf("tenant %q is also defined in %s; define it in one place", name, baseKey)}
			}
			tj, err := yaml.YAMLToJSONStrict(tenants[name])
			if err != nil {
				return admission.Config{}, &config.Error{File: key, Key: "tenants." + name, Reason: err.Error()}
			}
			merged[name] = tj
		}
		b, err := json.Marshal(merged)
		if err != nil { // every value is JSON that came out of YAMLToJSONStrict
			return admission.Config{}, &config.Error{File: baseKey, Key: "tenants", Reason: err.Error()}
		}
		doc["tenants"] = b
	}
	all, err := json.Marshal(doc)
	if err != nil {
		return admission.Config{}, &config.Error{File: baseKey, Reason: err.Error()}
	}
	cfg, err := config.Parse(baseKey, all)
	return cfg, attribute(prefix, tenants, err)
}

// attribute names the tenant document a refusal points into, when it does.
func attribute(prefix string, tenants map[string][]byte, err error) error {
	var ce *config.Error
	if !errors.As(err, &ce) {
		return err
	}
	name, ok := strings.CutPrefix(ce.Key, "tenants.")
	if !ok {
		return err
	}
	for t := range tenants {
		if name == t || strings.HasPrefix(name, t+".") || strings.HasPrefix(name, t+"[") {
			return &config.Error{File: TenantKey(prefix, t), Key: ce.Key, Reason: ce.Reason}
		}
	}
	return err
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// maxTxnOps is how many operations ApplyConfig puts in one transaction:
// etcd refuses more than 128 by default (--max-txn-ops).
const maxTxnOps = 128

// ApplyResult says what ApplyConfig wrote.
type ApplyResult struct {
	Revision        int64 // revision of the last write
	TenantsWritten  int   // tenant documents created or changed
	TenantsDeleted  int   // tenant documents of tenants no longer in the file
	Transactions    int   // etcd transactions used; 1 means the change was atomic
	PolicyUnchanged bool  // the policy document was already as written
}

// ApplyConfig validates the config file data (named name in errors) exactly
// as sluiced parses a --config file and, only if it is good, writes it under
// prefix: the policy document without its tenants, one document per tenant,
// and deletions of tenant documents the file no longer has. Unchanged
// documents are not rewritten. Up to 128 changes go in one transaction, which
// every replica sees as one step; a larger change is written in several, and
// replicas may refuse (and log) an intermediate state before the last write
// lands. Replicas validate again against their cluster (floors must fit).
func ApplyConfig(ctx context.Context, cli *clientv3.Client, prefix, name string, data []byte) (ApplyResult, error) {
	if _, err := config.Parse(name, data); err != nil {
		return ApplyResult{}, err
	}
	base, tenants, err := split(data)
	if err != nil {
		return ApplyResult{}, &config.Error{File: name, Reason: err.Error()}
	}
	var res ApplyResult
	var ops []clientv3.Op
	cur, err := cli.Get(ctx, ConfigKey(prefix))
	if err != nil {
		return res, fmt.Errorf("read %s: %w", ConfigKey(prefix), err)
	}
	if len(cur.Kvs) == 1 && bytes.Equal(cur.Kvs[0].Value, base) {
		res.PolicyUnchanged = true
	} else {
		ops = append(ops, clientv3.OpPut(ConfigKey(prefix), string(base)))
	}
	old, err := cli.Get(ctx, prefix+tenantsDir, clientv3.WithPrefix())
	if err != nil {
		return res, fmt.Errorf("read %s: %w", prefix+tenantsDir, err)
	}
	have := make(map[string][]byte, len(old.Kvs))
	for _, kv := range old.Kvs {
		_, t := classify(prefix, string(kv.Key))
		have[t] = kv.Value
	}
	for _, t := range slices.Sorted(maps.Keys(tenants)) {
		if !validName(t) {
			return ApplyResult{}, &config.Error{File: name, Key: "tenants." + t, Reason: "a tenant name must be non-empty and without '/' to have an etcd key"}
		}
		if v, ok := have[t]; !ok || !bytes.Equal(v, tenants[t]) {
			ops = append(ops, clientv3.OpPut(TenantKey(prefix, t), string(tenants[t])))
			res.TenantsWritten++
		}
	}
	for _, t := range slices.Sorted(maps.Keys(have)) {
		if _, ok := tenants[t]; !ok {
			ops = append(ops, clientv3.OpDelete(TenantKey(prefix, t)))
			res.TenantsDeleted++
		}
	}
	for len(ops) > 0 {
		n := min(len(ops), maxTxnOps)
		resp, err := cli.Txn(ctx).Then(ops[:n]...).Commit()
		if err != nil {
			return res, fmt.Errorf("write config under %s (%d of %d transactions done): %w", prefix, res.Transactions, res.Transactions+(len(ops)+maxTxnOps-1)/maxTxnOps, err)
		}
		res.Revision = resp.Header.Revision
		res.Transactions++
		ops = ops[n:]
	}
	return res, nil
}

// split separates a config file into the policy document (JSON, without
// tenants) and each tenant's entry (JSON).
func split(data []byte) (base []byte, tenants map[string][]byte, err error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, nil, err
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(js, &doc); err != nil {
		return nil, nil, err
	}
	tenants = make(map[string][]byte)
	if raw, ok := doc["tenants"]; ok && !isNull(raw) {
		var ts map[string]json.RawMessage
		if err := json.Unmarshal(raw, &ts); err != nil {
			return nil, nil, fmt.Errorf("tenants: %w", err)
		}
		for n, v := range ts {
			tenants[n] = v
		}
	}
	delete(doc, "tenants")
	base, err = json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	return base, tenants, nil
}

// ReadDocuments returns the policy document and the tenant documents stored
// under prefix; base is nil when there is no policy document.
func ReadDocuments(ctx context.Context, cli *clientv3.Client, prefix string) (base []byte, tenants map[string][]byte, rev int64, err error) {
	resp, err := cli.Get(ctx, ConfigKey(prefix))
	if err != nil {
		return nil, nil, 0, fmt.Errorf("read %s: %w", ConfigKey(prefix), err)
	}
	if len(resp.Kvs) == 1 {
		base = resp.Kvs[0].Value
	}
	ts, err := cli.Get(ctx, prefix+tenantsDir, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision))
	if err != nil {
		return nil, nil, 0, fmt.Errorf("read %s: %w", prefix+tenantsDir, err)
	}
	tenants = make(map[string][]byte, len(ts.Kvs))
	for _, kv := range ts.Kvs {
		_, t := classify(prefix, string(kv.Key))
		tenants[t] = kv.Value
	}
	return base, tenants, resp.Header.Revision, nil
}
