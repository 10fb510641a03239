#!/usr/bin/env bash
# gpu-check.sh: the real-driver check of NVML topology discovery, as one
# command on a machine with NVIDIA GPUs and a driver (nvidia-smi works).
#
#   deploy/gpu-check.sh [OUTDIR]        # OUTDIR defaults to ./gpu-check-out
#
# It builds with cgo (go-nvml needs it), runs the package's mock tests, then
# reads the real GPUs three ways and keeps every output in OUTDIR:
#   nvidia-smi.txt / nvidia-smi-nvlink.txt / fabric.txt   the driver's own view, to compare
#   print-topology.txt     go run ./cmd/sluiced --print-topology --topology=nvml
#   topology.json          go run ./cmd/sluicectl topology --topology=nvml -o json
#   cgo0.txt               the CGO_ENABLED=0 build's answer to --topology=nvml (must say unavailable)
# and checks what must hold on any GPU machine: --topology=nvml succeeds, the
# JSON has at least one domain and as many GPUs as nvidia-smi lists, and the
# cgo-less build refuses nvml clearly. Exit status 0 means all held.
# Needs Go 1.26+, gcc, python3 and the module cache: on a machine without
# network, fill it first (go mod download) where there is one and carry it.
set -euo pipefail

cd "$(dirname "$0")/.."
out="${1:-gpu-check-out}"
mkdir -p "$out"
fail=0
say() { printf '== %s\n' "$*"; }
bad() { printf 'FAIL: %s\n' "$*"; fail=1; }

say "driver"
nvidia-smi -L | tee "$out/nvidia-smi.txt"
nvidia-smi nvlink --status >"$out/nvidia-smi-nvlink.txt" 2>&1 || true
nvidia-smi -q | grep -A8 -i 'fabric' >"$out/fabric.txt" 2>&1 || true
want_gpus=$(nvidia-smi -L | grep -c '^GPU ')

say "build with cgo"
export CGO_ENABLED=1
go build ./topology/... ./cmd/sluiced ./cmd/sluicectl
go test -count=1 ./topology/... ./cmd/sluicectl/

say "sluiced --print-topology --topology=nvml"
if go run ./cmd/sluiced --print-topology --topology=nvml >"$out/print-topology.txt" 2>"$out/print-topology.err"; then
	cat "$out/print-topology.txt"
else
	cat "$out/print-topology.err"
	bad "sluiced --topology=nvml failed"
fi

say "sluicectl topology --topology=nvml -o json"
if go run ./cmd/sluicectl topology --topology=nvml -o json >"$out/topology.json" 2>"$out/topology.err"; then
	got=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(sum(d["gpus"] for d in r["domains"]), len(r["domains"]))' "$out/topology.json")
	read -r got_gpus got_domains <<<"$got"
	echo "domains: $got_domains, GPUs: $got_gpus (nvidia-smi lists $want_gpus)"
	[ "$got_domains" -ge 1 ] || bad "no domain discovered"
	[ "$got_gpus" -eq "$want_gpus" ] || bad "discovered $got_gpus GPUs, nvidia-smi lists $want_gpus"
	python3 -c 'import json,sys
r=json.load(open(sys.argv[1]))
for d in r["domains"]:
    print(d["id"], d["kind"], d["gpu_model"], "healthy %d/%d" % (d["healthy_gpus"], d["gpus"]), "peaks from", d["peaks"]["source"])
    for n in d["nodes"]:
        for g in n["gpus"]:
            if not g["healthy"]:
                print("  unhealthy:", n["name"], g["index"], g.get("problem", ""))' "$out/topology.json"
else
	cat "$out/topology.err"
	bad "sluicectl topology --topology=nvml failed"
fi

say "CGO_ENABLED=0 refuses nvml and says why"
if CGO_ENABLED=0 go run ./cmd/sluiced --print-topology --topology=nvml >"$out/cgo0.txt" 2>&1; then
	bad "the cgo-less build accepted --topology=nvml"
fi
cat "$out/cgo0.txt"
grep -q 'NVML unavailable: built without cgo' "$out/cgo0.txt" || bad "the cgo-less build did not say NVML is unavailable"

say "outputs in $out"
if [ "$fail" -ne 0 ]; then
	echo "gpu-check: FAILED"
	exit 1
fi
echo "gpu-check: ok"
