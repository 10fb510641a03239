package drill

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-sched/sluice/admission/client"
	"github.com/sluice-sched/sluice/admission/client/etcdmembers"
	"github.com/sluice-sched/sluice/admission/sharing"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// reclaimShare is the share of a domain's KV limit, as the replicas
// together held it before the kill, that counts as back: the replicas'
// holdings move between their reports, so the sums are not exact.
const reclaimShare = 0.95

// reclaimSlack is what the promise allows past the moment a dead
// replica's holding lapses, in reconcile intervals: a survivor's next
// report brings it back (one interval), on a machine that may be busy.
// It is never under reclaimSlackMin: at short intervals ten of them are
// less than a busy machine's scheduling delays (the self-contained
// fleet's 100 ms intervals give a second; on two cores under -race, with
// another process spinning, the capacity came back 2.05 s past the member
// TTL).
const (
	reclaimSlack    = 10
	reclaimSlackMin = 3 * time.Second
)

// reclaimBound is kill-replica's promise: the killed replica's KV capacity
// (what its leases held and its weight in the free part) is the others'
// again within its member TTL (with etcd: when its member lease expires)
// or SilentHoldRounds reconcile intervals (without), and reclaimSlack
// intervals more (reclaimSlackMin at least).
func (f *Fleet) reclaimBound() (time.Duration, string) {
	hold := sharing.SilentHoldRounds * f.Interval
	what := fmt.Sprintf("%d reconcile intervals", sharing.SilentHoldRounds)
	if f.Etcd != nil && f.MemberTTL > 0 {
		hold, what = max(hold, f.MemberTTL), "the member TTL"
	}
	slack := max(reclaimSlack*f.Interval, reclaimSlackMin)
	return hold + slack, fmt.Sprintf("%s (%v) + %v", what, hold, slack)
}

// kvLimits sums, per domain, the KV limits of the replicas that answer
// ListDomains now.
func (r *run) kvLimits(ctx context.Context) map[string]int64 {
	sum := map[string]int64{}
	for _, m := range r.f.members() {
		op, err := r.f.operator(m.Addr)
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := op.ListDomains(cctx, &admissionv1.ListDomainsRequest{})
		cancel()
		if err != nil {
			continue // the killed replica, or one not answering now
		}
		for _, d := range resp.GetDomains() {
			sum[d.GetId()] += d.GetKvLimit()
		}
	}
	return sum
}

// watchReclaim polls the replicas' KV limits from the kill (at killed,
// with before the sums just before it) until every domain's sum is back
// to reclaimShare of before or the promise's bound has passed, and adds
// the promise; the returned func waits for it.
func (r *run) watchReclaim(ctx context.Context, target string, before map[string]int64, killed time.Duration) func() {
	bound, promise := r.f.reclaimBound()
	done := make(chan struct{})
	go func() {
		defer close(done)
		lowest, lowestAt := 1.0, ""
		member := true
		left := func() {
			if member && !slices.ContainsFunc(r.f.members(), func(m client.Member) bool { return m.ID == target }) {
				member = false
				r.note("%s left the membership", target)
			}
		}
		// After the verdict, the timeline still shows when the membership
		// let the replica go (where it does before the bound).
		defer func() {
			for member && r.now()-killed <= bound && ctx.Err() == nil {
				left()
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		}()
		for {
			now := r.now()
			left()
			sums := r.kvLimits(ctx)
			back := true
			for id, b := range before {
				if b <= 0 {
					continue
				}
				share := float64(sums[id]) / float64(b)
				if share < lowest {
					lowest, lowestAt = share, id
				}
				back = back && share >= reclaimShare
			}
			if back {
				at := now - killed
				r.mu.Lock()
				s := secs(at)
				r.rep.CapacityBackSeconds = &s
				r.mu.Unlock()
				r.note("the replicas' KV limits are back to %.0f%% of before's on every domain", 100*reclaimShare)
				r.promise(Promise{Name: "dead replica's capacity back", Held: at <= bound,
					Detail: fmt.Sprintf("%s's share of the domains' KV back to the others %.2fs after the kill (bound %s = %.2fs); lowest %s", target, at.Seconds(), promise, bound.Seconds(), low(lowest, lowestAt))})
				return
			}
			if now-killed > bound || ctx.Err() != nil {
				r.promise(Promise{Name: "dead replica's capacity back", Held: false,
					Detail: fmt.Sprintf("%s's share of the domains' KV not back to the others %.2fs after the kill (bound %s = %.2fs): %s; lowest %s", target, (now - killed).Seconds(), promise, bound.Seconds(), shares(sums, before), low(lowest, lowestAt))})
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() { <-done }
}

func low(share float64, domain string) string {
	if domain == "" {
		return "-"
	}
	return fmt.Sprintf("%.0f%% of before's on %s", 100*share, domain)
}

// shares lists each domain's KV limits now as a share of before's.
func shares(now, before map[string]int64) string {
	ids := make([]string, 0, len(before))
	for id := range before {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var parts []string
	for _, id := range ids {
		if before[id] > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", id, 100*float64(now[id])/float64(before[id])))
		}
	}
	return strings.Join(parts, ", ")
}

// memberLease is the lease the replica's member key is attached to in
// etcd; 0 without etcd or key.
func (r *run) memberLease(ctx context.Context, id string) clientv3.LeaseID {
	if r.f.Etcd == nil {
		return 0
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := r.f.Etcd.Get(cctx, etcdmembers.Key(r.f.Prefix, id))
	if err != nil || len(resp.Kvs) == 0 {
		return 0
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

// noteMemberLease notes what etcd says is left of the killed replica's
// member lease: when the membership will see it gone.
func (r *run) noteMemberLease(ctx context.Context, id string, lease clientv3.LeaseID) {
	if lease == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if resp, err := r.f.Etcd.TimeToLive(cctx, lease); err == nil && resp.TTL > 0 {
		r.note("%s's member lease: %ds of %ds left (etcd)", id, resp.TTL, resp.GrantedTTL)
	}
}
