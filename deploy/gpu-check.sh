#!/usr/bin/env bash
# gpu-check.sh: the real-driver check of NVML topology discovery, as one
# command on a machine with NVIDIA GPUs and a driver (nvidia-smi works).
#
#   deploy/gpu-check.sh [OUTDIR]        # OUTDIR defaults to ./gpu-check-out
#
# It builds with cgo (go-nvml needs it), runs the package's mock tests, then
# reads the real GPUs three ways and keeps every output in OUTDIR:
#   nvidia-smi.txt / nvidia-smi-nvlink.txt / nvidia-smi-q.txt   the driver's own view, to compare
#   print-topology.txt     go run ./cmd/sluiced --print-topology --topology=nvml
#   print-topology.json    the same with --print-topology-format=json
#   topology.json          go run ./cmd/sluicectl topology --topology=nvml -o json
#   cgo0.txt               the CGO_ENABLED=0 build's answer to --topology=nvml (must say unavailable)
# and checks what must hold on any GPU machine: --topology=nvml succeeds, the
# JSON has at least one domain and as many GPUs as nvidia-smi lists, every
# GPU has as many active NVLinks as `nvidia-smi nvlink --status` shows up,
# every GPU whose fabric `nvidia-smi -q` reports registered (NVL72) is in
# that clique's domain (or unhealthy, saying why), and the cgo-less build
# refuses nvml clearly. Machines without NVLink or without a fabric (HGX,
# PCIe) skip those comparisons. Exit status 0 means all held.
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
nvidia-smi -q >"$out/nvidia-smi-q.txt" 2>&1 || true
want_gpus=$(nvidia-smi -L | grep -c '^GPU ')

say "build with cgo"
export CGO_ENABLED=1
go build ./topology/... ./cmd/sluiced ./cmd/sluicectl
go test -count=1 ./topology/... ./cmd/sluicectl/ ./cmd/sluiced/

say "sluiced --print-topology --topology=nvml"
if go run ./cmd/sluiced --print-topology --topology=nvml >"$out/print-topology.txt" 2>"$out/print-topology.err"; then
	cat "$out/print-topology.txt"
else
	cat "$out/print-topology.err"
	bad "sluiced --topology=nvml failed"
fi

if go run ./cmd/sluiced --print-topology --topology=nvml --print-topology-format=json >"$out/print-topology.json" 2>>"$out/print-topology.err"; then
	python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$out/print-topology.json" || bad "sluiced --print-topology-format=json is not JSON"
else
	bad "sluiced --print-topology-format=json failed"
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
    print(d["id"], d["kind"], d["gpuModel"], "healthy %d/%d" % (d["healthyGpus"], d["gpus"]), "peaks from", d["peaks"]["source"])
    for n in d["nodes"]:
        for g in n["gpus"]:
            if not g["healthy"]:
                print("  unhealthy:", n["name"], g["index"], g.get("problem", ""))' "$out/topology.json"
	say "NVLinks and fabric against nvidia-smi"
	python3 - "$out/topology.json" "$out/nvidia-smi-nvlink.txt" "$out/nvidia-smi-q.txt" <<'PY' || bad "discovery disagrees with nvidia-smi (above)"
import json, re, sys
report = json.load(open(sys.argv[1]))
gpus = {}  # uuid -> (domain id, gpu report)
for d in report["domains"]:
    for n in d["nodes"]:
        for g in n["gpus"]:
            if g["uuid"]:
                gpus[g["uuid"].lower()] = (d["id"], g)
bad = 0

# nvidia-smi nvlink --status: "GPU i: NAME (UUID: GPU-…)" then "Link k: 26.562 GB/s"
# for an active link ("<inactive>" otherwise). No such lines: no NVLink.
links, cur = {}, None
for line in open(sys.argv[2]):
    m = re.match(r"GPU \d+: .*\(UUID: (GPU-[0-9a-fA-F-]+)\)", line)
    if m:
        cur = m.group(1).lower()
        links[cur] = 0
    elif cur and re.search(r"Link \d+: .*GB/s", line):
        links[cur] += 1
if not any(links.values()):
    print("nvlink: no active NVLink reported by nvidia-smi; skipped")
for uuid, want in sorted(links.items()):
    if uuid not in gpus:
        print("nvlink: nvidia-smi lists", uuid, "which discovery did not"); bad = 1; continue
    got = gpus[uuid][1]["activeNvlinks"]
    print("nvlink: %s %d active (nvidia-smi %d)" % (uuid, got, want))
    if got != want:
        bad = 1

# nvidia-smi -q: per GPU "GPU UUID : GPU-…", and a "Fabric" section with
# State, Status, CliqueId, ClusterUUID ("N/A" or absent without a fabric).
text = open(sys.argv[3]).read()
sections = re.split(r"\n(?=GPU [0-9A-Fa-f]{8}:)", text)
seen = 0
for sec in sections:
    m = re.search(r"GPU UUID\s*:\s*(GPU-[0-9a-fA-F-]+)", sec)
    f = re.split(r"^\s*Fabric\s*$", sec, maxsplit=1, flags=re.M)
    if not m or len(f) < 2:
        continue
    field = lambda k: (re.search(r"^\s*" + k + r"\s*:\s*(\S+)", f[1], re.M) or [None, ""])[1]
    state, status, clique, cluster = field("State"), field("Status"), field("CliqueId"), field("ClusterUUID")
    if state.lower() != "completed" or status.lower() != "success" or not clique.isdigit() or cluster in ("", "N/A") or set(cluster) <= set("0-"):
        continue
    seen += 1
    uuid, want = m.group(1).lower(), "%s.%s" % (cluster.lower(), clique)
    if uuid not in gpus:
        print("fabric: nvidia-smi lists", uuid, "which discovery did not"); bad = 1; continue
    domain, g = gpus[uuid]
    ok = domain == want or (not g["healthy"] and "clique" in g.get("problem", ""))
    print("fabric: %s in %s (nvidia-smi %s)%s" % (uuid, domain, want, "" if ok else "  MISMATCH"))
    if not ok:
        bad = 1
if not seen:
    print("fabric: no registered fabric reported by nvidia-smi (HGX, PCIe); skipped")
sys.exit(bad)
PY
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
