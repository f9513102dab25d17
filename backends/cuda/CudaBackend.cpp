//===- CudaBackend.cpp - The CUDA backend plugin --------------------------===//
//
// One GPU per rank, one host thread per GPU. open_group places each rank's
// weights on its GPU (its slices of the split ones, in the file's block
// layout), allocates the rank's arena, caches and slots, decodes and checks
// every op (backend::decodeOp), binds each to a kernel launch, opens an
// NCCL communicator across the ranks, and captures each step of each rank
// into one CUDA graph: kernels and collectives, the whole step. run_step
// replays the graphs, one per GPU, concurrently; the token and the position
// are read by the kernels from the input slots in device memory, so one
// capture serves every position. KILN_RUN_EAGER launches the same ops one
// by one instead, for debugging (and must give the same bits).
//
// Data faults found on the device (a token outside the vocabulary, a full
// context, an expert id out of range) are recorded by the kernels in a
// fault word the rank reads after each step, and reported naming the op.
//
//===----------------------------------------------------------------------===//
#include "KernelImages.h"
#include "Nccl.h"
#include "SplitLayout.h"
#include "StepKernels.h"
#include "Timeline.h"
#include "support/DrawKey.h"

#include "artifact/Artifact.h"
#include "backend/KilnBackend.h"
#include "common/PluginSupport.h"
#include "common/StepOps.h"
#include "common/StepSchedule.h"
#include "support/AtomicFile.h"
#include "support/CheckedMath.h"
#include "support/Random.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

using namespace kiln;
using namespace kiln::artifact;
using namespace kiln::cuda;
using kiln::backend::OpKind;
using kiln::backend::StepOp;

namespace {

/// A failed CUDA call as an error naming the call and where it was made.
Status check(cudaError_t e, const std::string &where, const char *call) {
  if (e == cudaSuccess)
    return Status::ok();
  return Error(
      where, call,
      fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e)));
}
#define CUDA_TRY(where, call) KILN_TRY(check((call), (where), #call))

/// One device allocation, freed with its owner.
class DeviceMemory {
public:
  DeviceMemory() = default;
  DeviceMemory(DeviceMemory &&o) noexcept : ptr_(std::exchange(o.ptr_, {})) {}
  DeviceMemory &operator=(DeviceMemory &&o) noexcept {
    std::swap(ptr_, o.ptr_);
    return *this;
  }
  ~DeviceMemory() {
    if (ptr_)
      cudaFree(ptr_);
  }
  static Expected<DeviceMemory> allocate(uint64_t bytes,
                                         const std::string &what) {
    DeviceMemory m;
    // Never zero bytes: every buffer gets its own address.
    if (cudaError_t e = cudaMalloc(&m.ptr_, std::max<uint64_t>(bytes, 16));
        e != cudaSuccess)
      return Error(what, "cudaMalloc",
                   fmt::format("{} bytes: {}", bytes, cudaGetErrorString(e)));
    return m;
  }
  template <typename T = uint8_t> T *get() const {
    return static_cast<T *>(ptr_);
  }

private:
  void *ptr_ = nullptr;
};

/// Page-locked host memory that an input slot's bytes are staged in, so
/// that their copy to the device runs on the rank's stream without the
/// host waiting for it (from pageable memory cudaMemcpyAsync may return
/// before the bytes are read, so the host had to wait), and the event
/// after that copy: the stage is written again only once it has passed.
class PinnedStage {
public:
  PinnedStage() = default;
  PinnedStage(const PinnedStage &) = delete;
  PinnedStage &operator=(const PinnedStage &) = delete;
  ~PinnedStage() {
    if (host_)
      cudaFreeHost(host_);
    if (copied_)
      cudaEventDestroy(copied_);
  }
  /// `bytes` at `data` into `to` on `stream` (the current device's),
  /// through the stage.
  cudaError_t copy(void *to, const void *data, uint64_t bytes,
                   cudaStream_t stream) {
    if (!copied_)
      if (cudaError_t e =
              cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming);
          e != cudaSuccess)
        return e;
    // The last copy from the stage has read it (at once, most steps: the
    // step after it has ended by then).
    if (cudaError_t e = cudaEventSynchronize(copied_); e != cudaSuccess)
      return e;
    if (bytes > capacity_) {
      if (host_)
        cudaFreeHost(std::exchange(host_, nullptr));
      capacity_ = 0;
      if (cudaError_t e = cudaMallocHost(&host_, bytes); e != cudaSuccess)
        return e;
      capacity_ = bytes;
    }
    std::memcpy(host_, data, bytes);
    if (cudaError_t e =
            cudaMemcpyAsync(to, host_, bytes, cudaMemcpyHostToDevice, stream);
        e != cudaSuccess)
      return e;
    return cudaEventRecord(copied_, stream);
  }

private:
  void *host_ = nullptr;
  uint64_t capacity_ = 0;
  cudaEvent_t copied_ = nullptr;
};

/// Runs one job at a time on its own thread (a rank's host thread: every
/// CUDA and NCCL call of a rank is made from it).
class Worker {
public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void post(std::function<Status()> job) {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = std::move(job);
    result_.reset();
    cv_.notify_all();
  }
  Status wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return result_.has_value(); });
    return *result_;
  }

private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || job_; });
      if (stop_)
        return;
      std::function<Status()> job = std::move(job_);
      job_ = nullptr;
      lock.unlock();
      Status st = Status::ok();
      try {
        st = job();
      } catch (const std::exception &e) {
        st = Error("cuda backend", "", e.what());
      }
      lock.lock();
      result_ = st;
      cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<Status()> job_;
  std::optional<Status> result_;
  bool stop_ = false;
  std::thread thread_;
};

using Launch = std::function<Status(cudaStream_t)>;

/// One way to run a step's launch units: which it leaves out and which run
/// another launch, their schedule, and the graph captured from it.
struct StepGraph {
  /// Per unit: left out (empty: none).
  std::vector<bool> skip;
  /// Per unit: the launch run instead of the unit's own (empty: none).
  std::vector<std::optional<Launch>> instead;
  /// The graph's dataflow: which units may overlap (StepSchedule.h), with
  /// an event per signalling unit. The eager mode ignores it.
  backend::StepSchedule schedule;
  /// Per unit: whether it follows a collective in the graph (schedule) and
  /// in list order (eager); its mat-vecs then skip their early prefetch
  /// (setEarlyPrefetch).
  std::vector<bool> quietStart, quietStartEager;
  std::vector<cudaEvent_t> done; ///< per unit, null unless it signals
  /// What sets it apart from the step's first graph, for messages (empty
  /// for that one).
  std::string label;
  /// KILN_CUDA_SCHEDULE: the graph's kernel nodes after each unit was
  /// captured (a unit added the difference from the one before).
  std::vector<size_t> unitKernels;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;

  bool skips(size_t i) const { return !skip.empty() && skip[i]; }
};

/// What sets the nucleus's graphs apart (CudaStep::nucleusWhole).
constexpr const char *kNucleusLabel = "the argmax cutting a nucleus";

struct CudaStep {
  const Step *step = nullptr;
  std::vector<uint8_t *> ptrs; ///< each buffer's device address (not weights)
  /// By the buffer of the ids each writes, the routers (without an input
  /// norm) that may hand them to the experts reading that buffer by tags
  /// (TaggedIds): each launch of the router fills its entry in, which the
  /// experts' launch after it reads.
  std::map<int32_t, std::shared_ptr<TaggedIds>> routerIds;
  std::vector<DeviceMemory> slots;
  /// What a step enqueues: one unit per op, except a fused_linear, which
  /// has one per run of parts (below), so runs of different types can
  /// overlap. unitOp[u] is unit u's op.
  std::vector<Launch> units;
  std::vector<int32_t> unitOp;
  std::vector<std::string> where; ///< per op, for errors
  /// Every unit, as the step's ops say.
  StepGraph whole;
  /// A step with DSA indexers, at a position where each selects every
  /// attended position (position + 1 <= selectsAll, the smallest top-k):
  /// without the indexers' launches, each MLA attending positions 0 ..
  /// position without reading the selection (the same entries in the same
  /// order, so the same bits), so that MLA does not wait for them. A step
  /// with indexers has it unless KILN_CUDA_SHORT_GRAPH=0.
  std::optional<StepGraph> allSelected;
  int64_t selectsAll = 0;
  /// A step with DSA indexers over caches of at least wideFrom positions,
  /// at a position where at least wideFrom are attended: each indexer's
  /// selection by a cluster of 16 blocks, not 8 (faster there, slower
  /// below; the same selection). KILN_CUDA_SELECT_BLOCKS=auto (the
  /// default), where the GPU runs such clusters.
  std::optional<StepGraph> wideSelect;
  int64_t wideFrom = 0;
  /// The graphs above again with the argmax cutting a nucleus
  /// (OpBinder::nucleus: a grid of blocks, after a distributed_argmax's
  /// gather of the whole vocabulary on every rank), for the steps whose
  /// sampling words ask for one (nucleusAsked); absent where the argmax
  /// takes four words. A step that does not cut one keeps the graphs
  /// without (one block's argmax; at tp > 1 the best keys alone travel).
  std::optional<StepGraph> nucleusWhole, nucleusAllSelected, nucleusWideSelect;
  bool nucleusAsked = false;
  /// Whether those graphs also serve a plain temperature: a step whose
  /// argmax holds the whole vocabulary (one rank), where the grid's keys
  /// beat one block's (docs/perf.md, forty-sixth pass). At tp > 1 a plain
  /// draw keeps the ranks' best keys, which cross no logits.
  bool gridDraws = false;
  /// The position input as last written from the host (-1: not yet), which
  /// picks the graph a run replays.
  int64_t position = -1;
  /// Each input slot's stage (by buffer index), made at its first write.
  std::map<int32_t, std::unique_ptr<PinnedStage>> stages;
  /// KILN_RUN_PROFILE: an event before each op and after the last, and the
  /// time each op took, summed over the profiled runs.
  std::vector<cudaEvent_t> events;
  std::vector<double> opMs;
  uint64_t profiledRuns = 0;
  uint64_t replays = 0; ///< graph launches so far (KILN_CUDA_TIMELINE)

  /// The graph a run at the last written position takes.
  StepGraph &current() {
    // selectsAll and wideFrom are 0 where the step lacks that graph.
    const bool nucleus = nucleusAsked && nucleusWhole;
    switch (backend::stepGraphAt(position, selectsAll, wideFrom)) {
    case backend::StepGraphKind::AllSelected:
      return nucleus ? *nucleusAllSelected : *allSelected;
    case backend::StepGraphKind::WideSelect:
      return nucleus ? *nucleusWideSelect : *wideSelect;
    case backend::StepGraphKind::First:
      break;
    }
    return nucleus ? *nucleusWhole : whole;
  }
  /// Every graph the step has, the first graph first: they are captured,
  /// instantiated and uploaded in this order, and of two graphs of the same
  /// kernels the one uploaded second replayed 0.10-0.20 ms slower at
  /// GLM-5's full width (docs/perf.md, thirty-second pass), so the graph
  /// most steps take comes first.
  std::vector<StepGraph *> graphs() {
    std::vector<StepGraph *> all{&whole};
    for (std::optional<StepGraph> *g :
         {&allSelected, &wideSelect, &nucleusWhole, &nucleusAllSelected,
          &nucleusWideSelect})
      if (*g)
        all.push_back(&**g);
    return all;
  }
};

struct State {
  DeviceMemory memory;
  const Buffer *buffer = nullptr;
};

struct CudaRank {
  uint32_t index = 0; ///< the artifact's rank
  uint32_t ranks = 1; ///< ranks of the artifact
  int device = 0;
  bool simulate = false; ///< alone, collectives replaced by local traffic
  /// Every collective replaced by its local traffic on every rank of a real
  /// group too (KILN_CUDA_LOCAL_COLLECTIVES=1; measuring only: what the
  /// step costs without NCCL).
  bool localCollectives = false;
  bool overlap = true; ///< programmatic dependent launch (Launch.cuh)
  /// KILN_RUN_ONE_GPU: every rank of the group on this one GPU; each
  /// collective goes through the exchange (peerReduceFlat where the
  /// one-shot kernel does not take it whole), never NCCL.
  bool oneGpu = false;
  /// An mla_attention's output projection by MLA's launch where the
  /// weight allows (else the attention, then the stacked mat-vec).
  bool mlaProjection = false;
  /// KILN_CUDA_TAGGED_IDS (GraphSwitches).
  bool taggedIds = true;
  /// KILN_CUDA_CLUSTER_SELECT=1: the indexer's selection as before the
  /// seventeenth pass (GraphSwitches).
  bool clusterSelect = false;
  int selectBlocks = 0;    ///< KILN_CUDA_SELECT_BLOCKS (GraphSwitches)
  int64_t wideSelectFrom = 0; ///< KILN_CUDA_SELECT_WIDE_FROM (GraphSwitches)
  bool quietStart = true;  ///< KILN_CUDA_QUIET_START (GraphSwitches)
  /// KILN_CUDA_QUIET_PREFETCH (setQuietPrefetchPasses).
  int quietPrefetch = 1;
  bool shortGraph = true;  ///< KILN_CUDA_SHORT_GRAPH (GraphSwitches)
  /// KILN_CUDA_SPECIALISED: the families (ShapeFamily bits) whose launches
  /// of a shape ModelShapes.h lists run the kernels compiled for it
  /// (setShapeSpecialised).
  unsigned shapeSpecialised = 0;
  /// KILN_CUDA_ROUTER_TAIL (setRouterTailMode).
  RouterTailMode routerTail = RouterTailMode::Held;
  bool indexerMma = true;  ///< KILN_CUDA_INDEXER_MMA (setIndexerMma)
  bool routerWarps = true; ///< KILN_CUDA_ROUTER_WARPS (setRouterWarps)
  bool peerClusters = true; ///< KILN_CUDA_PEER_CLUSTER (setPeerClusters)
  bool expertsInt8X = false; ///< KILN_CUDA_EXPERTS_INT8_X (setExpertsInt8X)
  /// KILN_CUDA_PEER_CLUSTER_POLICY (setPeerClusterPolicy).
  cudaClusterSchedulingPolicy peerClusterPolicy =
      cudaClusterSchedulingPolicyDefault;
  bool lightOps = true;    ///< KILN_CUDA_LIGHT_OPS (GraphSwitches)
  /// KILN_CUDA_DROP_BRANCH_EDGES (GraphSwitches).
  bool dropBranchEdges = true;
  MlaLaunch mla;           ///< KILN_CUDA_MLA_* (GraphSwitches, setMlaLaunch)
  bool graphStats = false; ///< a line a captured step (KILN_CUDA_GRAPH_STATS)
  /// KILN_CUDA_SCHEDULE: where rank 0 writes each captured step's schedule.
  std::string scheduleFile;
  /// KILN_CUDA_TIMELINE: where the kernels of one replay go (Timeline.h);
  /// empty: none recorded.
  std::string timeline;
  int maxBranches = 4; ///< parallel branches of a captured step
  /// Op kinds left out of every step (KILN_CUDA_OMIT; measuring only).
  std::set<std::string, std::less<>> omit;
  std::string where; ///< "cuda rank 0 (GPU 0)"
  std::string arch;  ///< the GPU's, "sm_90"
  /// The artifact's kernel images for this GPU: every launch runs them.
  std::unique_ptr<KernelImages> images;
  cudaStream_t stream = nullptr;
  /// The extra streams a capture forks the step's branches onto, and the
  /// events that fork and join them.
  std::vector<cudaStream_t> branches;
  std::vector<cudaEvent_t> joins;
  DeviceMemory arena;
  std::map<std::string, State> states;
  /// By binding index; only the bindings this rank's plan uses are set.
  std::vector<DeviceWeight> weights;
  std::vector<DeviceMemory> weightStore;
  /// One-dimensional weights used as per-channel parameters, dequantised
  /// to f32 once at load, by binding.
  std::map<int32_t, float *> params;
  std::vector<DeviceMemory> scratch;
  DeviceMemory fault;
  /// The step's first-fault word (16 bytes), then one fault record per op
  /// of the longest step (FaultSink).
  uint32_t *firstFault() { return fault.get<uint32_t>(); }
  StepFault *faultRecords() {
    return reinterpret_cast<StepFault *>(fault.get() + kFaultRecords);
  }
  static constexpr uint64_t kFaultRecords = 16;
  uint64_t faultBytes = 0;
  StepFault *hostFault = nullptr; ///< pinned
  uint32_t *hostFirst = nullptr;  ///< pinned
  const NcclApi *nccl = nullptr;
  ncclComm_t comm = nullptr;
  /// The one-shot all-reduce over the group's GPUs (KILN_CUDA_ALLREDUCE=
  /// peers, the default): this rank's exchange memory and its view of every
  /// rank's; `usePeers` false when all-reduces go through NCCL (or, for a
  /// simulated rank, the ring-traffic kernel).
  bool usePeers = false;
  DeviceMemory exchange;
  /// The one-shot all-reduces' step epochs (beginStepEpochs: a zeroed word
  /// the step's last kernel advances); with KILN_CUDA_STEP_EPOCHS=0 unset,
  /// and each call loads its blocks' epochs from the exchange.
  DeviceMemory epochBase;
  PeerExchange peers;
  /// Direct slots (KILN_CUDA_DIRECT_SLOTS, on by default): by step name, the
  /// all-reduce inputs placed in the exchange, each at its site (floats from
  /// the exchange's slots: StepKernels.h peerSitesStart on).
  std::map<std::string, std::map<int32_t, int64_t>, std::less<>> directSites;
  std::map<std::string, CudaStep> steps;
  std::unique_ptr<Worker> worker; ///< absent for a lone rank (runs inline)

  ~CudaRank() {
    cudaSetDevice(device);
    for (auto &[name, s] : steps) {
      for (cudaEvent_t e : s.events)
        cudaEventDestroy(e);
      for (StepGraph *g : s.graphs()) {
        for (cudaEvent_t e : g->done)
          if (e)
            cudaEventDestroy(e);
        if (g->exec)
          cudaGraphExecDestroy(g->exec);
        if (g->graph)
          cudaGraphDestroy(g->graph);
      }
    }
    if (comm && nccl)
      nccl->commDestroy(comm);
    if (hostFault)
      cudaFreeHost(hostFault);
    if (hostFirst)
      cudaFreeHost(hostFirst);
    for (cudaEvent_t e : joins)
      cudaEventDestroy(e);
    for (cudaStream_t b : branches)
      cudaStreamDestroy(b);
    if (stream)
      cudaStreamDestroy(stream);
  }

  /// Runs `job` on this rank's thread (inline for a lone rank).
  void post(std::function<Status()> job) {
    if (worker)
      worker->post(std::move(job));
    else
      inlineResult_ = job();
  }
  Status wait() {
    if (worker)
      return worker->wait();
    return inlineResult_.value_or(Status::ok());
  }

  /// Zeroed scratch of its own (MLA and the router count their blocks'
  /// arrivals in theirs), zeroed on the rank's stream: what the stream
  /// writes into it next (a parameter's dequantisation at bind, say) lands
  /// after the zeros. (cudaMemset runs on the legacy stream, which the
  /// rank's non-blocking stream does not wait for: it could land after.)
  Expected<float *> scratchFloats(uint64_t n) {
    KILN_ASSIGN(m, DeviceMemory::allocate(n * sizeof(float), where));
    if (n)
      CUDA_TRY(where, cudaMemsetAsync(m.get(), 0, n * sizeof(float), stream));
    scratch.push_back(std::move(m));
    return scratch.back().get<float>();
  }

private:
  std::optional<Status> inlineResult_;
};

struct CudaGroup {
  Artifact artifact;
  bool eager = false;
  bool profile = false;
  uint64_t seed = 0;
  uint64_t fillPositions = 0;
  std::vector<std::unique_ptr<CudaRank>> ranks;
};

Status ncclCheck(const NcclApi &api, ncclResult_t r, const std::string &where,
                 const char *call) {
  if (r == ncclSuccess)
    return Status::ok();
  return Error(where, call, api.getErrorString(r));
}

DeviceCache cacheOf(const uint8_t *data, const Buffer &b) {
  CacheType t = b.dtype == DType::F16    ? CacheType::F16
                : b.dtype == DType::BF16 ? CacheType::BF16
                                         : CacheType::F32;
  return {const_cast<uint8_t *>(data), t, b.shape[0], b.shape[1]};
}

/// Binds one decoded op to its kernel launch on this rank's memory.
class OpBinder {
public:
  OpBinder(CudaRank &rank, CudaStep &step, StepOp op, int32_t index)
      : rank_(rank), step_(step), d_(std::move(op)), index_(index) {}

  Expected<Launch> bind();

  /// A fused_linear's runs: consecutive parts placed back to back
  /// (placeWeights) with one type, layout and width are one matrix whose
  /// rows are their segments in order, one launch. Each with its first
  /// output value.
  struct Run {
    DeviceWeight w;
    int64_t at;
    /// The run's rows read only from a position on (live_from): every row
    /// from `liveRows` on has the same live position `liveFrom` > 0, and
    /// none before it; liveFrom 0 when that is not the run's shape.
    int64_t liveRows = 0;
    int64_t liveFrom = 0;
  };
  std::vector<Run> fusedRuns() const;
  /// The launch of one run (of an rms_norm_linear: with the norm).
  Expected<Launch> runLaunch(const Run &r) {
    const float *x = f32In(0);
    float *y = f32Out(0) + r.at;
    DeviceWeight w = r.w;
    LiveRows live;
    const int32_t *position = positionInput();
    if (r.liveFrom > 0 && position)
      live = {position, int32_t(r.liveFrom), r.liveRows};
    if (d_.kind != OpKind::RmsNormLinear)
      return wrap([=](cudaStream_t s) {
        return launchLinear(x, 1, w, w.rows, false, y, s,
                            live.position ? &live : nullptr);
      });
    InputNorm norm;
    KILN_ASSIGN(weight, param(1));
    norm.weight = weight;
    norm.eps = float(d_.epsilon);
    // Each run its own scratch: runs may overlap.
    KILN_ASSIGN(scratch, rank_.scratchFloats(uint64_t(d_.k)));
    norm.scratch = scratch;
    return wrap([=](cudaStream_t s) {
      return launchNormedLinear(x, norm, w, y, s,
                                live.position ? &live : nullptr);
    });
  }
  /// The step's position input slot (live_from counts in it), or null.
  const int32_t *positionInput() const {
    std::optional<int32_t> i = step_.step->slot(BufferKind::Input, "position");
    if (!i || buffer(*i).dtype != DType::I32)
      return nullptr;
    return reinterpret_cast<const int32_t *>(step_.ptrs[size_t(*i)]);
  }
  /// An mla_attention with a selection: its launch for a step at which
  /// the selection is every attended position (StepGraph), which reads
  /// neither the selection nor its count. Set by bind().
  std::optional<Launch> everySelected;
  /// A dsa_indexer: its launch with the selection by a cluster of 16
  /// blocks, for CudaStep::wideSelect, where that graph applies (auto
  /// cluster size, a cache of at least wideSelectFrom positions, a GPU
  /// that runs such clusters). Set by bind().
  std::optional<Launch> wideSelect;
  /// An argmax that may cut a nucleus (eight sampling words): its launch
  /// for CudaStep's nucleus graphs, the cut by a grid of blocks
  /// (launchNucleusArgmax); a distributed_argmax's gathers the whole
  /// vocabulary's logits on every rank first and draws from them there
  /// (the same token on every rank). Set by bind().
  std::optional<Launch> nucleus;
  /// The first weight operand of a fused_linear or rms_norm_linear.
  size_t firstWeight() const {
    return d_.kind == OpKind::RmsNormLinear ? 2 : 1;
  }
  /// An rms_norm_linear's norm parameter when it lives in the arena (a
  /// weight's is read-only device memory of its own), else -1.
  int32_t normBuffer() const {
    if (d_.kind != OpKind::RmsNormLinear ||
        buffer(d_.ins[1]).kind == BufferKind::Weight)
      return -1;
    return d_.ins[1];
  }

private:
  const Buffer &buffer(int32_t i) const { return step_.step->buffers[i]; }
  float *f32In(size_t i) const {
    return reinterpret_cast<float *>(step_.ptrs[d_.ins[i]]);
  }
  float *f32Out(size_t i) const {
    return reinterpret_cast<float *>(step_.ptrs[d_.outs[i]]);
  }
  int32_t *i32In(size_t i) const {
    return reinterpret_cast<int32_t *>(step_.ptrs[d_.ins[i]]);
  }
  int32_t *i32Out(size_t i) const {
    return reinterpret_cast<int32_t *>(step_.ptrs[d_.outs[i]]);
  }
  /// An argmax op's draw (its sampling words and position), or none.
  DrawInputs drawInputs() const {
    if (!d_.drawn)
      return {};
    return DrawInputs{i32In(1), i32In(2), sink(), d_.drawWords};
  }
  const DeviceWeight &weight(size_t i) const {
    return rank_.weights[buffer(d_.ins[i]).binding];
  }
  DeviceCache cache(int32_t i) const {
    return cacheOf(step_.ptrs[i], buffer(i));
  }
  /// A per-channel parameter: an f32 buffer, or a 1-D weight dequantised
  /// once to f32 at load.
  Expected<const float *> param(size_t i);
  FaultSink sink() const {
    return {rank_.faultRecords() + index_, index_, rank_.firstFault()};
  }
  /// A launch's error, naming the op.
  Launch wrap(std::function<cudaError_t(cudaStream_t)> fn) const {
    std::string where = d_.where;
    return [fn = std::move(fn), where](cudaStream_t s) {
      return check(fn(s), where, "kernel launch");
    };
  }
  Expected<Launch> collective();
  Expected<Launch> gatherParts(const float *x, uint64_t part, float *gathered);
  /// launchNucleusArgmax's scratch for n values, zero.
  /// An argmax's input `x` (tokens base .. base + n of `vocab`) as its
  /// kernels read it, and what makes it: x itself and nothing, or in the
  /// adjusting form (DrawKey.h) scratch that launchAdjustLogits fills
  /// first.
  Expected<std::pair<const float *, std::function<Status(cudaStream_t)>>>
  adjustedLogits(const float *x, int64_t n, int64_t base, int64_t vocab) {
    std::function<Status(cudaStream_t)> none = [](cudaStream_t) {
      return Status::ok();
    };
    if (!d_.drawn || draw::adjustCapacity(d_.drawWords) == 0)
      return std::pair{x, none};
    KILN_ASSIGN(y, rank_.scratchFloats(uint64_t(n)));
    const DrawInputs draw = drawInputs();
    const std::string where = d_.where;
    return std::pair<const float *, std::function<Status(cudaStream_t)>>{
        y, [=](cudaStream_t s) {
          return check(launchAdjustLogits(x, n, base, vocab, y, s, draw), where,
                       "launchAdjustLogits");
        }};
  }
  Expected<void *> nucleusScratch(int64_t n) {
    KILN_ASSIGN(z, rank_.scratchFloats((nucleusScratchBytes(n) + 3) / 4));
    return static_cast<void *>(z);
  }

  CudaRank &rank_;
  CudaStep &step_;
  StepOp d_;
  int32_t index_;
};

std::vector<OpBinder::Run> OpBinder::fusedRuns() const {
  std::vector<Run> runs;
  const size_t first = firstWeight();
  for (size_t i = first; i < d_.ins.size(); ++i) {
    const DeviceWeight w = weight(i);
    if (!runs.empty()) {
      DeviceWeight &prev = runs.back().w;
      bool next = true;
      if (const SplitFormat *f = w.layout == WeightLayout::Blocks
                                     ? nullptr
                                     : splitFormatOf(w.type)) {
        // Every plane's rows follow the previous part's.
        const uint64_t blocks =
            uint64_t(prev.rows) * uint64_t(prev.cols / f->blockValues);
        for (int p = 0; p < f->planes; ++p)
          next = next &&
                 w.plane(p) == prev.plane(p) + splitPlaneBytes(*f, p, blocks);
      } else {
        next = w.data == prev.data + *rowBytes(prev.type, uint64_t(prev.cols)) *
                                         uint64_t(prev.rows);
      }
      if (w.type == prev.type && w.layout == prev.layout &&
          w.cols == prev.cols && next) {
        Run &run = runs.back();
        const int64_t from = d_.liveFrom.empty() ? 0 : d_.liveFrom[i - first];
        // Live rows stay a suffix of one position; otherwise every row is
        // computed (liveFrom -1 until the run ends, then 0).
        if (run.liveFrom == 0 && from == 0)
          run.liveRows += w.rows;
        else if (run.liveFrom == 0 || run.liveFrom != from)
          run.liveFrom = run.liveFrom == 0 && from > 0 ? from : -1;
        prev.rows += w.rows;
        continue;
      }
    }
    const int64_t from = d_.liveFrom.empty() ? 0 : d_.liveFrom[i - first];
    runs.push_back({w, d_.segments[i - first], from > 0 ? 0 : w.rows, from});
  }
  for (Run &run : runs)
    run.liveFrom = run.liveFrom < 0 ? 0 : run.liveFrom;
  return runs;
}

Expected<const float *> OpBinder::param(size_t i) {
  const Buffer &b = buffer(d_.ins[i]);
  if (b.kind != BufferKind::Weight)
    return static_cast<const float *>(f32In(i));
  auto it = rank_.params.find(b.binding);
  if (it != rank_.params.end())
    return static_cast<const float *>(it->second);
  const DeviceWeight &w = rank_.weights[b.binding];
  KILN_ASSIGN(out, rank_.scratchFloats(uint64_t(w.rows * w.cols)));
  KILN_TRY(
      check(launchDequant(w, out, rank_.stream), d_.where, "launchDequant"));
  rank_.params[b.binding] = out;
  return static_cast<const float *>(out);
}

/// A sum (or max) of `n` values over the exchange's ranks, as one-shot
/// all-reduces of at most kPeerMaxValues values each (KILN_RUN_ONE_GPU,
/// where no NCCL takes the collectives the one-shot kernel does not).
Status peerReduceFlat(const PeerExchange &peers, const float *x, uint64_t n,
                      bool sum, float *out, FaultSink fault, cudaStream_t s,
                      const std::string &where) {
  const uint64_t most =
      std::min(uint64_t(kPeerMaxValues), uint64_t(peers.capacity));
  for (uint64_t at = 0; at < n; at += most) {
    const uint64_t len = std::min(most, n - at);
    KILN_TRY(
        check(launchAllReducePeers(peers, x + at, 1, int64_t(len), sum, nullptr,
                                   nullptr, 0.f, out + at, nullptr, fault, s),
              where, "launchAllReducePeers"));
  }
  return Status::ok();
}

/// Every rank's `part` floats of x, rank after rank, into `gathered`:
/// NCCL's all-gather across the group; ranks on one GPU through its memory
/// (this rank's part at its place in a vector that is zero elsewhere, made
/// so once, summed over the ranks: the parts exactly, x + 0 = x); alone,
/// this rank's part in every rank's place.
Expected<Launch> OpBinder::gatherParts(const float *x, uint64_t part,
                                       float *gathered) {
  const NcclApi *nccl = rank_.nccl;
  CudaRank *rank = &rank_;
  const std::string where = d_.where;
  const int64_t ranks = int64_t(rank_.ranks);
  const bool simulate = rank_.simulate || rank_.localCollectives;
  const bool oneGpu = rank_.oneGpu;
  const PeerExchange peers = rank_.peers;
  FaultSink f = sink();
  float *staged = nullptr;
  if (oneGpu) {
    KILN_ASSIGN(z, rank_.scratchFloats(part * uint64_t(ranks)));
    staged = z;
  }
  const uint64_t me = rank_.index;
  return Launch([=](cudaStream_t s) -> Status {
    if (oneGpu) {
      CUDA_TRY(where,
               cudaMemcpyAsync(staged + me * part, x, part * sizeof(float),
                               cudaMemcpyDeviceToDevice, s));
      return peerReduceFlat(peers, staged, part * uint64_t(ranks), true,
                            gathered, f, s, where);
    }
    if (nccl && !simulate)
      return ncclCheck(
          *nccl, nccl->allGather(x, gathered, part, ncclFloat, rank->comm, s),
          where, "ncclAllGather");
    for (int64_t q = 0; q < ranks; ++q)
      CUDA_TRY(where,
               cudaMemcpyAsync(gathered + q * part, x, part * sizeof(float),
                               cudaMemcpyDeviceToDevice, s));
    return Status::ok();
  });
}

/// all_reduce, all_reduce_add(_rms_norm), all_gather, distributed_argmax:
/// NCCL across the group; alone (one rank, or a simulated rank of a larger
/// plan) the local equivalent, which for a simulated rank moves the bytes
/// a ring collective moves through each GPU's memory; ranks on one GPU
/// (KILN_RUN_ONE_GPU) through its memory: the one-shot all-reduce, and
/// gathers as sums of vectors that are zero outside each rank's part.
Expected<Launch> OpBinder::collective() {
  CudaRank *rank = &rank_;
  const NcclApi *nccl = rank_.nccl;
  std::string where = d_.where;
  int64_t ranks = int64_t(rank_.ranks);
  // A ring all-reduce sends and receives 2 (N - 1) / N of the buffer.
  auto ringBytes = [&](uint64_t bytes) {
    return bytes * 2 * uint64_t(ranks - 1) / uint64_t(ranks);
  };
  switch (d_.kind) {
  case OpKind::AllReduce:
  case OpKind::AllReduceAdd:
  case OpKind::AllReduceAddRmsNorm: {
    bool fused = d_.kind == OpKind::AllReduceAddRmsNorm;
    // all_reduce_add: the residual add without the norm.
    bool added = fused || d_.kind == OpKind::AllReduceAdd;
    // With a router tail (kiln-fold-router) the partial's last `tail`
    // values are reduced with the rest and divided by the norm's rms.
    int64_t tail = d_.tail;
    uint64_t n = uint64_t(d_.rows * d_.n + tail);
    bool simulate = rank_.simulate || rank_.localCollectives;
    const float *x = f32In(0);
    const float *w = nullptr;
    if (fused) {
      KILN_ASSIGN(weights, param(2));
      w = weights;
    }
    const float *residual = added ? f32In(1) : nullptr;
    float *sum = f32Out(0), *y = fused ? f32Out(1) : nullptr;
    float *logits = tail > 0 ? f32Out(2) : nullptr;
    // The router's choice from the logits (kiln-fuse-router-choice): made
    // by the one-shot kernel's block holding the tail, or after NCCL's
    // reduction by the choice kernel.
    RouterChoice choice;
    if (d_.hasChoice) {
      if (d_.hasBias) {
        KILN_ASSIGN(b, param(3));
        choice.bias = b;
      }
      choice.topK = d_.topK;
      choice.gating = d_.softmax ? Gating::Softmax : Gating::Sigmoid;
      choice.normalize = d_.normalize;
      choice.routedScale = float(d_.routedScale);
      choice.ids = i32Out(3);
      choice.weights = f32Out(4);
    }
    const bool chooses = d_.hasChoice;
    int64_t rows = d_.rows, cols = d_.n;
    float eps = float(d_.epsilon);
    bool isSum = d_.sum;
    uint64_t traffic = simulate ? ringBytes(n * sizeof(float)) : 0;
    // Direct slots: x lives in the exchange, at its site (directSites).
    int64_t site = -1;
    if (auto direct = rank_.directSites.find(step_.step->name);
        direct != rank_.directSites.end())
      if (auto at = direct->second.find(d_.ins[0]); at != direct->second.end())
        site = at->second;
    if (rank_.usePeers && allReducePeersFits(rank_.peers, rows, cols, tail)) {
      // One kernel: every rank's part read over NVLink (a simulated rank:
      // its own, once for every rank), combined in rank order, and for the
      // fused op added and normalised.
      const PeerExchange peers = rank_.peers;
      FaultSink f = sink();
      float *out = sum;
      return wrap([=](cudaStream_t s) {
        return launchAllReducePeers(peers, x, rows, cols, isSum, residual, w,
                                    eps, out, y, f, s, tail, logits,
                                    chooses ? &choice : nullptr, site);
      });
    }
    if (site >= 0)
      return Error(where, "direct slots",
                   "an all-reduce placed in the exchange that the one-shot "
                   "kernel does not take");
    // The fused ops reduce into scratch (their input is read-only).
    float *reduced = f32Out(0);
    if (added || (simulate && ranks > 1)) {
      KILN_ASSIGN(s, rank_.scratchFloats(simulate ? 2 * n : n));
      reduced = s;
    }
    const bool oneGpu = rank_.oneGpu;
    const PeerExchange peers = rank_.peers;
    FaultSink f = sink();
    return Launch([=](cudaStream_t s) -> Status {
      if (oneGpu) {
        KILN_TRY(peerReduceFlat(peers, x, n, isSum, reduced, f, s, where));
      } else if (nccl && !simulate) {
        KILN_TRY(
            ncclCheck(*nccl,
                      nccl->allReduce(x, reduced, n, ncclFloat,
                                      isSum ? ncclSum : ncclMax, rank->comm, s),
                      where, "ncclAllReduce"));
      } else {
        // Alone the sum is the input itself. A simulated rank also moves
        // the ring's traffic (x again, into the scratch's second half), in
        // one kernel as NCCL's would be.
        if (simulate && traffic > n * sizeof(float))
          KILN_TRY(check(launchRingTraffic(x, int64_t(n),
                                           int64_t(traffic / sizeof(float)),
                                           reduced, s),
                         where, "launchRingTraffic"));
        else if (reduced != x)
          CUDA_TRY(where, cudaMemcpyAsync(reduced, x, n * sizeof(float),
                                          cudaMemcpyDeviceToDevice, s));
      }
      if (fused) {
        KILN_TRY(
            check(launchAddRmsNorm(residual, reduced, rows, cols, w, eps, sum,
                                   y, s, reduced + rows * cols, tail, logits),
                  where, "launchAddRmsNorm"));
        if (!chooses)
          return Status::ok();
        return check(launchMoeChoose(logits, tail, choice.bias, choice.topK,
                                     choice.gating, choice.normalize,
                                     choice.routedScale, choice.ids,
                                     choice.weights, s),
                     where, "launchMoeChoose");
      }
      if (added)
        return check(launchAdd(residual, reduced, int64_t(n), sum, s), where,
                     "launchAdd");
      if (reduced != sum)
        CUDA_TRY(where, cudaMemcpyAsync(sum, reduced, n * sizeof(float),
                                        cudaMemcpyDeviceToDevice, s));
      return Status::ok();
    });
  }
  case OpKind::AllGather: {
    const float *x = f32In(0);
    float *y = f32Out(0);
    uint64_t part = uint64_t(d_.outer * d_.inner);
    int64_t outer = d_.outer, inner = d_.inner;
    // Rank-major parts land in scratch unless the gather is on dim 0.
    float *gathered = y;
    if (outer != 1) {
      KILN_ASSIGN(s, rank_.scratchFloats(part * uint64_t(ranks)));
      gathered = s;
    }
    KILN_ASSIGN(gather, gatherParts(x, part, gathered));
    return Launch([=](cudaStream_t s) -> Status {
      KILN_TRY(gather(s));
      if (gathered != y)
        return check(launchGatherReorder(gathered, ranks, outer, inner, y, s),
                     where, "launchGatherReorder");
      return Status::ok();
    });
  }
  case OpKind::DistributedArgmax: {
    int64_t n = d_.n;
    const DrawInputs draw = drawInputs();
    int32_t *y = i32Out(0);
    int32_t base = int32_t(int64_t(rank_.index) * n);
    // The adjusting form: the rank's part adjusted first, into scratch the
    // draw's kernels then read (every launch below starts with it).
    KILN_ASSIGN(adjusted, adjustedLogits(f32In(0), n, base, n * ranks));
    const auto [x, adjust] = adjusted;
    if (d_.drawn && d_.drawWords >= draw::kDrawWords) {
      // The whole vocabulary on every rank, then the grid's argmax that
      // cuts the nucleus and draws (the nucleus's graphs).
      KILN_ASSIGN(whole, rank_.scratchFloats(uint64_t(n) * uint64_t(ranks)));
      KILN_ASSIGN(gather, gatherParts(x, uint64_t(n), whole));
      const int64_t all = n * ranks;
      KILN_ASSIGN(scratch, nucleusScratch(all));
      nucleus = Launch([=](cudaStream_t s) -> Status {
        KILN_TRY(adjust(s));
        KILN_TRY(gather(s));
        return check(launchNucleusArgmax(whole, all, y, scratch, s, draw),
                     where, "launchNucleusArgmax");
      });
    }
    KILN_ASSIGN(buf, rank_.scratchFloats(2 * uint64_t(ranks)));
    auto *candidates = reinterpret_cast<ArgmaxCandidate *>(buf);
    bool simulate = rank_.simulate || rank_.localCollectives;
    uint32_t me = rank_.index;
    if (rank_.oneGpu) {
      // Each candidate as two floats in a [2 ranks] vector zero elsewhere,
      // summed over the ranks (launchArgmaxSlots).
      if (n * ranks > (int64_t(1) << 24))
        return Error(where, "",
                     fmt::format("ranks on one GPU gather argmax indices as "
                                 "floats, exact below 2^24; {} x {} values "
                                 "are more",
                                 ranks, n));
      KILN_ASSIGN(slots, rank_.scratchFloats(4 * uint64_t(ranks)));
      const PeerExchange peers = rank_.peers;
      FaultSink f = sink();
      return Launch([=](cudaStream_t s) -> Status {
        KILN_TRY(adjust(s));
        KILN_TRY(check(
            launchArgmaxSlots(x, n, base, int(ranks), int(me), slots, s, draw),
            where, "launchArgmaxSlots"));
        KILN_TRY(peerReduceFlat(peers, slots, 2 * uint64_t(ranks), true,
                                slots + 2 * ranks, f, s, where));
        return check(launchPickSlots(slots + 2 * ranks, int(ranks), y, s),
                     where, "launchPickSlots");
      });
    }
    return Launch([=](cudaStream_t s) -> Status {
      KILN_TRY(adjust(s));
      ArgmaxCandidate *mine = candidates + (nccl && !simulate ? me : 0);
      KILN_TRY(check(launchArgmaxCandidate(x, n, base, mine, s, draw), where,
                     "launchArgmaxCandidate"));
      if (nccl && !simulate) {
        // In place: each rank's candidate sits at its own slot.
        KILN_TRY(
            ncclCheck(*nccl,
                      nccl->allGather(mine, candidates, sizeof(ArgmaxCandidate),
                                      ncclUint8, rank->comm, s),
                      where, "ncclAllGather"));
        return check(launchPickCandidate(candidates, int(ranks), y, s), where,
                     "launchPickCandidate");
      }
      return check(launchPickCandidate(candidates, 1, y, s), where,
                   "launchPickCandidate");
    });
  }
  default:
    return Error(d_.where, "", "not a collective");
  }
}

Expected<Launch> OpBinder::bind() {
  const StepOp &d = d_;
  int64_t n = d.n, rows = d.rows;
  // A repacked device layout is read by the mat-vec kernels only.
  const std::string &kind = step_.step->ops[size_t(index_)].kind;
  for (size_t k = 0; k < d.ins.size(); ++k) {
    const int32_t i = d.ins[k];
    const Buffer &b = buffer(i);
    // Only a moe_experts' shared expert weights are 2-D there.
    const size_t dims =
        d.kind == OpKind::MoeExperts && !(d.hasShared && k >= d.sharedIndex)
            ? 3
            : 2;
    if (b.kind == BufferKind::Weight &&
        rank_.weights[b.binding].layout != WeightLayout::Blocks &&
        !readsWeightAsMatVec(kind, k, dims))
      return Error(d.where, step_.step->buffers[i].name,
                   "its device layout is read only by the mat-vec ops "
                   "(the artifact is inconsistent)");
  }
  switch (d.kind) {
  case OpKind::AllReduce:
  case OpKind::AllReduceAdd:
  case OpKind::AllReduceAddRmsNorm:
  case OpKind::AllGather:
  case OpKind::DistributedArgmax:
    return collective();
  case OpKind::Copy: {
    const float *x = f32In(0);
    float *y = f32Out(0);
    std::string where = d.where;
    return Launch([=](cudaStream_t s) -> Status {
      if (x != y)
        CUDA_TRY(where, cudaMemcpyAsync(y, x, uint64_t(n) * sizeof(float),
                                        cudaMemcpyDeviceToDevice, s));
      return Status::ok();
    });
  }
  case OpKind::Slice: {
    if (d.srcShape.size() > 4)
      return Error(d.where, "", "the CUDA slice handles up to 4 dims");
    const float *x = f32In(0);
    float *y = f32Out(0);
    std::vector<int64_t> src = d.srcShape, dst = d.dstShape, off = d.offsets;
    return wrap([=](cudaStream_t s) {
      return launchSlice(x, src.data(), dst.data(), off.data(), int(src.size()),
                         y, s);
    });
  }
  case OpKind::Concat: {
    // One kernel for every input: row o of the output is each input's
    // row o (`runs` values) in turn.
    if (d.ins.size() > size_t(kMaxConcatParts))
      return Error(
          d.where, "",
          fmt::format("the CUDA concat takes at most {} inputs, not {}",
                      kMaxConcatParts, d.ins.size()));
    std::vector<const float *> parts;
    for (size_t i = 0; i < d.ins.size(); ++i)
      parts.push_back(f32In(i));
    std::vector<int64_t> runs(d.runs.begin(), d.runs.end());
    float *y = f32Out(0);
    int64_t outer = d.outer, total = d.n;
    return wrap([=](cudaStream_t s) {
      return launchConcat(parts.data(), runs.data(), int(parts.size()), outer,
                          total, y, s);
    });
  }
  case OpKind::Add:
  case OpKind::Swiglu: {
    const float *a = f32In(0), *b = f32In(1);
    float *y = f32Out(0);
    bool isAdd = d.kind == OpKind::Add;
    return wrap([=](cudaStream_t s) {
      return isAdd ? launchAdd(a, b, n, y, s) : launchSwiglu(a, b, n, y, s);
    });
  }
  case OpKind::RmsNorm:
  case OpKind::LayerNorm: {
    KILN_ASSIGN(w, param(1));
    const float *bias = nullptr;
    if (d.kind == OpKind::LayerNorm) {
      KILN_ASSIGN(b, param(2));
      bias = b;
    }
    const float *x = f32In(0);
    float *y = f32Out(0);
    float eps = float(d.epsilon);
    return wrap([=](cudaStream_t s) {
      return bias ? launchLayerNorm(x, rows, n, w, bias, eps, y, s)
                  : launchRmsNorm(x, rows, n, w, eps, y, s);
    });
  }
  case OpKind::AddRmsNorm: {
    KILN_ASSIGN(w, param(2));
    const float *a = f32In(0), *b = f32In(1);
    float *sum = f32Out(0), *y = f32Out(1);
    float eps = float(d.epsilon);
    return wrap([=](cudaStream_t s) {
      return launchAddRmsNorm(a, b, rows, n, w, eps, sum, y, s);
    });
  }
  case OpKind::Rope: {
    const float *x = f32In(0);
    const int32_t *pos = i32In(1);
    float *y = f32Out(0);
    RopeStyle style = d.neox ? RopeStyle::NeoX : RopeStyle::Interleaved;
    float theta = float(d.theta);
    int64_t offset = d.ropeOffset, dims = d.ropeDims;
    return wrap([=](cudaStream_t s) {
      return launchRope(x, rows, n, pos, style, theta, offset, dims, y, s);
    });
  }
  case OpKind::Dequant: {
    DeviceWeight w = weight(0);
    float *y = f32Out(0);
    return wrap([=](cudaStream_t s) { return launchDequant(w, y, s); });
  }
  case OpKind::Embed: {
    DeviceWeight w = weight(0);
    const int32_t *token = i32In(1);
    float *y = f32Out(0);
    FaultSink f = sink();
    return wrap([=](cudaStream_t s) { return launchEmbed(w, token, y, f, s); });
  }
  case OpKind::Linear: {
    DeviceWeight w = weight(1);
    const float *x = f32In(0);
    float *y = f32Out(0);
    bool stacked = d.stacked;
    return wrap([=](cudaStream_t s) {
      return launchLinear(x, rows, w, n, stacked, y, s);
    });
  }
  case OpKind::FusedLinear:
  case OpKind::RmsNormLinear:
    return Error(d.where, "", "a fused mat-vec is bound run by run");
  case OpKind::SwigluLinear: {
    DeviceWeight w = weight(2);
    const float *gate = f32In(0), *up = f32In(1);
    float *y = f32Out(0);
    // The product's scratch, for layouts whose kernel cannot form it.
    float *scratch = nullptr;
    if (w.layout != WeightLayout::Q8Split) {
      KILN_ASSIGN(p, rank_.scratchFloats(uint64_t(d.k)));
      scratch = p;
    }
    return wrap([=](cudaStream_t s) {
      return launchSwigluLinear(gate, up, w, scratch, y, s);
    });
  }
  case OpKind::CacheAppend: {
    DeviceCache c = cache(d.outs[0]);
    const float *x = f32In(0);
    const int32_t *pos = i32In(1);
    FaultSink f = sink();
    return wrap(
        [=](cudaStream_t s) { return launchCacheAppend(x, pos, c, f, s); });
  }
  case OpKind::NormRopeAppend: {
    DeviceCache c = cache(d.outs[0]);
    KILN_ASSIGN(w, param(1));
    const float *bias = nullptr;
    if (d.hasBias) {
      KILN_ASSIGN(b, param(2));
      bias = b;
    }
    const float *x = f32In(0);
    const int32_t *pos = i32In(d.hasBias ? 3 : 2);
    RopeStyle style = d.neox ? RopeStyle::NeoX : RopeStyle::Interleaved;
    float eps = float(d.epsilon), theta = float(d.theta);
    int64_t normDims = d.k, offset = d.ropeOffset, dims = d.ropeDims;
    FaultSink f = sink();
    return wrap([=](cudaStream_t s) {
      return launchNormRopeAppend(x, normDims, w, bias, eps, pos, style, theta,
                                  offset, dims, c, f, s);
    });
  }
  case OpKind::MlaAttention: {
    DeviceCache c = cache(d.ins[2]);
    // The output projection (kiln-fuse-mla-projection): with
    // KILN_CUDA_MLA_PROJECTION=1 by MLA's launch where it takes the weight
    // (mlaProjectionFits: Q8_0 in the q8_0-split layout, a latent width of
    // a power of two), its combine and the projection in one kernel;
    // otherwise MLA into scratch of this op's, then the stacked mat-vec (by
    // default: docs/perf.md, twenty-eighth pass).
    std::optional<DeviceWeight> proj;
    if (d.projected)
      proj = weight(d.ins.size() - 1);
    const bool inside =
        proj && rank_.mlaProjection && mlaProjectionFits(*proj, d.heads, d.k);
    const int64_t entries = mlaMostEntries(c.positions, d.capacity);
    KILN_ASSIGN(scores, rank_.scratchFloats(
                            uint64_t(mlaScratchFloats(d.heads, d.k, entries))));
    float *latentOut = nullptr;
    if (proj && !inside) {
      KILN_ASSIGN(o, rank_.scratchFloats(uint64_t(d.heads * d.k)));
      latentOut = o;
    }
    const float *ql = f32In(0), *qr = f32In(1);
    const int32_t *pos = i32In(3);
    const int32_t *sel = d.capacity ? i32In(4) : nullptr;
    const int32_t *count = d.capacity ? i32In(5) : nullptr;
    float *y = f32Out(0);
    int64_t heads = d.heads, latent = d.k, rope = d.rope, capacity = d.capacity;
    float scale = float(d.scale);
    FaultSink f = sink();
    auto launch = [=, this](const int32_t *sel, const int32_t *count) {
      return wrap([=](cudaStream_t s) {
        if (inside)
          return launchMlaAttention(ql, qr, heads, latent, rope, c, pos, sel,
                                    count, capacity, scale, scores, y, f, s,
                                    &*proj);
        if (cudaError_t e = launchMlaAttention(
                ql, qr, heads, latent, rope, c, pos, sel, count, capacity,
                scale, scores, latentOut ? latentOut : y, f, s);
            e != cudaSuccess || !latentOut)
          return e;
        return launchLinear(latentOut, heads, *proj, n, /*stacked=*/true, y, s);
      });
    };
    // Below the selection's size every position is selected: positions 0
    // .. position, at most `capacity`, without reading the selection (the
    // same entries in the same order, so the same bits).
    if (capacity > 0)
      everySelected = launch(nullptr, nullptr);
    return launch(sel, count);
  }
  case OpKind::DsaIndexer: {
    DeviceCache c = cache(d.ins[2]);
    KILN_ASSIGN(scores, rank_.scratchFloats(uint64_t(c.positions)));
    const float *q = f32In(0), *w = f32In(1);
    const int32_t *pos = i32In(3);
    int32_t *sel = i32Out(0), *count = i32Out(1);
    int64_t heads = d.heads, dim = d.k, topK = d.topK;
    float scale = float(d.scale);
    QueryRope rope{d.neox ? RopeStyle::NeoX : RopeStyle::Interleaved,
                   float(d.theta), d.ropeOffset, d.ropeDims};
    FaultSink f = sink();
    IndexerSelect select =
        rank_.clusterSelect ? kClusterSelect : IndexerSelect{};
    select.clusterBlocks = rank_.selectBlocks;
    auto launch = [=, this](IndexerSelect by) {
      return wrap([=](cudaStream_t s) {
        return launchDsaIndexer(q, heads, dim, w, c, pos, topK, scale, scores,
                                sel, count, f, s, rope, kMaxStagedKeyBytes, by);
      });
    };
    if (rank_.selectBlocks == 0 && rank_.wideSelectFrom > 0 &&
        c.positions >= rank_.wideSelectFrom) {
      IndexerSelect wide = select;
      wide.clusterBlocks = 16;
      int blocks = 0;
      CUDA_TRY(d.where,
               dsaSelectBlocks(c.positions, wide, kMaxStagedKeyBytes, blocks));
      if (blocks == wide.clusterBlocks)
        wideSelect = launch(wide);
    }
    return launch(select);
  }
  case OpKind::RouterPartial: {
    DeviceWeight gate = weight(2);
    KILN_ASSIGN(g, param(3));
    const float *p = f32In(0), *x = f32In(1);
    float *t = f32Out(0);
    float scale = float(d.residualScale);
    return wrap([=](cudaStream_t s) {
      return launchRouterPartial(p, x, gate, g, scale, t, s);
    });
  }
  case OpKind::LinearRouter: {
    // The composed rows [M | C] (StepOps.h), made once at bind time from
    // the weights on the device (random ones too, for --bench).
    DeviceWeight w = weight(1), gate = weight(3);
    KILN_ASSIGN(norm, param(4));
    // The decoder checked the dims (the gate a whole F32 [hidden, experts]
    // weight: the file's rows) and that ranks divides hidden.
    const int64_t hidden = d.n, k = d.k, experts = d.experts;
    const int64_t shareCols = hidden / d.ranks,
                  shareBegin = int64_t(rank_.index) * shareCols;
    KILN_ASSIGN(composed,
                rank_.scratchFloats(uint64_t(experts * (k + shareCols))));
    {
      KILN_ASSIGN(dense,
                  DeviceMemory::allocate(uint64_t(hidden * k) * sizeof(float),
                                         d.where + " (composed router)"));
      KILN_TRY(check(launchDequant(w, dense.get<float>(), rank_.stream),
                     d.where, "launchDequant"));
      KILN_TRY(check(
          launchComposeRouter(reinterpret_cast<const float *>(gate.data), norm,
                              dense.get<float>(), experts, hidden, k,
                              shareBegin, shareCols, composed, rank_.stream),
          d.where, "launchComposeRouter"));
      // The dense copy is freed here: the kernels must have read it.
      CUDA_TRY(d.where, cudaStreamSynchronize(rank_.stream));
    }
    const float *x = f32In(0), *residual = f32In(2);
    float *y = f32Out(0);
    RouterTail tail{composed,  experts, k + shareCols, k, residual + shareBegin,
                    y + hidden};
    return wrap(
        [=](cudaStream_t s) { return launchLinearRouter(x, w, tail, y, s); });
  }
  case OpKind::MoeChoose: {
    const float *bias = nullptr;
    if (d.hasBias) {
      KILN_ASSIGN(b, param(1));
      bias = b;
    }
    const float *logits = f32In(0);
    int32_t *ids = i32Out(0);
    float *w = f32Out(1);
    int64_t experts = d.experts, topK = d.topK;
    Gating g = d.softmax ? Gating::Softmax : Gating::Sigmoid;
    bool norm = d.normalize;
    float rs = float(d.routedScale);
    return wrap([=](cudaStream_t s) {
      return launchMoeChoose(logits, experts, bias, topK, g, norm, rs, ids, w,
                             s);
    });
  }
  case OpKind::MoeRouter:
  case OpKind::RmsNormRouter: {
    // rms_norm_router: input, norm, gate[, bias] -> output, ids, weights;
    // moe_router: input, gate[, bias] -> ids, weights.
    const bool normed = d.kind == OpKind::RmsNormRouter;
    const size_t in0 = normed ? 1 : 0, out0 = normed ? 1 : 0;
    std::optional<InputNorm> norm;
    if (normed) {
      KILN_ASSIGN(normWeight, param(1));
      norm = InputNorm{normWeight, float(d.epsilon), nullptr};
    }
    const float *bias = nullptr;
    if (d.hasBias) {
      KILN_ASSIGN(b, param(in0 + 2));
      bias = b;
    }
    KILN_ASSIGN(scratch,
                rank_.scratchFloats(uint64_t(routerScratchFloats(d.experts))));
    DeviceWeight gate = weight(in0 + 1);
    const float *x = f32In(0);
    float *normalised = normed ? f32Out(0) : nullptr;
    int32_t *ids = i32Out(out0);
    float *w = f32Out(out0 + 1);
    int64_t topK = d.topK;
    Gating g = d.softmax ? Gating::Softmax : Gating::Sigmoid;
    bool normalize = d.normalize;
    float rs = float(d.routedScale);
    std::shared_ptr<TaggedIds> tagged;
    if (!normed && rank_.taggedIds) {
      tagged = std::make_shared<TaggedIds>();
      step_.routerIds[d_.outs[out0]] = tagged;
    }
    return wrap([=](cudaStream_t s) {
      return launchMoeRouter(x, gate, bias, topK, g, normalize, rs, scratch,
                             ids, w, s, norm ? &*norm : nullptr, normalised,
                             tagged.get());
    });
  }
  case OpKind::MoeExperts: {
    const size_t first = d.hasAddend ? 4 : 3;
    DeviceWeight gate = weight(first);
    std::optional<DeviceWeight> up;
    if (!d.fusedGateUp)
      up = weight(first + 1);
    DeviceWeight down = weight(first + (d.fusedGateUp ? 1 : 2));
    std::optional<SharedExpert> shared;
    if (d.hasShared)
      shared = SharedExpert{weight(d.sharedIndex), weight(d.sharedIndex + 1),
                            weight(d.sharedIndex + 2)};
    KILN_ASSIGN(act, rank_.scratchFloats(uint64_t(moeExpertsActFloats(
                         d.topK, d.ffn, n, shared ? &*shared : nullptr))));
    const float *x = f32In(0), *w = f32In(2);
    const float *addend = d.hasAddend ? f32In(3) : nullptr;
    const int32_t *ids = i32In(1);
    float *y = f32Out(0);
    int64_t ffn = d.ffn, experts = d.experts, chosen = d.topK;
    FaultSink f = sink();
    // Its router's ids by tags, where the router that writes its ids
    // buffer can hand them so.
    std::shared_ptr<const TaggedIds> tagged;
    if (auto it = step_.routerIds.find(d_.ins[1]); it != step_.routerIds.end())
      tagged = it->second;
    return wrap([=](cudaStream_t s) {
      return launchMoeExperts(x, n, ffn, experts, ids, w, chosen, gate,
                              up ? &*up : nullptr, down, act, addend, y, f, s,
                              shared ? &*shared : nullptr, tagged.get());
    });
  }
  case OpKind::Argmax: {
    int32_t *y = i32Out(0);
    const DrawInputs draw = drawInputs();
    KILN_ASSIGN(adjusted, adjustedLogits(f32In(0), n, 0, n));
    const auto [x, adjust] = adjusted;
    const std::string where = d.where;
    if (d.drawn && d.drawWords >= draw::kDrawWords) {
      // The nucleus's graphs: its cut by a grid of blocks.
      KILN_ASSIGN(scratch, nucleusScratch(n));
      nucleus = Launch([=](cudaStream_t s) -> Status {
        KILN_TRY(adjust(s));
        return check(launchNucleusArgmax(x, n, y, scratch, s, draw), where,
                     "launchNucleusArgmax");
      });
    }
    return Launch([=](cudaStream_t s) -> Status {
      KILN_TRY(adjust(s));
      return check(launchArgmax(x, n, y, s, draw), where, "launchArgmax");
    });
  }
  }
  return Error(d.where, "", "the CUDA backend has no kernel for this op");
}

/// Places binding `b` on the rank's GPU: the rank's slice of the file's
/// bytes, or random valid blocks.
/// The device geometry of binding `b` as a rank holds it, and its bytes.
/// The device layout a binding names (docs/cuda.md).
Expected<WeightLayout> layoutOf(const WeightBinding &b) {
  if (b.layout == "gguf")
    return WeightLayout::Blocks;
  if (const SplitFormat *f = splitFormatNamed(b.layout)) {
    if (b.type != f->type)
      return Error(b.tensor, "layout",
                   fmt::format("{} is for {} weights, not {}", f->name,
                               nameOf(f->type), nameOf(b.type)));
    return splitLayoutOf(f->type);
  }
  std::string names = "gguf";
  for (const SplitFormat &f : kSplitFormats)
    names += fmt::format(", {}", f.name);
  return Error(b.tensor, "layout",
               fmt::format("'{}' is not a layout the cuda backend reads ({})",
                           b.layout, names));
}

/// A binding's local geometry and layout, and the bytes of its blocks in
/// the file's layout (a repacked layout holds the same bytes).
Expected<std::pair<DeviceWeight, uint64_t>> geometryOf(const WeightBinding &b) {
  std::vector<int64_t> dims = backend::localDims(b);
  DeviceWeight w;
  KILN_ASSIGN(layout, layoutOf(b));
  w.layout = layout;
  w.type = b.type;
  w.cols = dims[0];
  w.rows = 1;
  for (size_t i = 1; i < dims.size(); ++i)
    w.rows *= dims[i];
  std::optional<uint64_t> row = rowBytes(b.type, uint64_t(w.cols));
  std::optional<uint64_t> total =
      row ? checkedMul(*row, uint64_t(w.rows)) : std::nullopt;
  if (!total)
    return Error(b.tensor, "dims", "the size overflows");
  return std::pair{w, *total};
}

/// Places binding `b` at `dst` on the rank's GPU (`bytes` bytes): the
/// rank's slice of the file's bytes, or random valid blocks.
Status fillWeight(CudaRank &rank, const WeightBinding &b,
                  const kiln_weight_bytes *bytes, uint64_t seed, uint8_t *dst,
                  uint64_t size) {
  if (bytes) {
    std::vector<std::vector<uint8_t>> store;
    KILN_ASSIGN(host, backend::sliceWeight(b, *bytes, store));
    if (host.bytes != size)
      return Error(b.tensor, "bytes", "the slice does not match its dims");
    // On the rank's stream, so the repack that may follow reads it: a
    // plain cudaMemcpy from pageable memory can return before its DMA
    // lands, and the rank's stream does not wait for the legacy stream.
    CUDA_TRY(b.tensor, cudaMemcpyAsync(dst, host.data, host.bytes,
                                       cudaMemcpyHostToDevice, rank.stream));
    CUDA_TRY(b.tensor, cudaStreamSynchronize(rank.stream));
    return Status::ok();
  }
  // Every tensor its own stream of random blocks, by its name: two
  // artifacts that bind it (one with the indexers left out, say) fill it
  // alike, so their bench results compare.
  CUDA_TRY(b.tensor, launchFillRandomBlocks(b.type, dst, size,
                                            seed * 0x9E3779B97F4A7C15ull +
                                                fnv1a(b.tensor),
                                            rank.stream));
  return Status::ok();
}

/// Places split-layout bindings `group` (all of one type and layout) in one
/// allocation: plane 0 of every part, rows back to back in group order, then
/// plane 1 of every part, and so on, each plane from a kSplitPlaneAlign
/// offset (SplitLayout.h), so consecutive parts form one matrix in every
/// plane. Each part's blocks go through a staging buffer and are repacked
/// on the device.
Status placeSplitWeights(CudaRank &rank, const Artifact &a,
                         const std::vector<int32_t> &group,
                         std::vector<std::pair<DeviceWeight, uint64_t>> &parts,
                         const kiln_weight_bytes *weights, uint64_t seed) {
  const std::string &name = a.weights[group.front()].tensor;
  const DeviceWeight &front = parts.front().first;
  const SplitFormat *f = splitFormatOf(front.type);
  if (!f || splitLayoutOf(front.type) != front.layout)
    return Error(name, "layout", "not a split layout of its type");
  uint64_t blocks = 0, staging = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto &[w, bytes] = parts[i];
    if (w.type != front.type || w.layout != front.layout)
      return Error(
          a.weights[group[i]].tensor, "layout",
          fmt::format("placed with {}, whose type or layout differs", name));
    if (w.cols % f->blockValues)
      return Error(a.weights[group[i]].tensor, "dims",
                   fmt::format("{} values a row is not whole {} blocks", w.cols,
                               nameOf(w.type)));
    std::optional<uint64_t> n =
        checkedMul(uint64_t(w.rows), uint64_t(w.cols / f->blockValues));
    if (!n || !checkedAdd(blocks, *n))
      return Error(a.weights[group[i]].tensor, "dims", "the size overflows");
    blocks += *n;
    staging = std::max(staging, bytes);
  }
  KILN_ASSIGN(memory, DeviceMemory::allocate(
                          splitPlaneStart(*f, f->planes, blocks), name));
  KILN_ASSIGN(stage, DeviceMemory::allocate(staging, name + " (staging)"));
  uint64_t at = 0; // blocks placed so far
  for (size_t i = 0; i < group.size(); ++i) {
    int32_t binding = group[i];
    DeviceWeight &w = parts[i].first;
    KILN_TRY(fillWeight(rank, a.weights[binding],
                        weights ? &weights[binding] : nullptr, seed,
                        stage.get(), parts[i].second));
    for (int p = 0; p < f->planes; ++p)
      w.setPlane(p, memory.get() + splitPlaneStart(*f, p, blocks) +
                        splitPlaneBytes(*f, p, at));
    CUDA_TRY(a.weights[binding].tensor,
             launchRepackSplit(stage.get(), w, rank.stream));
    // The staging buffer is refilled next (by a copy outside the stream).
    CUDA_TRY(a.weights[binding].tensor, cudaStreamSynchronize(rank.stream));
    rank.weights[binding] = w;
    at += uint64_t(w.rows) * uint64_t(w.cols / f->blockValues);
  }
  rank.weightStore.push_back(std::move(memory));
  return Status::ok();
}

/// Places bindings `group` in one allocation, back to back in this order
/// (one binding alone, or the parts of a fused_linear, whose rows then form
/// one matrix: a single launch computes every segment).
Status placeWeights(CudaRank &rank, const Artifact &a,
                    const std::vector<int32_t> &group,
                    const kiln_weight_bytes *weights, uint64_t seed) {
  std::vector<std::pair<DeviceWeight, uint64_t>> parts;
  uint64_t total = 0;
  for (int32_t binding : group) {
    KILN_ASSIGN(g, geometryOf(a.weights[binding]));
    parts.push_back(g);
    total += g.second;
  }
  if (parts.front().first.layout != WeightLayout::Blocks)
    return placeSplitWeights(rank, a, group, parts, weights, seed);
  KILN_ASSIGN(memory,
              DeviceMemory::allocate(total, a.weights[group.front()].tensor));
  uint64_t at = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    int32_t binding = group[i];
    KILN_TRY(fillWeight(rank, a.weights[binding],
                        weights ? &weights[binding] : nullptr, seed,
                        memory.get() + at, parts[i].second));
    parts[i].first.data = memory.get() + at;
    rank.weights[binding] = parts[i].first;
    at += parts[i].second;
  }
  rank.weightStore.push_back(std::move(memory));
  return Status::ok();
}

/// The fused_linear and rms_norm_linear parts that can share one matrix:
/// runs of consecutive parts of the same type, layout and width, none bound
/// twice. Each run of two or more, in segment order.
std::vector<std::vector<int32_t>> fusedGroups(const Artifact &a,
                                              const RankPlan &plan) {
  std::vector<std::vector<int32_t>> groups;
  std::vector<int> uses(a.weights.size(), 0);
  for (const Step &s : plan.steps)
    for (const Op &op : s.ops)
      for (int32_t i : op.ins())
        if (s.buffers[i].kind == BufferKind::Weight)
          ++uses[s.buffers[i].binding];
  auto close = [&](std::vector<int32_t> &run) {
    if (run.size() >= 2)
      groups.push_back(run);
    run.clear();
  };
  for (const Step &s : plan.steps)
    for (const Op &op : s.ops) {
      if (op.kind != "fused_linear" && op.kind != "rms_norm_linear")
        continue;
      // The weights follow the input (and an rms_norm_linear's norm).
      const size_t first = op.kind == "rms_norm_linear" ? 2 : 1;
      std::vector<int32_t> run;
      for (size_t i = first; i < op.ins().size(); ++i) {
        const Buffer &b = s.buffers[op.ins()[i]];
        if (b.kind != BufferKind::Weight || uses[b.binding] != 1) {
          close(run);
          continue;
        }
        if (!run.empty()) {
          const WeightBinding &w = a.weights[b.binding];
          const WeightBinding &first = a.weights[run.front()];
          if (w.type != first.type || w.layout != first.layout ||
              backend::localDims(w).front() !=
                  backend::localDims(first).front())
            close(run);
        }
        run.push_back(b.binding);
      }
      close(run);
    }
  return groups;
}

Status fillStates(CudaRank &rank, uint64_t positions, uint64_t seed) {
  for (auto &[name, st] : rank.states) {
    CUDA_TRY(rank.where, cudaMemsetAsync(st.memory.get(), 0, st.buffer->bytes(),
                                         rank.stream));
    if (positions == 0)
      continue;
    DeviceCache c = cacheOf(st.memory.get(), *st.buffer);
    if (int64_t(positions) > c.positions)
      return Error(name, "positions",
                   fmt::format("cannot fill {} positions: the cache holds {}",
                               positions, c.positions));
    c.positions = int64_t(positions);
    CUDA_TRY(name, launchFillRandomCache(
                       c, seed ^ std::hash<std::string>()(name), rank.stream));
  }
  CUDA_TRY(rank.where, cudaStreamSynchronize(rank.stream));
  return Status::ok();
}

/// Parallel branches of a captured step. The GLM-5 layer's widest point
/// has the query, latent-cache, indexer-query and indexer-key paths beside
/// each other, and when every branch is taken the scheduler puts the next
/// op behind the branch idle longest, an ordering the data does not need:
/// at tp=8 (1k context) 4 branches measured 6.48 ms a step, 6 6.33, 8 6.31
/// (with the compiler's reuse distance 16, docs/perf.md).
constexpr int kMaxBranches = 8;

/// The families of kernels compiled for GLM-5's shapes that run unless
/// KILN_CUDA_SPECIALISED says otherwise: the routed experts', MLA's, the
/// router's and the one-shot all-reduce's. At a GLM-5 tp=8 rank
/// (docs/perf.md) the first two took 0.20 ms off the step at 1k and 0.35
/// ms at 16k (sixteenth pass), the all-reduce's 0.33 ms at 1k and the
/// router's another 0.06 (fifty-second pass); the q8_0 mat-vecs' add 0.28
/// ms at 1k, and the indexer's take 0.03 ms off at 1k but add 0.12 ms at
/// 16k.
constexpr unsigned kDefaultShapeFamilies =
    unsigned(ShapeFamily::Experts) | unsigned(ShapeFamily::Mla) |
    unsigned(ShapeFamily::Router) | unsigned(ShapeFamily::AllReduce);

/// Switches for measuring what each graph feature, op kind and NCCL costs
/// (docs/cuda.md): KILN_CUDA_PDL=0 turns overlapped launches off,
/// KILN_CUDA_BRANCHES=N caps the parallel branches (1: the step in list
/// order), KILN_CUDA_OMIT=kind,kind leaves every op of those kinds out of
/// the step (its outputs keep whatever they held: the step's results are
/// then meaningless, its time is what the other ops cost),
/// KILN_CUDA_LOCAL_COLLECTIVES=1 runs every collective as a simulated rank
/// does (its ring traffic in a local kernel, no NCCL),
/// KILN_CUDA_MLA_PROJECTION=1 combines and projects MLA's output in a
/// second kernel of MLA's launch (by default MLA combines after a grid
/// barrier, and a mat-vec launch of its own projects),
/// KILN_CUDA_QUIET_START=0 lets the mat-vecs after a collective prefetch
/// their weights early as the others do (by default they do not),
/// KILN_CUDA_SPECIALISED=q8,experts,mla,indexer,router,allreduce (1: all,
/// 0: none) runs
/// the kernels compiled for GLM-5's shapes of those families where a launch
/// has one (ModelShapes.h; readShapeFamilies),
/// KILN_CUDA_LIGHT_OPS=0 schedules the short ops as the others
/// (OpFootprint::light), KILN_CUDA_DROP_BRANCH_EDGES=0 keeps every edge
/// along a branch, also where the op's waits order its source
/// (StepSchedule::waitsSuffice), KILN_CUDA_MLA_LATE_DEPENDENTS=0 lets the
/// kernels after MLA be scheduled at its start, KILN_CUDA_MLA_ALONE=0 lets
/// MLA's blocks share multiprocessors, KILN_CUDA_MLA_EARLY_ROWS=0 loads all
/// of MLA's rows after its wait (MlaLaunch), KILN_CUDA_STEP_EPOCHS=0 has each
/// one-shot all-reduce load its epoch from the exchange (beginStepEpochs),
/// KILN_CUDA_DIRECT_SLOTS=0 has
/// the one-shot all-reduces copy their inputs into the exchange instead of
/// their producers writing them there (directSites), KILN_CUDA_PEER_PUSH=1 has
/// a real group's one-shot all-reduces push each part into every rank's
/// exchange instead of pulling them (PeerExchange::push),
/// KILN_CUDA_PEER_CLUSTER=1 runs the one-shot all-reduces without the router's
/// choice as one cluster instead of by blocks that are not a cluster
/// (setPeerClusters), KILN_CUDA_EXPERTS_INT8_X=1 rounds the routed experts'
/// gate/up input to an int8 grid (setExpertsInt8X; its results are not the
/// CPU's), KILN_CUDA_TIMELINE=FILE records the kernels of one replay
/// (Timeline.h).
struct GraphSwitches {
  bool overlap = true;
  /// KILN_CUDA_GRAPH_STATS=1: one line a captured step on stderr (its
  /// kernel nodes and edges by kind).
  bool stats = false;
  int branches = kMaxBranches;
  std::set<std::string, std::less<>> omit;
  bool localCollectives = false;
  std::string timeline;
  std::string schedule;
  /// KILN_CUDA_ALLREDUCE=peers|nccl: the one-shot all-reduce over NVLink
  /// peers (default) or NCCL's.
  bool peerAllReduce = true;
  /// KILN_CUDA_MLA_PROJECTION=1: MLA's output combined and projected by
  /// MLA's launch (a second kernel), not by a grid barrier and a mat-vec
  /// of its own (off by default: docs/perf.md, twenty-eighth pass).
  bool mlaProjection = false;
  /// KILN_CUDA_CLUSTER_SELECT=1: the indexer's top-k as before the
  /// seventeenth pass (docs/perf.md): by the cluster of blocks at every
  /// count, four radix passes always (kClusterSelect), for comparisons; the
  /// same selection.
  bool clusterSelect = false;
  /// KILN_CUDA_SELECT_BLOCKS=8|16|auto: the indexer selection's cluster
  /// size (IndexerSelect::clusterBlocks), or 0 for auto (the default): 8,
  /// and 16 from wideSelectFrom attended positions by a second graph
  /// (CudaStep::wideSelect); 16 is faster past ~100k attended positions and
  /// slower below (docs/perf.md, thirty-first pass); the same selection.
  int selectBlocks = 0;
  /// KILN_CUDA_SELECT_WIDE_FROM=N: where auto takes 16 blocks (attended
  /// positions; 0: never, no second graph).
  int64_t wideSelectFrom = kWideSelectFrom;
  /// KILN_CUDA_QUIET_START=0: the ops after a collective prefetch early
  /// too (on by default: docs/perf.md, fourteenth pass).
  bool quietStart = true;
  /// KILN_CUDA_QUIET_PREFETCH=N: the q8_0-split mat-vecs after a collective
  /// prefetch their warps' first N passes early all the same (default 1;
  /// 0: none, as before the sixty-first pass; docs/perf.md).
  int quietPrefetch = 1;
  /// KILN_CUDA_SHORT_GRAPH: a step with DSA indexers has a second graph,
  /// without them, for the positions where they select every attended one
  /// (CudaStep::allSelected); on by default (the whole-context GLM-5 rank
  /// at 1k 0.20 ms faster, though that graph is uploaded second; level past
  /// the top-k: docs/perf.md, thirty-fourth pass), =0 leaves it out.
  bool shortGraph = true;
  /// KILN_CUDA_SPECIALISED: the families of fixed-shape kernels that run
  /// where they apply (ShapeFamily bits).
  unsigned shapeSpecialised = 0;
  /// KILN_CUDA_ROUTER_TAIL=held|l2|last: how linear_router's tail blocks
  /// get their rows (StepKernels.h RouterTailMode; held by default).
  RouterTailMode routerTail = RouterTailMode::Held;
  /// KILN_CUDA_INDEXER_MMA=0: the indexer's scores without the tensor
  /// cores (setIndexerMma; on by default).
  bool indexerMma = true;
  /// KILN_CUDA_ROUTER_WARPS=0: GLM-5's router chooses through shared
  /// memory with three block barriers, not by its warps with one
  /// (setRouterWarps; on by default).
  bool routerWarps = true;
  /// KILN_CUDA_LIGHT_OPS=0: the schedule lays the short ops out as any
  /// other (OpFootprint::light unset), so that one may take the branch a
  /// mat-vec would have followed (on by default: docs/perf.md,
  /// thirty-sixth pass).
  bool lightOps = true;
  /// KILN_CUDA_DROP_BRANCH_EDGES=0: every op's node keeps the edge from
  /// the op before it on its branch. By default the edge is left out where
  /// the op's waits already order that op (StepSchedule::waitsSuffice), so
  /// that such a node (GLM-5: the rope of q_b's rows, the latent cache's
  /// append) has one predecessor and is launched early, and so is MLA after
  /// them (docs/perf.md, thirty-sixth pass).
  bool dropBranchEdges = true;
  /// KILN_CUDA_MLA_LATE_DEPENDENTS=0: MLA lets the kernels after it be
  /// scheduled at once after its wait, not after its chunks;
  /// KILN_CUDA_MLA_ALONE=0: its blocks may share a multiprocessor when they
  /// are placed beside other kernels (launched early), two to one where it
  /// has room; KILN_CUDA_MLA_EARLY_ROWS=0: it loads every cache row after
  /// its wait (StepKernels.h MlaLaunch).
  MlaLaunch mla;
  /// KILN_CUDA_DIRECT_SLOTS (on; =0 off): an all-reduce's input written by
  /// its producer straight into the exchange where the peers read it, not
  /// copied there by the all-reduce (directSites; measured faster at 1k and
  /// 16k, docs/perf.md "Forty-first pass").
  bool directSlots = true;
  /// KILN_CUDA_STEP_EPOCHS (on; =0 off): each one-shot all-reduce of a step
  /// takes its epoch from the step's base and its call's place, before its
  /// wait, instead of loading it from the exchange after (beginStepEpochs;
  /// docs/perf.md, fiftieth pass).
  bool stepEpochs = true;
  /// KILN_CUDA_TAGGED_IDS (on; =0 off): a GLM-5 router without an input
  /// norm hands its chosen ids to the routed experts' bulk-copy kernels
  /// by tagged words, which they poll instead of waiting for the router's
  /// grid to end (StepKernels.h TaggedIds; needs the step epochs).
  bool taggedIds = true;
  /// KILN_CUDA_PEER_CLUSTER (off; =1 on): the one-shot all-reduces without
  /// the router's choice (the fused norm's too) as one thread-block
  /// cluster, the parts summed through its shared memory; off, by blocks
  /// that are not a cluster, the fused norm's parts through the exchange
  /// (setPeerClusters; the flat form measured faster).
  bool peerClusters = false;
  /// KILN_CUDA_PEER_CLUSTER_POLICY=spread|balance: how the GPU places the
  /// one-shot all-reduce's clusters (setPeerClusterPolicy; unset: the
  /// driver's default; a probe).
  cudaClusterSchedulingPolicy peerClusterPolicy =
      cudaClusterSchedulingPolicyDefault;
  /// KILN_CUDA_PEER_PUSH=1: a real group's one-shot all-reduces push every
  /// part into every rank's exchange, so that each reads its own memory
  /// (StepKernels.h PeerExchange; off until measured on two GPUs or more).
  bool peerPush = false;
  /// KILN_CUDA_EXPERTS_INT8_X=1: the routed experts' gate/up kernel rounds
  /// its input to an int8 grid and dots by `dp4a` (setExpertsInt8X; a
  /// timing probe, the step's results then differ from the CPU's).
  bool expertsInt8X = false;
};

/// Environment variable `name` as 0 or 1 (`unset` when it is not set).
Expected<bool> readFlag(const char *name, bool unset) {
  const char *v = std::getenv(name);
  if (!v)
    return unset;
  std::string t = v;
  if (t != "0" && t != "1")
    return Error(name, t, "expected 0 or 1");
  return t == "1";
}

/// A switch for measuring only (0 or 1, off when unset): when on, says on
/// stderr `what` it does and that the step's results are not valid.
Expected<bool> readProbeFlag(const char *name, const char *what) {
  KILN_ASSIGN(on, readFlag(name, false));
  if (on)
    std::fprintf(stderr,
                 "cuda backend: %s=1: %s; the step's results are not valid "
                 "(for measuring only)\n",
                 name, what);
  return on;
}

/// Environment variable `name` as a whole decimal number in [low, high]
/// (`unset` when it is not set).
Expected<int64_t> readCount(const char *name, int64_t low, int64_t high,
                            int64_t unset) {
  const char *v = std::getenv(name);
  if (!v)
    return unset;
  const std::string t = v;
  char *end = nullptr;
  errno = 0;
  const long long n = std::strtoll(t.c_str(), &end, 10);
  if (t.empty() || *end || errno == ERANGE || n < low || n > high)
    return Error(name, t,
                 fmt::format("expected a count from {} to {}", low, high));
  return int64_t(n);
}

/// KILN_CUDA_SPECIALISED as ShapeFamily bits (parseShapeFamilies);
/// `unset` when it is not set.
Expected<unsigned> readShapeFamilies(unsigned unset) {
  const char *v = std::getenv("KILN_CUDA_SPECIALISED");
  if (!v)
    return unset;
  if (std::optional<unsigned> families = parseShapeFamilies(v))
    return *families;
  return Error("KILN_CUDA_SPECIALISED", v,
               "expected 1, 0 or a comma list of q8, experts, mla, indexer, "
               "router, allreduce");
}

/// Whether KILN_CUDA_OMIT leaves an all-reduce out (then direct slots are
/// not used: their reuse relies on every all-reduce's flags).
bool omitsCollectives(const std::set<std::string, std::less<>> &omit) {
  return omit.count("all_reduce") || omit.count("all_reduce_add") ||
         omit.count("all_reduce_add_rms_norm");
}

Expected<GraphSwitches> readGraphSwitches() {
  GraphSwitches g;
  KILN_ASSIGN(local, readProbeFlag("KILN_CUDA_LOCAL_COLLECTIVES",
                                   "every collective stays on its rank's GPU, "
                                   "nothing is exchanged between GPUs"));
  g.localCollectives = local;
  if (const char *v = std::getenv("KILN_CUDA_OMIT")) {
    std::string_view t = v;
    while (!t.empty()) {
      const size_t comma = t.find(',');
      std::string_view kind = t.substr(0, comma);
      if (!backend::isOpKindName(kind))
        return Error("KILN_CUDA_OMIT", std::string(kind),
                     "not an op kind of a step (rms_norm, linear, ...)");
      g.omit.emplace(kind);
      t = comma == std::string_view::npos ? std::string_view()
                                          : t.substr(comma + 1);
    }
    if (!g.omit.empty())
      std::fprintf(stderr,
                   "cuda backend: KILN_CUDA_OMIT=%s: those ops are left out "
                   "of every step; its results are not valid (for measuring "
                   "only)\n",
                   v);
  }
  KILN_ASSIGN(overlap, readFlag("KILN_CUDA_PDL", true));
  g.overlap = overlap;
  KILN_ASSIGN(mlaProjection, readFlag("KILN_CUDA_MLA_PROJECTION", false));
  g.mlaProjection = mlaProjection;
  KILN_ASSIGN(clusterSelect, readFlag("KILN_CUDA_CLUSTER_SELECT", false));
  g.clusterSelect = clusterSelect;
  if (const char *v = std::getenv("KILN_CUDA_SELECT_BLOCKS")) {
    const std::string t = v;
    if (t != "8" && t != "16" && t != "auto")
      return Error("KILN_CUDA_SELECT_BLOCKS", t, "expected 8, 16 or auto");
    g.selectBlocks = t == "auto" ? 0 : std::stoi(t);
  }
  KILN_ASSIGN(wideFrom, readCount("KILN_CUDA_SELECT_WIDE_FROM", 0, INT32_MAX,
                                  kWideSelectFrom));
  g.wideSelectFrom = wideFrom;
  KILN_ASSIGN(quietStart, readFlag("KILN_CUDA_QUIET_START", true));
  g.quietStart = quietStart;
  KILN_ASSIGN(quietPasses,
              readCount("KILN_CUDA_QUIET_PREFETCH", 0, 64, g.quietPrefetch));
  g.quietPrefetch = int(quietPasses);
  KILN_ASSIGN(indexerMma, readFlag("KILN_CUDA_INDEXER_MMA", true));
  g.indexerMma = indexerMma;
  KILN_ASSIGN(routerWarps, readFlag("KILN_CUDA_ROUTER_WARPS", true));
  g.routerWarps = routerWarps;
  KILN_ASSIGN(lightOps, readFlag("KILN_CUDA_LIGHT_OPS", true));
  g.lightOps = lightOps;
  KILN_ASSIGN(dropEdges, readFlag("KILN_CUDA_DROP_BRANCH_EDGES", true));
  g.dropBranchEdges = dropEdges;
  KILN_ASSIGN(mlaLate, readFlag("KILN_CUDA_MLA_LATE_DEPENDENTS", true));
  KILN_ASSIGN(mlaAlone, readFlag("KILN_CUDA_MLA_ALONE", true));
  KILN_ASSIGN(mlaEarlyRows, readFlag("KILN_CUDA_MLA_EARLY_ROWS", true));
  KILN_ASSIGN(mlaMma, readFlag("KILN_CUDA_MLA_MMA", true));
  g.mla = MlaLaunch{mlaLate, mlaAlone, mlaEarlyRows, mlaMma};
  KILN_ASSIGN(directSlots, readFlag("KILN_CUDA_DIRECT_SLOTS", true));
  g.directSlots = directSlots;
  KILN_ASSIGN(stepEpochs, readFlag("KILN_CUDA_STEP_EPOCHS", true));
  g.stepEpochs = stepEpochs;
  KILN_ASSIGN(taggedIds, readFlag("KILN_CUDA_TAGGED_IDS", true));
  g.taggedIds = taggedIds;
  KILN_ASSIGN(peerClusters, readFlag("KILN_CUDA_PEER_CLUSTER", false));
  g.peerClusters = peerClusters;
  if (const char *v = std::getenv("KILN_CUDA_PEER_CLUSTER_POLICY")) {
    std::string t = v;
    if (t != "spread" && t != "balance")
      return Error("KILN_CUDA_PEER_CLUSTER_POLICY", t,
                   "expected spread or balance");
    g.peerClusterPolicy = t == "spread"
                              ? cudaClusterSchedulingPolicySpread
                              : cudaClusterSchedulingPolicyLoadBalancing;
  }
  KILN_ASSIGN(peerPush, readFlag("KILN_CUDA_PEER_PUSH", false));
  g.peerPush = peerPush;
  KILN_ASSIGN(int8X, readProbeFlag("KILN_CUDA_EXPERTS_INT8_X",
                                   "the routed experts' gate/up kernel "
                                   "rounds its input to an int8 grid"));
  g.expertsInt8X = int8X;
  KILN_ASSIGN(shortGraph, readFlag("KILN_CUDA_SHORT_GRAPH", true));
  g.shortGraph = shortGraph;
  KILN_ASSIGN(specialised, readShapeFamilies(kDefaultShapeFamilies));
  g.shapeSpecialised = specialised;
  KILN_ASSIGN(stats, readFlag("KILN_CUDA_GRAPH_STATS", false));
  g.stats = stats;
  if (const char *v = std::getenv("KILN_CUDA_TIMELINE"); v && *v)
    g.timeline = v;
  if (const char *v = std::getenv("KILN_CUDA_SCHEDULE"); v && *v)
    g.schedule = v;
  if (const char *v = std::getenv("KILN_CUDA_ALLREDUCE")) {
    std::string t = v;
    if (t != "peers" && t != "nccl")
      return Error("KILN_CUDA_ALLREDUCE", t, "expected peers or nccl");
    g.peerAllReduce = t == "peers";
  }
  if (const char *v = std::getenv("KILN_CUDA_ROUTER_TAIL")) {
    std::string t = v;
    if (t != "held" && t != "l2" && t != "last")
      return Error("KILN_CUDA_ROUTER_TAIL", t, "expected held, l2 or last");
    g.routerTail = t == "held" ? RouterTailMode::Held
                   : t == "l2" ? RouterTailMode::L2
                               : RouterTailMode::Last;
  }
  KILN_ASSIGN(branches, readCount("KILN_CUDA_BRANCHES", 1, 16, g.branches));
  g.branches = int(branches);
  return g;
}

bool isCollective(OpKind k) {
  return k == OpKind::AllReduce || k == OpKind::AllReduceAdd ||
         k == OpKind::AllReduceAddRmsNorm || k == OpKind::AllGather ||
         k == OpKind::DistributedArgmax;
}

/// Whether an op is a short one of elementwise work or a cache row, which
/// the schedule keeps off the branch a mat-vec would follow
/// (OpFootprint::light).
bool isLight(OpKind k) {
  switch (k) {
  case OpKind::Copy:
  case OpKind::Slice:
  case OpKind::Concat:
  case OpKind::Add:
  case OpKind::Swiglu:
  case OpKind::RmsNorm:
  case OpKind::LayerNorm:
  case OpKind::AddRmsNorm:
  case OpKind::Rope:
  case OpKind::CacheAppend:
  case OpKind::NormRopeAppend:
    return true;
  default:
    return false;
  }
}

/// The device bytes each op reads and writes (weights are read-only and
/// left out; a state such as a cache counts whole), for the schedule.
/// Collectives stay in step order: every rank issues them alike.
std::vector<backend::OpFootprint>
footprints(const CudaStep &s, const std::vector<StepOp> &ops, bool lightOps) {
  std::vector<backend::OpFootprint> out(ops.size());
  auto range = [&](int32_t i, bool write) {
    const Buffer &b = s.step->buffers[size_t(i)];
    uint64_t begin = reinterpret_cast<uintptr_t>(s.ptrs[size_t(i)]);
    return backend::MemoryRange{begin, begin + b.bytes(), write};
  };
  for (size_t j = 0; j < ops.size(); ++j) {
    out[j].ordered = isCollective(ops[j].kind);
    out[j].light = lightOps && isLight(ops[j].kind);
    for (int32_t i : ops[j].ins)
      if (s.step->buffers[size_t(i)].kind != BufferKind::Weight)
        out[j].ranges.push_back(range(i, false));
    for (int32_t i : ops[j].outs)
      out[j].ranges.push_back(range(i, true));
  }
  return out;
}

/// Whether unit `i` of `s` is of an op kind KILN_CUDA_OMIT leaves out.
bool omitted(const CudaRank &rank, const CudaStep &s, size_t i) {
  return !rank.omit.empty() &&
         rank.omit.count(s.step->ops[size_t(s.unitOp[i])].kind);
}

/// A graph's schedule over the units' footprints and which units start
/// quiet: the whole step laid out afresh; a graph that leaves units out on
/// the whole step's branches (`layout`).
void planGraph(const CudaRank &rank, StepGraph &g,
               std::vector<backend::OpFootprint> prints,
               const backend::StepSchedule *layout = nullptr) {
  std::vector<bool> skip = g.skip;
  skip.resize(prints.size(), false);
  for (size_t i = 0; i < prints.size(); ++i)
    if (skip[i])
      prints[i] = {};
  g.schedule = layout ? backend::scheduleOnBranches(prints, *layout, skip)
                      : backend::scheduleStep(prints, rank.maxBranches);
  if (rank.quietStart) {
    g.quietStart = backend::followsOrdered(g.schedule, prints, skip);
    g.quietStartEager =
        backend::followsOrdered(backend::scheduleStep(prints, 1), prints, skip);
  } else {
    g.quietStart.assign(prints.size(), false);
    g.quietStartEager.assign(prints.size(), false);
  }
}

/// The graph of the positions where every DSA indexer selects all attended
/// positions (CudaStep::allSelected): the indexers left out, and each MLA
/// that reads a selection run by its launch without it (`everySelected`,
/// by unit), its footprint then with its indexer's reads in place of the
/// selection's buffers. None when another op reads what an indexer writes
/// (`selections`), or such an MLA has no launch without it.
std::optional<StepGraph>
allSelectedGraph(const CudaRank &rank, const CudaStep &s,
                 const std::vector<StepOp> &ops,
                 std::vector<backend::OpFootprint> prints,
                 std::vector<std::optional<Launch>> &everySelected,
                 const std::set<int32_t> &selections) {
  StepGraph g;
  g.skip = s.whole.skip; // KILN_CUDA_OMIT's units stay out too
  g.skip.resize(s.units.size(), false);
  g.instead.resize(s.units.size());
  // Each selection buffer's latest writer so far (the buffer is the same
  // one in every layer when the arena reuses it). An indexer's footprint
  // stays as it is: only MLA's change below.
  std::map<int32_t, size_t> writer;
  for (size_t i = 0; i < s.units.size(); ++i) {
    const StepOp &op = ops[size_t(s.unitOp[i])];
    if (op.kind == OpKind::DsaIndexer) {
      g.skip[i] = true;
      for (int32_t b : op.outs)
        writer[b] = i;
      continue;
    }
    if (std::none_of(op.ins.begin(), op.ins.end(),
                     [&](int32_t b) { return selections.count(b) > 0; }))
      continue;
    if (op.kind != OpKind::MlaAttention || !everySelected[i])
      return std::nullopt;
    g.instead[i] = std::move(everySelected[i]);
    // MLA reads what its indexer read instead of what it wrote: it still
    // follows the indexer's inputs (the key's append among them), and
    // whatever later overwrites those still follows MLA, as the indexer
    // ordered both before; a later kernel would otherwise wait across
    // branches for the key's append, which costs its early launch.
    auto &rs = prints[i].ranges;
    for (int32_t b : op.ins) {
      if (!selections.count(b))
        continue;
      const uint64_t at = reinterpret_cast<uintptr_t>(s.ptrs[size_t(b)]);
      rs.erase(std::remove_if(rs.begin(), rs.end(),
                              [&](const backend::MemoryRange &m) {
                                return !m.write && m.begin == at;
                              }),
               rs.end());
      auto w = writer.find(b);
      if (w == writer.end())
        return std::nullopt;
      for (const backend::MemoryRange &m : prints[w->second].ranges)
        if (!m.write)
          rs.push_back(m);
    }
  }
  planGraph(rank, g, std::move(prints), &s.whole.schedule);
  return g;
}

Status prepareStep(CudaRank &rank, const Artifact &a, const Step &step) {
  CudaStep &s = rank.steps[step.name];
  s.step = &step;
  s.ptrs.assign(step.buffers.size(), nullptr);
  // Direct slots: the all-reduce inputs that live in the exchange.
  const auto direct = rank.directSites.find(step.name);
  for (size_t i = 0; i < step.buffers.size(); ++i) {
    const Buffer &b = step.buffers[i];
    switch (b.kind) {
    case BufferKind::Arena:
      s.ptrs[i] = rank.arena.get() + b.offset;
      if (direct != rank.directSites.end())
        if (auto site = direct->second.find(int32_t(i));
            site != direct->second.end())
          s.ptrs[i] = reinterpret_cast<uint8_t *>(
              rank.peers.slots[rank.peers.me] + site->second);
      break;
    case BufferKind::View:
      s.ptrs[i] = s.ptrs[b.base] + b.offset * elementBytes(b.dtype);
      break;
    case BufferKind::Weight:
      break;
    case BufferKind::State: {
      auto it = rank.states.find(b.name);
      if (it == rank.states.end()) {
        KILN_ASSIGN(m, DeviceMemory::allocate(b.bytes(), b.name));
        it = rank.states.emplace(b.name, State{std::move(m), &b}).first;
      } else if (it->second.buffer->bytes() != b.bytes()) {
        return Error(step.name, b.name,
                     "the same state has different sizes in two steps");
      }
      s.ptrs[i] = it->second.memory.get();
      break;
    }
    case BufferKind::Input:
    case BufferKind::Output: {
      KILN_ASSIGN(m, DeviceMemory::allocate(b.bytes(), b.name));
      CUDA_TRY(b.name, cudaMemsetAsync(m.get(), 0, b.bytes(), rank.stream));
      s.ptrs[i] = m.get();
      s.slots.push_back(std::move(m));
      break;
    }
    }
  }
  KILN_ASSIGN(ops, backend::decodeStep(a, step, rank.ranks));
  std::vector<backend::OpFootprint> prints = footprints(s, ops, rank.lightOps),
                                    unitPrints;
  // For the graph of the positions where every indexer selects all
  // (StepGraph allSelected): each MLA's launch without the selection, and
  // the buffers the indexers write.
  std::vector<std::optional<Launch>> everySelected;
  // For the graph of the long contexts (StepGraph wideSelect): each
  // indexer's launch with the selection by a cluster of 16.
  std::vector<std::optional<Launch>> wideSelects;
  // For the nucleus's graphs: each argmax's launch by a grid of blocks
  // (OpBinder::nucleus).
  std::vector<std::optional<Launch>> nuclei;
  std::set<int32_t> selections;
  int64_t selectsAll = 0;
  for (const StepOp &op : ops) {
    if (op.kind == OpKind::DsaIndexer) {
      selections.insert(op.outs.begin(), op.outs.end());
      selectsAll = selectsAll ? std::min(selectsAll, op.topK) : op.topK;
    }
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    s.where.push_back(ops[i].where);
    const bool fused = ops[i].kind == OpKind::FusedLinear ||
                       ops[i].kind == OpKind::RmsNormLinear;
    const int32_t x = ops[i].ins[0], y = ops[i].outs[0];
    // A copy: the ops plan the second graph after binding.
    OpBinder binder(rank, s, ops[i], int32_t(i));
    if (!fused) {
      KILN_ASSIGN(launch, binder.bind());
      s.units.push_back(std::move(launch));
      s.unitOp.push_back(int32_t(i));
      unitPrints.push_back(prints[i]);
      everySelected.push_back(std::move(binder.everySelected));
      wideSelects.push_back(std::move(binder.wideSelect));
      nuclei.push_back(std::move(binder.nucleus));
      continue;
    }
    // Each run reads x and writes its own rows of y: runs overlap.
    const uint64_t xAt = reinterpret_cast<uintptr_t>(s.ptrs[size_t(x)]),
                   yAt = reinterpret_cast<uintptr_t>(s.ptrs[size_t(y)]);
    const int32_t norm = binder.normBuffer();
    for (const OpBinder::Run &r : binder.fusedRuns()) {
      KILN_ASSIGN(launch, binder.runLaunch(r));
      s.units.push_back(std::move(launch));
      s.unitOp.push_back(int32_t(i));
      const uint64_t begin = yAt + uint64_t(r.at) * sizeof(float);
      backend::OpFootprint print{
          {{xAt, xAt + step.buffers[size_t(x)].bytes(), false},
           {begin, begin + uint64_t(r.w.rows) * sizeof(float), true}},
          false};
      if (norm >= 0) {
        const uint64_t at = reinterpret_cast<uintptr_t>(s.ptrs[size_t(norm)]);
        print.ranges.push_back(
            {at, at + step.buffers[size_t(norm)].bytes(), false});
      }
      unitPrints.push_back(std::move(print));
      everySelected.emplace_back();
      wideSelects.emplace_back();
      nuclei.emplace_back();
    }
  }
  planGraph(rank, s.whole, unitPrints);
  // KILN_CUDA_OMIT: the omitted units left out on the same branches (no
  // waits, no signals), as the second graph leaves the indexers out. An
  // omitted unit that still recorded its event, with nothing captured on
  // its branch since, stalled the kernels that waited for it (docs/perf.md,
  // eighteenth pass).
  if (!rank.omit.empty()) {
    std::vector<bool> skip(s.units.size(), false);
    for (size_t i = 0; i < s.units.size(); ++i)
      skip[i] = omitted(rank, s, i);
    if (std::find(skip.begin(), skip.end(), true) != skip.end()) {
      const backend::StepSchedule layout = s.whole.schedule;
      s.whole.skip = std::move(skip);
      planGraph(rank, s.whole, unitPrints, &layout);
    }
  }
  // The long contexts' graph: the same units on the same branches, each
  // indexer's selection by 16 blocks.
  if (std::any_of(wideSelects.begin(), wideSelects.end(),
                  [](const std::optional<Launch> &l) { return bool(l); })) {
    // Its footprints are the first graph's, so is its plan (laid out
    // again on the same branches, the waits could differ).
    StepGraph g;
    g.label = "the selection by clusters of 16 blocks";
    g.skip = s.whole.skip;
    g.instead = std::move(wideSelects);
    g.schedule = s.whole.schedule;
    g.quietStart = s.whole.quietStart;
    g.quietStartEager = s.whole.quietStartEager;
    s.wideSelect = std::move(g);
    s.wideFrom = rank.wideSelectFrom;
  }
  if (rank.shortGraph && !selections.empty() && selectsAll > 0) {
    s.allSelected = allSelectedGraph(rank, s, ops, std::move(unitPrints),
                                     everySelected, selections);
    if (s.allSelected)
      s.allSelected->label = "without its indexers";
  }
  s.selectsAll = s.allSelected ? selectsAll : 0;
  // The nucleus's graphs: each graph above again, its argmax cutting the
  // nucleus (the same buffers read and written, and scratch of its own:
  // the same plan).
  if (std::any_of(nuclei.begin(), nuclei.end(),
                  [](const std::optional<Launch> &l) { return bool(l); })) {
    auto twin = [&](const StepGraph &g) {
      StepGraph t;
      t.label = g.label.empty() ? std::string(kNucleusLabel)
                                : g.label + ", " + kNucleusLabel;
      t.skip = g.skip;
      t.instead = g.instead;
      t.instead.resize(s.units.size());
      for (size_t i = 0; i < nuclei.size(); ++i)
        if (nuclei[i])
          t.instead[i] = nuclei[i];
      t.schedule = g.schedule;
      t.quietStart = g.quietStart;
      t.quietStartEager = g.quietStartEager;
      return t;
    };
    s.nucleusWhole = twin(s.whole);
    s.gridDraws = std::any_of(ops.begin(), ops.end(), [](const StepOp &op) {
      return op.kind == OpKind::Argmax && op.drawn;
    });
    if (s.allSelected)
      s.nucleusAllSelected = twin(*s.allSelected);
    if (s.wideSelect)
      s.nucleusWideSelect = twin(*s.wideSelect);
  }
  return Status::ok();
}

/// Makes the calling thread work for `rank`: its GPU, its kernel images.
/// Every job on a rank starts here (a lone rank's jobs run on the caller's
/// thread, which may change between calls).
Status enter(CudaRank &rank) {
  CUDA_TRY(rank.where, cudaSetDevice(rank.device));
  setKernelImages(rank.images.get());
  setShapeSpecialised(rank.shapeSpecialised);
  setRouterTailMode(rank.routerTail);
  setIndexerMma(rank.indexerMma);
  setRouterWarps(rank.routerWarps);
  setQuietPrefetchPasses(rank.quietPrefetch);
  setPeerClusters(rank.peerClusters);
  setExpertsInt8X(rank.expertsInt8X);
  setMlaLaunch(rank.mla);
  return Status::ok();
}

/// Loads the artifact's kernel images for the rank's GPU (payloads
/// "cuda"/"sm_XX/NAME.fatbin"; KernelImages.h).
Status loadKernelImages(CudaRank &rank, const Artifact &a) {
  CUDA_TRY(rank.where, cudaSetDevice(rank.device));
  rank.images = std::make_unique<KernelImages>();
  const std::string prefix = rank.arch + "/";
  for (const Payload &p : a.payloads) {
    if (p.backend != "cuda" || p.name.rfind(prefix, 0) != 0)
      continue;
    if (cudaError_t e = rank.images->load(p.name, p.data.data(), p.data.size());
        e != cudaSuccess)
      return Error("artifact", "payload cuda/" + p.name,
                   fmt::format("the kernel image does not load on {}: {}",
                               rank.where, cudaGetErrorString(e)));
  }
  if (rank.images->loaded().empty())
    return Error("artifact", "payloads",
                 fmt::format("no kernel images for {} ({}); recompile with "
                             "kiln-compile --target=cuda:{}",
                             rank.arch, rank.where, rank.arch));
  return Status::ok();
}

/// Enqueues unit i of graph `g` on `stream` (nothing when the graph leaves
/// it out: KILN_CUDA_OMIT's units, the second graph's indexers), its
/// mat-vecs without their early prefetch when `quiet`.
Status enqueueUnit(CudaStep &s, const StepGraph &g, size_t i,
                   cudaStream_t stream, bool quiet) {
  if (g.skips(i))
    return Status::ok();
  setEarlyPrefetch(!quiet);
  const bool instead = !g.instead.empty() && g.instead[i];
  Status launched = instead ? (*g.instead[i])(stream) : s.units[i](stream);
  setEarlyPrefetch(true);
  return launched;
}

/// The step's work on a stream as graph `g` runs it: clear the fault word,
/// then every op (with an event before each and after the last when
/// profiling).
/// A step's all-reduce epochs (beginStepEpochs) while it is enqueued, on
/// the rank's word where it has one (a rank with the one-shot all-reduce
/// and step epochs: setUpPeerExchange); finish() launches the step's last
/// kernel, which advances the word by the step's calls. The calling
/// thread's setting is cleared however the enqueueing ends.
class StepEpochs {
public:
  explicit StepEpochs(CudaRank &rank)
      : rank_(rank), base_(rank.epochBase.get<uint32_t>()) {
    if (base_)
      beginStepEpochs(base_);
  }
  StepEpochs(const StepEpochs &) = delete;
  StepEpochs &operator=(const StepEpochs &) = delete;
  ~StepEpochs() {
    if (base_)
      endStepEpochs();
  }
  Status finish() {
    if (!base_)
      return Status::ok();
    const int32_t calls = endStepEpochs();
    uint32_t *base = std::exchange(base_, nullptr);
    CUDA_TRY(rank_.where, launchAdvanceEpochs(base, calls, rank_.stream));
    return Status::ok();
  }

private:
  CudaRank &rank_;
  uint32_t *base_;
};

Status enqueueStep(CudaRank &rank, CudaStep &s, const StepGraph &g,
                   bool profile = false) {
  setOverlappedLaunches(rank.overlap && !profile);
  CUDA_TRY(rank.where, cudaMemsetAsync(rank.firstFault(), 0xff,
                                       sizeof(uint32_t), rank.stream));
  StepEpochs epochs(rank);
  for (size_t i = 0; i < s.units.size(); ++i) {
    if (profile)
      CUDA_TRY(rank.where, cudaEventRecord(s.events[i], rank.stream));
    KILN_TRY(enqueueUnit(s, g, i, rank.stream, g.quietStartEager[i]));
  }
  if (profile)
    CUDA_TRY(rank.where, cudaEventRecord(s.events.back(), rank.stream));
  return epochs.finish();
}

/// After a profiled run: each op's time, added to its total.
Status collectProfile(CudaRank &rank, CudaStep &s) {
  s.opMs.resize(s.units.size(), 0.0);
  for (size_t i = 0; i < s.units.size(); ++i) {
    float ms = 0;
    CUDA_TRY(rank.where,
             cudaEventElapsedTime(&ms, s.events[i], s.events[i + 1]));
    s.opMs[i] += ms;
  }
  ++s.profiledRuns;
  return Status::ok();
}

/// The profile of each rank's steps by op kind, on stderr: what an expert
/// reads first when a step is slower than its floor.
void printProfile(const CudaGroup &g) {
  for (const std::unique_ptr<CudaRank> &rank : g.ranks) {
    std::string images;
    for (const auto &[name, bytes] : rank->images->loaded())
      images += fmt::format("{}{} ({} bytes)", images.empty() ? "" : ", ", name,
                            bytes);
    std::fprintf(stderr,
                 "profile: %s runs %zu kernels from the artifact's images: "
                 "%s\n",
                 rank->where.c_str(), rank->images->resolved(), images.c_str());
    for (const auto &[name, s] : rank->steps) {
      if (!s.profiledRuns)
        continue;
      std::map<std::string, std::pair<int, double>> byKind;
      double total = 0;
      for (size_t i = 0; i < s.opMs.size(); ++i) {
        const int32_t op = s.unitOp[i];
        auto &[count, ms] = byKind[s.step->ops[size_t(op)].kind];
        count += i == 0 || s.unitOp[i - 1] != op; // an op's first unit
        ms += s.opMs[i] / double(s.profiledRuns);
        total += s.opMs[i] / double(s.profiledRuns);
      }
      std::vector<std::pair<double, std::string>> order;
      for (const auto &[kind, v] : byKind)
        order.push_back({v.second, kind});
      std::sort(order.rbegin(), order.rend());
      std::fprintf(stderr,
                   "profile: %s, step '%s', %llu runs, eager with an event "
                   "pair per op: %.3f ms per step\n",
                   rank->where.c_str(), name.c_str(),
                   (unsigned long long)s.profiledRuns, total);
      std::fprintf(stderr, "  %-26s %6s %12s %7s\n", "op", "count",
                   "ms per step", "share");
      for (const auto &[ms, kind] : order)
        std::fprintf(stderr, "  %-26s %6d %12.4f %6.1f%%\n", kind.c_str(),
                     byKind[kind].first, ms, 100.0 * ms / total);
    }
  }
}

/// The kernel nodes of the graph `stream` is capturing.
Expected<size_t> capturedKernels(cudaStream_t stream,
                                 const std::string &where) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  CUDA_TRY(where, cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph,
                                           nullptr, nullptr, nullptr));
  if (status != cudaStreamCaptureStatusActive || !graph)
    return size_t(0);
  size_t nodes = 0;
  CUDA_TRY(where, cudaGraphGetNodes(graph, nullptr, &nodes));
  std::vector<cudaGraphNode_t> node(nodes);
  CUDA_TRY(where, cudaGraphGetNodes(graph, node.data(), &nodes));
  size_t kernels = 0;
  for (cudaGraphNode_t n : node) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    CUDA_TRY(where, cudaGraphNodeGetType(n, &type));
    kernels += type == cudaGraphNodeTypeKernel;
  }
  return kernels;
}

/// The nodes a capturing stream's next node will depend on, with their
/// edges' data, into `nodes` and `edges`; both empty where the stream is
/// not capturing.
Status captureDependencies(cudaStream_t stream, const std::string &where,
                           std::vector<cudaGraphNode_t> &nodes,
                           std::vector<cudaGraphEdgeData> &edges) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t *deps = nullptr;
  const cudaGraphEdgeData *data = nullptr;
  size_t count = 0;
  CUDA_TRY(where, cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr,
                                           &deps, &data, &count));
  nodes.clear();
  edges.clear();
  if (status != cudaStreamCaptureStatusActive)
    return Status::ok();
  for (size_t k = 0; k < count; ++k) {
    nodes.push_back(deps[k]);
    edges.push_back(data ? data[k] : cudaGraphEdgeData{});
  }
  return Status::ok();
}

/// Under capture, where an op's waits alone order it after the op before
/// it on its branch (StepSchedule::waitsSuffice): the stream's next node
/// made to depend only on the waited ops' nodes, not on the branch's last
/// one, so that the op's first kernel has one predecessor and can be
/// launched under its tail. `before`: the stream's dependencies before its
/// waits (that last node).
Status dropBranchEdge(cudaStream_t stream, const std::string &where,
                      const std::vector<cudaGraphNode_t> &before) {
  std::vector<cudaGraphNode_t> nodes, kept;
  std::vector<cudaGraphEdgeData> edges, keptEdges;
  KILN_TRY(captureDependencies(stream, where, nodes, edges));
  for (size_t k = 0; k < nodes.size(); ++k)
    if (std::find(before.begin(), before.end(), nodes[k]) == before.end()) {
      kept.push_back(nodes[k]);
      keptEdges.push_back(edges[k]);
    }
  if (kept.empty() || kept.size() == nodes.size())
    return Status::ok();
  CUDA_TRY(where, cudaStreamUpdateCaptureDependencies(
                      stream, kept.data(), keptEdges.data(), kept.size(),
                      cudaStreamSetCaptureDependencies));
  return Status::ok();
}

/// The step's ops on its schedule's branches: branch 0 is the rank's
/// stream, the others fork from it after the fault word is cleared and
/// join it at the end; an op waits for the events of the ops on other
/// branches it depends on. Under capture the events become graph edges.
Status enqueueBranches(CudaRank &rank, CudaStep &s, StepGraph &g) {
  const backend::StepSchedule &plan = g.schedule;
  const size_t extra = size_t(plan.branches - 1);
  while (rank.branches.size() < extra) {
    cudaStream_t b = nullptr;
    CUDA_TRY(rank.where, cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    rank.branches.push_back(b);
  }
  while (rank.joins.size() < extra + 1) {
    cudaEvent_t e = nullptr;
    CUDA_TRY(rank.where, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    rank.joins.push_back(e);
  }
  g.done.resize(s.units.size(), nullptr);
  for (size_t i = 0; i < s.units.size(); ++i)
    if (plan.signals[i] && !g.done[i])
      CUDA_TRY(rank.where,
               cudaEventCreateWithFlags(&g.done[i], cudaEventDisableTiming));
  auto streamOf = [&](int branch) {
    return branch == 0 ? rank.stream : rank.branches[size_t(branch - 1)];
  };
  CUDA_TRY(rank.where, cudaMemsetAsync(rank.firstFault(), 0xff,
                                       sizeof(uint32_t), rank.stream));
  StepEpochs epochs(rank);
  CUDA_TRY(rank.where, cudaEventRecord(rank.joins[0], rank.stream));
  for (size_t b = 0; b < extra; ++b)
    CUDA_TRY(rank.where,
             cudaStreamWaitEvent(rank.branches[b], rank.joins[0], 0));
  for (size_t i = 0; i < s.units.size(); ++i) {
    cudaStream_t stream = streamOf(plan.branch[i]);
    const std::string &where = s.where[size_t(s.unitOp[i])];
    const bool alone = rank.dropBranchEdges && i < plan.waitsSuffice.size() &&
                       plan.waitsSuffice[i];
    std::vector<cudaGraphNode_t> before;
    if (alone) {
      std::vector<cudaGraphEdgeData> unused;
      KILN_TRY(captureDependencies(stream, where, before, unused));
    }
    for (int32_t d : plan.waits[i])
      CUDA_TRY(where, cudaStreamWaitEvent(stream, g.done[size_t(d)], 0));
    if (alone && !before.empty())
      KILN_TRY(dropBranchEdge(stream, where, before));
    KILN_TRY(enqueueUnit(s, g, i, stream, g.quietStart[i]));
    if (!rank.scheduleFile.empty() && rank.index == 0) {
      KILN_ASSIGN(kernels, capturedKernels(stream, where));
      g.unitKernels.push_back(kernels);
    }
    if (plan.signals[i])
      CUDA_TRY(where, cudaEventRecord(g.done[i], stream));
  }
  for (size_t b = 0; b < extra; ++b) {
    CUDA_TRY(rank.where, cudaEventRecord(rank.joins[b + 1], rank.branches[b]));
    CUDA_TRY(rank.where,
             cudaStreamWaitEvent(rank.stream, rank.joins[b + 1], 0));
  }
  return epochs.finish(); // after every branch has joined
}

/// A captured step's nodes and edges, by kind: stream capture makes an edge
/// between two kernels launched with programmatic serialization
/// programmatic (the later one starts while the earlier one finishes, on
/// its own stream or across branches alike), and an edge to or from any
/// other node (a copy, a memset, NCCL's) a full one.
struct GraphCounts {
  size_t kernels = 0, others = 0, edges = 0, programmatic = 0;
};

Expected<GraphCounts> countGraph(cudaGraph_t graph, const std::string &where) {
  GraphCounts c;
  size_t nodes = 0;
  CUDA_TRY(where, cudaGraphGetNodes(graph, nullptr, &nodes));
  std::vector<cudaGraphNode_t> node(nodes);
  CUDA_TRY(where, cudaGraphGetNodes(graph, node.data(), &nodes));
  for (cudaGraphNode_t n : node) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    CUDA_TRY(where, cudaGraphNodeGetType(n, &type));
    ++(type == cudaGraphNodeTypeKernel ? c.kernels : c.others);
  }
  CUDA_TRY(where,
           cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &c.edges));
  std::vector<cudaGraphNode_t> from(c.edges), to(c.edges);
  std::vector<cudaGraphEdgeData> data(c.edges);
  CUDA_TRY(where, cudaGraphGetEdges(graph, from.data(), to.data(), data.data(),
                                    &c.edges));
  for (const cudaGraphEdgeData &d : data)
    c.programmatic += d.type == cudaGraphDependencyTypeProgrammatic;
  return c;
}

/// KILN_CUDA_SCHEDULE=FILE: the step's launch units in enqueue order, each
/// with its op, branch, the units on other branches it waits for and the
/// kernel nodes it added (a unit's kernels are the next ones of the
/// graph's, in creation order, as CUPTI numbers them), as TSV; the file is
/// written whole or not at all.
Status writeSchedule(const CudaStep &s, const StepGraph &g,
                     const std::string &path) {
  std::string text = "unit\top\tbranch\twaits\tkernels\tquiet\n";
  for (size_t i = 0; i < s.units.size(); ++i) {
    std::string waits;
    for (int32_t d : g.schedule.waits[i]) {
      if (!waits.empty())
        waits += ',';
      waits += std::to_string(d);
    }
    const size_t before = i == 0 ? 0 : g.unitKernels[i - 1];
    text +=
        fmt::format("{}\t{}\t{}\t{}\t{}\t{}\n", i, s.where[size_t(s.unitOp[i])],
                    g.schedule.branch[i], waits, g.unitKernels[i] - before,
                    g.quietStart[i] ? 1 : 0);
  }
  AtomicFile file;
  KILN_TRY(file.create(path));
  KILN_TRY(file.writeAt(text.data(), text.size(), 0));
  KILN_TRY(file.commit());
  std::fprintf(
      stderr, "schedule: step '%s'%s, %zu launch units: %s\n",
      s.step->name.c_str(),
      g.label.empty() ? "" : fmt::format(" (the graph {})", g.label).c_str(),
      s.units.size(), path.c_str());
  return Status::ok();
}

Status capture(CudaRank &rank, CudaStep &s, StepGraph &g) {
  std::string where =
      fmt::format("{}: capturing step '{}'{}", rank.where, s.step->name,
                  g.label.empty() ? "" : " (" + g.label + ")");
  setOverlappedLaunches(rank.overlap);
  CUDA_TRY(where, cudaStreamBeginCapture(rank.stream,
                                         cudaStreamCaptureModeThreadLocal));
  g.unitKernels.clear();
  const uint64_t widthBefore = shapeSpecialisedLaunches(),
                 sharedBefore = moeSharedInsideLaunches(),
                 mlaMmaBefore = mlaTensorCoreLaunches();
  Status enqueued = enqueueBranches(rank, s, g);
  const uint64_t widthKernels = shapeSpecialisedLaunches() - widthBefore,
                 sharedInside = moeSharedInsideLaunches() - sharedBefore,
                 mlaMma = mlaTensorCoreLaunches() - mlaMmaBefore;
  cudaGraph_t graph = nullptr;
  cudaError_t ended = cudaStreamEndCapture(rank.stream, &graph);
  if (!enqueued)
    return enqueued;
  CUDA_TRY(where, ended);
  g.graph = graph;
  if (rank.graphStats) {
    KILN_ASSIGN(c, countGraph(graph, where));
    std::string which;
    if (s.allSelected && &g == &*s.allSelected)
      which = fmt::format(" below {} positions, {}", s.selectsAll + 1, g.label);
    else if (s.wideSelect && &g == &*s.wideSelect)
      which =
          fmt::format(" from {} attended positions, {}", s.wideFrom, g.label);
    else if (!g.label.empty())
      which = ", " + g.label;
    std::fprintf(stderr,
                 "graph: %s, step '%s'%s: %zu kernel nodes, %zu other nodes, "
                 "%zu edges, %zu of them programmatic; %llu launches of "
                 "kernels compiled for their shapes (KILN_CUDA_SPECIALISED); "
                 "%llu moe_experts with the shared expert inside the routed "
                 "experts' kernels; %llu MLA launches on the tensor cores\n",
                 rank.where.c_str(), s.step->name.c_str(), which.c_str(),
                 c.kernels, c.others, c.edges, c.programmatic,
                 (unsigned long long)widthKernels,
                 (unsigned long long)sharedInside, (unsigned long long)mlaMma);
  }
  CUDA_TRY(where, cudaGraphInstantiate(&g.exec, graph, 0));
  CUDA_TRY(where, cudaGraphUpload(g.exec, rank.stream));
  return Status::ok();
}

std::string faultText(const StepFault &f) {
  switch (FaultCode(f.code)) {
  case FaultCode::TokenOutOfRange:
    return fmt::format("token {} is outside the vocabulary [0, {})", f.value,
                       f.limit);
  case FaultCode::PositionOutOfRange:
    return fmt::format("position {} is outside the cache's {} positions: the "
                       "context is full",
                       f.value, f.limit);
  case FaultCode::SelectionOutOfRange:
    return fmt::format("a selected position {} is outside the cache's {}",
                       f.value, f.limit);
  case FaultCode::CountOutOfRange:
    return fmt::format("selected_count {} is outside 0..{}", f.value, f.limit);
  case FaultCode::ExpertOutOfRange:
    return fmt::format("expert id {} is outside [0, {})", f.value, f.limit);
  case FaultCode::PeerTimeout:
    return fmt::format("rank {} did not reach all-reduce call {} within 10 s "
                       "(the group's ranks ran different steps, or one "
                       "stopped)",
                       f.value, f.limit);
  case FaultCode::GridWaitTimeout:
    return fmt::format("the kernel's {} blocks did not all run within 10 s "
                       "(they wait for each other; another process holding "
                       "the GPU's multiprocessors can starve them)",
                       f.value);
  case FaultCode::SamplingOutOfRange:
    return fmt::format("sampling word {} is {:#010x}: {}", f.value,
                       uint32_t(f.limit), draw::wordRule(int(f.value)));
  default:
    return fmt::format("fault code {} (value {}, limit {})", f.code, f.value,
                       f.limit);
  }
}

Status runRank(CudaRank &rank, CudaStep &s, bool eager, bool profile) {
  KILN_TRY(enter(rank));
  if (profile && s.events.empty()) {
    s.events.resize(s.units.size() + 1);
    for (cudaEvent_t &e : s.events)
      CUDA_TRY(rank.where, cudaEventCreate(&e));
  }
  // One replay's kernels on a timeline: rank 0's (CUPTI records the whole
  // process; the file names each kernel's device).
  StepGraph &g = s.current();
  const bool replay = !eager && !profile;
  const uint64_t replays = replay ? ++s.replays : s.replays;
  const bool record = replay && !rank.timeline.empty() && rank.index == 0 &&
                      replays == uint64_t(kTimelineReplay);
  // The schedule of the graph replayed first, or of the one the timeline
  // records.
  if (replay && !rank.scheduleFile.empty() && rank.index == 0 &&
      g.unitKernels.size() == s.units.size() &&
      (record || (rank.timeline.empty() && replays == 1)))
    KILN_TRY(writeSchedule(s, g, rank.scheduleFile));
  if (record) {
    CUDA_TRY(rank.where, cudaDeviceSynchronize());
    KILN_TRY(beginTimeline());
  }
  if (eager || profile) {
    KILN_TRY(enqueueStep(rank, s, g, profile));
  } else {
    CUDA_TRY(rank.where, cudaGraphLaunch(g.exec, rank.stream));
  }
  if (record) {
    CUDA_TRY(rank.where, cudaStreamSynchronize(rank.stream));
    KILN_TRY(endTimeline(rank.timeline));
    std::fprintf(stderr, "timeline: %s, step '%s', replay %d: %s\n",
                 rank.where.c_str(), s.step->name.c_str(), kTimelineReplay,
                 rank.timeline.c_str());
  }
  CUDA_TRY(rank.where,
           cudaMemcpyAsync(rank.hostFirst, rank.firstFault(), sizeof(uint32_t),
                           cudaMemcpyDeviceToHost, rank.stream));
  CUDA_TRY(fmt::format("{}: step '{}'", rank.where, s.step->name),
           cudaStreamSynchronize(rank.stream));
  if (profile)
    KILN_TRY(collectProfile(rank, s));
  if (*rank.hostFirst != kNoFault) {
    // The earliest faulting op's record; then every record is cleared for
    // the next step (later ops may have faulted too).
    StepFault *records = rank.faultRecords();
    CUDA_TRY(rank.where, cudaMemcpy(rank.hostFault, records + *rank.hostFirst,
                                    sizeof(StepFault), cudaMemcpyDeviceToHost));
    CUDA_TRY(rank.where,
             cudaMemsetAsync(records, 0,
                             rank.faultBytes - CudaRank::kFaultRecords,
                             rank.stream));
  }
  const StepFault &f = *rank.hostFault;
  if (*rank.hostFirst != kNoFault && f.code != 0) {
    std::string where = f.op >= 0 && size_t(f.op) < s.where.size()
                            ? s.where[f.op]
                            : s.step->name;
    return Error(rank.where + ": " + where, "", faultText(f));
  }
  return Status::ok();
}

/// Runs `job(rank)` on every rank's thread at once and returns the first
/// failure, naming its rank.
Status onEveryRank(CudaGroup &g, const std::function<Status(CudaRank &)> &job) {
  for (std::unique_ptr<CudaRank> &r : g.ranks) {
    CudaRank *rank = r.get();
    rank->post([rank, &job] { return job(*rank); });
  }
  std::optional<Error> first;
  for (std::unique_ptr<CudaRank> &r : g.ranks)
    if (Status st = r->wait(); !st && !first)
      first = st.error();
  if (first)
    return *first;
  return Status::ok();
}

/// The floats the largest all-reduce of the rank plans' steps reduces.
int64_t largestAllReduce(const Artifact &a) {
  int64_t largest = 0;
  for (const RankPlan &plan : a.rankPlans)
    for (const Step &step : plan.steps)
      for (const Op &op : step.ops)
        if ((op.kind == "all_reduce" || op.kind == "all_reduce_add" ||
             op.kind == "all_reduce_add_rms_norm") &&
            !op.operands.empty())
          largest = std::max(
              largest,
              int64_t(step.buffers[size_t(op.operands[0])].elements()));
  return largest;
}

/// Direct slots (KILN_CUDA_DIRECT_SLOTS, on; StepKernels.h PeerExchange): in
/// each step of `plan`, the inputs of the all-reduces the one-shot kernel
/// takes whole (an exchange of `capacity`) that can live in the exchange:
/// an arena buffer that no view aliases, that one earlier op writes
/// without reading it and that nothing but the all-reduce reads. Each such
/// buffer gets a site of its own, 128-byte aligned, counted from
/// peerSitesStart(capacity); `floats` is the sites' extent. A site is
/// written again by the next run's producer, which every rank starts only
/// after its last all-reduce of this run waited for every peer's flag,
/// published once that peer's earlier all-reduces (collectives run in list
/// order, each after the one before it) had read their sites: the step's
/// last all-reduce, read after its flag, is left out, so a step with one
/// has none.
struct DirectSites {
  std::map<std::string, std::map<int32_t, int64_t>, std::less<>> at;
  int64_t floats = 0;
  int64_t calls = 0; ///< the one-shot all-reduces of the plan's steps
  bool operator==(const DirectSites &) const = default;
};

Expected<DirectSites> directSites(const Artifact &a, const RankPlan &plan,
                                  uint32_t ranks, int64_t capacity) {
  constexpr int64_t kAlign = 128 / sizeof(float);
  DirectSites sites;
  int64_t next = peerSitesStart(capacity);
  for (const Step &step : plan.steps) {
    KILN_ASSIGN(ops, backend::decodeStep(a, step, ranks));
    std::vector<int32_t> calls;
    for (size_t o = 0; o < ops.size(); ++o) {
      const OpKind k = ops[o].kind;
      if ((k == OpKind::AllReduce || k == OpKind::AllReduceAdd ||
           k == OpKind::AllReduceAddRmsNorm) &&
          allReducePeersShape(ops[o].rows, ops[o].n, ops[o].tail, capacity))
        calls.push_back(int32_t(o));
    }
    sites.calls += int64_t(calls.size());
    if (calls.size() < 2)
      continue;
    calls.pop_back(); // the step's last: read after its flag
    const std::vector<bool> owned = backend::firstInputsOwned(step, ops, calls);
    for (size_t c = 0; c < calls.size(); ++c) {
      if (!owned[c])
        continue;
      const StepOp &op = ops[size_t(calls[c])];
      const int32_t x = op.ins[0];
      const int64_t floats =
          std::max(int64_t(step.buffers[size_t(x)].elements()),
                   op.rows * op.n + op.tail);
      sites.at[step.name][x] = next;
      next += (floats + kAlign - 1) / kAlign * kAlign;
    }
  }
  sites.floats = next - peerSitesStart(capacity);
  return sites;
}

/// The one-shot all-reduce's exchange (StepKernels.h PeerExchange): each
/// rank's memory, every GPU of the group given access to every other's,
/// and each rank's view of all of them. A simulated rank (`local`) has
/// one of its own that stands for every rank's. When two GPUs of the group
/// cannot reach each other's memory, all-reduces stay with NCCL. Ranks on
/// one GPU (`oneGpu`) have no NCCL: every collective goes through the
/// exchange, in parts of at most kPeerMaxValues values. `direct`: with
/// direct slots where the ranks' plans place them alike (directSites);
/// `push`: a real group's parts pushed (PeerExchange::push); `stepEpochs`:
/// each rank's word of step epochs (CudaRank::epochBase).
Status setUpPeerExchange(CudaGroup &g, bool local, bool oneGpu, bool direct,
                         bool push, bool stepEpochs) {
  const Artifact &a = g.artifact;
  const int64_t capacity = oneGpu ? kPeerMaxValues : largestAllReduce(a);
  if (oneGpu && a.ranks > uint32_t(kMaxPeers))
    return Error("cuda backend", "one GPU",
                 fmt::format("{} ranks on one GPU: its exchange holds at "
                             "most {}",
                             a.ranks, kMaxPeers));
  if (capacity <= 0 || a.ranks > uint32_t(kMaxPeers))
    return Status::ok();
  for (auto &r : g.ranks)
    for (auto &o : g.ranks) {
      int can = 1;
      if (r->device != o->device && !local)
        CUDA_TRY(r->where, cudaDeviceCanAccessPeer(&can, r->device, o->device));
      if (!can) {
        std::fprintf(stderr,
                     "cuda backend: GPU %d cannot read GPU %d's memory: "
                     "all-reduces go through NCCL\n",
                     r->device, o->device);
        return Status::ok();
      }
    }
  // Every rank reads its peers' sites at its own offsets: the plans must
  // place them alike (tensor-parallel plans do).
  DirectSites sites;
  if (direct) {
    for (size_t i = 0; i < g.ranks.size(); ++i) {
      KILN_ASSIGN(mine, directSites(a, a.rankPlans[g.ranks[i]->index], a.ranks,
                                    capacity));
      if (i == 0) {
        sites = std::move(mine);
      } else if (!(mine == sites)) {
        std::fprintf(stderr, "cuda backend: the ranks' plans place their "
                             "all-reduces' inputs differently: no direct "
                             "slots\n");
        sites.at.clear();
        sites.floats = 0;
        break;
      }
    }
    size_t placed = 0;
    for (const auto &[name, inputs] : sites.at)
      placed += inputs.size();
    // Said when asked for by name; the default stays quiet.
    if (std::getenv("KILN_CUDA_DIRECT_SLOTS"))
      std::fprintf(stderr,
                   "cuda backend: direct slots: %zu of %lld all-reduces read "
                   "their inputs where their producers wrote them\n",
                   placed, (long long)sites.calls);
  }
  // The push region after the sites (a simulated rank pulls its own part).
  const bool pushed = push && !local;
  if (push)
    std::fprintf(stderr,
                 pushed ? "cuda backend: KILN_CUDA_PEER_PUSH=1: %u ranks push "
                          "their parts into every rank's exchange\n"
                        : "cuda backend: KILN_CUDA_PEER_PUSH=1: no effect on "
                          "%u ranks whose collectives stay local\n",
                 a.ranks);
  KILN_TRY(onEveryRank(g, [&](CudaRank &rank) -> Status {
    KILN_TRY(enter(rank));
    if (!local)
      for (auto &o : g.ranks)
        if (o->device != rank.device)
          CUDA_TRY(rank.where, enablePeerAccess(o->device));
    const uint64_t bytes = peerExchangeBytes(capacity, sites.floats,
                                             pushed ? int32_t(a.ranks) : 0);
    KILN_ASSIGN(m, DeviceMemory::allocate(bytes, "all-reduce exchange"));
    // Zero before any rank's first all-reduce reads the flags (the legacy
    // stream's memset, waited for: no rank stream is ordered after it).
    CUDA_TRY(rank.where, cudaMemset(m.get(), 0, bytes));
    if (stepEpochs) {
      KILN_ASSIGN(base, DeviceMemory::allocate(sizeof(uint32_t),
                                               "all-reduce step epochs"));
      CUDA_TRY(rank.where, cudaMemset(base.get(), 0, sizeof(uint32_t)));
      rank.epochBase = std::move(base);
    }
    CUDA_TRY(rank.where, cudaDeviceSynchronize());
    rank.exchange = std::move(m);
    return Status::ok();
  }));
  std::vector<uint8_t *> bases;
  for (auto &r : g.ranks)
    bases.push_back(r->exchange.get());
  for (auto &r : g.ranks) {
    r->peers = peerExchangeView(
        local ? std::vector<uint8_t *>{r->exchange.get()} : bases,
        int32_t(a.ranks), int32_t(r->index), capacity, local,
        pushed ? peerSitesStart(capacity) + sites.floats : -1);
    r->usePeers = true;
    r->directSites = sites.at;
  }
  return Status::ok();
}

Expected<std::unique_ptr<CudaGroup>>
openGroup(std::span<const uint8_t> bytes, const kiln_weight_bytes *weights,
          uint32_t weightCount, const kiln_rank_options *options) {
  KILN_ASSIGN(parsed, parseArtifact(bytes, "artifact"));
  auto group = std::make_unique<CudaGroup>();
  group->artifact = std::move(parsed);
  const Artifact &a = group->artifact;
  uint32_t flags = options ? options->flags : 0;
  uint32_t known = KILN_RUN_EAGER | KILN_RUN_RANDOM_WEIGHTS |
                   KILN_RUN_SIMULATE_RANK | KILN_RUN_PROFILE | KILN_RUN_ONE_GPU;
  if (flags & ~known)
    return Error("cuda backend", "options",
                 fmt::format("unknown flags {:#x}", flags & ~known));
  bool random = flags & KILN_RUN_RANDOM_WEIGHTS;
  bool simulate = flags & KILN_RUN_SIMULATE_RANK;
  const bool oneGpu = flags & KILN_RUN_ONE_GPU;
  if (simulate && oneGpu)
    return Error("cuda backend", "options",
                 "a simulated rank runs alone; every rank on one GPU "
                 "(--one-gpu) is the other way to use one GPU, not both");
  group->eager = flags & KILN_RUN_EAGER;
  group->profile = flags & KILN_RUN_PROFILE;
  group->seed = options ? options->seed : 0;
  group->fillPositions = options ? options->fill_positions : 0;
  KILN_ASSIGN(switches, readGraphSwitches());
  if (oneGpu && (!switches.peerAllReduce || switches.localCollectives))
    return Error("cuda backend", "options",
                 "ranks on one GPU exchange through its memory: "
                 "KILN_CUDA_ALLREDUCE=nccl and KILN_CUDA_LOCAL_COLLECTIVES=1 "
                 "do not apply");
  // The timeline waits for the whole GPU, where another rank may be
  // waiting for this one.
  if (oneGpu && !switches.timeline.empty())
    return Error("cuda backend", "options",
                 "KILN_CUDA_TIMELINE times a step; ranks on one GPU are for "
                 "checking results, not timing them");
  if (!random && (!weights || weightCount != a.weights.size()))
    return Error("artifact", "weights",
                 fmt::format("{} weight buffers given for {} bindings",
                             weightCount, a.weights.size()));
  if (simulate && options->simulate_rank >= a.ranks)
    return Error("cuda backend", "simulate_rank",
                 fmt::format("rank {} of {}", options->simulate_rank, a.ranks));

  // Ranks on one GPU: each rank's stream its own hardware queue where the
  // GPU has enough (up to 32; CUDA's default 8), so that a rank waiting
  // in a collective does not hold back, in a queue they share, the launch
  // of another rank that it waits for. Read when the process first uses
  // CUDA; the user's own setting wins.
  if (oneGpu)
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  int devices = 0;
  CUDA_TRY("cuda backend", cudaGetDeviceCount(&devices));
  uint32_t first = options ? options->device : 0;
  uint32_t local = simulate ? 1 : a.ranks;
  // The GPUs the ranks run on, from `first`.
  const uint32_t gpus = oneGpu ? 1 : local;
  if (uint64_t(first) + gpus > uint64_t(devices))
    return Error("cuda backend", "devices",
                 fmt::format("{} GPU(s) from GPU {} are needed ({} rank(s){}), "
                             "{} visible",
                             gpus, first, a.ranks,
                             simulate ? ", one simulated"
                             : oneGpu ? " on one GPU"
                                      : "",
                             devices));

  // The artifact names the architectures it may run on (kiln-compile
  // --target=cuda:sm_90,...) and carries their kernel images; each GPU
  // must be one of them.
  std::string archs;
  for (const Payload &p : a.payloads)
    if (p.backend == "cuda" && p.name == "archs")
      archs.assign(p.data.begin(), p.data.end());
  for (uint32_t i = 0; i < gpus; ++i) {
    cudaDeviceProp prop{};
    CUDA_TRY("cuda backend", cudaGetDeviceProperties(&prop, int(first + i)));
    std::string arch = fmt::format("sm_{}{}", prop.major, prop.minor);
    if (("," + archs + ",").find("," + arch + ",") == std::string::npos)
      return Error("artifact", "target",
                   fmt::format("compiled for {} (kiln-compile "
                               "--target=cuda:{}), but GPU {} is a {} ({})",
                               archs, archs, first + i, prop.name, arch));
  }

  // NCCL for a real group of more than one rank. NVLink SHARP (NVLS) buys
  // nothing for all-reduces of a few KiB and reserves memory per
  // communicator: off unless the user asks for it.
  const NcclApi *nccl = nullptr;
  ncclUniqueId id{};
  if (local > 1 && !oneGpu) {
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    KILN_ASSIGN(api, loadNccl());
    nccl = api;
    KILN_TRY(ncclCheck(*nccl, nccl->getUniqueId(&id), "cuda backend",
                       "ncclGetUniqueId"));
  }

  for (uint32_t i = 0; i < local; ++i) {
    auto rank = std::make_unique<CudaRank>();
    rank->index = simulate ? options->simulate_rank : i;
    rank->ranks = a.ranks;
    rank->device = int(first + (oneGpu ? 0 : i));
    rank->simulate = simulate;
    rank->oneGpu = oneGpu && a.ranks > 1;
    // On one GPU no launch starts before its predecessor ends: an early
    // launch's waiting blocks could fill the GPU while this rank waits in
    // an all-reduce for a rank that then finds no room to reach it. A
    // single rank has no one to wait for, and keeps its early launches.
    rank->overlap = switches.overlap && !rank->oneGpu;
    rank->mlaProjection = switches.mlaProjection;
    rank->taggedIds = switches.taggedIds;
    rank->clusterSelect = switches.clusterSelect;
    rank->selectBlocks = switches.selectBlocks;
    rank->wideSelectFrom = switches.wideSelectFrom;
    rank->quietStart = switches.quietStart;
    rank->quietPrefetch = switches.quietPrefetch;
    rank->shortGraph = switches.shortGraph;
    rank->shapeSpecialised = switches.shapeSpecialised;
    rank->routerTail = switches.routerTail;
    rank->indexerMma = switches.indexerMma;
    rank->routerWarps = switches.routerWarps;
    rank->expertsInt8X = switches.expertsInt8X;
    rank->peerClusters = switches.peerClusters;
    rank->peerClusterPolicy = switches.peerClusterPolicy;
    rank->lightOps = switches.lightOps;
    rank->dropBranchEdges = switches.dropBranchEdges;
    rank->mla = switches.mla;
    rank->maxBranches = switches.branches;
    rank->graphStats = switches.stats;
    rank->omit = switches.omit;
    rank->localCollectives = switches.localCollectives;
    rank->timeline = switches.timeline;
    rank->scheduleFile = switches.schedule;
    rank->nccl = nccl;
    rank->where =
        fmt::format("cuda rank {} (GPU {})", rank->index, rank->device);
    cudaDeviceProp prop{};
    CUDA_TRY(rank->where, cudaGetDeviceProperties(&prop, rank->device));
    rank->arch = fmt::format("sm_{}{}", prop.major, prop.minor);
    if (local > 1)
      rank->worker = std::make_unique<Worker>();
    group->ranks.push_back(std::move(rank));
  }

  if (switches.peerAllReduce && a.ranks > 1)
    KILN_TRY(setUpPeerExchange(
        *group, simulate || switches.localCollectives, oneGpu,
        switches.directSlots && !omitsCollectives(switches.omit),
        switches.peerPush, switches.stepEpochs));

  // Each rank on its own thread: place, prepare, join NCCL, capture.
  Status opened = onEveryRank(*group, [&](CudaRank &rank) -> Status {
    KILN_TRY(loadKernelImages(rank, a));
    KILN_TRY(enter(rank));
    if (rank.peerClusterPolicy != cudaClusterSchedulingPolicyDefault)
      CUDA_TRY(rank.where, setPeerClusterPolicy(rank.peerClusterPolicy));
    CUDA_TRY(rank.where,
             cudaStreamCreateWithFlags(&rank.stream, cudaStreamNonBlocking));
    const RankPlan &plan = a.rankPlans[rank.index];
    rank.weights.resize(a.weights.size());
    std::vector<bool> placed(a.weights.size(), false);
    const kiln_weight_bytes *bytes = random ? nullptr : weights;
    for (const std::vector<int32_t> &fused : fusedGroups(a, plan)) {
      for (int32_t binding : fused)
        placed[binding] = true;
      KILN_TRY(placeWeights(rank, a, fused, bytes, group->seed));
    }
    for (const Step &s : plan.steps)
      for (const Buffer &b : s.buffers)
        if (b.kind == BufferKind::Weight && !placed[b.binding]) {
          placed[b.binding] = true;
          KILN_TRY(placeWeights(rank, a, {b.binding}, bytes, group->seed));
        }
    uint64_t arena = 0;
    for (const Step &s : plan.steps)
      arena = std::max(arena, s.arenaBytes);
    KILN_ASSIGN(arenaMemory, DeviceMemory::allocate(arena, "arena"));
    rank.arena = std::move(arenaMemory);
    CUDA_TRY(rank.where,
             cudaMemsetAsync(rank.arena.get(), 0, arena, rank.stream));
    size_t longest = 0;
    for (const Step &s : plan.steps)
      longest = std::max(longest, s.ops.size());
    rank.faultBytes = CudaRank::kFaultRecords + longest * sizeof(StepFault);
    KILN_ASSIGN(fault,
                DeviceMemory::allocate(rank.faultBytes, "fault records"));
    rank.fault = std::move(fault);
    CUDA_TRY(rank.where, cudaMemsetAsync(rank.fault.get(), 0, rank.faultBytes,
                                         rank.stream));
    CUDA_TRY(rank.where, cudaMallocHost(&rank.hostFault, sizeof(StepFault)));
    CUDA_TRY(rank.where, cudaMallocHost(&rank.hostFirst, sizeof(uint32_t)));
    for (const Step &s : plan.steps)
      KILN_TRY(prepareStep(rank, a, s));
    KILN_TRY(fillStates(rank, group->fillPositions, group->seed));
    if (nccl)
      KILN_TRY(ncclCheck(
          *nccl,
          nccl->commInitRank(&rank.comm, int(local), id, int(rank.index)),
          rank.where, "ncclCommInitRank"));
    // NCCL connects its peers on a communicator's first collectives,
    // which cannot happen inside a capture: run every step once
    // eagerly (all ranks together, inputs zero), then start the
    // caches afresh.
    if (nccl) {
      for (auto &[name, s] : rank.steps) {
        KILN_TRY(enqueueStep(rank, s, s.whole));
        // The nucleus's gather too, where a step has one.
        if (s.nucleusWhole)
          KILN_TRY(enqueueStep(rank, s, *s.nucleusWhole));
      }
      CUDA_TRY(rank.where, cudaStreamSynchronize(rank.stream));
      KILN_TRY(fillStates(rank, group->fillPositions, group->seed));
    }
    // Ranks on one GPU capture their graphs with --eager too: capturing
    // loads every kernel of a step (CUDA loads them lazily, and a load may
    // wait for the GPU to go idle, which a rank waiting in a collective
    // for another that is loading a kernel never lets it do).
    if (!group->eager || rank.oneGpu)
      for (auto &[name, s] : rank.steps) {
        for (StepGraph *g : s.graphs())
          KILN_TRY(capture(rank, s, *g));
      }
    CUDA_TRY(rank.where, cudaStreamSynchronize(rank.stream));
    return Status::ok();
  });
  if (!opened)
    return opened.error();
  return group;
}

Expected<CudaStep *> findStep(CudaRank &rank, const char *name) {
  return backend::findStep(rank.steps, name);
}

/// The plugin's operations (backend::PluginEntryPoints makes the C ABI).
struct CudaPlugin {
  using Group = CudaGroup;
  static constexpr const char *kName = "cuda backend";

  static Expected<std::unique_ptr<CudaGroup>>
  open(std::span<const uint8_t> artifact, const kiln_weight_bytes *weights,
       uint32_t weightCount, const kiln_rank_options *options) {
    return openGroup(artifact, weights, weightCount, options);
  }

  /// Into the input slot of every rank, or out of the first rank's output
  /// slot.
  static Status copySlot(CudaGroup &group, const char *step, BufferKind kind,
                         const char *slot, void *data, uint64_t bytes) {
    for (std::unique_ptr<CudaRank> &rank : group.ranks) {
      KILN_ASSIGN(s, findStep(*rank, step));
      KILN_ASSIGN(index, backend::findSlot(*s->step, kind, slot, bytes));
      uint8_t *p = s->ptrs[index];
      CUDA_TRY(rank->where, cudaSetDevice(rank->device));
      // On the rank's stream: ordered after the step that wrote an output
      // and before the next that reads an input. (A plain cudaMemcpy from
      // pageable memory may return before its DMA lands, on the legacy
      // stream, which the rank's stream does not wait for: a step could
      // read the previous token.) An output is waited for; an input goes
      // through its page-locked stage, not waited for.
      if (kind == BufferKind::Output) {
        CUDA_TRY(rank->where,
                 cudaMemcpyAsync(data, p, bytes, cudaMemcpyDeviceToHost,
                                 rank->stream));
        CUDA_TRY(rank->where, cudaStreamSynchronize(rank->stream));
        break;
      }
      std::unique_ptr<PinnedStage> &stage = s->stages[index];
      if (!stage)
        stage = std::make_unique<PinnedStage>();
      CUDA_TRY(rank->where, stage->copy(p, data, bytes, rank->stream));
      // The position picks the graph a run replays (CudaStep::current),
      // and so do the sampling words' nucleus.
      if (std::string_view(slot) == "position" && bytes == sizeof(int32_t)) {
        int32_t position = 0;
        std::memcpy(&position, data, sizeof position);
        s->position = position;
      }
      if (std::string_view(slot) == "sampling" &&
          bytes >= draw::kDrawWords * sizeof(int32_t)) {
        // The eight words, or the adjusting form's first eight (its count
        // bounds word 6).
        int32_t words[draw::kDrawWords];
        std::memcpy(words, data, sizeof words);
        draw::DrawParams params;
        int bad = 0;
        // Bad words fault in either graph's argmax.
        s->nucleusAsked =
            draw::readWords(words, int(bytes / sizeof(int32_t)), params, bad) &&
            (params.cuts() || (s->gridDraws && params.temperature != 0.0f));
      }
    }
    return Status::ok();
  }

  static Status run(CudaGroup &group, const char *step) {
    bool eager = group.eager, profile = group.profile;
    std::string name = step ? step : "";
    return onEveryRank(group, [&](CudaRank &rank) -> Status {
      KILN_ASSIGN(s, findStep(rank, name.c_str()));
      return runRank(rank, *s, eager, profile);
    });
  }

  static Status reset(CudaGroup &group) {
    return onEveryRank(group, [&](CudaRank &rank) -> Status {
      KILN_TRY(enter(rank));
      return fillStates(rank, group.fillPositions, group.seed);
    });
  }

  static void close(std::unique_ptr<CudaGroup> group) {
    setKernelImages(nullptr);
    if (group->profile)
      printProfile(*group);
  }
};

constexpr kiln_backend_v1 kCudaBackend =
    backend::PluginEntryPoints<CudaPlugin>::table(
        "cuda",
        "Kiln CUDA backend (one captured graph per rank per step, NCCL)");

} // namespace

extern "C" __attribute__((visibility("default"))) const kiln_backend_v1 *
kiln_backend_entry(uint32_t abiVersion) {
  return abiVersion == KILN_BACKEND_ABI_VERSION ? &kCudaBackend : nullptr;
}
