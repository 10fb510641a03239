// Package topology is Sluice's model of the cluster it schedules onto:
//
//	Cluster → Domain (an NVLink domain) → Node → GPU (with its Peaks)
//
// It knows nothing of capacity or requests; package pd turns a Domain's
// peaks into buckets.
//
// # Domains
//
// A domain is the unit no request may cross: prefill, decode and the KV
// transfer between them stay inside one NVLink domain. On NVL72 systems it
// is the NVLink clique (NVML fabric info "<ClusterUuid>.<CliqueId>", the
// nvidia.com/gpu.clique label); GPUs without fabric (HGX boards) form one
// domain per node. Cluster.Validate enforces that domain ids are unique and
// that every node name is unique across the cluster, so a node belongs to
// exactly one domain and nothing spans two.
//
// # Peaks
//
// Each GPU has Peaks: SMs, dense BF16 FLOP/s, HBM bandwidth (B/s) and HBM
// bytes. They come from the known-GPU table (LookupGPU, Source "table"),
// from config (Source "config"), or from NVML readings (Source
// "nvml-estimate"). The table, by datasheet:
//
//	model  SMs  FLOP/s (dense bf16)  HBM B/s   HBM bytes   NVML name
//	H100   132  989e12               3.35e12   80e9        NVIDIA H100 80GB HBM3 (SXM)
//	H200   132  989e12               4.8e12    141e9       NVIDIA H200
//	B200   148  2.25e15              8.0e12    180e9       NVIDIA B200
//	GB200  148  2.5e15               8.0e12    186e9       NVIDIA GB200 (per GPU)
//
// Names match case-insensitively by their first word after "NVIDIA", so
// "GB200" is never read as "B200"; PCIe and NVL boards are not matched.
// ModelName gives the canonical model ("GB200") that calibrations key on.
//
// Peaks.Figures records the source of each figure where they differ (an
// NVML estimate reads HBM bytes and SMs, SourceNVML, and derives bandwidth
// and FLOP/s, SourceNVMLEstimate; a known GPU discovered through NVML takes
// HBM bytes and SMs from NVML and the rest from the table; a figure that
// could not be obtained is SourceUnavailable); FigureSources resolves them.
//
// A domain's capacity counts its healthy GPUs only. With h(g) = 1 for a
// healthy GPU and 0 otherwise:
//
//	Domain.TotalPeaks().X = Σ_{g ∈ domain} h(g) · g.Peaks.X   for X ∈ {SMs, FLOPS, HBMBandwidth, HBMBytes}
//	Domain.GPUModel()     = ModelName(g.Name) if every healthy GPU agrees (every GPU
//	                        when none is healthy), else "mixed"
//
// An unhealthy GPU stays in the topology, with GPU.Problem saying why
// (fabric health, missing NVLinks, peaks that could not be estimated, an
// identity NVML could not read), so that a smaller domain is explained. Its
// peaks may be zero.
//
// # Sources
//
// NVML discovery (package topology/nvml) runs per node and gives a
// NodeDiscovery: the node, its GPUs and its clique. Merge assembles a
// cluster from any number of them: nodes of one clique form a domain of
// kind KindNVLinkClique, a node without a clique is a domain by itself
// (KindHGX, or KindPCIe without NVLink), and a GPU with fewer active NVLinks
// than the domain's other GPUs of its model is marked unhealthy. Write
// prints a cluster as a table or JSON (sluicectl topology).
//
// Simulated is the embedded default (two GB200 NVL72 racks and four HGX
// H200 servers: 6 domains, 176 GPUs). LoadFile and Parse read a cluster
// file, YAML or JSON (JSON is YAML), strictly: unknown and duplicate keys are
// errors, and every error names its key path, e.g.
//
//	cluster.yaml: domains[1].nodes[0].gpu: unknown GPU "X100" (known: B200, GB200, H100, H200); give peaks to use it
//
// # File format
//
//	domains:                        # required, one entry per NVLink domain
//	  - id: rack-a                  # required, unique
//	    kind: nvl72                 # required, free text (nvl72, hgx, …)
//	    gpu: GB200                  # default GPU for the nodes below
//	    gpus_per_node: 4            # default count for the nodes below
//	    peaks: {hbm_bytes: 180e9}   # default peaks override for the nodes below
//	    nodes:                      # required: a list of nodes …
//	      - name: rack-a-tray01     # required, unique in the cluster
//	        gpu: GB200              # model from the table, or any name with full peaks
//	        count: 4                # N identical healthy GPUs
//	        peaks: {sms: 148, flops: 2.5e15, hbm_bandwidth: 8e12, hbm_bytes: 186e9}
//	      - name: rack-a-tray02
//	        gpus:                   # … or list the GPUs (instead of count)
//	          - {}                  # every key optional:
//	          - {healthy: false, active_nvlinks: 0, uuid: GPU-…, pci_bus_id: …, name: GB200, index: 1, peaks: {…}}
//	  - id: rack-b                  # … or a node count (the domain shorthand):
//	    kind: nvl72
//	    gpu: GB200                  # required with a count
//	    gpus_per_node: 4            # required with a count
//	    nodes: 18                   # nodes rack-b-node01 … rack-b-node18
//	    node_prefix: rack-b-tray    # optional: name them rack-b-tray01 … instead
//	    engines:                    # optional: serving engines whose metrics correct the capacity
//	      - {metrics: "http://rack-b-node01:8000/metrics", kind: vllm}   # kind: vllm, sglang, or one the config names
//
// Peaks overrides apply field by field over the table, domain then node then
// GPU, and make the source "config"; a GPU the table does not know needs all
// four fields. Generated GPUs are healthy, have the table's NVLink port
// count (18 for the four models; 0 for unknown GPUs), and deterministic fake
// UUIDs and PCI bus ids derived from the node name and index. EncodeYAML and
// EncodeJSON write a cluster back in this format; testdata/cluster.yaml is
// an example.
//
// Values of this package are plain data, safe to share once no one writes
// to them.
package topology
