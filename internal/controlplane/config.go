package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
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
// each tenant document is decoded alone (config.ParseTenant), the tenants
// join base's own tenants, and the whole is defaulted and validated
// (config.ParseParts). A refusal is a *config.Error whose File is the etcd
// key at fault: the tenant's key when the problem is inside one tenant's
// entry (the least such name, when several are), the policy key otherwise.
func ParseDocuments(prefix string, base []byte, tenants map[string][]byte) (admission.Config, error) {
	parsed := make(map[string]admission.TenantConfig, len(tenants))
	var first string
	var firstErr error
	for name, doc := range tenants {
		if firstErr != nil && name >= first {
			continue
		}
		tc, err := parseTenantDocument(prefix, name, doc)
		if err != nil {
			first, firstErr = name, err
			continue
		}
		parsed[name] = tc
	}
	if firstErr != nil {
		return admission.Config{}, firstErr
	}
	cfg, err := config.ParseParts(ConfigKey(prefix), base, parsed)
	return cfg, attribute(prefix, maps.Keys(tenants), err)
}

// parseTenantDocument decodes the tenant document of name.
func parseTenantDocument(prefix, name string, doc []byte) (admission.TenantConfig, error) {
	key := TenantKey(prefix, name)
	if !validName(name) {
		return admission.TenantConfig{}, &config.Error{File: key, Reason: "a tenant name must be non-empty and without '/'"}
	}
	return config.ParseTenant(key, name, doc)
}

// attribute names the tenant document a refusal points into, when it does:
// the refusal's key path is tenants.NAME or under it, for one of the tenant
// documents named. Tenant names may hold dots, so the longest name that
// matches wins ("a.b" over "a" for tenants.a.b.weight).
func attribute(prefix string, names iter.Seq[string], err error) error {
	var ce *config.Error
	if !errors.As(err, &ce) {
		return err
	}
	name, ok := strings.CutPrefix(ce.Key, "tenants.")
	if !ok {
		return err
	}
	best, found := "", false
	for t := range names {
		if (name == t || strings.HasPrefix(name, t+".") || strings.HasPrefix(name, t+"[")) && (!found || len(t) > len(best)) {
			best, found = t, true
		}
	}
	if !found {
		return err
	}
	return &config.Error{File: TenantKey(prefix, best), Key: ce.Key, Reason: ce.Reason}
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// maxTxnOps is how many operations ApplyConfig puts in one transaction:
// etcd refuses more than 128 by default (--max-txn-ops).
const maxTxnOps = 128

// applyAttempts bounds how many times ApplyConfig reads and writes again
// when another writer changes the documents between its read and its write.
const applyAttempts = 5

// afterApplyRead, when set (by tests), runs between ApplyConfig's read and
// its first write: the window in which another writer may change etcd.
var afterApplyRead func()

// ApplyResult says what ApplyConfig wrote.
type ApplyResult struct {
	Revision        int64 // revision of the last write
	TenantsWritten  int   // tenant documents created or changed
	TenantsDeleted  int   // tenant documents of tenants no longer in the file
	Transactions    int   // etcd transactions that wrote; 1 means the change was atomic
	PolicyUnchanged bool  // the policy document was already as written
	Attempts        int   // reads of etcd's documents; above 1 when another writer raced
}

// ApplyConfig validates the config file data (named name in errors) exactly
// as sluiced parses a --config file and, only if it is good, writes it under
// prefix: the policy document without its tenants, one document per tenant,
// and deletions of tenant documents the file no longer has. Unchanged
// documents are not rewritten. Replicas validate again against their cluster
// (floors must fit).
//
// The write is a read-modify-write guarded against other writers: the first
// transaction commits only if, since the read, no config document was
// created or changed and the policy document was neither deleted nor
// recreated (revision compares on the policy key and the tenants directory);
// otherwise nothing is written and the apply reads and tries again. A tenant
// document deleted since the read leaves no revision to compare (etcd has no
// count compare, and a marker key would not see other clients' deletions),
// so the guard cannot refuse it: the transaction reads the tenant count as it
// commits, and a count other than the one read shows the deletion after the
// first transaction's writes have landed; the apply then reads and writes
// again, restoring what the file says. After 5 attempts it fails, saying
// another writer is active and whether writes of this apply landed (etcd then
// holds a mix of the file and the other writer's documents; apply again).
// Up to 128 changes go in the first transaction, which every replica sees as
// one step. A larger change is written in several; the later ones are not
// guarded, so a concurrent writer and this apply are last-writer-wins per
// document, and replicas may refuse (and log) an intermediate state before
// the last write lands.
func ApplyConfig(ctx context.Context, cli *clientv3.Client, prefix, name string, data []byte) (ApplyResult, error) {
	if _, err := config.Parse(name, data); err != nil {
		return ApplyResult{}, err
	}
	base, tenants, err := split(data)
	if err != nil {
		return ApplyResult{}, &config.Error{File: name, Reason: err.Error()}
	}
	for _, t := range slices.Sorted(maps.Keys(tenants)) {
		if !validName(t) {
			return ApplyResult{}, &config.Error{File: name, Key: "tenants." + t, Reason: "a tenant name must be non-empty and without '/' to have an etcd key"}
		}
	}
	res := ApplyResult{PolicyUnchanged: true}
	for res.Attempts < applyAttempts {
		res.Attempts++
		cur, err := readDocuments(ctx, cli, prefix)
		if err != nil {
			return res, err
		}
		if afterApplyRead != nil {
			afterApplyRead()
		}
		ops := cur.diff(prefix, base, tenants, &res)
		if len(ops) == 0 {
			return res, nil
		}
		done, err := writeGuarded(ctx, cli, prefix, cur, ops, &res)
		if err != nil || done {
			return res, err
		}
		// A writer raced the read: read again and write what still differs.
	}
	if res.Transactions > 0 {
		return res, fmt.Errorf("write config under %s: another writer changed the config documents during each of %d attempts; "+
			"writes of this apply landed (%d transactions, last at revision %d: %d tenant documents written, %d deleted, policy document written: %t) "+
			"before a tenant document's deletion by the other writer was seen, so etcd holds a mix of this file and the other writer's documents; apply again when it is done",
			prefix, applyAttempts, res.Transactions, res.Revision, res.TenantsWritten, res.TenantsDeleted, !res.PolicyUnchanged)
	}
	return res, fmt.Errorf("write config under %s: another writer changed the config documents during each of %d attempts; nothing was written; try again when it is done", prefix, applyAttempts)
}

// documents are the config documents under a prefix as read at one revision.
type documents struct {
	rev           int64
	base          []byte // nil: no policy document
	baseCreateRev int64  // the policy key's create revision; 0 when absent
	tenants       map[string][]byte
}

// readDocuments reads the policy document and the tenant documents at one
// revision.
func readDocuments(ctx context.Context, cli *clientv3.Client, prefix string) (documents, error) {
	resp, err := cli.Get(ctx, ConfigKey(prefix))
	if err != nil {
		return documents{}, fmt.Errorf("read %s: %w", ConfigKey(prefix), err)
	}
	d := documents{rev: resp.Header.Revision}
	if len(resp.Kvs) == 1 {
		d.base, d.baseCreateRev = resp.Kvs[0].Value, resp.Kvs[0].CreateRevision
	}
	ts, err := cli.Get(ctx, prefix+tenantsDir, clientv3.WithPrefix(), clientv3.WithRev(d.rev))
	if err != nil {
		return documents{}, fmt.Errorf("read %s: %w", prefix+tenantsDir, err)
	}
	d.tenants = make(map[string][]byte, len(ts.Kvs))
	for _, kv := range ts.Kvs {
		_, t := classify(prefix, string(kv.Key))
		d.tenants[t] = kv.Value
	}
	return d, nil
}

// diff returns the writes that turn d into base and tenants, counting them
// in res.
func (d documents) diff(prefix string, base []byte, tenants map[string][]byte, res *ApplyResult) []clientv3.Op {
	var ops []clientv3.Op
	if d.base == nil || !bytes.Equal(d.base, base) {
		ops = append(ops, clientv3.OpPut(ConfigKey(prefix), string(base)))
	}
	for _, t := range slices.Sorted(maps.Keys(tenants)) {
		if v, ok := d.tenants[t]; !ok || !bytes.Equal(v, tenants[t]) {
			ops = append(ops, clientv3.OpPut(TenantKey(prefix, t), string(tenants[t])))
		}
	}
	for _, t := range slices.Sorted(maps.Keys(d.tenants)) {
		if _, ok := tenants[t]; !ok {
			ops = append(ops, clientv3.OpDelete(TenantKey(prefix, t)))
		}
	}
	return ops
}

// writeGuarded writes ops: the first transaction only if the documents are
// still as read (cur), the rest after it. It reports done when every op was
// written and no deletion raced the read; false with a nil error when the
// caller must read again: the guard failed and nothing was written, or a
// tenant document was deleted in the window, which the guard cannot see and
// which is found only after every op was written.
func writeGuarded(ctx context.Context, cli *clientv3.Client, prefix string, cur documents, ops []clientv3.Op, res *ApplyResult) (bool, error) {
	// The revision guard: nothing created or changed since the read, and
	// the policy document neither deleted nor recreated. A deleted tenant
	// document leaves no revision to compare; the count read first in the
	// same transaction shows it.
	guard := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(ConfigKey(prefix)), "<", cur.rev+1),
		clientv3.Compare(clientv3.CreateRevision(ConfigKey(prefix)), "=", cur.baseCreateRev),
		clientv3.Compare(clientv3.ModRevision(prefix+tenantsDir), "<", cur.rev+1).WithPrefix(),
	}
	count := clientv3.OpGet(prefix+tenantsDir, clientv3.WithPrefix(), clientv3.WithCountOnly())
	total := (len(ops) + 1 + maxTxnOps - 1) / maxTxnOps
	raced := false
	for first := true; len(ops) > 0; first = false {
		txn := cli.Txn(ctx)
		n := min(len(ops), maxTxnOps)
		then := ops[:n]
		if first {
			n = min(len(ops), maxTxnOps-1)
			then = append([]clientv3.Op{count}, ops[:n]...)
			txn = txn.If(guard...)
		}
		resp, err := txn.Then(then...).Commit()
		if err != nil {
			return false, fmt.Errorf("write config under %s (%d of %d transactions done): %w", prefix, res.Transactions, total, err)
		}
		if first {
			if !resp.Succeeded {
				return false, nil // nothing written
			}
			raced = resp.Responses[0].GetResponseRange().GetCount() != int64(len(cur.tenants))
		}
		for _, op := range ops[:n] {
			switch {
			case op.IsDelete():
				res.TenantsDeleted++
			case string(op.KeyBytes()) == ConfigKey(prefix):
				res.PolicyUnchanged = false
			default:
				res.TenantsWritten++
			}
		}
		res.Revision = resp.Header.Revision
		res.Transactions++
		ops = ops[n:]
	}
	return !raced, nil
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
// under prefix, read at one revision; base is nil when there is no policy
// document.
func ReadDocuments(ctx context.Context, cli *clientv3.Client, prefix string) (base []byte, tenants map[string][]byte, rev int64, err error) {
	d, err := readDocuments(ctx, cli, prefix)
	if err != nil {
		return nil, nil, 0, err
	}
	return d.base, d.tenants, d.rev, nil
}
