// Package nvml discovers a node's GPU topology through NVML
// (github.com/NVIDIA/go-nvml) and resolves the --topology setting that
// sluiced, sluicectl and sluice-agent share.
//
// # What is read, per GPU
//
// UUID, name, PCI bus id, memory total (GetMemoryInfo), max SM and memory
// clocks (GetMaxClockInfo), memory bus width (GetMemoryBusWidth), compute
// capability, SM count (GetAttributes, else GetNumGpuCores over the cores
// per SM), active NVLinks (GetNvLinkState on every link up to
// NVLINK_MAX_LINKS, counting FEATURE_ENABLED), and fabric info:
// GetGpuFabricInfo_v4 where the driver has it (it adds the fabric health
// summary), else GetGpuFabricInfo. GetGpuFabricInfoV is not used: its
// handler is a struct the mocks cannot fake. The raw readings are kept in
// topology.GPU (MemoryBytes, MaxSMClockMHz, MaxMemClockMHz,
// MemoryBusWidthBits; zero where not read) and printed beside the peaks.
//
// A GPU whose fabric state is COMPLETED with status SUCCESS and a non-zero
// cluster UUID is in the clique "<ClusterUuid>.<CliqueId>" (the string GPU
// Feature Discovery writes as nvidia.com/gpu.clique); a node's GPUs in a
// clique make it part of that domain, and GPUs without fabric (HGX, PCIe)
// make the node its own domain. A GPU is unhealthy (it stays listed, with
// its Problem, and contributes no capacity) when its fabric registration is
// not finished or failed, when its fabric health summary is UNHEALTHY or
// LIMITED_CAPACITY, when it is in a different clique than the rest of its
// node, when its peaks can be neither looked up nor estimated, when its
// identity cannot be read, or (decided by topology.Merge, which sees the
// whole domain) when it has fewer active NVLinks than its domain peers.
//
// LIMITED_CAPACITY takes the whole GPU out, by choice: a GPU whose fabric is
// degraded cannot be trusted at full NVLink bandwidth, and a request placed
// on the domain may put its KV transfers and collectives across any GPU;
// the engine's health is per GPU and on or off, with no partial capacity to
// give it.
//
// No single GPU fails its node: a GPU whose handle, UUID or name cannot be
// read (ERROR_GPU_IS_LOST, say) is listed unhealthy under the stand-in name
// "gpu-index-<N>" with the failed call as its Problem (its UUID only where
// read: a stand-in must not collide across nodes). Only a failed Init, no
// GPU, or a failing DeviceGetCount fails discovery.
//
// # Peaks
//
// A GPU named in the known-GPU table (topology.LookupGPU) takes the table's
// dense BF16 FLOP/s and HBM bandwidth (datasheet figures NVML cannot give)
// and NVML's memory total and SM count where read, the table's otherwise.
// Any other GPU's peaks are estimated from readings. Peaks.Figures records
// the source of each figure:
//
//	HBM bytes      = GetMemoryInfo().Total                                   (nvml)
//	SMs            = GetAttributes().MultiprocessorCount, else
//	                 GetNumGpuCores() / CUDA cores per SM                    (nvml)
//	HBM B/s        = bus width bits / 8 · max memory clock · 2 (double data rate)  (nvml-estimate)
//	dense BF16 F/s = SMs · max SM clock · BF16 FLOP per SM per clock          (nvml-estimate)
//
// where FLOP per SM per clock comes from the compute capability: 1024 for
// 7.x (V100, T4; they have no BF16 tensor cores, so this is their FP16
// tensor rate), 2048 for 8.0 (A100), 1024 for other 8.x (A10, L4, L40S),
// 4096 for 9.0 (Hopper), 8192 for 10.x (B200, GB200, B300), 1024 for 12.x
// (RTX Blackwell); 11.x (Jetson Thor) has no rate. Estimated FLOP/s use
// NVML's max SM clock, while datasheets quote the boost clock, which is
// lower on most parts: estimates run a few per cent high.
//
// A figure that cannot be obtained (no SM count, no compute capability or
// one without a rate, a missing clock or bus width) is zero with source
// "unavailable", and the GPU is listed unhealthy with the missing readings
// as its Problem, so that the node still serves on its other GPUs and the
// operator knows what a topology file must supply.
//
// # Safety
//
// nvml.Init without the library returns ERROR_LIBRARY_NOT_FOUND, and any
// other NVML call after a failed Init may kill the process; after a failed
// Init nothing else is called, not even Shutdown or ErrorString (a return
// code is named from a table, returnName, in every error and Problem, so
// the text is the same on a real driver and on the mocks). go-nvml
// binds functions lazily, so calling one the installed driver lacks aborts
// the process too: every call newer than R384 (fabric info, bus width, core
// count, attributes, compute capability) is made only where
// Extensions().LookupSymbol finds its symbol, and a missing one is a
// reading not taken. The adapter needs cgo: without it (CGO_ENABLED=0)
// Discover reports ErrUnavailable and the rest of Sluice builds and runs on
// a file or the simulated cluster.
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
// Any other failure (NVML works but DeviceGetCount fails) is an error
// under auto too: a GPU machine must not silently schedule onto a
// simulated cluster. Loaded.Discovered says whether NVML gave the cluster.
//
// A node agent uses NodeLoader instead: the same setting, resolved by the
// same code to its own node's discovery (from NVML, or its entry in the
// fallback), again at every publication, with the auto fallback logged
// once rather than at each. Once NVML has answered a NodeLoader no longer
// falls back: NVML becoming unavailable later gives its last discovery
// with every GPU unhealthy (Problem: the reason), logged at Warn once per
// reason, so that a node whose driver went away leaves capacity rather
// than being republished healthy from the fallback.
package nvml
