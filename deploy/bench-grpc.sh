#!/usr/bin/env bash
# bench-grpc.sh — gRPC throughput of sluiced from outside its process, beside
# the same server's gRPC health Check in the same run (the target:
# Admit(+Release) ≥ 0.90 of Check; ≥ 0.85 with 200k leases held).
#
# It builds sluiced and sluicectl, and for each measurement starts a fresh
# sluiced on loopback with deploy/bench/grpc-config.yaml (100 tenants whose
# quotas never bind, leases living 1 h), runs `sluicectl load` against it — a
# separate process on the generated admission/v1 client — with
# `--reference health` in alternating rounds, and stops the server:
#
#   1. Admit+Release          closed loop, C callers, 100 tenants
#   2. Admit only             the same, --release=false: leases accumulate
#   3. Admit+Release, held    after --prefill PREFILL leases held through the run
#
# Then it prints each ratio, of calls per second and of CPU time per call
# (client + server, from /proc: steadier than calls per second when other
# work shares the machine). Both processes share the machine's cores, as on
# the project's 2-core machines. Run from the repository root:
#
#   deploy/bench-grpc.sh                     # defaults below
#   ROUNDS=4 DURATION=3s deploy/bench-grpc.sh
#
# Environment: CONCURRENCY (16), DURATION per side per round (5s), ROUNDS (6),
# PREFILL (200000), PORT (17070; PORT+1 is the HTTP port), OUT (a directory
# for the JSON reports; default a temporary one), PROFILE=1 records a
# perf profile of sluiced during each measurement (needs perf) into OUT.
set -euo pipefail

CONCURRENCY=${CONCURRENCY:-16}
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-6}
PREFILL=${PREFILL:-200000}
PORT=${PORT:-17070}
PROFILE=${PROFILE:-0}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(mktemp -d)
OUT=${OUT:-$bin}
mkdir -p "$OUT"
addr=127.0.0.1:$PORT
config=$root/deploy/bench/grpc-config.yaml
pid=

cleanup() {
	if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

echo "building sluiced and sluicectl into $bin" >&2
(cd "$root" && go build -o "$bin/sluiced" ./cmd/sluiced && go build -o "$bin/sluicectl" ./cmd/sluicectl)

tenants=$(for i in $(seq -w 1 100); do printf 'bench-%s:small:1,' "$i"; done)
tenants=${tenants%,}

start_server() {
	"$bin/sluiced" --config "$config" --topology simulated --grpc-addr "$addr" \
		--http-addr "127.0.0.1:$((PORT + 1))" --log-level warn >"$OUT/sluiced.log" 2>&1 &
	pid=$!
	for _ in $(seq 100); do
		if "$bin/sluicectl" domain list --server "$addr" --timeout 1s >/dev/null 2>&1; then return; fi
		sleep 0.1
	done
	echo "sluiced did not answer on $addr; its log:" >&2
	cat "$OUT/sluiced.log" >&2
	exit 1
}

stop_server() {
	kill "$pid"
	wait "$pid" || true
	pid=
}

# measure NAME ARGS…: one fresh server, one sluicectl load with the reference.
measure() {
	local name=$1
	shift
	start_server
	local cmd=("$bin/sluicectl" load --server "$addr" --tenants "$tenants" --concurrency "$CONCURRENCY"
		--duration "$DURATION" --rounds "$ROUNDS" --reference health --server-pid "$pid" "$@")
	echo "== $name: sluicectl load --server $addr --tenants bench-001..100:small --concurrency $CONCURRENCY --duration $DURATION --rounds $ROUNDS --reference health $*"
	local perfpid=
	if [[ $PROFILE == 1 ]]; then
		perf record -F 999 -g -p "$pid" -o "$OUT/$name.perf.data" >/dev/null 2>&1 &
		perfpid=$!
	fi
	"${cmd[@]}" -o json >"$OUT/$name.json"
	if [[ -n $perfpid ]]; then kill -INT "$perfpid"; wait "$perfpid" || true; fi
	jq -r '"  health Check \(.reference.callsPerSec|floor)/s, \(.load.kind) \(.load.callsPerSec|floor) calls/s (\(.load.admitCallsPerSec|floor) Admit calls/s, \(.load.admissionsPerSec|floor) admissions/s); ratio \(.ratio*1000|round/1000) (median of rounds \(.ratioMedian*1000|round/1000); rounds \([.rounds[].ratio*100|round/100])); CPU µs/call client+server: Check \(.reference.clientCpuPerCallUs*10|round/10)+\(.reference.serverCpuPerCallUs*10|round/10), load \(.load.clientCpuPerCallUs*10|round/10)+\(.load.serverCpuPerCallUs*10|round/10), CPU ratio \(.cpuRatio*1000|round/1000); leases held after: \(.leasesHeld // "?"); Admit p50/p99 \(.load.latency.p50Us)/\(.load.latency.p99Us) µs, Check p50/p99 \(.reference.latency.p50Us)/\(.reference.latency.p99Us) µs; errors \(.load.errors // {})\(if .load.firstError then "; first: " + .load.firstError else "" end)"' "$OUT/$name.json"
	stop_server
}

measure admit-release
measure admit-only --release=false
measure admit-release-held --prefill "$PREFILL"

echo
echo "target: Admit(+Release) ÷ health Check ≥ 0.90; with $PREFILL leases held ≥ 0.85"
for name in admit-release admit-only admit-release-held; do
	jq -r --arg n "$name" '"\($n): \(.ratio*1000|round/1000) (median of rounds \(.ratioMedian*1000|round/1000)); by CPU per call \(.cpuRatio*1000|round/1000)"' "$OUT/$name.json"
done
echo "reports: $OUT/*.json"
