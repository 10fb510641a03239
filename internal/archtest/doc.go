// Package archtest holds the dependency rule of Sluice's packages as a
// test, and keeps docs/architecture.md's package table in step with the
// code.
//
// Every package of the module has a kind, declared once in kinds (its test
// file) and repeated in the doc's table:
//
//   - foundation: imports no Sluice package (token-bucket math, the clock,
//     hashing, the heap, the CLI's logger).
//   - core: topology, pd, wfq, admission and its sub-packages that hold the
//     decision; imports foundations and core packages below it only, in the
//     order topology, wfq → pd → admission/sharing → admission →
//     admission/deferral.
//   - contract: the generated gRPC API; imports no Sluice package.
//   - adapter: plugs the core into the world (Redis, etcd, bbolt, HTTP,
//     gRPC, metrics); imports anything but tooling, test support and cmd.
//   - test support: helpers only tests import (real redis-server, embedded
//     etcd, fixtures); no product package imports them.
//   - tooling: replay, drills (and the embedded etcd they share with the
//     tests), load, the fleet simulator and generator, which sluicectl
//     runs; no product package imports them.
//   - command: cmd/...; nothing imports a command, and the server's and
//     the agent's commands import no tooling.
//   - docs: a package that only documents.
//
// Tests may cross the rule from outside (a core package's external tests
// use adapters): only the non-test files' imports are checked.
package archtest
