package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// creditFreezeKey holds the fleet's credit freeze.
const creditFreezeKey = "credit-freeze"

// CreditFreezeKey returns the key of the fleet's credit freeze.
func CreditFreezeKey(prefix string) string { return prefix + creditFreezeKey }

// CreditFreezeMark is an operator's freeze of every tenant's burst credit on
// every replica. Until is absolute, so that replicas that read the mark at
// different moments end the freeze at the same one.
type CreditFreezeMark struct {
	Until  time.Time `json:"until"`
	Reason string    `json:"reason,omitempty"`
	By     string    `json:"by,omitempty"`
	At     time.Time `json:"at"`
}

// Describe is the freeze's reason as replicas show it: who, when and why.
func (m CreditFreezeMark) Describe() string { return describeMark("frozen", m.By, m.At, m.Reason) }

// decodeCreditFreeze reads the freeze mark. Unlike a drain mark, one
// without a readable end cannot be applied: a freeze must end.
func decodeCreditFreeze(value []byte) (CreditFreezeMark, error) {
	var m CreditFreezeMark
	if err := json.Unmarshal(value, &m); err != nil {
		return m, fmt.Errorf("credit freeze: %w", err)
	}
	if m.Until.IsZero() {
		return m, fmt.Errorf("credit freeze: no until")
	}
	return m, nil
}

// PutCreditFreeze writes the fleet's credit freeze, replacing any; every
// replica applies it when its watch delivers it. It returns the revision of
// the write.
func PutCreditFreeze(ctx context.Context, cli *clientv3.Client, prefix string, m CreditFreezeMark) (int64, error) {
	if m.Until.IsZero() {
		return 0, fmt.Errorf("credit freeze: until is required")
	}
	b, err := json.Marshal(m)
	if err != nil {
		return 0, fmt.Errorf("credit freeze: %w", err)
	}
	resp, err := cli.Put(ctx, CreditFreezeKey(prefix), string(b))
	if err != nil {
		return 0, fmt.Errorf("credit freeze: write %s: %w", CreditFreezeKey(prefix), err)
	}
	return resp.Header.Revision, nil
}

// DeleteCreditFreeze removes the fleet's credit freeze; every replica thaws.
// It reports whether there was one.
func DeleteCreditFreeze(ctx context.Context, cli *clientv3.Client, prefix string) (bool, error) {
	resp, err := cli.Delete(ctx, CreditFreezeKey(prefix))
	if err != nil {
		return false, fmt.Errorf("credit thaw: delete %s: %w", CreditFreezeKey(prefix), err)
	}
	return resp.Deleted > 0, nil
}

// GetCreditFreeze reads the fleet's credit freeze; false when there is none
// (a mark whose end has passed is returned: the caller compares Until).
func GetCreditFreeze(ctx context.Context, cli *clientv3.Client, prefix string) (CreditFreezeMark, bool, error) {
	resp, err := cli.Get(ctx, CreditFreezeKey(prefix))
	if err != nil {
		return CreditFreezeMark{}, false, fmt.Errorf("read %s: %w", CreditFreezeKey(prefix), err)
	}
	if len(resp.Kvs) == 0 {
		return CreditFreezeMark{}, false, nil
	}
	m, err := decodeCreditFreeze(resp.Kvs[0].Value)
	return m, err == nil, err
}

// reconcileFreeze applies the freeze key to the engine: a mark freezes until
// its end (one already past thaws), and no key thaws. The key is
// authoritative: with etcd, the Operator RPC freezes through it too (and
// applies its freeze at once, which a put and a delete arriving in one
// watch response must still undo). An unreadable mark is logged and left
// alone.
func (c *Controller) reconcileFreeze() {
	key := CreditFreezeKey(c.prefix)
	e, ok := c.st.kvs[kindFreeze][key]
	if !ok {
		if c.opts.Engine.ThawCredit() {
			c.opts.Logger.Info("credit freeze removed; burst credit lends again", "key", key)
		}
		return
	}
	m, err := decodeCreditFreeze(e.value)
	if err != nil {
		c.st.badKeys.warnOnce(c.opts.Logger, key, "credit freeze unreadable; not applied", err)
		return
	}
	delete(c.st.badKeys, key)
	c.opts.Engine.FreezeCredit(m.Until, m.Describe())
	c.opts.Logger.Info("credit freeze applied", "until", m.Until, "reason", m.Describe())
}
