package fleetsim

import (
	"iter"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/tokenbucket"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// leaseTTL is the lease TTL the replicas' views report (admission's
// default): it caps how long a KV holding outlives a silent replica.
const leaseTTL = time.Minute

// simTenant is one tenant's state on one replica: the engine's four
// buckets (floor and critical without limits, so never reported) and the
// whole limits of its policy.
type simTenant struct {
	name    string
	rank    int
	b       [sharing.TenantKinds]tokenbucket.Bucket
	limits  [sharing.TenantKinds][2]int64 // rate, burst
	created int64
}

var _ sharing.Tenant = (*simTenant)(nil)

func newSimTenant(rank int, limits [sharing.TenantKinds][2]int64, now int64) *simTenant {
	t := &simTenant{name: tenantName(rank), rank: rank, limits: limits, created: now}
	for k, l := range limits {
		t.b[k] = tokenbucket.New(l[0], l[1], 0, now)
	}
	return t
}

// tenantName names the tenant of a rank (0 is the busiest), as
// sluicectl fleet generate names its tenants.
func tenantName(rank int) string {
	s := strconv.Itoa(rank)
	if len(s) < 7 {
		s = strings.Repeat("0", 7-len(s)) + s
	}
	return "fleet-" + s
}

// rankOf is tenantName's inverse; -1 for another name.
func rankOf(name string) int {
	s, ok := strings.CutPrefix(name, "fleet-")
	if !ok {
		return -1
	}
	r, err := strconv.Atoi(s)
	if err != nil || r < 0 {
		return -1
	}
	return r
}

// Name implements sharing.Tenant.
func (t *simTenant) Name() string { return t.name }

// Buckets implements sharing.Tenant.
func (t *simTenant) Buckets() [sharing.TenantKinds]*tokenbucket.Bucket {
	return [sharing.TenantKinds]*tokenbucket.Bucket{&t.b[0], &t.b[1], &t.b[2], &t.b[3]}
}

// Limits implements sharing.Tenant.
func (t *simTenant) Limits(k sharing.Kind) (rate, burst int64) { return t.limits[k][0], t.limits[k][1] }

// CreditLent implements sharing.Tenant: the simulated tier lends no
// burst credit.
func (t *simTenant) CreditLent() int64 { return 0 }

// Created implements sharing.Tenant.
func (t *simTenant) Created() int64 { return t.created }

// FailClosed implements sharing.Tenant: the simulated tier fails open.
func (t *simTenant) FailClosed() bool { return false }

// ResetLimits implements sharing.Tenant: the whole limits, levels kept.
func (t *simTenant) ResetLimits(int64) {
	for k, l := range t.limits {
		t.b[k].SetLimits(l[0], l[1], 0)
	}
}

// simDomain is one NVL72 domain as one replica holds it: its own
// capacity (each replica's share differs), the topology shared.
type simDomain struct {
	topo *topology.Domain
	cap  pd.DomainCapacity
	// reads: this replica reads the domain's engines; lookedAt: when
	// placement last tried it (looked: ever).
	reads    bool
	looked   bool
	lookedAt int64
}

var _ sharing.Domain = (*simDomain)(nil)

// ID implements sharing.Domain.
func (d *simDomain) ID() string { return d.topo.ID }

// Removed implements sharing.Domain: the simulated fleet does not change.
func (d *simDomain) Removed() bool { return false }

// Capacity implements sharing.Domain.
func (d *simDomain) Capacity() *pd.DomainCapacity { return &d.cap }

// RestoreCapacity implements sharing.Domain.
func (d *simDomain) RestoreCapacity() { _ = d.cap.Resize(d.topo) } // the same domain: cannot fail

// lease is an admission's KV hold, freed at end.
type lease struct {
	end int64
	dom int32
}

// replica is one sluiced: the engine as a sharing.View sees it, its
// strategy, and what the simulation keeps of its admissions.
type replica struct {
	sim   *sim
	id    string
	strat sharing.Strategy

	mu      sync.Mutex
	tenants []*simTenant // with state, in the order they came
	byRank  map[int]*simTenant
	domains []simDomain // every domain, in cluster order; never grows
	cursor  int         // the next domain to place on
	leases  []lease     // in end order (one lease time for all)
	nextID  uint64
	// readPhase is when in each EngineRead this replica reads the engines
	// it reads: half a read period off its reconciles' phase, so that a
	// reading waits half a period, on average, to be published.
	readPhase int64
}

var (
	_ sharing.View     = (*replica)(nil)
	_ sharing.Readings = (*replica)(nil)
)

// Lock implements sharing.View.
func (r *replica) Lock() { r.mu.Lock() }

// Unlock implements sharing.View.
func (r *replica) Unlock() { r.mu.Unlock() }

// NowLocked implements sharing.View: the virtual time.
func (r *replica) NowLocked() int64 { return r.sim.now }

// Wall implements sharing.View: the virtual time as a wall time.
func (r *replica) Wall() time.Time { return r.sim.base.Add(time.Duration(r.sim.now)) }

// TenantsLocked implements sharing.View: the tenants routed here that
// have state, in the order they came (deterministic, unlike a map's).
func (r *replica) TenantsLocked() iter.Seq[sharing.Tenant] {
	return func(yield func(sharing.Tenant) bool) {
		for _, t := range r.tenants {
			if !yield(t) {
				return
			}
		}
	}
}

// TenantLocked implements sharing.View.
func (r *replica) TenantLocked(name string) sharing.Tenant {
	if t, ok := r.byRank[rankOf(name)]; ok {
		return t
	}
	return nil
}

// DomainsLocked implements sharing.View.
func (r *replica) DomainsLocked() iter.Seq[sharing.Domain] {
	return func(yield func(sharing.Domain) bool) {
		for i := range r.domains {
			if !yield(&r.domains[i]) {
				return
			}
		}
	}
}

// DomainLocked implements sharing.View.
func (r *replica) DomainLocked(id string) sharing.Domain {
	if i, ok := r.sim.domainIndex[id]; ok {
		return &r.domains[i]
	}
	return nil
}

// LeaseLocked implements sharing.View. Only strict mode asks for a
// lease's charge; the batched replicas keep none.
func (r *replica) LeaseLocked(uint64) (sharing.Charge, bool) { return sharing.Charge{}, false }

// RevokeLocked implements sharing.View. Only strict mode revokes.
func (r *replica) RevokeLocked(string, uint64) {}

// OwnEngineReadingLocked implements sharing.Readings: a domain this replica
// reads has a reading every EngineRead, at the replica's phase (the
// values are placeholders: the simulation measures their relay).
func (r *replica) OwnEngineReadingLocked(d sharing.Domain) (sharing.EngineReading, int64, bool) {
	if !d.(*simDomain).reads || r.sim.now < r.readPhase {
		return sharing.EngineReading{}, 0, false
	}
	now := r.sim.now
	at := now - (now-r.readPhase)%int64(EngineRead)
	return sharing.EngineReading{Queue: 3, Running: 40, KVUsage: 0.61, Age: time.Duration(now - at)}, at, true
}

// EngineReadingWantedLocked implements sharing.Readings: placement tried the
// domain within EngineStale.
func (r *replica) EngineReadingWantedLocked(d sharing.Domain) bool {
	sd := d.(*simDomain)
	return r.sim.cfg.EngineReaders > 0 && sd.looked && r.sim.now-sd.lookedAt <= int64(EngineStale)
}

// RelayEngineReadingLocked implements sharing.Readings: it counts the
// reading, and its age.
func (r *replica) RelayEngineReadingLocked(_ sharing.Domain, e sharing.EngineReading) {
	r.sim.res.Relayed++
	_ = r.sim.relayAge.RecordValue(e.Age.Microseconds())
}

// LeaseTTLLocked implements sharing.View.
func (r *replica) LeaseTTLLocked() time.Duration { return leaseTTL }

// Background implements sharing.View: at once, on the caller's
// goroutine, so that the run stays deterministic.
func (r *replica) Background(fn func()) { fn() }
