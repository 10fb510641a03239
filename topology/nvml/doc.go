// Package nvml discovers a node's GPU topology through NVML
// (github.com/NVIDIA/go-nvml) and resolves the --topology setting that
// sluiced, sluicectl and sluice-agent share.
//
// # What is read, per GPU
//
// UUID, name, PCI bus id, active NVLinks (GetNvLinkState on every link,
// counting FEATURE_ENABLED), and fabric info: GetGpuFabricInfo_v4 where the
// driver has it (it adds the fabric health summary), else GetGpuFabricInfo,
// each guarded by the library's symbol lookup, so an older driver is not
// asked for a function it lacks. GetGpuFabricInfoV is not used: its handler
// is a struct the mocks cannot fake.
//
// A GPU whose fabric state is COMPLETED with status SUCCESS and a non-zero
// cluster UUID is in the clique "<ClusterUuid>.<CliqueId>" (the string GPU
// Feature Discovery writes as nvidia.com/gpu.clique); a node's GPUs in a
// clique make it part of that domain, and GPUs without fabric (HGX, PCIe)
// make the node its own domain. A GPU is unhealthy (it stays listed, with
// its Problem, and contributes no capacity) when its fabric registration is
// not finished or failed, when its fabric health summary is UNHEALTHY or
// LIMITED_CAPACITY, when it is in a different clique than the rest of its
// node, or (decided by topology.Merge, which sees the whole domain) when it
// has fewer active NVLinks than its domain peers.
//
// # Peaks
//
// A GPU named in the known-GPU table (topology.LookupGPU) takes the table's
// peaks. Any other GPU's peaks are estimated from readings, with the source
// of each figure recorded in Peaks.Figures:
//
//	HBM bytes      = GetMemoryInfo().Total                                   (nvml)
//	SMs            = GetAttributes().MultiprocessorCount, else
//	                 GetNumGpuCores() / CUDA cores per SM                    (nvml)
//	HBM B/s        = bus width bits / 8 · max memory clock · 2 (double data rate)  (nvml-estimate)
//	dense BF16 F/s = SMs · max SM clock · BF16 FLOP per SM per clock          (nvml-estimate)
//
// where FLOP per SM per clock comes from the compute capability: 2048 for
// 8.0 (A100), 1024 for 8.6–8.9 (A10, L4, L40S), 4096 for 9.0 (Hopper), 8192
// for 10.x (B200, GB200, B300), 1024 for 12.x (RTX Blackwell). A GPU whose
// peaks can be neither looked up nor estimated fails discovery with the
// missing reading named: describe it in a topology file instead.
//
// # Safety
//
// nvml.Init without the library returns ERROR_LIBRARY_NOT_FOUND, and any
// other NVML call after a failed Init may kill the process; after a failed
// Init nothing else is called, not even Shutdown or ErrorString. The
// adapter needs cgo: without it (CGO_ENABLED=0) Discover reports
// ErrUnavailable and the rest of Sluice builds and runs on a file or the
// simulated cluster.
//
// # The --topology setting (Load)
//
//	auto          NVML when it is usable, else the simulated cluster (the default of sluiced and sluicectl)
//	auto:<file>   NVML when it is usable, else the file
//	nvml          NVML, or an error saying why it is unavailable
//	simulated     the built-in simulated cluster (topology.Simulated)
//	<file>        a cluster file (topology.LoadFile)
//
// Under auto, "unusable" means ErrUnavailable: no cgo, no library, a
// failed Init (driver not loaded, no permission), or no GPU. It is said in
// one log line, at Info level when the library is simply absent and Warn
// otherwise, since a GPU host without a working driver deserves attention.
// Any other failure (NVML works but a GPU cannot be modelled) is an error
// under auto too: a GPU machine must not silently schedule onto a
// simulated cluster.
package nvml
