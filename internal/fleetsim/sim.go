package fleetsim

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/rendezvous"
	"github.com/sluice-sched/sluice/pd"
	"github.com/sluice-sched/sluice/topology"
)

// The workload's fixed shape; Config sets its scale.
const (
	// Interval is the batched reconcile period (sluiced's default).
	Interval = 100 * time.Millisecond
	// ZipfExponent is s of the tenants' rates: rank k (0 the busiest)
	// offers a share ∝ (k+1)^−s of the fleet's rate.
	ZipfExponent = 1.1
	// Overload is each tenant's offered rate ÷ its quota: every tenant
	// asks for more than it may have, so that the quota binds.
	Overload = 1.25
	// PromptTokens and OutputTokens are every request's size, on the
	// catalog's "small" model; Weight is its weighted tokens (prompt + 4 ×
	// output, the default output_token_weight).
	PromptTokens = 1000
	OutputTokens = 200
	Weight       = PromptTokens + 4*OutputTokens
	// LeaseTime is how long an admitted request holds its KV.
	LeaseTime = 2 * time.Second
	// minBurstRequests is the least burst of a tenant, in requests: a
	// tenant of the tail can send a few requests however small its rate.
	minBurstRequests = 5
	// placeTries is how many domains an admission tries, from the
	// replica's cursor on, before it is refused for capacity.
	placeTries = 3
	// settleBand is how close the grants' sum must come to the rate.
	settleBand = 0.05
	// EngineRead is how often a reader reads a domain's engines
	// (sluiced's --engine-metrics-period); EngineStale how long a replica
	// wants a domain's readings after placement weighed it (its
	// feedback.stale).
	EngineRead  = 100 * time.Millisecond
	EngineStale = 500 * time.Millisecond
)

// Config is the scale of a run. A zero field takes its default.
type Config struct {
	Replicas int           `json:"replicas"` // N, default 1,000
	Tenants  int           `json:"tenants"`  // T, default 1,000,000
	Domains  int           `json:"domains"`  // D (GB200 NVL72), default 1,400
	Shards   int           `json:"shards"`   // S, default 3
	Duration time.Duration `json:"duration"` // virtual, default 4 s
	Seed     uint64        `json:"seed"`     // default 1
	Rate     float64       `json:"rate"`     // the fleet's offered requests/s, default 200,000
	// EngineReaders, when not 0, simulates the engines' readings and
	// their relay: each domain's engines are read every EngineRead by the
	// first EngineReaders replicas in its rendezvous order of the
	// replicas, which publish each reading in their reconcile; a replica
	// asks for the readings of the domains it weighed within EngineStale.
	EngineReaders int `json:"engineReaders,omitempty"`
}

// DefaultConfig is the fleet the simulation is for: a 100k-GPU fleet
// (1,400 NVL72 domains) behind 1,000 replicas serving a million tenants,
// its keys on 3 shards.
func DefaultConfig() Config {
	return Config{Replicas: 1000, Tenants: 1_000_000, Domains: 1400, Shards: 3, Duration: 4 * time.Second, Seed: 1, Rate: 200_000}
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Replicas == 0 {
		c.Replicas = d.Replicas
	}
	if c.Tenants == 0 {
		c.Tenants = d.Tenants
	}
	if c.Domains == 0 {
		c.Domains = d.Domains
	}
	if c.Shards == 0 {
		c.Shards = d.Shards
	}
	if c.Duration == 0 {
		c.Duration = d.Duration
	}
	if c.Seed == 0 {
		c.Seed = d.Seed
	}
	if c.Rate == 0 {
		c.Rate = d.Rate
	}
	return c
}

// Validate reports the first field out of range (zero fields are valid:
// they take defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Replicas < 2 || c.Replicas > 100_000:
		return fmt.Errorf("fleetsim: replicas %d: want 2 to 100000", c.Replicas)
	case c.Tenants < 2 || c.Tenants > 10_000_000:
		return fmt.Errorf("fleetsim: tenants %d: want 2 to 10000000", c.Tenants)
	case c.Domains < 1 || c.Domains > 100_000:
		return fmt.Errorf("fleetsim: domains %d: want 1 to 100000", c.Domains)
	case c.Shards < 1 || c.Shards > Slots:
		return fmt.Errorf("fleetsim: shards %d: want 1 to %d", c.Shards, Slots)
	case c.Duration < 2*Interval || c.Duration > time.Hour:
		return fmt.Errorf("fleetsim: duration %v: want %v to 1h", c.Duration, 2*Interval)
	case !(c.Rate > 0 && c.Rate <= 1e9):
		return fmt.Errorf("fleetsim: rate %g: want a positive number of requests/s up to 1e9", c.Rate)
	case c.EngineReaders < 0 || c.EngineReaders >= c.Replicas:
		return fmt.Errorf("fleetsim: engine readers %d: want 0 (none simulated) to %d, fewer than the replicas", c.EngineReaders, c.Replicas-1)
	}
	return nil
}

// route is where a tenant's requests go: its replicas, taken in turn.
type route struct {
	members []int
	next    int
	most    int // the most replicas it had at once
}

// event is a change of a hot tenant's replicas mid-run and the grants'
// sum sampled every interval after it.
type event struct {
	kind     string
	rank     int
	departed int // the replica that left (leave), -1 otherwise
	before   int
	samples  []int64 // Σ token-bucket rates over its replicas, at each interval from the change on
}

// sim is one run: the fleet, the store and the workload, in virtual time.
type sim struct {
	cfg   Config
	base  time.Time
	now   int64 // virtual nanoseconds since the start
	clk   *clock.Manual
	store *shardedStore

	replicas    []*replica
	domainIndex map[string]int
	cost        pd.Cost

	zipf      *rand.Zipf
	norm      float64 // Σ (k+1)^−s over the tenants
	perRep    float64 // requests/s one replica carries on average
	hot       int     // tenants ranked below hot are spread over several replicas
	routes    map[int]*route
	admitted  []int64 // weighted tokens admitted, per hot (or event) tenant
	seen      []uint64
	events    []*event
	changeAt  int64
	changed   bool
	hashSalt  uint64
	nextReq   int64
	requestNs float64
	relayAge  *hdrhistogram.Histogram // the relayed engine readings' ages, µs

	res Result
}

// Run simulates cfg and returns what it measured.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, err := newSim(cfg.withDefaults())
	if err != nil {
		return nil, err
	}
	if err := s.run(ctx); err != nil {
		return nil, err
	}
	return s.result(), nil
}

func newSim(cfg Config) (*sim, error) {
	s := &sim{
		cfg:         cfg,
		base:        time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC),
		domainIndex: make(map[string]int, cfg.Domains),
		routes:      make(map[int]*route),
		seen:        make([]uint64, (cfg.Tenants+63)/64),
		hashSalt:    mix(cfg.Seed),
		requestNs:   1e9 / cfg.Rate,
		relayAge:    hdrhistogram.New(1, int64(time.Hour/time.Microsecond), 3),
	}
	s.clk = clock.NewManual(s.base)
	s.store = newShardedStore(cfg.Shards, s.clk)
	rng := rand.New(rand.NewPCG(cfg.Seed, mix(cfg.Seed^0x5eed)))
	s.zipf = rand.NewZipf(rng, ZipfExponent, 1, uint64(cfg.Tenants-1))
	for k := range cfg.Tenants {
		s.norm += math.Pow(float64(k+1), -ZipfExponent)
	}
	s.perRep = cfg.Rate / float64(cfg.Replicas)
	for s.hot < cfg.Tenants && s.offered(s.hot) > s.perRep {
		s.hot++
	}
	for k := range max(s.hot, 2) {
		s.routes[k] = s.hotRoute(k)
	}
	s.admitted = make([]int64, max(s.hot, 2))
	if err := s.buildFleet(); err != nil {
		return nil, err
	}
	s.planEvents()
	return s, nil
}

// offered is tenant k's offered requests/s.
func (s *sim) offered(k int) float64 {
	return s.cfg.Rate * math.Pow(float64(k+1), -ZipfExponent) / s.norm
}

// spread is how many replicas tenant k is routed to: one for a tenant
// that offers no more than a replica carries on average (the fleet's
// rate ÷ N), else as many as it takes to carry it at that average.
func (s *sim) spread(k int) int {
	return min(s.cfg.Replicas, max(1, int(math.Ceil(s.offered(k)/s.perRep))))
}

// home is the first replica of tenant k: a hash of its rank.
func (s *sim) home(k int) int { return int(mix(uint64(k)^s.hashSalt) % uint64(s.cfg.Replicas)) }

// hotRoute is tenant k's route: spread(k) consecutive replicas from home.
func (s *sim) hotRoute(k int) *route {
	n := s.spread(k)
	r := &route{most: n}
	for i := range n {
		r.members = append(r.members, (s.home(k)+i)%s.cfg.Replicas)
	}
	return r
}

// limits is tenant k's policy: a token quota of its offered rate ÷
// Overload (weighted tokens), with a burst of one second of it (at least
// minBurstRequests requests), and an RPS bucket twice as large, so that
// the token bucket is the one that binds.
func (s *sim) limits(k int) [sharing.TenantKinds][2]int64 {
	quota := s.offered(k) / Overload
	tokRate := max(1, int64(math.Round(quota*Weight)))
	tokBurst := max(tokRate, minBurstRequests*Weight)
	rpsRate := max(1, int64(math.Round(2*quota*sharing.RequestUnit)))
	rpsBurst := max(rpsRate, 2*minBurstRequests*sharing.RequestUnit)
	var l [sharing.TenantKinds][2]int64
	l[sharing.KindRPS] = [2]int64{rpsRate, rpsBurst}
	l[sharing.KindTokens] = [2]int64{tokRate, tokBurst}
	return l
}

// buildFleet makes the domains and the replicas. Each replica holds its
// own capacity of every domain (its share is its own); they are copies of
// one capacity per domain built by pd.NewDomainCapacity, which is what
// building each anew would give at time 0, at a fraction of the time.
func (s *sim) buildFleet() error {
	cat, err := pd.NewCatalog(pd.DefaultModels())
	if err != nil {
		return fmt.Errorf("fleetsim: catalog: %w", err)
	}
	m, _ := cat.Get("small")
	template := topology.Simulated().Domains[0] // a GB200 NVL72 rack
	topos := make([]topology.Domain, s.cfg.Domains)
	protos := make([]*pd.DomainCapacity, s.cfg.Domains)
	for i := range topos {
		topos[i] = template.Clone()
		topos[i].ID = fmt.Sprintf("nvl72-%04d", i+1)
		s.domainIndex[topos[i].ID] = i
		if protos[i], err = pd.NewDomainCapacity(&topos[i], cat, pd.DefaultConfig(), 0); err != nil {
			return fmt.Errorf("fleetsim: domain %s: %w", topos[i].ID, err)
		}
	}
	if s.cost, err = protos[0].Cost(m, PromptTokens, OutputTokens); err != nil {
		return fmt.Errorf("fleetsim: request cost: %w", err)
	}
	readers := s.engineReaders(topos)
	for i := range s.cfg.Replicas {
		r := &replica{sim: s, id: fmt.Sprintf("r%05d", i), byRank: make(map[int]*simTenant), domains: make([]simDomain, s.cfg.Domains),
			readPhase: (int64(i)*int64(Interval)/int64(s.cfg.Replicas) + int64(EngineRead)/2) % int64(EngineRead)}
		r.cursor = int(mix(uint64(i)^s.hashSalt^0xd0) % uint64(s.cfg.Domains))
		for j := range r.domains {
			r.domains[j] = simDomain{topo: &topos[j], cap: *protos[j], reads: readers[j][r.id]}
		}
		// Patience: a call runs in virtual time, however long it takes.
		r.strat, err = sharing.New(r, r, s.store, sharing.Options{Mode: sharing.Batched, Replica: r.id, Replicas: s.cfg.Replicas, Interval: Interval, Patience: time.Hour})
		if err != nil {
			return fmt.Errorf("fleetsim: replica %s: %w", r.id, err)
		}
		r.Lock()
		for j := range r.domains {
			r.strat.CapacityRebuiltLocked(0, &r.domains[j], nil) // new to the cluster: a 1/N slice
		}
		r.Unlock()
		s.replicas = append(s.replicas, r)
	}
	return nil
}

// engineReaders is, per domain, the replicas that read its engines: the
// first EngineReaders in its rendezvous order of the replicas' ids, as
// sluiced chooses them over the etcd membership (none where engines are
// not simulated).
func (s *sim) engineReaders(topos []topology.Domain) []map[string]bool {
	out := make([]map[string]bool, len(topos))
	if s.cfg.EngineReaders == 0 {
		return out
	}
	ids := make([]string, s.cfg.Replicas)
	hashes := make([]uint64, s.cfg.Replicas)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%05d", i)
		hashes[i] = rendezvous.NodeHash(ids[i])
	}
	order := make([]int, s.cfg.Replicas)
	for j := range topos {
		h := rendezvous.Hash(topos[j].ID)
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(a, b int) int {
			return cmp.Compare(rendezvous.ScoreHashed(h, hashes[b], 1), rendezvous.ScoreHashed(h, hashes[a], 1))
		})
		out[j] = make(map[string]bool, s.cfg.EngineReaders)
		for _, i := range order[:s.cfg.EngineReaders] {
			out[j][ids[i]] = true
		}
	}
	return out
}

// planEvents picks the mid-run changes: a replica joins the busiest
// tenant, and the second busiest, if spread, loses its last replica.
func (s *sim) planEvents() {
	s.changeAt = int64(s.cfg.Duration/2/Interval) * int64(Interval)
	if r := s.routes[0]; len(r.members) < s.cfg.Replicas {
		s.events = append(s.events, &event{kind: "join", rank: 0, departed: -1, before: len(r.members)})
	}
	if r := s.routes[1]; len(r.members) >= 2 {
		s.events = append(s.events, &event{kind: "leave", rank: 1, before: len(r.members)})
	}
}

// change applies the planned events.
func (s *sim) change() {
	for _, e := range s.events {
		r := s.routes[e.rank]
		switch e.kind {
		case "join":
			r.members = append(r.members, (s.home(e.rank)+len(r.members))%s.cfg.Replicas)
			r.most = max(r.most, len(r.members))
		case "leave":
			e.departed = r.members[len(r.members)-1]
			r.members = r.members[:len(r.members)-1]
		}
	}
	s.changed = true
}

// run drives the fleet: requests arrive evenly spaced at the fleet's
// rate, each from a tenant drawn by Zipf and routed to one of its
// replicas; replica i reconciles every interval at phase i/N of it, so
// the fleet's reconciles are spread as independent processes' are.
func (s *sim) run(ctx context.Context) error {
	n := s.cfg.Replicas
	end := int64(s.cfg.Duration)
	for k := int64(0); ; k++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("fleetsim: %w", err)
		}
		for i, r := range s.replicas {
			at := k*int64(Interval) + int64(i)*int64(Interval)/int64(n)
			if at >= end {
				return nil
			}
			s.requestsUntil(ctx, at)
			s.now = at
			if i == 0 {
				if !s.changed && at >= s.changeAt {
					s.change()
				}
				if s.changed {
					s.sample()
				}
			}
			s.clk.Set(s.base.Add(time.Duration(at)))
			r.Lock()
			r.releaseLocked(at)
			r.Unlock()
			s.res.Rounds++
			if err := r.strat.Reconcile(ctx); err != nil {
				return fmt.Errorf("fleetsim: replica %s at %v: %w", r.id, time.Duration(at), err)
			}
		}
	}
}

// requestsUntil admits every request arriving before t.
func (s *sim) requestsUntil(ctx context.Context, t int64) {
	for {
		at := int64(float64(s.nextReq) * s.requestNs)
		if at >= t {
			return
		}
		s.nextReq++
		s.now = at
		k := int(s.zipf.Uint64())
		s.seen[k/64] |= 1 << (k % 64)
		var ri int
		if r := s.routes[k]; r != nil {
			ri = r.members[r.next%len(r.members)]
			r.next++
		} else {
			ri = s.home(k)
		}
		s.admit(ctx, s.replicas[ri], k, at)
	}
}

// admit decides one request on replica r as the engine does, simplified:
// the store's gate, the tenant's RPS and token buckets, then the first of
// placeTries domains from the replica's cursor whose capacity fits it;
// all charged only once every gate passed. The strategy hears what the
// engine tells it (a new tenant, a quota refusal, every answer).
func (s *sim) admit(ctx context.Context, r *replica, k int, now int64) {
	s.res.Requests++
	r.Lock()
	r.releaseLocked(now)
	t := r.byRank[k]
	if t == nil {
		t = newSimTenant(k, s.limits(k), now)
		r.byRank[k] = t
		r.tenants = append(r.tenants, t)
		r.strat.TenantReadyLocked(t, now, false)
	}
	var id uint64
	rps, tok := &t.b[sharing.KindRPS], &t.b[sharing.KindTokens]
	switch {
	case r.strat.GateLocked(t).Refused():
		s.res.RefusedUnavailable++
	case !rps.Fits(now, sharing.RequestUnit, 0):
		r.strat.QuotaRefusedLocked(t, rps.RetryAfter(now, sharing.RequestUnit, 0))
		s.res.RefusedQuota++
	case !tok.Fits(now, Weight, -tok.Credit()):
		r.strat.QuotaRefusedLocked(t, tok.AllowRetryAfter(now, Weight))
		s.res.RefusedQuota++
	default:
		d := r.placeLocked(now, s.cost)
		if d < 0 {
			s.res.RefusedCapacity++
			break
		}
		rps.Take(now, sharing.RequestUnit)
		tok.Take(now, Weight)
		r.domains[d].cap.Charge(now, s.cost)
		r.leases = append(r.leases, lease{end: now + int64(LeaseTime), dom: int32(d)})
		r.nextID++
		id = r.nextID
		s.res.Admitted++
		if k < len(s.admitted) {
			s.admitted[k] += Weight
		}
	}
	r.Unlock()
	r.strat.Decided(ctx, "", id)
}

// placeLocked returns the domain the request goes to, or -1: domains are
// taken in turn from the replica's cursor, so a replica's load spreads
// over all of them.
func (r *replica) placeLocked(now int64, cost pd.Cost) int {
	n := len(r.domains)
	start := r.cursor
	r.cursor = (r.cursor + 1) % n
	for i := range min(placeTries, n) {
		d := (start + i) % n
		r.domains[d].lookedAt, r.domains[d].looked = now, true // its engines' readings matter here
		if r.domains[d].cap.Fits(now, cost, false) {
			return d
		}
	}
	return -1
}

// releaseLocked frees the KV of the leases ended by now (each used what
// it was charged: nothing else to settle).
func (r *replica) releaseLocked(now int64) {
	i := 0
	for ; i < len(r.leases) && r.leases[i].end <= now; i++ {
		c := r.sim.cost
		r.domains[r.leases[i].dom].cap.Release(now, c, c)
	}
	if i > 0 {
		r.leases = append(r.leases[:0], r.leases[i:]...)
	}
}

// sample records, for each event, the sum of the token-bucket rates its
// tenant's replicas hold now (the one that left included: it admits at
// its grant until its buckets freeze).
func (s *sim) sample() {
	for _, e := range s.events {
		var sum int64
		reps := s.routes[e.rank].members
		if e.departed >= 0 {
			reps = append(reps[:len(reps):len(reps)], e.departed)
		}
		for _, i := range reps {
			r := s.replicas[i]
			r.Lock()
			if t := r.byRank[e.rank]; t != nil {
				sum += t.b[sharing.KindTokens].Rate()
			}
			r.Unlock()
		}
		e.samples = append(e.samples, sum)
	}
}

// mix is SplitMix64's finaliser: a cheap, well-spread hash.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
