// Package controlplane is Sluice's etcd adapter: the fleet's configuration,
// replica membership, node agents' topology and drain marks live in etcd
// (go.etcd.io/etcd/client/v3) under one key prefix, and every sluiced
// replica follows them with one watch.
//
// # Keys
//
// Under PREFIX (DefaultPrefix, "/sluice/"):
//
//	PREFIX config              the policy document (YAML or JSON, the format of a --config file)
//	PREFIX tenants/NAME        one tenant's entry (the value of tenants.NAME in that format)
//	PREFIX drains/DOMAIN       a drain mark: JSON DrainMark {domain, reason, by, at}
//	PREFIX agents/NODE         a node agent's GPUs: JSON AgentRecord, under the agent's lease
//	PREFIX members/ID          a replica: JSON client.Member {id, grpc_addr}, under its lease
//	PREFIX credit-freeze       every tenant's burst credit frozen: JSON CreditFreezeMark {until, reason, by, at}
//
// Tenants have keys of their own so that a fleet of 100k tenants fits under
// etcd's request size limit and one tenant's change is one small write.
//
// # Config
//
// The serving config is the policy document with the tenant documents merged
// into its tenants map, parsed by internal/config (strict keys, full key
// paths) and applied with the engine's Apply, which validates it against the
// cluster and swaps it in without dropping leases or queued work. Anything
// refused (a bad document, a tenant defined twice, floors the cluster cannot
// hold) is logged with the etcd key, the key path inside the document and the
// reason, recorded in Status (the Operator GetConfigStatus RPC) and counted
// in sluice_config_refusals_total; the last good config keeps serving.
// Tenant documents without a policy document are refused as well: until a
// policy document exists, the replica serves its local config (--config or
// the embedded default).
//
// # Topology and drains
//
// Each node agent publishes its node's GPUs and NVLink domain under a lease
// (RunAgent), creating its key only if no other lease holds it, and
// republishes a changed node every RediscoverEvery. A replica merges every
// agent's record (topology.Merge) into the cluster and sets it on the
// engine, which takes a shrunken cluster even when it cannot hold the
// config's floors; an agent whose lease expires takes its GPUs out of
// capacity, its leases there finishing. While no agent has published
// anything the replica keeps its own topology source; when every agent is
// gone it keeps the last cluster the agents built (an engine cannot serve an
// empty cluster) with every GPU unhealthy, so that nothing new is placed,
// and says so in its log. A config the engine refused is tried again after
// each topology change; a retry refused for the same reason is not recorded
// again, and a config refused before the engine saw it is not retried.
//
// A drain mark drains its domain on every replica as soon as the watch event
// arrives (the engine's DrainAhead); deleting it undrains. A mark for a
// domain the cluster does not have holds from the moment the domain appears:
// drains are applied before the topology of the same update. Marks are
// authoritative for the domains they name: every mark is applied again
// whenever the marks change, so that an Operator RPC undrain of a marked
// domain lasts until then. When a mark goes its domain is undrained, unless
// the engine had it drained (by the Operator RPC) before the mark came: it
// keeps that drain and its reason, unless the Operator RPC undrained it
// meanwhile. Domains no mark names are left alone; an unreadable mark still
// drains.
//
// The agents' cluster read by the first full read at start-up replaces the
// replica's own as if present from the start (the engine's
// SetStartupTopology): its domains start whole. Later, a domain that joins
// or whose healthy GPUs grow (an agent returns), and a domain a deleted mark
// undrains, warm up (admission.WarmupConfig).
//
// # Credit freeze
//
// The credit-freeze key freezes every tenant's burst credit on every
// replica until its until, an absolute time, so that replicas that read it
// at different moments end it together (the engine's FreezeCredit); its
// deletion thaws. A mark without a readable end is logged and not applied:
// a freeze must end. sluiced's Operator FreezeBurstCredit writes it
// (PutCreditFreeze) when the replica follows etcd.
//
// # Outages
//
// etcd being unreachable never stops admission: the engine keeps its last
// config, topology and drains. A probe sets Status's connected flag (and the
// sluice_control_plane_connected gauge) and logs each transition; the watch
// resumes from the last revision it applied when etcd returns, and a
// revision compacted meanwhile is answered by reading everything again.
package controlplane
