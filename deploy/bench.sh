#!/usr/bin/env bash
# bench.sh — every figure of docs/performance.md's table, from one
# command, each printed beside the reference measured in the same run, the
# ratio the target is about, the target, and whether it is met.
#
#   deploy/bench.sh                 # everything (about 20 minutes on 2 cores)
#   GRPC=0 deploy/bench.sh          # without the separate-process gRPC runs
#   COUNT=5 deploy/bench.sh         # more runs per benchmark (medians are printed)
#   FLEET=0 deploy/bench.sh         # without the fleet-scale runs
#
# Environment: COUNT (3) runs per Go benchmark; GRPC (1) runs
# deploy/bench-grpc.sh (sluiced and sluicectl load as two processes; its
# own knobs — CONCURRENCY, DURATION, ROUNDS, PREFILL — pass through);
# OUT (a temporary directory) keeps every raw output. The Redis rows run
# when redis-server is on PATH (the benchmark starts its own), the
# instruction counts when valgrind is (callgrind: a count no other work on
# the machine moves, beside the time that it does). Run from
# anywhere; it works in the repository root. Needs Go and jq.
#
# FLEET (GRPC's value) runs deploy/bench-fleet.sh: 1,400 NVL72 domains and
# a million tenants, a few minutes more; its own knobs — DOMAINS, TENANTS,
# ACTIVE, CHURN — and the ones above pass through. It also runs
# BenchmarkTenantChangeAtFleetScale (internal/controlplane): one tenant's
# change through a real etcd holding a million tenant documents.
#
# Every figure is a median of COUNT runs. On a machine shared with other
# work the absolute figures move; the ratios, measured in the same run,
# move much less.
set -euo pipefail

COUNT=${COUNT:-3}
GRPC=${GRPC:-1}
FLEET=${FLEET:-$GRPC}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
failed=0

# median FILE NAME UNIT: the median of the values given in UNIT by the
# benchmark lines of NAME (its -N GOMAXPROCS suffix aside).
median() {
	{ grep -E "^$2(-[0-9]+)?[[:space:]]" "$1" || true; } |
		awk -v u="$3" '{ for (i = 2; i <= NF; i++) if ($i == u) print $(i-1) }' |
		sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else print v[int((NR + 1) / 2)] }'
}

# calc EXPR: awk arithmetic, three significant figures.
calc() { awk "BEGIN { printf \"%.3g\", $1 }"; }

# row MEASURE FIGURE REFERENCE RATIO TARGET-OP TARGET-VALUE VALUE: one line
# of the table; VALUE is held to the target (VALUE OP TARGET-VALUE).
row() {
	local verdict
	verdict=$(awk -v v="$7" -v b="$6" -v op="$5" 'BEGIN {
		if (v == "nan" || v == "") { print "?"; exit }
		ok = (op == "<=") ? (v + 0 <= b + 0) : (v + 0 >= b + 0)
		print ok ? "met" : "NOT MET" }')
	[[ $verdict == met ]] || failed=1
	printf '%-46s | %-22s | %-30s | %-16s | %-9s | %s\n' "$1" "$2" "$3" "$4" "$5 $6" "$verdict"
}

# info MEASURE FIGURE REFERENCE RATIO: a line of the table with no target
# of its own (a bound the targets are read against).
info() {
	printf '%-46s | %-22s | %-30s | %-16s | %-9s | %s\n' "$1" "$2" "$3" "$4" "" "(bound)"
}

bench() { # OUTFILE PACKAGE ARGS…: one go test -bench run, its output kept
	local file=$1 pkg=$2
	shift 2
	echo "go test -run '^\$' $* $pkg" >&2
	go test -run '^$' "$@" "$pkg" >"$OUT/$file"
}

bench admission.txt ./admission/ -bench 'BenchmarkAdmit$|BenchmarkXTimeRate|BenchmarkIdleTenantMemory|BenchmarkLeaseMemory' -benchmem -count "$COUNT"
bench wfq.txt ./wfq/ -bench 'BenchmarkEnqueueDequeueRatio$' -benchmem -count "$COUNT"
bench queued.txt ./admission/ -bench 'BenchmarkQueuedAdmit$' -benchmem -count "$COUNT"
bench grpc-inprocess.txt ./internal/server/ -bench 'BenchmarkGRPC$|BenchmarkRLS$/(Interleaved|Canned)' -benchtime 3s -count "$COUNT"
bench replay.txt ./internal/replay/ -bench 'BenchmarkReplayCodeHour$|BenchmarkReadCodeTrace' -benchtime 5x -cpu 1 -count "$COUNT"
if command -v redis-server >/dev/null; then
	bench redis.txt ./internal/state/redisstate/ -bench BenchmarkDecision -benchtime 2s -count "$COUNT"
fi
# instructions PATTERN BENCH N: instructions per call of the functions
# matching PATTERN while BENCH runs N times under callgrind (simulated
# execution: no other work on the machine changes it).
instructions() {
	local out
	# Without asynchronous preemption: callgrind can abort on the
	# runtime's preemption signal, and no count would come back.
	out=$(GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --toggle-collect="$1" --callgrind-out-file=/dev/null \
		"$OUT/admission.test" -test.run '^$' -test.bench "$2" -test.benchtime "${3}x" -test.cpu 1 2>&1 >/dev/null |
		awk '/Collected :/ { print $NF }')
	awk -v n="${out:-nan}" -v runs="$(($3 + 1))" 'BEGIN { printf "%.0f", n / runs }' # testing runs it once with N=1 first
}
if command -v valgrind >/dev/null; then
	echo "valgrind --tool=callgrind: instructions per Admit and per AllowN" >&2
	go test -c -o "$OUT/admission.test" ./admission/
	admit_instr=$(instructions '*admission.(*Engine).Admit' 'BenchmarkAdmit$' 20000)
	allown_instr=$(instructions '*rate.(*Limiter).reserveN' 'BenchmarkXTimeRate/AllowN$' 200000)
fi
echo "go test -count=1 -run TestHundredThousandTenantsResidentMemory -v ./cmd/sluiced/" >&2
go test -count=1 -run TestHundredThousandTenantsResidentMemory -v ./cmd/sluiced/ >"$OUT/rss.txt" || true
if [[ $GRPC == 1 ]]; then
	echo "deploy/bench-grpc.sh" >&2
	OUT="$OUT/grpc" deploy/bench-grpc.sh >"$OUT/grpc.txt"
fi
if [[ $FLEET == 1 ]]; then
	echo "deploy/bench-fleet.sh" >&2
	OUT="$OUT/fleet" deploy/bench-fleet.sh >"$OUT/fleet.txt" || true
	bench etcd-tenant.txt ./internal/controlplane/ -bench BenchmarkTenantChangeAtFleetScale -benchtime 200x -count 1 -timeout 30m
fi

echo
printf '%-46s | %-22s | %-30s | %-16s | %-9s | %s\n' measure figure "reference (same run)" ratio target ""
printf '%s\n' "-----------------------------------------------+------------------------+--------------------------------+------------------+-----------+--------"

a=$OUT/admission.txt
admit=$(median "$a" BenchmarkAdmit ns/op)
allocs=$(median "$a" BenchmarkAdmit allocs/op)
allown=$(median "$a" BenchmarkXTimeRate/AllowN ns/op)
row "in-process Admit, admitted at once" "$admit ns, $allocs allocs" "x/time/rate AllowN $allown ns" "$(calc "$admit / $allown")× AllowN" "<=" 20 "$(calc "$admit / $allown")"
allow=$(median "$a" BenchmarkXTimeRate/Allow ns/op)
info "  the same beside Allow (reads the clock too)" "$admit ns" "x/time/rate Allow $allow ns" "$(calc "$admit / $allow")× Allow"
if [[ -n ${admit_instr:-} ]]; then
	# AllowN is inlined into its caller: reserveN is the whole of its work.
	info "  the same in instructions (callgrind)" "$admit_instr instructions" "AllowN $allown_instr instructions" "$(calc "$admit_instr / $allown_instr")× AllowN"
fi
row "in-process Admit: allocations" "$allocs allocs/op" "" "" "<=" 0 "$allocs"
idle=$(median "$a" BenchmarkIdleTenantMemory bytes/tenant)
row "idle tenant (100k configured)" "$idle B" "" "" "<=" 128 "$idle"
lease=$(median "$a" BenchmarkLeaseMemory bytes/lease)
row "lease held (200k held)" "$lease B" "" "" "<=" 256 "$lease"

rss=$(grep -o '[0-9.]* MB resident' "$OUT/rss.txt" | awk '{ print $1 }' || true)
row "sluiced RSS, 100k tenants" "${rss:-?} MB" "" "" "<=" 64 "${rss:-nan}"

w=$OUT/wfq.txt
w1k=$(median "$w" BenchmarkEnqueueDequeueRatio ns/op-1k)
w100k=$(median "$w" BenchmarkEnqueueDequeueRatio ns/op-100k)
wratio=$(median "$w" BenchmarkEnqueueDequeueRatio ratio)
row "WFQ enqueue+dequeue, 100k flows (CPU time)" "$w100k ns" "1k flows: $w1k ns" "$(calc "$wratio")× 1k" "<=" 300 "$w100k"
row "WFQ 100k flows ÷ 1k flows, same run" "$(calc "$wratio")×" "" "" "<=" 4 "$wratio"
qa=$OUT/queued.txt
qratio=$(median "$qa" BenchmarkQueuedAdmit ratio)
row "queued Admit, 100k backlogged flows ÷ 1k" "$(median "$qa" BenchmarkQueuedAdmit ns/op-100k) ns" "1k flows: $(median "$qa" BenchmarkQueuedAdmit ns/op-1k) ns" "$(calc "$qratio")× 1k" "<=" 2 "$qratio"

g=$OUT/grpc-inprocess.txt
check=$(median "$g" BenchmarkGRPC/HealthCheck ns/op)
gadmit=$(median "$g" BenchmarkGRPC/Admit ns/op)
row "gRPC Admit, client in-process" "$gadmit ns/op" "health Check $check ns/op" "$(calc "$check / $gadmit")" ">=" 0.9 "$(calc "$check / $gadmit")"
rls=$(median "$g" BenchmarkRLS/Interleaved rls/check)
row "gRPC ShouldRateLimit (Envoy RLS), in-process" "$(median "$g" BenchmarkRLS/Interleaved ns/rls) ns/call" "health Check $(median "$g" BenchmarkRLS/Interleaved ns/check) ns/call" "$rls (CPU $(median "$g" BenchmarkRLS/Interleaved rls/check-cpu))" ">=" 0.9 "$rls"
# The protocol's own cost: the same server options and client against
# handlers answering a prepared response of the same shape, no engine.
info "  the same, canned answer: protocol only" "$(median "$g" BenchmarkRLS/Canned ns/rls) ns/call" "health Check $(median "$g" BenchmarkRLS/Canned ns/check) ns/call" "$(median "$g" BenchmarkRLS/Canned rls/check) (CPU $(median "$g" BenchmarkRLS/Canned rls/check-cpu))"
info "gRPC Admit, canned answer: protocol only" "$(median "$g" BenchmarkRLS/Canned ns/admit) ns/call" "health Check $(median "$g" BenchmarkRLS/Canned ns/check) ns/call" "$(median "$g" BenchmarkRLS/Canned admit/check) (CPU $(median "$g" BenchmarkRLS/Canned admit/check-cpu))"

if [[ $GRPC == 1 ]]; then
	for spec in "admit-release:Admit+Release, client a process:0.9" "admit-only:Admit only (leases accumulate):0.9" "admit-release-held:Admit+Release, 200k leases held:0.85"; do
		IFS=: read -r name label target <<<"$spec"
		j=$OUT/grpc/$name.json
		if [[ ! -f $j ]]; then
			row "gRPC $label" "?" "" "" ">=" "$target" nan
			continue
		fi
		ratio=$(jq -r '.ratio' "$j")
		row "gRPC $label" "$(jq -r '.load.callsPerSec|floor' "$j") calls/s" "health Check $(jq -r '.reference.callsPerSec|floor' "$j") calls/s" "$(calc "$ratio") (CPU $(calc "$(jq -r '.cpuRatio' "$j")"))" ">=" "$target" "$ratio"
	done
fi

if [[ $FLEET == 1 ]]; then
	f=$OUT/fleet
	fd=$(jq -r '.domains // "?"' "$f/fleet.json" 2>/dev/null || echo "?")
	ft=$(jq -r '.tenants // "?"' "$f/fleet.json" 2>/dev/null || echo "?")
	fa=$(jq -r '.load.tenants[0].pool // "?"' "$f/cold.json" 2>/dev/null || echo "?")
	for spec in "cold:$fd NVL72 × $fa tenants, from cold:0.8" "churn:the same, placement changing ${CHURN:-10}/s:0.75"; do
		IFS=: read -r name label target <<<"$spec"
		j=$f/$name.json
		if [[ ! -f $j ]]; then
			row "fleet: $label" "?" "" "" ">=" "$target" nan
			continue
		fi
		ratio=$(jq -r '.ratio' "$j")
		row "fleet: $label" "$(jq -r '.load.callsPerSec|floor' "$j") calls/s" "health Check $(jq -r '.reference.callsPerSec|floor' "$j") calls/s" "$(calc "$ratio") (CPU $(calc "$(jq -r '.cpuRatio' "$j")"))" ">=" "$target" "$ratio"
	done
	rss=nan hwm=?
	if [[ -f $f/rss.json ]]; then
		rss=$(jq -r '.rssMB | round' "$f/rss.json")
		hwm=$(jq -r '.hwmMB | round' "$f/rss.json")
	fi
	row "fleet: RSS, $ft tenants, $(jq -r '.active // "?"' "$f/rss.json" 2>/dev/null || echo "?") active" "$rss MB" "" "" "<=" 512 "$rss"
	info "  its peak (VmHWM), start-up included" "$hwm MB" "" ""
	e=$OUT/etcd-tenant.txt
	change=$(median "$e" BenchmarkTenantChangeAtFleetScale ms/change)
	row "fleet: one tenant's change through etcd, 1M" "$change ms" "etcd put+watch $(median "$e" BenchmarkTenantChangeAtFleetScale ms/etcd-trip) ms" "$(calc "$(median "$e" BenchmarkTenantChangeAtFleetScale ratio)")× etcd" "<=" 100 "$change"
	info "  start-up from etcd, 1M tenant documents" "$(median "$e" BenchmarkTenantChangeAtFleetScale startup-s) s" "" ""
fi

r=$OUT/replay.txt
hour=$(median "$r" BenchmarkReplayCodeHour ns/op)
read=$(median "$r" BenchmarkReadCodeTrace ns/op)
row "replay an hour of the code trace, 1 core" "$(calc "$hour / 1e9") s" "reading it: $(calc "$read / 1e9") s" "" "<=" 60 "$(calc "$hour / 1e9")"

if [[ -f $OUT/redis.txt ]]; then
	x=$OUT/redis.txt
	bp99=$(median "$x" BenchmarkDecision/batched p99-µs)
	ep99=$(median "$x" BenchmarkDecision/embedded p99-µs)
	calls=$(median "$x" BenchmarkDecision/batched redis-calls/decision)
	row "decision p99, batched Redis" "$bp99 µs" "embedded $ep99 µs" "+$(calc "$bp99 - $ep99") µs" "<=" 50 "$(calc "$bp99 - $ep99")"
	row "Redis calls per decision, batched" "$calls" "" "" "<=" 0.01 "$calls"
fi

echo
echo "raw outputs: $OUT"
exit "$failed"
