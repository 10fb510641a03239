// Package etcdmembers is the etcd side of replica membership: the key layout
// under which each sluiced registers itself (with a lease, so that a replica
// that dies leaves the list when its lease expires) and a client.MemberSource
// that watches it, for routers that use client.Router.
//
// Layout: PREFIX + "members/" + ID holds the JSON of a client.Member,
// {"id": ID, "grpc_addr": "host:port"}, attached to the replica's lease.
// PREFIX is the control plane's key prefix, "/sluice/" by default.
package etcdmembers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/admission/client"
)

// Dir is the directory of member keys under the control-plane prefix.
const Dir = "members/"

// Prefix returns the key prefix of every member key under prefix.
func Prefix(prefix string) string { return prefix + Dir }

// Key returns the key of the member id under prefix.
func Key(prefix, id string) string { return prefix + Dir + id }

// Encode returns the value stored under a member's key.
func Encode(m client.Member) ([]byte, error) {
	if err := check(m); err != nil {
		return nil, err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("member %s: %w", m.ID, err)
	}
	return b, nil
}

// Decode reads the value under key, which must be a member key under prefix
// whose last segment is the member's id.
func Decode(prefix, key string, value []byte) (client.Member, error) {
	id, ok := strings.CutPrefix(key, Prefix(prefix))
	if !ok {
		return client.Member{}, fmt.Errorf("member key %s: not under %s", key, Prefix(prefix))
	}
	var m client.Member
	dec := json.NewDecoder(strings.NewReader(string(value)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return client.Member{}, fmt.Errorf("member key %s: %w", key, err)
	}
	if m.ID != id {
		return client.Member{}, fmt.Errorf("member key %s: id %q does not match the key", key, m.ID)
	}
	if err := check(m); err != nil {
		return client.Member{}, fmt.Errorf("member key %s: %w", key, err)
	}
	return m, nil
}

func check(m client.Member) error {
	switch {
	case m.ID == "" || strings.Contains(m.ID, "/"):
		return fmt.Errorf("member id %q: want a non-empty name without '/'", m.ID)
	case m.Addr == "":
		return fmt.Errorf("member %s: empty grpc_addr", m.ID)
	}
	return nil
}

// List returns the members registered under prefix (normalized as
// NewSource does), sorted by ID. Entries that are not members are skipped
// and returned as errors beside the list.
func List(ctx context.Context, cli *clientv3.Client, prefix string) ([]client.Member, []error, error) {
	prefix = normalizePrefix(prefix)
	resp, err := cli.Get(ctx, Prefix(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", Prefix(prefix), err)
	}
	var out []client.Member
	var bad []error
	for _, kv := range resp.Kvs {
		m, err := Decode(prefix, string(kv.Key), kv.Value)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b client.Member) int { return strings.Compare(a.ID, b.ID) })
	return out, bad, nil
}

// Source watches the members under a prefix. It implements
// client.MemberSource.
type Source struct {
	cli    *clientv3.Client
	prefix string
	log    *slog.Logger
	retry  time.Duration
}

// NewSource returns a Source of the members under prefix ("/sluice/" in
// production), normalized as the control plane's prefix is: "" is
// "/sluice/", and "/sluice" and "/sluice/" name the same keys. log receives
// the entries it skips and the errors it retries on; nil discards them.
func NewSource(cli *clientv3.Client, prefix string, log *slog.Logger) *Source {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Source{cli: cli, prefix: normalizePrefix(prefix), log: log, retry: 500 * time.Millisecond}
}

// defaultPrefix is the control plane's default key prefix
// (controlplane.DefaultPrefix, which imports this package).
const defaultPrefix = "/sluice/"

// normalizePrefix is controlplane.NormalizePrefix: prefix ending in exactly
// one "/", "" giving defaultPrefix.
func normalizePrefix(prefix string) string {
	if prefix == "" {
		return defaultPrefix
	}
	return strings.TrimRight(prefix, "/") + "/"
}

// Watch implements client.MemberSource: it reads the members, sends them, and
// follows the changes from the revision it read. When the watch breaks (an
// outage, a compaction) it reads again; while etcd is unreachable the last
// list stays in force.
func (s *Source) Watch(ctx context.Context) <-chan []client.Member {
	out := make(chan []client.Member, 1)
	go func() {
		defer close(out)
		for ctx.Err() == nil {
			if err := s.follow(ctx, out); err != nil && ctx.Err() == nil {
				s.log.Warn("member watch broke; reading the members again", "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(s.retry):
				}
			}
		}
	}()
	return out
}

// follow reads the members once, then follows the watch until it breaks.
func (s *Source) follow(ctx context.Context, out chan []client.Member) error {
	resp, err := s.cli.Get(ctx, Prefix(s.prefix), clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("read %s: %w", Prefix(s.prefix), err)
	}
	members := make(map[string]client.Member, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		s.put(members, string(kv.Key), kv.Value)
	}
	if !send(ctx, out, members) {
		return nil
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range s.cli.Watch(wctx, Prefix(s.prefix), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch %s: %w", Prefix(s.prefix), err)
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				delete(members, strings.TrimPrefix(string(ev.Kv.Key), Prefix(s.prefix)))
				continue
			}
			s.put(members, string(ev.Kv.Key), ev.Kv.Value)
		}
		if len(wr.Events) > 0 && !send(ctx, out, members) {
			return nil
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return errors.New("watch closed")
}

// put records a member, or logs and drops an entry that is not one.
func (s *Source) put(members map[string]client.Member, key string, value []byte) {
	id := strings.TrimPrefix(key, Prefix(s.prefix))
	m, err := Decode(s.prefix, key, value)
	if err != nil {
		s.log.Warn("skipping a member entry", "key", key, "err", err)
		delete(members, id)
		return
	}
	members[id] = m
}

// send delivers a copy of the list, replacing one the Router has not read
// yet (only the latest matters). It reports false when ctx ended.
func send(ctx context.Context, out chan []client.Member, members map[string]client.Member) bool {
	list := slices.SortedFunc(maps.Values(members), func(a, b client.Member) int { return strings.Compare(a.ID, b.ID) })
	for {
		select {
		case out <- list:
			return true
		case <-ctx.Done():
			return false
		default:
		}
		select {
		case <-out: // drop the stale list nobody read
		default:
		}
	}
}
