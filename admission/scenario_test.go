package admission_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"sigs.k8s.io/yaml"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/admission/admissiontest"
	"github.com/sluice-sched/sluice/admission/sharing"
	"github.com/sluice-sched/sluice/internal/clock"
	"github.com/sluice-sched/sluice/internal/state/memstate"
	"github.com/sluice-sched/sluice/topology"
	"github.com/sluice-sched/sluice/topology/topologytest"
)

// TestScenarios runs the engine scenarios in testdata/scenarios on a
// manual clock. Each file is a script of commands; the expected output is
// what they print, rewritten with
// `go test ./admission -run TestScenarios -rewrite`.
//
// Engines and the store:
//
//	init domains=N [shared=batched|strict] [replicas=N] [engines=K]
//	        a cluster of N HGX H200 nodes (d1…dN) and a YAML config (the
//	        body). With shared=, K engines r1…rK (default 1) share one
//	        in-memory store (internal/state/memstate) behind
//	        admissiontest.Counting and admissiontest.Flaky, each told N
//	        replicas (default 1); the store breaker opens after 2 failures
//	        and probes after 1s. Commands act on r1 unless they say on=rK.
//	apply [on=rK]           reload every engine (or one) with the body's
//	                        config; a refusal prints as `error: ...`
//	set-topology [domains=N] [on=rK]
//	                        replace the cluster: N HGX nodes, or the body
//	                        (a topology file)
//	drain D [reason=R] [ahead] / undrain D
//	freeze-credit for=D [reason=R] [on=rK] / thaw-credit [on=rK]
//	                        an operator's freeze of every tenant's burst
//	                        credit, for D from now; its end
//	store-down / store-up   the shared store fails every call / answers again
//	reconcile [on=rK]       one batched reconcile on every engine (or one)
//	rounds n=K every=D      K times: advance the clock by D, Tick, reconcile
//	                        every engine; prints the tenant buckets each
//	                        round reported
//	set-replicas n=N        tell every engine N replicas share the quotas
//
// Requests (a queued request is numbered #n; leases print their slot):
//
//	admit tenant=T model=M prompt=P output=O [accept=m1,m2] [id=X]
//	      [critical] [deadline=RFC3339] [on=rK]
//	burst tenant=T model=M prompt=P output=O n=K [by=answer] [on=rK]
//	        K identical requests; prints counts by outcome (by=answer:
//	        refusals counted by reason and Retry-After)
//	saturate tenant=T model=M prompt=P output=O [on=rK]
//	        admit until a request does not fit at once; a queued one is
//	        taken back out (its caller gives up)
//	advance D               move the clock by D and Tick every engine;
//	                        prints the queued requests answered
//	cancel #N               the caller of queued request #N gives up
//	release lease=N output=O [prompt=P] [error] [on=rK]
//	release all output=O [prompt=P] [on=rK]
//	                        every lease the scenario was given, oldest first
//
// What it prints:
//
//	print [on=rK]           domains (rounded) and active tenants
//	domain ID [on=rK]       one domain, exact
//	tenant NAME [on=rK]     one tenant, exact
//	leases [on=rK]          leases held and requests queued
//	shared-status [on=rK]   the shared-state link
//	store [KEY...]          calls that reached the store, and bucket levels
//
// In shared scenarios, every command's output ends with the breaker
// transitions it caused.
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/scenarios", func(t *testing.T, path string) {
		var s scenario
		defer s.close()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out := s.run(t, d)
			for _, r := range s.engines {
				r.e.WaitBackground() // what the command started in the background is part of it
			}
			if ev := s.transitions(); ev != "" {
				if out != "" && !strings.HasSuffix(out, "\n") {
					out += "\n"
				}
				out += ev
			}
			return out
		})
	})
}

type scenario struct {
	clk      *clock.Manual
	engines  []*replica
	mem      *memstate.Store
	counting *admissiontest.Counting
	flaky    *admissiontest.Flaky
	queued   []queued
	nextNum  int

	mu     sync.Mutex // OnBreaker runs under an engine's lock
	events []string
}

// replica is one engine and the leases it gave the scenario.
type replica struct {
	name   string
	e      *admission.Engine
	leases []uint64 // in the order given, released ones included
}

type queued struct {
	num int
	r   *replica
	tk  *admission.Ticket
}

func (s *scenario) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "init":
		return s.init(t, d)
	case "apply":
		var cfg admission.Config
		if err := yaml.UnmarshalStrict([]byte(d.Input), &cfg); err != nil {
			return "config: " + err.Error()
		}
		return s.each(t, d, func(r *replica) string { return errLine(r.e.Apply(cfg)) })
	case "set-topology":
		return s.each(t, d, func(r *replica) string {
			if d.HasArg("domains") {
				var n int
				d.ScanArgs(t, "domains", &n)
				return errLine(r.e.SetTopology(topologytest.HGX(t, n)))
			}
			c, err := topology.Parse([]byte(d.Input))
			if err != nil {
				return "topology: " + err.Error() + "\n"
			}
			return errLine(r.e.SetTopology(c))
		})
	case "drain", "undrain":
		return s.drain(t, d)
	case "freeze-credit":
		var dur, reason string
		d.ScanArgs(t, "for", &dur)
		if d.HasArg("reason") {
			d.ScanArgs(t, "reason", &reason)
		}
		for_, err := time.ParseDuration(dur)
		if err != nil {
			t.Fatalf("for=%s: %v", dur, err)
		}
		return s.each(t, d, func(r *replica) string {
			r.e.FreezeCredit(s.clk.Now().Add(for_), reason)
			return ""
		})
	case "thaw-credit":
		return s.each(t, d, func(r *replica) string {
			r.e.ThawCredit()
			return ""
		})
	case "store-down", "store-up":
		s.needStore(t, d)
		s.flaky.SetDown(d.Cmd == "store-down")
		return ""
	case "reconcile":
		return s.each(t, d, func(r *replica) string {
			if err := r.e.Reconcile(context.Background()); err != nil {
				return "error: " + err.Error() + "\n"
			}
			return "ok\n"
		})
	case "rounds":
		s.needStore(t, d)
		return s.rounds(t, d)
	case "set-replicas":
		var n int
		d.ScanArgs(t, "n", &n)
		for _, r := range s.engines {
			r.e.SetReplicas(n)
		}
		return ""
	case "admit":
		r := s.request(t, d)
		if d.HasArg("id") {
			d.ScanArgs(t, "id", &r.RequestID)
		}
		if d.HasArg("critical") {
			r.Priority = admission.PriorityCritical
		}
		if d.HasArg("deadline") {
			var dl string
			d.ScanArgs(t, "deadline", &dl)
			var err error
			if r.Deadline, err = time.Parse(time.RFC3339, dl); err != nil {
				t.Fatalf("deadline: %v", err)
			}
		}
		return s.submit(s.on(t, d), r)
	case "burst":
		return s.burst(t, d)
	case "saturate":
		return s.saturate(t, d)
	case "advance":
		return s.advance(t, d)
	case "cancel":
		return s.cancel(t, d)
	case "release":
		return s.release(t, d)
	case "print":
		return s.print(s.on(t, d).e)
	case "domain":
		return s.domain(t, d)
	case "engines":
		return s.observeEngines(t, d)
	case "tenant":
		return s.tenant(t, d)
	case "leases":
		e := s.on(t, d).e
		return fmt.Sprintf("%d leases, %d queued\n", e.LeaseCount(), e.QueueLen())
	case "shared-status":
		return s.sharedStatus(t, d)
	case "store":
		s.needStore(t, d)
		return s.store(d)
	}
	t.Fatalf("unknown command %q", d.Cmd)
	return ""
}

func (s *scenario) init(t *testing.T, d *datadriven.TestData) string {
	s.close()
	s.engines, s.queued, s.nextNum = nil, nil, 0
	s.mem, s.counting, s.flaky = nil, nil, nil
	s.transitions()
	var n int
	d.ScanArgs(t, "domains", &n)
	var cfg admission.Config
	if err := yaml.UnmarshalStrict([]byte(d.Input), &cfg); err != nil {
		return "config: " + err.Error()
	}
	s.clk = clock.NewManual(admission.Epoch)
	engines, replicas, mode := 1, 1, sharing.Mode(0)
	if d.HasArg("shared") {
		var m string
		d.ScanArgs(t, "shared", &m)
		switch m {
		case "batched":
			mode = sharing.Batched
		case "strict":
			mode = sharing.Strict
		default:
			t.Fatalf("shared=%s: want batched or strict", m)
		}
		s.mem = memstate.New(s.clk)
		s.counting = admissiontest.NewCounting(s.mem)
		s.flaky = admissiontest.NewFlaky(s.counting)
	}
	if d.HasArg("replicas") {
		d.ScanArgs(t, "replicas", &replicas)
	}
	if d.HasArg("engines") {
		d.ScanArgs(t, "engines", &engines)
	}
	var out strings.Builder
	for i := 1; i <= engines; i++ {
		name := fmt.Sprintf("r%d", i)
		opts := []admission.Option{admission.WithClock(s.clk)}
		if mode != 0 {
			opts = append(opts, admission.WithSharedState(s.flaky, sharing.Options{
				Mode: mode, Replica: name, Replicas: replicas, Failures: 2, Cooldown: time.Second,
				OnBreaker: func(open bool) { s.noteBreaker(name, open) },
			}))
		}
		e, err := admission.New(cfg, topologytest.HGX(t, n), opts...)
		if err != nil {
			fmt.Fprintf(&out, "error: %v\n", err)
			continue
		}
		s.engines = append(s.engines, &replica{name: name, e: e})
	}
	return out.String()
}

// needStore fails a command that needs the shared store in a scenario
// without one.
func (s *scenario) needStore(t *testing.T, d *datadriven.TestData) {
	if s.flaky == nil {
		t.Fatalf("%s: the engines share no store (init without shared=)", d.Cmd)
	}
}

// close closes every engine, answering what is still queued.
func (s *scenario) close() {
	for _, r := range s.engines {
		r.e.Close()
	}
}

// on returns the engine a command names with on=rK, or the first.
func (s *scenario) on(t *testing.T, d *datadriven.TestData) *replica {
	if len(s.engines) == 0 {
		t.Fatalf("%s: no engine (init failed or is missing)", d.Cmd)
	}
	if !d.HasArg("on") {
		return s.engines[0]
	}
	var name string
	d.ScanArgs(t, "on", &name)
	for _, r := range s.engines {
		if r.name == name {
			return r
		}
	}
	t.Fatalf("on=%s: no such engine", name)
	return nil
}

// each runs fn on the engine named by on=, or on every engine; with
// several, each line of output is prefixed by the engine's name.
func (s *scenario) each(t *testing.T, d *datadriven.TestData, fn func(r *replica) string) string {
	if d.HasArg("on") || len(s.engines) == 1 {
		return fn(s.on(t, d))
	}
	var b strings.Builder
	for _, r := range s.engines {
		if out := fn(r); out != "" {
			b.WriteString(r.name + ": " + out)
		}
	}
	return b.String()
}

func errLine(err error) string {
	if err != nil {
		return "error: " + err.Error() + "\n"
	}
	return ""
}

func (s *scenario) noteBreaker(name string, open bool) {
	state := "closed"
	if open {
		state = "opened"
	}
	s.mu.Lock()
	s.events = append(s.events, fmt.Sprintf("breaker %s on %s\n", state, name))
	s.mu.Unlock()
}

// transitions returns the breaker transitions since the last call.
func (s *scenario) transitions() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := strings.Join(s.events, "")
	s.events = nil
	return out
}

func (s *scenario) drain(t *testing.T, d *datadriven.TestData) string {
	id := d.CmdArgs[0].Key
	r := s.on(t, d)
	if d.Cmd == "undrain" {
		return errLine(r.e.Undrain(id))
	}
	reason := ""
	if d.HasArg("reason") {
		d.ScanArgs(t, "reason", &reason)
	}
	if d.HasArg("ahead") {
		r.e.DrainAhead(id, reason)
		return ""
	}
	return errLine(r.e.Drain(id, reason))
}

func (s *scenario) rounds(t *testing.T, d *datadriven.TestData) string {
	var n int
	var every string
	d.ScanArgs(t, "n", &n)
	d.ScanArgs(t, "every", &every)
	step, err := time.ParseDuration(every)
	if err != nil {
		t.Fatal(err)
	}
	before := len(s.counting.Reports())
	var b strings.Builder
	for i := 0; i < n; i++ {
		s.clk.Advance(step)
		for _, r := range s.engines {
			r.e.Tick()
			if err := r.e.Reconcile(context.Background()); err != nil {
				fmt.Fprintf(&b, "round %d on %s: error: %v\n", i+1, r.name, err)
			}
		}
	}
	var counts []int
	for _, rep := range s.counting.Reports()[before:] {
		counts = append(counts, rep.TenantBuckets)
	}
	b.WriteString("tenant buckets reported: " + runs(counts) + "\n")
	return b.String()
}

// runs writes a list of counts as runs: "2×10 0×15".
func runs(xs []int) string {
	var parts []string
	for i := 0; i < len(xs); {
		j := i
		for j < len(xs) && xs[j] == xs[i] {
			j++
		}
		parts = append(parts, fmt.Sprintf("%d×%d", xs[i], j-i))
		i = j
	}
	return strings.Join(parts, " ")
}

func (s *scenario) request(t *testing.T, d *datadriven.TestData) admission.Request {
	var r admission.Request
	d.ScanArgs(t, "tenant", &r.Tenant)
	d.ScanArgs(t, "model", &r.Model)
	d.ScanArgs(t, "prompt", &r.PromptTokens)
	d.ScanArgs(t, "output", &r.MaxOutputTokens)
	if d.HasArg("accept") {
		var accept string
		d.ScanArgs(t, "accept", &accept)
		r.AcceptDowngrade = strings.Split(accept, ",")
	}
	return r
}

// answer submits one request and returns its answer, or the queued
// request's ticket.
func (s *scenario) answer(r *replica, req admission.Request) (admission.Decision, *admission.Ticket, error) {
	d, tk, err := r.e.Submit(context.Background(), req)
	if err == nil && tk == nil && d.LeaseID != 0 {
		r.leases = append(r.leases, d.LeaseID)
	}
	return d, tk, err
}

func (s *scenario) submit(r *replica, req admission.Request) string {
	d, tk, err := s.answer(r, req)
	if err != nil {
		return "error: " + err.Error()
	}
	if tk != nil {
		return "QUEUED #" + strconv.Itoa(s.enqueue(r, tk))
	}
	return formatDecision(r.e, d)
}

func (s *scenario) enqueue(r *replica, tk *admission.Ticket) int {
	s.nextNum++
	s.queued = append(s.queued, queued{num: s.nextNum, r: r, tk: tk})
	return s.nextNum
}

func (s *scenario) burst(t *testing.T, d *datadriven.TestData) string {
	r := s.on(t, d)
	req := s.request(t, d)
	var n int
	d.ScanArgs(t, "n", &n)
	byAnswer := false
	if d.HasArg("by") {
		var by string
		d.ScanArgs(t, "by", &by)
		byAnswer = by == "answer"
	}
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		out := s.submit(r, req)
		key := strings.Fields(out)[0]
		if byAnswer && key == admission.Rejected.String() {
			f := strings.Fields(out) // REJECTED REASON retry_after=D
			key = fmt.Sprintf("%s(%s %s)", f[0], f[1], strings.Replace(f[2], "=", ":", 1))
		}
		counts[key]++
	}
	return summarize(counts)
}

func (s *scenario) saturate(t *testing.T, d *datadriven.TestData) string {
	r := s.on(t, d)
	req := s.request(t, d)
	admitted := 0
	for i := 0; i < 100000; i++ {
		dec, tk, err := s.answer(r, req)
		switch {
		case err != nil:
			return fmt.Sprintf("ADMITTED=%d, then error: %v", admitted, err)
		case tk != nil:
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			got := r.e.Await(ctx, tk)
			return fmt.Sprintf("ADMITTED=%d, then QUEUED and given up: %s", admitted, formatDecision(r.e, got))
		case dec.Outcome == admission.Rejected:
			return fmt.Sprintf("ADMITTED=%d, then %s", admitted, formatDecision(r.e, dec))
		}
		admitted++
	}
	t.Fatal("saturate: never saturated")
	return ""
}

func (s *scenario) advance(t *testing.T, d *datadriven.TestData) string {
	dur, err := time.ParseDuration(strings.TrimSpace(d.CmdArgs[0].Key))
	if err != nil {
		t.Fatal(err)
	}
	s.clk.Advance(dur)
	for _, r := range s.engines {
		r.e.Tick()
	}
	var b strings.Builder
	var still []queued
	for _, q := range s.queued {
		if !q.tk.Answered() {
			still = append(still, q)
			continue
		}
		dec := q.r.e.Await(context.Background(), q.tk)
		if dec.LeaseID != 0 {
			q.r.leases = append(q.r.leases, dec.LeaseID)
		}
		fmt.Fprintf(&b, "#%d %s\n", q.num, formatDecision(q.r.e, dec))
	}
	s.queued = still
	return b.String()
}

func (s *scenario) cancel(t *testing.T, d *datadriven.TestData) string {
	num, err := strconv.Atoi(strings.TrimPrefix(d.CmdArgs[0].Key, "#"))
	if err != nil {
		t.Fatalf("cancel %s: want #N", d.CmdArgs[0].Key)
	}
	for i, q := range s.queued {
		if q.num != num {
			continue
		}
		s.queued = append(s.queued[:i], s.queued[i+1:]...)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return fmt.Sprintf("#%d %s", num, formatDecision(q.r.e, q.r.e.Await(ctx, q.tk)))
	}
	t.Fatalf("cancel #%d: no such queued request", num)
	return ""
}

func (s *scenario) release(t *testing.T, d *datadriven.TestData) string {
	r := s.on(t, d)
	rel := admission.Release{Outcome: admission.ReleaseOK}
	d.ScanArgs(t, "output", &rel.OutputTokens)
	if d.HasArg("prompt") {
		d.ScanArgs(t, "prompt", &rel.PromptTokens)
	}
	if d.HasArg("error") {
		rel.Outcome = admission.ReleaseError
	}
	if d.CmdArgs[0].Key == "all" {
		n := 0
		for _, id := range r.leases {
			rel.LeaseID = id
			if _, err := r.e.Release(context.Background(), rel); err == nil {
				n++
			} else if !errors.Is(err, admission.ErrLeaseNotFound) {
				return fmt.Sprintf("released %d, then error: %v", n, err)
			}
		}
		return fmt.Sprintf("released %d leases", n)
	}
	var num uint32
	d.ScanArgs(t, "lease", &num)
	rel.LeaseID = r.e.LeaseSlot(num)
	res, err := r.e.Release(context.Background(), rel)
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("released from %s: refunded %d tokens, cost %d µ$", res.Domain, res.RefundedTokens, res.ActualCostMicros)
}

func formatDecision(e *admission.Engine, d admission.Decision) string {
	switch d.Outcome {
	case admission.Admitted, admission.Degraded:
		out := fmt.Sprintf("%s lease=%d domain=%s model=%s", d.Outcome, e.LeaseNumber(d.LeaseID), d.Domain, d.Model)
		if d.Outcome == admission.Degraded {
			out += " path=" + strings.Join(d.DowngradePath, ">")
		}
		if d.Trace.Floor {
			out += " floor"
		}
		if d.Trace.Critical {
			out += " critical"
		}
		if d.Queued > 0 {
			out += " queued=" + d.Queued.String()
		}
		return out + fmt.Sprintf(" quota=%d>%d", d.Trace.QuotaBefore, d.Trace.QuotaAfter)
	}
	return fmt.Sprintf("%s %s retry_after=%s", d.Outcome, d.Reason, d.RetryAfter)
}

func summarize(counts map[string]int) string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, counts[k]))
	}
	return strings.Join(parts, " ")
}

func (s *scenario) print(e *admission.Engine) string {
	var b strings.Builder
	for _, d := range e.Domains() {
		state := ""
		if d.Draining {
			state = " draining(" + d.DrainReason + ")"
		}
		state += warming(d)
		fmt.Fprintf(&b, "domain %s: prefill %.0f%% decode %.0f%% kv %.1f%% reserved %.0f%% in-flight %d weight %.2f%s\n",
			d.ID, pct(d.PrefillLevel, d.PrefillBurst), pct(d.DecodeLevel, d.DecodeBurst), pct(d.KVInUse, d.KVLimit),
			100*d.ReservedFrac, d.InFlight, d.HealthWeight, state)
	}
	if f, ok := e.CreditFrozen(); ok {
		fmt.Fprintf(&b, "burst credit frozen for %v: %s\n", f.Until.Sub(s.clk.Now()), f.Reason)
	}
	for _, ti := range e.Tenants() {
		fmt.Fprintf(&b, "tenant %s: tokens %d/%d credit %d in-flight %d queued %d", ti.Name, ti.TokenLevel, ti.TokenBurst, ti.Credit, ti.InFlight, ti.Queued)
		if ti.BreakerOpen {
			b.WriteString(" breaker-open")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (s *scenario) domain(t *testing.T, d *datadriven.TestData) string {
	id := d.CmdArgs[0].Key
	for _, di := range s.on(t, d).e.Domains() {
		if di.ID != id {
			continue
		}
		out := fmt.Sprintf("domain %s: %s %d gpus; prefill %d/%d at %d/s; decode %d/%d at %d/s; kv %d/%d; in-flight %d; weight %.2f",
			di.ID, di.Kind, di.GPUs, di.PrefillLevel, di.PrefillBurst, di.PrefillRate,
			di.DecodeLevel, di.DecodeBurst, di.DecodeRate, di.KVInUse, di.KVLimit, di.InFlight, di.HealthWeight)
		if di.Draining {
			out += "; draining (" + di.DrainReason + ")"
		}
		if w := warming(di); w != "" {
			out += ";" + w
		}
		if di.EngineMetricsAge > 0 || di.EngineQueue > 0 || di.EngineKVUsage > 0 {
			out += fmt.Sprintf("; engines queue %g kv %g read %v ago", di.EngineQueue, di.EngineKVUsage, di.EngineMetricsAge)
			if di.EngineSaturated {
				out += " saturated"
			}
		}
		return out
	}
	return "no domain " + id
}

// observeEngines gives a replica a reading of a domain's engines, as the server's
// metrics reader does: engines d1 queue=12 kv=0.5 relay on=r1 (relay: the
// replica reads them for all, and every replica's rounds relay readings,
// as sluiced's do under a membership).
func (s *scenario) observeEngines(t *testing.T, d *datadriven.TestData) string {
	sig := admission.EngineSignal{Domain: d.CmdArgs[0].Key}
	if d.HasArg("queue") {
		d.ScanArgs(t, "queue", &sig.Queue)
	}
	if d.HasArg("kv") {
		d.ScanArgs(t, "kv", &sig.KVUsage)
	}
	if sig.Relay = d.HasArg("relay"); sig.Relay {
		for _, r := range s.engines {
			r.e.RelayEngineReadings(true)
		}
	}
	if err := s.on(t, d).e.ObserveEngines([]admission.EngineSignal{sig}); err != nil {
		return "error: " + err.Error()
	}
	return ""
}

// warming describes a domain's warm-up ramp, or is empty when it is whole.
func warming(d admission.DomainInfo) string {
	if d.WarmupLeft == 0 {
		return ""
	}
	return fmt.Sprintf(" warming %.1f%% (%v left)", 100*d.WarmupFraction, d.WarmupLeft)
}

func (s *scenario) tenant(t *testing.T, d *datadriven.TestData) string {
	name := d.CmdArgs[0].Key
	ti, ok := s.on(t, d).e.Tenant(name)
	if !ok {
		return "no tenant " + name
	}
	out := fmt.Sprintf("tenant %s (%s, weight %d, floor %d): tokens %d/%d at %d/s, credit %d; rps level %d; in-flight %d, queued %d; spent %d µ$ today, %d µ$ this month",
		ti.Name, ti.Tier, ti.Weight, ti.FloorTokens, ti.TokenLevel, ti.TokenBurst, ti.TokenRate, ti.Credit,
		ti.RPSLevel, ti.InFlight, ti.Queued, ti.SpentTodayMicros, ti.SpentMonthMicros)
	if ti.BreakerOpen {
		out += fmt.Sprintf("; breaker open until +%s", ti.BreakerUntil.Sub(s.clk.Now()))
	}
	return out
}

func (s *scenario) sharedStatus(t *testing.T, d *datadriven.TestData) string {
	st, ok := s.on(t, d).e.SharedStatus()
	if !ok {
		return "embedded"
	}
	breaker := "closed"
	if st.BreakerOpen {
		breaker = "open"
	}
	return fmt.Sprintf("%s, %d replicas; breaker %s, %gs of fallback; %d calls for %d decisions, %d failures; overage %d",
		st.Mode, st.Replicas, breaker, st.FallbackSeconds, st.Calls, st.Decisions, st.Failures, st.Overage)
}

func (s *scenario) store(d *datadriven.TestData) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d reconciles, %d commits, %d settles\n", len(s.counting.Reports()), s.counting.Commits(), s.counting.Settles())
	for _, a := range d.CmdArgs {
		if l, ok := s.mem.Level(a.Key); ok {
			fmt.Fprintf(&b, "%s: %s\n", a.Key, strconv.FormatFloat(l, 'f', -1, 64))
		} else {
			fmt.Fprintf(&b, "%s: none\n", a.Key)
		}
	}
	return b.String()
}

func pct(v, of int64) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(v) / float64(of)
}
