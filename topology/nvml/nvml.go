//go:build cgo

package nvml

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/sluice-sched/sluice/topology"
)

// Symbols guarded before use. go-nvml binds libnvidia-ml lazily: calling a
// function the installed driver lacks fails at the C call and aborts the
// process, so every call newer than the oldest driver Sluice supports is
// made only where Extensions().LookupSymbol finds it, and a missing symbol
// is a reading not taken. Made directly, because every driver since R384
// (the first with Volta, the oldest GPU generation with tensor cores) has
// them: Init, DeviceGetCount, DeviceGetHandleByIndex, GetUUID, GetName,
// GetPciInfo, GetMemoryInfo, GetMaxClockInfo and GetNvLinkState (go-nvml
// itself falls back to the older versions of the versioned ones).
const (
	symFabricInfoV4 = "nvmlDeviceGetGpuFabricInfo_v4" // Hopper-era and later drivers
	symFabricInfo   = "nvmlDeviceGetGpuFabricInfo"    // Hopper-era and later drivers
	symBusWidth     = "nvmlDeviceGetMemoryBusWidth"   // R510 on; not in R470
	symNumGpuCores  = "nvmlDeviceGetNumGpuCores"      // R510 on; not in R470
	symAttributesV2 = "nvmlDeviceGetAttributes_v2"    // came with MIG (R450)
	symAttributes   = "nvmlDeviceGetAttributes"       // came with MIG (R450)
	// GetCudaComputeCapability is old, but guarding it costs nothing and
	// its first driver is not documented.
	symComputeCap = "nvmlDeviceGetCudaComputeCapability"
)

// deviceAPI is what this library lets discovery ask a device, decided once
// per discovery from the symbols it has.
type deviceAPI struct {
	fabric     fabricReader // nil: no fabric API
	busWidth   bool         // GetMemoryBusWidth
	numCores   bool         // GetNumGpuCores
	attributes bool         // GetAttributes
	computeCap bool         // GetCudaComputeCapability
}

// apiOf looks up the guarded symbols of lib.
func apiOf(lib gonvml.Interface) deviceAPI {
	ext := lib.Extensions()
	has := func(sym string) bool { return ext.LookupSymbol(sym) == nil }
	return deviceAPI{
		fabric:     fabricReaderFor(has),
		busWidth:   has(symBusWidth),
		numCores:   has(symNumGpuCores),
		attributes: has(symAttributesV2) || has(symAttributes),
		computeCap: has(symComputeCap),
	}
}

// maxGPUs bounds the device count a driver may report, so that a corrupt
// answer cannot make discovery allocate without limit.
const maxGPUs = 1024

// Discover reads this node's GPUs through the system's NVML library
// (libnvidia-ml.so.1). node names the node in the result.
func Discover(node string) (topology.NodeDiscovery, error) {
	return DiscoverWith(gonvml.New(), node)
}

// DiscoverWith reads a node's GPUs through lib: the system library
// (gonvml.New()) or a mock. It initialises lib and shuts it down before
// returning; when Init fails it calls nothing else on lib, because NVML may
// kill the process on any call after a failed Init. Every failure that means
// NVML is not usable here (Init failed, no GPU) wraps ErrUnavailable. No
// single GPU fails discovery: one that cannot be identified, modelled or
// trusted is listed unhealthy with its Problem (readGPU).
func DiscoverWith(lib gonvml.Interface, node string) (topology.NodeDiscovery, error) {
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		return topology.NodeDiscovery{}, &unavailableError{
			reason:   "nvml.Init: " + initErrorName(ret),
			expected: ret == gonvml.ERROR_LIBRARY_NOT_FOUND,
		}
	}
	defer lib.Shutdown() // nothing to do if it fails: the readings are taken
	n, ret := lib.DeviceGetCount()
	switch {
	case ret != gonvml.SUCCESS:
		return topology.NodeDiscovery{}, fmt.Errorf("nvml: DeviceGetCount: %s", returnName(ret))
	case n <= 0:
		return topology.NodeDiscovery{}, &unavailableError{reason: "no GPU on this node"}
	case n > maxGPUs:
		return topology.NodeDiscovery{}, fmt.Errorf("nvml: DeviceGetCount: %d GPUs, more than the %d supported", n, maxGPUs)
	}
	api := apiOf(lib)
	gpus := make([]nodeGPU, 0, n)
	for i := range n {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			gpus = append(gpus, nodeGPU{gpu: standIn(i, "", "DeviceGetHandleByIndex: "+returnName(ret))})
			continue
		}
		gpus = append(gpus, readGPU(dev, i, api))
	}
	return resolveNode(node, gpus), nil
}

// initErrorName names a failed Init's code (returnName), with what it
// means where that helps an operator.
func initErrorName(ret gonvml.Return) string {
	switch ret {
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		return returnName(ret) + " (libnvidia-ml.so.1 is not installed)"
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		return returnName(ret) + " (the NVIDIA kernel driver is not running)"
	case gonvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return returnName(ret) + " (NVML library and kernel driver versions differ)"
	}
	return returnName(ret)
}

// returnName names an NVML return code as nvml.h does, less its NVML_
// prefix ("ERROR_GPU_IS_LOST"); a code it does not know is "NVML error
// <n>". Every Return in a Problem or an error is named here, never by
// Return.Error: once go-nvml has loaded the library that calls
// nvmlErrorString, whose prose ("GPU is lost") would differ from the
// mocks' names, and which nothing may call after a failed Init.
func returnName(ret gonvml.Return) string {
	if name, ok := returnNames[ret]; ok {
		return name
	}
	return fmt.Sprintf("NVML error %d", int32(ret))
}

// returnNames are the codes of nvml.h (go-nvml v0.13), by name.
var returnNames = map[gonvml.Return]string{
	gonvml.SUCCESS:                         "SUCCESS",
	gonvml.ERROR_UNINITIALIZED:             "ERROR_UNINITIALIZED",
	gonvml.ERROR_INVALID_ARGUMENT:          "ERROR_INVALID_ARGUMENT",
	gonvml.ERROR_NOT_SUPPORTED:             "ERROR_NOT_SUPPORTED",
	gonvml.ERROR_NO_PERMISSION:             "ERROR_NO_PERMISSION",
	gonvml.ERROR_ALREADY_INITIALIZED:       "ERROR_ALREADY_INITIALIZED",
	gonvml.ERROR_NOT_FOUND:                 "ERROR_NOT_FOUND",
	gonvml.ERROR_INSUFFICIENT_SIZE:         "ERROR_INSUFFICIENT_SIZE",
	gonvml.ERROR_INSUFFICIENT_POWER:        "ERROR_INSUFFICIENT_POWER",
	gonvml.ERROR_DRIVER_NOT_LOADED:         "ERROR_DRIVER_NOT_LOADED",
	gonvml.ERROR_TIMEOUT:                   "ERROR_TIMEOUT",
	gonvml.ERROR_IRQ_ISSUE:                 "ERROR_IRQ_ISSUE",
	gonvml.ERROR_LIBRARY_NOT_FOUND:         "ERROR_LIBRARY_NOT_FOUND",
	gonvml.ERROR_FUNCTION_NOT_FOUND:        "ERROR_FUNCTION_NOT_FOUND",
	gonvml.ERROR_CORRUPTED_INFOROM:         "ERROR_CORRUPTED_INFOROM",
	gonvml.ERROR_GPU_IS_LOST:               "ERROR_GPU_IS_LOST",
	gonvml.ERROR_RESET_REQUIRED:            "ERROR_RESET_REQUIRED",
	gonvml.ERROR_OPERATING_SYSTEM:          "ERROR_OPERATING_SYSTEM",
	gonvml.ERROR_LIB_RM_VERSION_MISMATCH:   "ERROR_LIB_RM_VERSION_MISMATCH",
	gonvml.ERROR_IN_USE:                    "ERROR_IN_USE",
	gonvml.ERROR_MEMORY:                    "ERROR_MEMORY",
	gonvml.ERROR_NO_DATA:                   "ERROR_NO_DATA",
	gonvml.ERROR_VGPU_ECC_NOT_SUPPORTED:    "ERROR_VGPU_ECC_NOT_SUPPORTED",
	gonvml.ERROR_INSUFFICIENT_RESOURCES:    "ERROR_INSUFFICIENT_RESOURCES",
	gonvml.ERROR_FREQ_NOT_SUPPORTED:        "ERROR_FREQ_NOT_SUPPORTED",
	gonvml.ERROR_ARGUMENT_VERSION_MISMATCH: "ERROR_ARGUMENT_VERSION_MISMATCH",
	gonvml.ERROR_DEPRECATED:                "ERROR_DEPRECATED",
	gonvml.ERROR_NOT_READY:                 "ERROR_NOT_READY",
	gonvml.ERROR_GPU_NOT_FOUND:             "ERROR_GPU_NOT_FOUND",
	gonvml.ERROR_INVALID_STATE:             "ERROR_INVALID_STATE",
	gonvml.ERROR_RESET_TYPE_NOT_SUPPORTED:  "ERROR_RESET_TYPE_NOT_SUPPORTED",
	gonvml.ERROR_UNKNOWN:                   "ERROR_UNKNOWN",
}

// fabricInfo is what the fabric API said about a GPU, in either version.
type fabricInfo struct {
	clusterUUID [16]uint8
	status      gonvml.Return
	cliqueID    uint32
	state       uint8
	health      uint8 // GPU_FABRIC_HEALTH_SUMMARY_*; NOT_SUPPORTED before v4
}

// fabricReader reads a GPU's fabric info; ok is false where the GPU (or
// the driver) has no fabric API.
type fabricReader func(gonvml.Device) (info fabricInfo, ok bool, err error)

// fabricReaderFor picks the newest fabric API the library has (has says
// whether it has a symbol): GetGpuFabricInfo_v4 (with health), else
// GetGpuFabricInfo, else none (nil).
func fabricReaderFor(has func(sym string) bool) fabricReader {
	switch {
	case has(symFabricInfoV4):
		return func(dev gonvml.Device) (fabricInfo, bool, error) {
			v4, ret := dev.GetGpuFabricInfo_v4()
			if ok, err := fabricRet("GetGpuFabricInfo_v4", ret); !ok {
				return fabricInfo{}, false, err
			}
			return fabricInfo{
				clusterUUID: v4.ClusterUuid,
				status:      gonvml.Return(v4.Status),
				cliqueID:    unicastClique(v4),
				state:       v4.State,
				health:      v4.HealthSummary,
			}, true, nil
		}
	case has(symFabricInfo):
		return func(dev gonvml.Device) (fabricInfo, bool, error) {
			v1, ret := dev.GetGpuFabricInfo()
			if ok, err := fabricRet("GetGpuFabricInfo", ret); !ok {
				return fabricInfo{}, false, err
			}
			return fabricInfo{
				clusterUUID: v1.ClusterUuid,
				status:      gonvml.Return(v1.Status),
				cliqueID:    v1.CliqueId,
				state:       v1.State,
				health:      gonvml.GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED,
			}, true, nil
		}
	}
	return nil
}

// fabricRet sorts a fabric call's return: answered, not supported (no
// fabric, not an error), or failed.
func fabricRet(call string, ret gonvml.Return) (ok bool, err error) {
	switch ret {
	case gonvml.SUCCESS:
		return true, nil
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND:
		return false, nil
	}
	return false, fmt.Errorf("%s: %s", call, returnName(ret))
}

// unicastClique is v4's equivalent of the v1 CliqueId: the id of the first
// unicast-pointer clique (nvml.h: "The legacy v3 cliqueId maps to the id of
// the first NVML_GPU_FABRIC_CLIQUE_TYPE_UNICAST_POINTER entry"); 0 when
// there is none, as v1 would say.
func unicastClique(v4 gonvml.GpuFabricInfo_v4) uint32 {
	n := min(int(v4.NumCliques), len(v4.Cliques))
	for _, c := range v4.Cliques[:n] {
		if c.Type == gonvml.GPU_FABRIC_CLIQUE_TYPE_UNICAST_POINTER {
			return c.Id
		}
	}
	return 0
}

// nodeGPU is a GPU as read, with its clique ("" for none) before the node's
// domain is decided.
type nodeGPU struct {
	gpu    topology.GPU
	clique string
}

// standIn is a GPU whose identity could not be read (its handle, UUID or
// name; typically ERROR_GPU_IS_LOST): listed under the name
// "gpu-index-<index>" (and its UUID where that was read), unhealthy with
// problem, so that one lost GPU is reported rather than hiding its node.
// Its UUID stays empty otherwise: a stand-in must not collide with another
// node's in the cluster.
func standIn(index int, uuid, problem string) topology.GPU {
	return topology.GPU{Index: index, UUID: uuid, Name: fmt.Sprintf("gpu-index-%d", index), Problem: problem}
}

// readGPU reads one GPU. Nothing fails the node: a GPU whose identity
// cannot be read is a stand-in (standIn), a reading the driver refuses or
// lacks is zero, and a GPU that cannot serve (fabric, lost, peaks neither
// known nor estimable) is unhealthy with its Problem.
func readGPU(dev gonvml.Device, index int, api deviceAPI) nodeGPU {
	uuid, ret := dev.GetUUID()
	if ret != gonvml.SUCCESS {
		return nodeGPU{gpu: standIn(index, "", "GetUUID: "+returnName(ret))}
	}
	name, ret := dev.GetName()
	if ret != gonvml.SUCCESS {
		return nodeGPU{gpu: standIn(index, uuid, "GetName: "+returnName(ret))}
	}
	g := topology.GPU{Index: index, UUID: uuid, Name: name, Healthy: true}
	if pci, ret := dev.GetPciInfo(); ret == gonvml.SUCCESS {
		g.PCIBusID = cString(pci.BusId[:])
	}
	problem := func(p string) {
		if g.Healthy {
			g.Healthy, g.Problem = false, p
		}
	}
	for link := range gonvml.NVLINK_MAX_LINKS {
		state, ret := dev.GetNvLinkState(link)
		switch {
		case ret == gonvml.SUCCESS && state == gonvml.FEATURE_ENABLED:
			g.ActiveNVLinks++
		case ret == gonvml.ERROR_GPU_IS_LOST:
			problem("GPU is lost (GetNvLinkState)")
		}
		// Other answers (a link the GPU lacks, no NVLink at all) are not
		// active links and not faults.
	}
	var clique string
	switch info, ok, err := fabric(api, dev); {
	case err != nil:
		problem("fabric: " + err.Error())
	case ok:
		var p string
		clique, p = judgeFabric(info)
		if p != "" {
			problem(p)
		}
	}
	r := read(dev, api)
	g.MemoryBytes = clampInt64(r.memTotal)
	g.MaxSMClockMHz, g.MaxMemClockMHz, g.MemoryBusWidthBits = int(r.smClockMHz), int(r.memClockMHz), int(r.busWidthBits)
	peaks, err := gpuPeaks(name, r)
	if err != nil {
		problem(err.Error() + "; describe it in a topology file")
	}
	g.Peaks = peaks
	return nodeGPU{gpu: g, clique: clique}
}

// fabric reads a GPU's fabric info with the reader api chose; ok is false
// where the library has no fabric API.
func fabric(api deviceAPI, dev gonvml.Device) (fabricInfo, bool, error) {
	if api.fabric == nil {
		return fabricInfo{}, false, nil
	}
	return api.fabric(dev)
}

// read takes the readings of a GPU, every one where the library has it; a
// refused or missing one stays zero.
func read(dev gonvml.Device, api deviceAPI) readings {
	var r readings
	if mem, ret := dev.GetMemoryInfo(); ret == gonvml.SUCCESS {
		r.memTotal = mem.Total
	}
	if v, ret := dev.GetMaxClockInfo(gonvml.CLOCK_SM); ret == gonvml.SUCCESS {
		r.smClockMHz = v
	}
	if v, ret := dev.GetMaxClockInfo(gonvml.CLOCK_MEM); ret == gonvml.SUCCESS {
		r.memClockMHz = v
	}
	if api.busWidth {
		if v, ret := dev.GetMemoryBusWidth(); ret == gonvml.SUCCESS {
			r.busWidthBits = v
		}
	}
	if api.computeCap {
		if major, minor, ret := dev.GetCudaComputeCapability(); ret == gonvml.SUCCESS {
			r.ccMajor, r.ccMinor = major, minor
		}
	}
	// The SM count: GetAttributes where it answers (MIG devices; a full
	// GPU usually answers NOT_SUPPORTED), else the CUDA cores over the cores
	// per SM of the compute capability.
	if api.attributes {
		if a, ret := dev.GetAttributes(); ret == gonvml.SUCCESS && a.MultiprocessorCount > 0 {
			r.sms = int(a.MultiprocessorCount)
		}
	}
	if r.sms == 0 && api.numCores {
		if cores, ret := dev.GetNumGpuCores(); ret == gonvml.SUCCESS && cores > 0 {
			if per := coresPerSM(r.ccMajor, r.ccMinor); per > 0 {
				r.sms = cores / per
			}
		}
	}
	return r
}

// judgeFabric turns fabric info into the GPU's clique ("" when it is in
// none) and the problem that keeps it from serving there ("" when none).
// A GPU in a clique serves only when its registration with the fabric
// manager completed and succeeded and the fabric calls it healthy.
func judgeFabric(f fabricInfo) (clique, problem string) {
	switch f.state {
	case gonvml.GPU_FABRIC_STATE_NOT_SUPPORTED:
		return "", ""
	case gonvml.GPU_FABRIC_STATE_COMPLETED:
	case gonvml.GPU_FABRIC_STATE_NOT_STARTED:
		return "", "fabric registration not started"
	case gonvml.GPU_FABRIC_STATE_IN_PROGRESS:
		return "", "fabric registration in progress"
	default:
		return "", fmt.Sprintf("fabric state %d unknown", f.state)
	}
	if f.status != gonvml.SUCCESS {
		return "", "fabric registration failed: " + returnName(f.status)
	}
	if f.clusterUUID == ([16]uint8{}) {
		// Registered without a cluster: a single-node NVSwitch fabric
		// (HGX), whose domain is the node.
		return "", ""
	}
	clique = cliqueID(f.clusterUUID, f.cliqueID)
	switch f.health {
	case gonvml.GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY:
		return clique, "fabric health: unhealthy"
	case gonvml.GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY:
		return clique, "fabric health: limited capacity"
	}
	return clique, ""
}

// cliqueID formats a clique as GPU Feature Discovery labels it
// (nvidia.com/gpu.clique): the cluster UUID in canonical form, a dot, the
// clique id in decimal.
func cliqueID(u [16]uint8, id uint32) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x.%d", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16], id)
}

// gpuPeaks gives a GPU its peaks. A GPU the known-GPU table names takes
// the table's FLOP/s and bandwidth (datasheet figures NVML cannot give) and
// NVML's HBM bytes and SM count where read (Figures says which). Any other
// GPU's peaks are estimated from r (estimatePeaks); err names what could
// not be estimated, and the peaks then hold what could.
func gpuPeaks(name string, r readings) (topology.Peaks, error) {
	p, ok := topology.LookupGPU(name)
	if !ok {
		return estimatePeaks(r)
	}
	if r.memTotal > 0 {
		p.HBMBytes, p.Figures.HBMBytes = clampInt64(r.memTotal), topology.SourceNVML
	}
	if r.sms > 0 {
		p.SMs, p.Figures.SMs = r.sms, topology.SourceNVML
	}
	return p, nil
}

// cString reads a NUL-terminated C char array.
func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// resolveNode decides the node's domain and makes the discovery. The node
// joins the clique most of its GPUs are in (ties: the smallest id), since a
// node belongs to exactly one domain; a GPU in another clique, or in none
// while its node has one, cannot reach its node's domain over NVLink and is
// marked unhealthy.
func resolveNode(node string, gpus []nodeGPU) topology.NodeDiscovery {
	count := make(map[string]int)
	for _, g := range gpus {
		if g.clique != "" {
			count[g.clique]++
		}
	}
	domain := ""
	for _, c := range slices.Sorted(maps.Keys(count)) {
		if domain == "" || count[c] > count[domain] {
			domain = c
		}
	}
	nd := topology.NodeDiscovery{Node: node, Domain: domain, GPUs: make([]topology.GPU, len(gpus))}
	for i, g := range gpus {
		if domain != "" && g.clique != domain && g.gpu.Healthy {
			g.gpu.Healthy = false
			if g.clique == "" {
				g.gpu.Problem = "in no fabric clique; the rest of its node is in " + domain
			} else {
				g.gpu.Problem = "in fabric clique " + g.clique + "; the rest of its node is in " + domain
			}
		}
		nd.GPUs[i] = g.gpu
	}
	slices.SortFunc(nd.GPUs, func(a, b topology.GPU) int { return cmp.Compare(a.Index, b.Index) })
	return nd
}
