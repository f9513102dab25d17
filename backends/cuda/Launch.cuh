//===- Launch.cuh - Step kernel launches, overlapped -----------*- CUDA -*-===//
//
// A decode step is a chain of ~2,000 short kernels, and on a Hopper GPU a
// kernel that follows another in a stream normally starts only after its
// predecessor has drained: its blocks' launch and prologue add about a
// microsecond to every link of the chain. Programmatic dependent launch
// (sm_90+) lets the next kernel's blocks be scheduled while the previous
// one finishes; they then wait in `griddepcontrol.wait` until the
// predecessor grid has completed and its writes are visible.
//
// The contract, kept by every step kernel: its first statement is
// stepKernelPrologue(), which waits for the predecessor before the kernel
// reads or writes any global memory (so neither a read-after-write nor a
// write-after-read hazard can cross the overlap), then allows its own
// dependents to be scheduled. The mat-vec kernels alone touch memory
// before the wait, and only their weights, which no kernel of a step
// writes: an L2 prefetch (prefetchL2), or for F32 rows (the router's gate,
// linearF32Kernel) loads into registers (DeviceCommon.cuh holdF32Part);
// and the routed experts' Q4_K / Q5_K down kernel
// (StepMatVec.cu) reads the chosen ids and starts copying those experts'
// weights into shared memory, because its predecessor, the gate/up kernel,
// lets it be scheduled only after its own wait, when the router that wrote
// the ids has finished. The q8_0-split and F32 mat-vecs with live rows
// (StepKernels.h LiveRows) also read the step's position input before the
// wait, to size their work: input slots are written between steps, never
// by a kernel of the step. The one-shot all-reduce loads its fused norm's
// weights before its wait. MLA with an output projection asks the L2 for
// its projection rows before its wait too, and lets its dependents be
// scheduled only after its grid barrier (StepKernels.cu mlaKernel); MLA
// without one lets them be scheduled after its chunks (MlaLaunch),
// so that the mat-vecs after it prefetch beside its combine. A
// kernel launched without the attribute, or on a GPU before sm_90, runs
// the prologue as a no-op.
//
// launchStep() launches with the attribute unless overlapped launches are
// switched off for the calling thread (setOverlappedLaunches; the plugin
// reads KILN_CUDA_PDL=0 to compare both ways), and runs the kernel from the
// thread's kernel images (KernelImages.h: the artifact's) when set.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_CUDA_LAUNCH_CUH
#define KILN_BACKENDS_CUDA_LAUNCH_CUH

#include "KernelImages.h"
#include "StepKernels.h"

#include <cuda_runtime.h>

#include <utility>

namespace kiln::cuda {

/// Lets the next kernel of the stream be scheduled (its blocks then wait
/// in their own prologue).
__device__ __forceinline__ void allowDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Waits until the predecessor grid has completed and its writes are
/// visible.
__device__ __forceinline__ void waitForPredecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// A step's input scalar (its position), read before the kernel waits for
/// its predecessor. The host writes a step's inputs before the replay, in
/// stream order, and no op of a step writes them (the artifact's loader
/// refuses one that does: Artifact.cpp), so the load, and what a kernel
/// derives from it alone (the rope's angles), can overlap the wait instead
/// of following it on the step's path (docs/perf.md, thirty-third pass).
/// Call it before stepKernelPrologue: the wait's memory clobber keeps the
/// load in front of it. A kernel must still wait before it returns, whatever
/// the position says: along a branch each kernel's completion stands for
/// its predecessors' (the schedule orders an op after the ops before it on
/// its branch through that chain), so one that returned before its wait
/// would let its successor run beside an op it must follow.
__device__ __forceinline__ int32_t stepInputBeforeWait(const int32_t *p) {
  return *p;
}

/// Waits for the predecessor grid, then lets dependents be scheduled.
__device__ __forceinline__ void stepKernelPrologue() {
  waitForPredecessor();
  allowDependents();
}

/// Asks the L2 to fetch [p, p + bytes) (the 16-byte aligned part of it):
/// a hint, which reads nothing into the thread. The mat-vec kernels issue
/// it for their weights before waiting for their predecessor: weights are
/// never written during a step, so streaming them early crosses no hazard,
/// and their DRAM time overlaps the previous kernel's tail.
__device__ __forceinline__ void prefetchL2(const void *p, uint64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t begin = (reinterpret_cast<uint64_t>(p) + 15) & ~uint64_t(15);
  const uint64_t end = (reinterpret_cast<uint64_t>(p) + bytes) & ~uint64_t(15);
  constexpr uint64_t kMaxChunk = uint64_t(1) << 30;
  while (begin < end) {
    const uint64_t n = end - begin < kMaxChunk ? end - begin : kMaxChunk;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(begin),
                 "r"(uint32_t(n))
                 : "memory");
    begin += n;
  }
#endif
}

/// Launches `kernel` in clusters of `clusterBlocks` blocks (0: as compiled,
/// __cluster_dims__ or none), asking for an overlapped start after the
/// previous kernel in the stream when overlappedLaunches() is on.
template <typename... Params, typename... Args>
[[nodiscard]] cudaError_t
launchStepClustered(unsigned clusterBlocks, void (*kernel)(Params...),
                    dim3 grid, dim3 block, size_t sharedBytes,
                    cudaStream_t stream, Args &&...args) {
  // The thread's kernel images (the artifact's) or the stub itself.
  const void *function = resolveKernel(reinterpret_cast<const void *>(kernel));
  if (!function)
    return cudaErrorSymbolNotFound;
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (overlappedLaunches()) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (clusterBlocks > 0) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count++].val.clusterDim = {clusterBlocks, 1, 1};
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = sharedBytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  // The arguments converted to the kernel's parameter types, as
  // cudaLaunchKernelEx does, then passed by address.
  const cudaError_t e = [&](Params... converted) {
    void *pointers[sizeof...(Params) + 1] = {&converted..., nullptr};
    return cudaLaunchKernelExC(&config, function, pointers);
  }(std::forward<Args>(args)...);
  // The error is returned here, so it is taken off the thread's last-error
  // slot: a later launch's check must not report it again for another op.
  if (e != cudaSuccess)
    cudaGetLastError();
  return e;
}

/// Launches `kernel` as compiled (launchStepClustered without a cluster
/// size of the launch's own).
template <typename... Params, typename... Args>
[[nodiscard]] cudaError_t launchStep(void (*kernel)(Params...), dim3 grid,
                                     dim3 block, size_t sharedBytes,
                                     cudaStream_t stream, Args &&...args) {
  return launchStepClustered(0, kernel, grid, block, sharedBytes, stream,
                             std::forward<Args>(args)...);
}

/// Sets one attribute of `kernel` (as launchStep resolves it) on the
/// current GPU.
template <typename... Params>
cudaError_t setKernelAttribute(void (*kernel)(Params...),
                               cudaFuncAttribute attribute, int value) {
  const void *stub = reinterpret_cast<const void *>(kernel);
  const void *function = resolveKernel(stub);
  if (!function)
    return cudaErrorSymbolNotFound;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    return e;
  return function == stub
             ? cudaFuncSetAttribute(stub, attribute, value)
             : cudaKernelSetAttributeForDevice(
                   cudaKernel_t(const_cast<void *>(function)), attribute,
                   value, device);
}

/// Whether the current GPU runs `kernel` (as launchStep resolves it) in
/// clusters of `clusterBlocks` blocks of `threads` threads and `shared`
/// dynamic bytes: at least one such cluster fits at once. Sizes past the
/// portable 8 are allowed on the kernel first.
template <typename... Params>
bool clustersFit(void (*kernel)(Params...), unsigned clusterBlocks,
                 unsigned threads, size_t shared) {
  const void *function = resolveKernel(reinterpret_cast<const void *>(kernel));
  if (!function)
    return false;
  if (clusterBlocks > 8 &&
      setKernelAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                         1) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  cudaLaunchAttribute cluster[1] = {};
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim = {clusterBlocks, 1, 1};
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(clusterBlocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = shared;
  config.attrs = cluster;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, function, &config) !=
      cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return clusters > 0;
}

/// Lets `kernel` (as launchStep resolves it) use `bytes` of dynamic shared
/// memory on the current GPU (needed beyond 48 KiB), and asks for the
/// largest shared-memory carveout, so such blocks can share a
/// multiprocessor.
template <typename... Params>
cudaError_t allowDynamicShared(void (*kernel)(Params...), size_t bytes) {
  const std::pair<cudaFuncAttribute, int> settings[] = {
      {cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)},
      {cudaFuncAttributePreferredSharedMemoryCarveout,
       int(cudaSharedmemCarveoutMaxShared)}};
  for (const auto &[attribute, value] : settings)
    if (cudaError_t e = setKernelAttribute(kernel, attribute, value);
        e != cudaSuccess)
      return e;
  return cudaSuccess;
}

/// Blocks of host stub `stub`'s kernel, as launchStep resolves it (the
/// artifact's image when the thread has images), that one multiprocessor
/// of the current GPU holds with `threads` threads and `shared` dynamic
/// bytes. allowDynamicShared raises the limit above 48 KiB on what runs,
/// the image, so that is what is asked (the runtime takes an image's kernel
/// handle where it takes a stub); should the runtime refuse the handle,
/// the stub answers, as it did before, which agrees up to 48 KiB.
inline cudaError_t residentBlocks(const void *stub, int threads, size_t shared,
                                  int &blocks) {
  const void *function = resolveKernel(stub);
  if (!function)
    return cudaErrorSymbolNotFound;
  if (function != stub &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, function, threads,
                                                    shared) == cudaSuccess)
    return cudaSuccess;
  cudaGetLastError(); // the image's refusal is not the caller's error
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, stub, threads,
                                                       shared);
}

/// What one host thread last asked residentWave for one kernel: the
/// answer holds for a device and a shared size (a kernel's launcher keeps
/// one, static thread_local, so the runtime is asked once, not at every
/// launch: an eager step launches each a layer).
struct WaveCache {
  int device = -1;
  size_t shared = 0;
  int processors = 0, resident = 0;
};

/// The current device's multiprocessors and how many blocks of `stub` (as
/// launchStep resolves it) one holds with `threads` threads and `shared`
/// dynamic bytes, through `cache`.
inline cudaError_t residentWave(WaveCache &cache, const void *stub, int threads,
                                size_t shared, int &processors, int &resident) {
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    return e;
  if (device != cache.device || shared != cache.shared) {
    int p = 0, r = 0;
    if (cudaError_t e =
            cudaDeviceGetAttribute(&p, cudaDevAttrMultiProcessorCount, device);
        e != cudaSuccess)
      return e;
    if (cudaError_t e = residentBlocks(stub, threads, shared, r);
        e != cudaSuccess)
      return e;
    cache = WaveCache{device, shared, p, r};
  }
  processors = cache.processors;
  resident = cache.resident;
  return cudaSuccess;
}

} // namespace kiln::cuda

#endif // KILN_BACKENDS_CUDA_LAUNCH_CUH
