#!/usr/bin/env bash
# bench-fleet.sh — sluiced at fleet scale from outside its process, each
# figure beside the same server's gRPC health Check in the same run, as
# deploy/bench-grpc.sh measures the default cluster.
#
# It builds sluiced and sluicectl, writes a fleet with `sluicectl fleet
# generate` (DOMAINS GB200 NVL72 domains, TENANTS tenants whose quotas never
# bind) and, for each measurement, starts a fresh sluiced on it, runs
# `sluicectl load` against it — a separate process on the generated
# admission/v1 client, C callers, Admit then Release — and stops the server:
#
#   1. cold         Admit+Release, each call a random tenant of the first
#                   ACTIVE, from the server's start: no warm-up round, so
#                   every tenant's first decision is in the figure
#                   (target ≥ 0.80 of health Check)
#   2. churn        the same while placement changes CHURN times a second
#                   (--churn: a domain drained, a domain's health weight
#                   cut, a domain undrained, in turn; target ≥ 0.75)
#   3. rss          the ACTIVE tenants each admitted once, in turn
#                   (--prefill ACTIVE --tenant-order sequential: their
#                   leases held together, then released), then sluiced's
#                   resident memory (VmRSS, the least of 5 samples a second
#                   apart, as the runtime hands freed memory back in the
#                   background; target ≤ 512 MB) beside its peak (VmHWM,
#                   start-up included)
#
# It prints each ratio, of calls per second and of CPU time per call
# (client + server, from /proc), and the memory; the JSON reports go to OUT.
# Run from the repository root:
#
#   deploy/bench-fleet.sh                       # defaults below
#   DURATION=3s ROUNDS=2 deploy/bench-fleet.sh  # a short run
#
# Environment: DOMAINS (1400), TENANTS (1000000) configured, ACTIVE
# (100000) the tenants drawn, CONCURRENCY (16), DURATION per side per round
# (5s), ROUNDS (6), CHURN (10) changes per second, PORT (17170; PORT+1 is
# the HTTP port), OUT (a directory for the fleet's files and the reports;
# default a temporary one), SKIP (space-separated measurements not to run:
# cold churn rss). Needs Go and jq.
set -euo pipefail

DOMAINS=${DOMAINS:-1400}
TENANTS=${TENANTS:-1000000}
ACTIVE=${ACTIVE:-100000}
CONCURRENCY=${CONCURRENCY:-16}
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-6}
CHURN=${CHURN:-10}
PORT=${PORT:-17170}
MEMORY_LIMIT=${MEMORY_LIMIT:-460MiB}
SKIP=${SKIP:-}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(mktemp -d)
OUT=${OUT:-$bin}
mkdir -p "$OUT"
addr=127.0.0.1:$PORT
pid=

cleanup() {
	if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

if ((ACTIVE > TENANTS)); then
	echo "ACTIVE=$ACTIVE: want at most TENANTS=$TENANTS" >&2
	exit 2
fi

echo "building sluiced and sluicectl into $bin" >&2
(cd "$root" && go build -o "$bin/sluiced" ./cmd/sluiced && go build -o "$bin/sluicectl" ./cmd/sluicectl)

fleet=$OUT/fleet
"$bin/sluicectl" fleet generate --dir "$fleet" --domains "$DOMAINS" --tenants "$TENANTS" -o json >"$OUT/fleet.json"
format=$(jq -r .tenantFormat "$OUT/fleet.json")
pool="$format:$ACTIVE:small"
echo "fleet: $DOMAINS NVL72 domains ($(jq -r .gpus "$OUT/fleet.json") GPUs), $TENANTS tenants; load draws from --tenant-pool $pool" >&2

# start_server NAME: a fresh sluiced on the fleet; its start-up time (to
# the first answer of ListDomains) goes to OUT/NAME.startup.
start_server() {
	local t0
	t0=$(date +%s.%N)
	"$bin/sluiced" --config "$fleet/config.yaml" --topology "$fleet/topology.yaml" --grpc-addr "$addr" \
		--http-addr "127.0.0.1:$((PORT + 1))" --memory-limit "$MEMORY_LIMIT" --log-level warn >"$OUT/$1.sluiced.log" 2>&1 &
	pid=$!
	# A million tenants take a while to read: up to 5 minutes.
	for _ in $(seq 3000); do
		if "$bin/sluicectl" domain list --server "$addr" --timeout 1s -o json >/dev/null 2>&1; then
			awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f\n", b - a }' >"$OUT/$1.startup"
			return
		fi
		if ! kill -0 "$pid" 2>/dev/null; then break; fi
		sleep 0.1
	done
	echo "sluiced did not answer on $addr; its log:" >&2
	cat "$OUT/$1.sluiced.log" >&2
	exit 1
}

stop_server() {
	kill "$pid"
	wait "$pid" || true
	pid=
}

# kb PID FIELD: a field of /proc/PID/status, in kB.
kb() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }

skipped() { [[ " $SKIP " == *" $1 "* ]]; }

# measure NAME ARGS…: one fresh server, one sluicectl load with the reference.
measure() {
	local name=$1
	shift
	start_server "$name"
	local cmd=("$bin/sluicectl" load --server "$addr" --tenant-pool "$pool" --concurrency "$CONCURRENCY"
		--duration "$DURATION" --rounds "$ROUNDS" --reference health --server-pid "$pid" "$@")
	echo "== $name: sluicectl load --server $addr --tenant-pool $pool --concurrency $CONCURRENCY --duration $DURATION --rounds $ROUNDS --reference health $* (sluiced up in $(cat "$OUT/$name.startup")s)"
	"${cmd[@]}" -o json >"$OUT/$name.json"
	jq -r '"  health Check \(.reference.callsPerSec|floor)/s, \(.load.kind) \(.load.callsPerSec|floor) calls/s; ratio \(.ratio*1000|round/1000) (median of rounds \(.ratioMedian*1000|round/1000); rounds \([.rounds[].ratio*100|round/100])); CPU µs/call client+server: Check \(.reference.clientCpuPerCallUs*10|round/10)+\(.reference.serverCpuPerCallUs*10|round/10), load \(.load.clientCpuPerCallUs*10|round/10)+\(.load.serverCpuPerCallUs*10|round/10), CPU ratio \(.cpuRatio*1000|round/1000); tenants called \([.load.tenants[].distinct]|add) of \(.load.tenants[0].pool); Admit p50/p99 \(.load.latency.p50Us)/\(.load.latency.p99Us) µs; errors \(.load.errors // {})\(if .load.firstError then "; first: " + .load.firstError else "" end)\(if .load.churn then "; churn \(.load.churn.changesPerSec*10|round/10)/s: \(.load.churn.drains) drains, \(.load.churn.undrains) undrains, \(.load.churn.healthCuts) health cuts, \(.load.churn.weightCut) domains with a cut weight after, errors \(.load.churn.errors // {})" else "" end)"' "$OUT/$name.json"
	stop_server
}

skipped cold || measure cold
skipped churn || measure churn --churn --churn-rate "$CHURN"

if ! skipped rss; then
	start_server rss
	echo "== rss: sluicectl load --server $addr --tenant-pool $pool --tenant-order sequential --prefill $ACTIVE --concurrency $CONCURRENCY --duration 1s (sluiced up in $(cat "$OUT/rss.startup")s)"
	"$bin/sluicectl" load --server "$addr" --tenant-pool "$pool" --tenant-order sequential --prefill "$ACTIVE" \
		--concurrency "$CONCURRENCY" --duration 1s -o json >"$OUT/rss-load.json"
	least=
	for _ in 1 2 3 4 5; do
		v=$(kb "$pid" VmRSS)
		if [[ -z $least ]] || ((v < least)); then least=$v; fi
		sleep 1
	done
	hwm=$(kb "$pid" VmHWM)
	heap=$(curl -s "http://127.0.0.1:$((PORT + 1))/metrics" | awk '$1 == "go_memstats_heap_inuse_bytes" { printf "%d", $2 }')
	jq -n --argjson rss "$least" --argjson hwm "$hwm" --argjson heap "${heap:-0}" --arg limit "$MEMORY_LIMIT" --argjson startup "$(cat "$OUT/rss.startup")" \
		--argjson domains "$DOMAINS" --argjson tenants "$TENANTS" --argjson active "$ACTIVE" \
		--argjson prefilled "$(jq .prefilled "$OUT/rss-load.json")" \
		'{domains: $domains, tenants: $tenants, active: $active, prefilled: $prefilled, rssMB: ($rss / 1024), hwmMB: ($hwm / 1024), heapInuseMB: ($heap / 1048576), memoryLimit: $limit, startupSeconds: $startup}' >"$OUT/rss.json"
	jq -r '"  \(.prefilled) tenants admitted once each; sluiced VmRSS \(.rssMB*10|round/10) MB (least of 5 samples), VmHWM \(.hwmMB*10|round/10) MB, heap in use \(.heapInuseMB*10|round/10) MB (--memory-limit \(.memoryLimit)); start-up \(.startupSeconds) s"' "$OUT/rss.json"
	stop_server
fi

echo
echo "targets: cold Admit+Release ÷ health Check ≥ 0.80; with churn ≥ 0.75; RSS ≤ 512 MB"
for name in cold churn; do
	[[ -f $OUT/$name.json ]] || continue
	jq -r --arg n "$name" '"\($n): \(.ratio*1000|round/1000) (median of rounds \(.ratioMedian*1000|round/1000)); by CPU per call \(.cpuRatio*1000|round/1000)"' "$OUT/$name.json"
done
[[ -f $OUT/rss.json ]] && jq -r '"rss: \(.rssMB*10|round/10) MB (peak \(.hwmMB*10|round/10) MB)"' "$OUT/rss.json"
echo "reports: $OUT/*.json"
