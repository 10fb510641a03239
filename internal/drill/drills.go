package drill

import (
	"context"
	"errors"
	"math/rand/v2"
)

// The drills, in the order `all` runs them (each leaves the fleet as it
// found it).
const (
	DrainDomain      = "drain-domain"
	KillAgent        = "kill-agent"
	KillReplica      = "kill-replica"
	StopEtcd         = "stop-etcd"
	KillRedis        = "kill-redis"
	CreditExhaustion = "credit-exhaustion"
	DeferredBurst    = "deferred-burst"
)

// drillSpec is one drill: what it needs of the fleet, how it picks its
// target, its fault and the undo of it, and the words of its own
// promises. Run, analyze and Soak read a drill's behaviour here rather
// than from its name.
type drillSpec struct {
	name string
	// stops: the fault stops part of the fleet, through Fleet.Faults.
	stops bool
	// noEtcd, when set, is the error for a fleet without etcd.
	noEtcd string
	// credit: the drill drives Options.CreditTenant, whose policy is
	// read beside the mix's; soak draws it only when there is one.
	credit bool
	// burst: the drill drives Options.BurstTenants, whose policies are
	// read beside the mix's; soak draws it only when there are some.
	burst bool
	// nodeTarget: the target is a node, which the drill picks only on the
	// self-contained fleet (its nodes are its domains); soak draws it only
	// there.
	nodeTarget bool
	// part is what the fault stops and the recovery starts, for target
	// (nil: nothing).
	part func(target string) Part
	// pick is the default target (nil: the drill takes none).
	pick func(r *run) (string, error)
	// soakTarget draws a target from the self-contained fleet for soak
	// (nil: none).
	soakTarget func(l *Local, rng *rand.Rand) string
	// drive runs the drill, after its policies are read.
	drive func(r *run, ctx context.Context) error
	// fault breaks the fleet (faultDrill's drills): what it leaves
	// running is stopped before the recovery action or waited for at the
	// drill's end. mend is the recovery action; afterMend starts a watch
	// of the recovery, stopped at the drill's end (nil: none).
	fault     func(r *run, ctx context.Context) (watch, error)
	mend      func(r *run, ctx context.Context) error
	afterMend func(r *run, ctx context.Context) func()
	// leasesDie: the target replica's leases die with it, so that a failed
	// Release of one is the drill's own doing.
	leasesDie bool
	// departure names what makes r.domain forbidden in its promises ("no
	// placement after the mark"); back is the promise that placements
	// return there.
	departure, back string
	// judge adds the drill's own promises from the recorded answers, once
	// the phases are measured (nil: it has none, or adds them in drive).
	judge func(r *run, answers []answer)
}

// watch is what a fault leaves running: stop ends it before the recovery
// action, wait waits for it at the drill's end (either nil: nothing).
type watch struct{ stop, wait func() }

// drills are the drills in the order `all` runs them.
var drills = []drillSpec{
	{
		name:       DrainDomain,
		pick:       (*run).busiestDomain,
		soakTarget: fleetNode,
		drive:      (*run).faultDrill,
		fault:      (*run).drainFault,
		mend:       func(r *run, ctx context.Context) error { return r.drain(ctx, r.target, false) },
		afterMend:  func(r *run, ctx context.Context) func() { return r.watchWarmup(ctx, r.target) },
		departure:  "the mark", back: "undrain restores",
	},
	{
		name:       KillAgent,
		stops:      true,
		noEtcd:     "drill kill-agent watches the agent's record: the fleet needs etcd (--etcd)",
		nodeTarget: true,
		part:       func(t string) Part { return Part{Kind: "agent", Name: t} },
		pick:       (*run).busiestNode,
		soakTarget: fleetNode,
		drive:      (*run).faultDrill,
		fault:      (*run).agentFault,
		mend:       (*run).startPart,
		departure:  "its node's departure", back: "capacity returns with the agent",
	},
	{
		name:  KillReplica,
		stops: true,
		part:  func(t string) Part { return Part{Kind: "replica", Name: t} },
		pick:  (*run).firstTenantsReplica,
		soakTarget: func(l *Local, rng *rand.Rand) string {
			return l.Replicas()[rng.IntN(len(l.Replicas()))]
		},
		drive:     (*run).faultDrill,
		fault:     (*run).replicaFault,
		mend:      (*run).startPart,
		leasesDie: true,
	},
	{
		name:   StopEtcd,
		stops:  true,
		noEtcd: "drill stop-etcd: the fleet has no etcd (--etcd)",
		part:   func(string) Part { return Part{Kind: "etcd"} },
		drive:  (*run).faultDrill,
		fault:  (*run).stopFault,
		mend:   (*run).startPart,
	},
	{
		name:  KillRedis,
		stops: true,
		part:  func(string) Part { return Part{Kind: "redis"} },
		drive: (*run).faultDrill,
		fault: (*run).stopFault,
		mend:  (*run).startPart,
	},
	{
		name:   CreditExhaustion,
		credit: true,
		drive:  (*run).creditExhaustion,
	},
	{
		name:  DeferredBurst,
		burst: true,
		drive: (*run).deferredBurst,
		judge: (*run).judgeDeferred,
	},
}

// Names lists the drills in the order `all` runs them.
var Names = func() []string {
	out := make([]string, len(drills))
	for i, d := range drills {
		out[i] = d.name
	}
	return out
}()

// drillNamed is the drill of that name, or nil.
func drillNamed(name string) *drillSpec {
	for i := range drills {
		if drills[i].name == name {
			return &drills[i]
		}
	}
	return nil
}

// canRun says why the fleet cannot run d ("" when it can).
func (d *drillSpec) canRun(f *Fleet) string {
	switch {
	case d.stops && f.Faults == nil:
		return "drill " + d.name + " stops part of the fleet: give --stop and --start (or --self-contained)"
	case d.noEtcd != "" && f.Etcd == nil:
		return d.noEtcd
	}
	return ""
}

// soakable reports whether soak may draw d on f with o: it can run, and
// it needs no target soak cannot draw or tenants o lacks.
func (d *drillSpec) soakable(f *Fleet, o Options) bool {
	return d.canRun(f) == "" && !(d.credit && o.CreditTenant == "") && !(d.burst && len(o.BurstTenants) == 0) &&
		!(d.nodeTarget && f.Local == nil)
}

// fleetNode draws one of the self-contained fleet's nodes (each its own
// domain).
func fleetNode(_ *Local, rng *rand.Rand) string { return FleetNodes[rng.IntN(len(FleetNodes))] }

// busiestNode is the node whose record makes the busiest domain: on the
// self-contained fleet the domain itself; an operator's fleet names it.
func (r *run) busiestNode() (string, error) {
	best, err := r.busiestDomain()
	if err != nil {
		return "", err
	}
	if r.f.Local != nil {
		return best, nil // the self-contained fleet's nodes are their domains
	}
	return "", errors.New("kill-agent: give the NODE")
}

// firstTenantsReplica is the replica the mix's first tenant is routed to.
func (r *run) firstTenantsReplica() (string, error) {
	m, ok := r.f.Router.Route(r.o.Tenants[0].Tenant)
	if !ok {
		return "", errors.New("no replica is registered")
	}
	return m.ID, nil
}
