//===- StepKernels.h - GPU kernels for every step op ------------*- C++ -*-===//
//
// The CUDA backend's kernels, one launch function per step op (plus the
// local halves of the collectives), each enqueued on a stream and nothing
// else: no allocation, no synchronisation, no host reads of device data, so
// every one of them may be captured into a CUDA graph. Scalars that change
// per token (the token id, the position, the indexer's selection) are read
// from device memory by the kernels, never passed by value, so a captured
// step stays valid for every position.
//
// Semantics are those of the CPU reference (backends/cpu/CpuKernels.h);
// activations are f32, caches f32/f16/bf16, weights in the file's own block
// layout (decoded per value by GenericQuant.cuh, or, in the mat-vecs of
// StepMatVec.cu, by QuantDot.cuh's block decoders). Results agree with the
// CPU within float rounding; summation orders differ (warp trees), so they
// are not bit-identical to it, but each kernel is deterministic: the same
// inputs give the same bits on every run.
//
// Bad data found on the device (a token outside the vocabulary, a position
// outside the cache, an expert id or a selection entry out of range) cannot
// throw: the kernel records the first such fault in a StepFault the runtime
// reads after the step, and reads nothing out of bounds (the faulting work
// item is skipped).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_CUDA_STEPKERNELS_H
#define KILN_BACKENDS_CUDA_STEPKERNELS_H

#include "ModelShapes.h"
#include "quant/QuantTypes.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace kiln::cuda {

/// What a kernel found wrong with its data.
enum class FaultCode : int32_t {
  None = 0,
  TokenOutOfRange = 1,     ///< embed: value = token, limit = vocab
  PositionOutOfRange = 2,  ///< value = position, limit = cache positions
  SelectionOutOfRange = 3, ///< mla_attention: value = entry, limit = positions
  CountOutOfRange = 4,     ///< mla_attention: value = count, limit = capacity
  ExpertOutOfRange = 5,    ///< moe_experts: value = id, limit = experts
  PeerTimeout = 6, ///< all-reduce over peers: value = the peer, limit = epoch
  GridWaitTimeout = 7, ///< mla_attention: value = the grid's blocks
  /// argmax drawn: value = the bad word's index, limit = its bits.
  SamplingOutOfRange = 8,
};

/// An op's fault, in device memory. `code` is claimed with atomicCAS(&code,
/// 0, c) (the op's first faulting thread wins), then op/value/limit are
/// written by the claimer.
struct StepFault {
  int32_t code;
  int32_t op; ///< the op's index in its step
  int64_t value;
  int64_t limit;
};

/// Where a kernel reports: its op's fault record and index, and optionally
/// the step's first-fault word, which keeps the lowest faulting op index
/// (atomicMin; cleared to 0xffffffff). Ops of a step may run concurrently,
/// so the step reports the fault of its earliest op in step order, the
/// same one a run op by op reports.
struct FaultSink {
  StepFault *fault = nullptr;
  int32_t op = 0;
  uint32_t *first = nullptr;
};
/// The first-fault word's value when no op faulted.
constexpr uint32_t kNoFault = 0xffffffffu;

/// How a weight's bytes lie in device memory: the artifact binding's
/// layout, chosen by the compiler (docs/cuda.md). The split layouts keep
/// every byte of the file's blocks, each field of a block in its own plane
/// (SplitLayout.h: plane p holds bytes [offset, offset + bytes) of every
/// block, in file order); a row of a plane is the row's blocks' pieces side
/// by side. Each plane is one DeviceWeight field (below), aligned to its
/// piece (16 bytes for pieces of 16 or more, else the piece's size: the
/// kernels read a piece with one load), and the rows of every plane are
/// back to back ([rows][cols / blockValues][piece]). They are read by
/// launchLinear and launchDequant only.
enum class WeightLayout : int32_t {
  /// "gguf": the file's own blocks, rowBytes(type, cols) bytes per row.
  Blocks = 0,
  /// "q8_0-split" (Q8_0 only): `data` the int8 quants [rows][cols]; `scales`
  /// the f16 scales, one per 32 values, [rows][cols / 32].
  Q8Split = 1,
  /// "q4_k-split" (Q4_K only): `data` the quants qs [rows][cols / 256][128]
  /// (the block's nibble order kept); `scales` the block heads [rows][cols /
  /// 256][16]: d, dmin (f16), then the 12 packed 6-bit scale/min bytes.
  Q4KSplit = 2,
  /// "q5_k-split" (Q5_K only): `data` qs [rows][cols / 256][128]; `scales`
  /// the heads [rows][cols / 256][16] as q4_k-split; `high` the fifth bits
  /// qh [rows][cols / 256][32].
  Q5KSplit = 3,
  /// "q6_k-split" (Q6_K only): `data` the low nibbles ql [rows][cols /
  /// 256][128]; `scales` the int8 sub-block scales [rows][cols / 256][16];
  /// `high` the high bit pairs qh [rows][cols / 256][64]; `d` the f16
  /// super-block scales [rows][cols / 256].
  Q6KSplit = 4,
  /// "iq4_xs-split" (IQ4_XS only): `data` the quants qs [rows][cols /
  /// 256][128] (16 bytes per 32-value sub-block, the block's nibble order
  /// kept); `scales` the block heads [rows][cols / 256][8]: d (f16),
  /// scales_h (u16), scales_l[4].
  IQ4XSSplit = 5,
  /// "iq4_nl-split" (IQ4_NL only): `data` qs [rows][cols / 32][16];
  /// `scales` the f16 d [rows][cols / 32].
  IQ4NLSplit = 6,
  /// "q5_0-split" (Q5_0 only): `data` qs [rows][cols / 32][16]; `scales`
  /// the f16 d [rows][cols / 32]; `high` the fifth bits qh [rows][cols /
  /// 32][4].
  Q50Split = 7,
  /// "q5_1-split" (Q5_1 only): `data` qs [rows][cols / 32][16]; `scales`
  /// the block heads [rows][cols / 32][8]: d, m (f16), then qh[4].
  Q51Split = 8,
};

/// A weight in device memory: `rows` rows of `cols` values (cols = ne[0],
/// the quantised dim; rows = the product of the other dims) in `layout`.
struct DeviceWeight {
  GGMLType type = GGMLType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t *data = nullptr; ///< the blocks, or a split layout's plane 0
  WeightLayout layout = WeightLayout::Blocks;
  const uint8_t *scales = nullptr; ///< split layouts: plane 1
  const uint8_t *high = nullptr;   ///< q5_k-, q6_k-, q5_0-split: plane 2
  const uint8_t *d = nullptr;      ///< q6_k-split: plane 3

  /// Plane p of a split layout (0: data, 1: scales, 2: high, 3: d).
  const uint8_t *plane(int p) const {
    return p == 0 ? data : p == 1 ? scales : p == 2 ? high : d;
  }
  void setPlane(int p, const uint8_t *at) {
    (p == 0 ? data : p == 1 ? scales : p == 2 ? high : d) = at;
  }
};

/// The split layout for weights of `type` (Q8_0, Q4_K, Q5_K, Q6_K,
/// IQ4_XS, IQ4_NL, Q5_0, Q5_1), or
/// Blocks when it has none; and the type a layout is for (F32 for Blocks).
WeightLayout splitLayoutOf(GGMLType type);
GGMLType splitTypeOf(WeightLayout layout);

/// Repacks `rows` rows of Q8_0 blocks (`cols` values a row, a multiple of
/// 32) into the q8_0-split layout: quants[rows][cols] int8 and
/// scales[rows][cols / 32] f16 bits, every byte copied unchanged.
cudaError_t launchRepackQ8Split(const uint8_t *blocks, int64_t rows,
                                int64_t cols, uint8_t *quants, uint8_t *scales,
                                cudaStream_t s);

/// Repacks w.rows rows of the file's blocks of w.type (w.cols values a
/// row, whole blocks) at `blocks` into the planes of w.layout, a split
/// layout of that type, at w's plane pointers (device memory the caller
/// owns and lets this launch write), every byte copied unchanged.
cudaError_t launchRepackSplit(const uint8_t *blocks, const DeviceWeight &w,
                              cudaStream_t s);

enum class CacheType : int32_t { F32 = 0, F16 = 1, BF16 = 2 };

/// A cache in device memory: `positions` rows of `width` values.
struct DeviceCache {
  void *data = nullptr;
  CacheType type = CacheType::F16;
  int64_t positions = 0;
  int64_t width = 0;
};

enum class RopeStyle : int32_t { Interleaved = 0, NeoX = 1 };
enum class Gating : int32_t { Sigmoid = 0, Softmax = 1 };

/// y = a + b; y = silu(g) * u (silu(g) = g / (1 + exp(-g))). y may alias.
cudaError_t launchAdd(const float *a, const float *b, int64_t n, float *y,
                      cudaStream_t s);
cudaError_t launchSwiglu(const float *g, const float *u, int64_t n, float *y,
                         cudaStream_t s);

/// y[i] = x[i mod n] for i < count (y must not overlap x): what a rank
/// simulated alone moves in place of a collective (its ring traffic), in
/// one kernel, as NCCL's own would be, not in copy-engine nodes.
cudaError_t launchRingTraffic(const float *x, int64_t n, int64_t count,
                              float *y, cudaStream_t s);

/// The one-shot all-reduce over the GPUs of one process (NVLink peers).
/// Every rank's exchange (device memory each rank allocates and every peer
/// can read, all zero at the start) holds two parities of `capacity`
/// floats, then a flag and an epoch word for each of the call's
/// kPeerBlocks blocks (one cluster). Block b of
/// call e (its epoch + 1) copies its part of the rank's input into the
/// slots of parity e % 2, publishes flag b = e (system-scope release),
/// waits until every peer's flag b has reached e, then reads that part of
/// every rank's slots and combines them in rank order (as the CPU
/// backend's all-reduce: bit-identical to it, and across ranks). A rank
/// writes parity e % 2 again only at call e + 2, after every peer has
/// published e + 1, which each does only after reading call e. The fused
/// norm's blocks share their parts of each row's sum of squares through
/// the cluster's shared memory and add them in block order. `local`: a rank
/// simulated alone; every rank's slots are its own and no peer is waited
/// for.
///
/// Direct slots (KILN_CUDA_DIRECT_SLOTS, the backend's default): after the
/// flags and epochs an exchange may hold a region of sites, one for each
/// all-reduce of a step whose input only its producer writes and only the
/// all-reduce reads; the producer writes that input straight into the rank's
/// site (the backend places the buffer there), and the call at `site` reads
/// every rank's part at the same offset of its exchange, with no copy of its
/// own part. Site c is written again only by the next step's producer of c,
/// after this rank has waited in a later call (or at the step's end, in the
/// step's last one) for every peer's flag, which each publishes only once its
/// earlier kernels, the reads of c among them, have ended: so a step needs
/// two calls or more for its sites.
///
/// Pushed (KILN_CUDA_PEER_PUSH=1, a real group): after the sites an
/// exchange may hold a push region, `push` floats from its slots: two
/// parities of `ranks` slots of `capacity` floats, one for each source
/// rank, then a flag for each source rank and block. Block b of call e
/// writes its part into its slot of parity e % 2 in every rank's exchange
/// (posted stores over NVLink), then, after one system-scope fence, flag b
/// for itself in every peer's; it then waits for its own memory's flags
/// and reads every part there. Pulling polls every peer's flag and reads
/// every part over NVLink, two round trips; pushing leaves one one-way
/// trip. The reuse argument is the parities' above: a rank pushes into
/// parity e % 2 again only at call e + 2, after every peer's flag for call
/// e + 1, which each pushes only after reading call e.
constexpr int kMaxPeers = 8;
constexpr int kPeerBlocks = 8;
constexpr int kMaxPeerRows = 4;
/// The most values one launchAllReducePeers reduces (its blocks' threads,
/// four values each).
constexpr int64_t kPeerMaxValues = int64_t(kPeerBlocks) * 256 * 4;
struct PeerExchange {
  float *slots[kMaxPeers] = {};
  uint32_t *flags[kMaxPeers] = {};
  uint32_t *epochs = nullptr; ///< this rank's, one a block
  /// This rank's words for the fused norm's parts when its blocks are not
  /// a cluster: two parities of kMaxPeerRows x kPeerBlocks, each a part
  /// tagged with its call's epoch.
  uint64_t *norms = nullptr;
  int32_t ranks = 0, me = 0;
  int64_t capacity = 0;
  bool local = false;
  /// The push region's start in floats from each rank's slots, or -1:
  /// pulled (never pushed for a rank simulated alone).
  int64_t push = -1;
};
/// The floats of an exchange's push region for a group of `ranks`.
int64_t peerPushFloats(int64_t capacity, int32_t ranks);
/// The bytes of one rank's exchange for `capacity` floats, `sites` floats
/// of direct slots (a multiple of 32) and, with `pushRanks` > 0, a push
/// region for that many ranks after them (at peerSitesStart + sites).
uint64_t peerExchangeBytes(int64_t capacity, int64_t sites = 0,
                           int32_t pushRanks = 0);
/// Where the direct slots begin, in floats from a rank's slots (after the
/// two parities, the flags and the epochs, at a multiple of 128 bytes).
int64_t peerSitesStart(int64_t capacity);
/// Rank `me`'s view of a group of `ranks`: bases[q] is rank q's exchange
/// (peerExchangeBytes(capacity) bytes). `local`: a rank simulated alone,
/// whose one exchange, bases[0], stands for every rank's.
PeerExchange peerExchangeView(const std::vector<uint8_t *> &bases,
                              int32_t ranks, int32_t me, int64_t capacity,
                              bool local, int64_t push = -1);
/// Lets the current device read `peer`'s memory (already allowed is fine).
cudaError_t enablePeerAccess(int peer);

/// All-reduce of x (rows x n) over the exchange's ranks into `out` (sum,
/// or max as std::max), in kPeerBlocks blocks; with a `residual` and no
/// `w`, all_reduce_add (a sum): out = residual + reduced; with `w` too, the
/// fused all_reduce_add_rms_norm instead: out = residual + reduced, y =
/// rms_norm(out) * w per row. A peer that does not arrive within 10 s is
/// reported through `fault` and not waited for. With a `tail` (the fused
/// op, rows = 1; kiln-fold-router): x has n + tail values, all reduced,
/// the last tail divided by the norm's rms into `logits`; with a `choice`
/// too (kiln-fuse-router-choice), the block holding the tail's last value
/// then makes the router's choice from those logits, as launchMoeChoose
/// would (the same code: the same ids and weights). With a `site` >= 0
/// (direct slots), x is this rank's slots + site (peerSitesStart on), and
/// every rank's part is read at that offset of its slots.
struct RouterChoice {
  const float *bias = nullptr;
  int64_t topK = 0;
  Gating gating = Gating::Sigmoid;
  bool normalize = false;
  float routedScale = 1.f;
  int32_t *ids = nullptr;
  float *weights = nullptr;
};
cudaError_t
launchAllReducePeers(const PeerExchange &p, const float *x, int64_t rows,
                     int64_t n, bool sum, const float *residual, const float *w,
                     float eps, float *out, float *y, FaultSink fault,
                     cudaStream_t s, int64_t tail = 0, float *logits = nullptr,
                     const RouterChoice *choice = nullptr, int64_t site = -1);
/// The calling host thread's all-reduce epochs for the step it enqueues (a
/// graph's capture or an eager run): between beginStepEpochs(base) and
/// endStepEpochs(), each launchAllReducePeers is the step's next call, and
/// its kernel takes its call's epoch as *base + call + 1, read before the
/// kernel's wait, instead of loading each block's last epoch from the
/// exchange after it (a round trip at the head of every all-reduce);
/// endStepEpochs returns the step's calls, which launchAdvanceEpochs, the
/// step's last launch, adds to *base once every call has ended. So each
/// call's epoch is one more than the call's before it, across steps too, as
/// the exchange's parities need, and every rank of a group, running the
/// same calls, gives a call the same epoch. *base (a zeroed word of the
/// rank's) is written only by that last kernel, and a step's calls read it
/// only after the previous step has ended.
void beginStepEpochs(uint32_t *base);
int32_t endStepEpochs();
cudaError_t launchAdvanceEpochs(uint32_t *base, int32_t calls, cudaStream_t s);
/// Whether launchAllReducePeers runs its kPeerBlocks blocks as a cluster
/// (the calling host thread's setting; on by default): off, but for the
/// router's choice, they are blocks that need not be placed together, and
/// the fused norm's parts go through the exchange (PeerExchange::norms)
/// instead of the cluster's shared memory. The backend sets it off for a
/// step unless KILN_CUDA_PEER_CLUSTER=1 (the flat form measured faster,
/// docs/perf.md "Forty-first pass"). The same bits either way.
bool peerClusters();
void setPeerClusters(bool on);
/// Asks the GPU to place launchAllReducePeers's clusters by `policy`
/// (cudaClusterSchedulingPolicySpread or ...LoadBalancing; Default: the
/// driver's choice), on the current GPU for the current kernel images.
/// KILN_CUDA_PEER_CLUSTER_POLICY=spread|balance sets it for a step (a
/// probe: a cluster of 8 measured ~0.4 us a call dearer than free blocks,
/// docs/perf.md, thirty-ninth pass). The same sums either way.
cudaError_t setPeerClusterPolicy(cudaClusterSchedulingPolicy policy);
/// Whether launchAllReducePeers takes rows x n (+ tail): at most
/// kMaxPeerRows rows and 8,192 values, within the capacity.
bool allReducePeersFits(const PeerExchange &p, int64_t rows, int64_t n,
                        int64_t tail = 0);
/// The shape half of allReducePeersFits, for an exchange of `capacity`.
bool allReducePeersShape(int64_t rows, int64_t n, int64_t tail,
                         int64_t capacity);

/// y = x / sqrt(mean(x^2) + eps) * w per row of n; y may be x.
cudaError_t launchRmsNorm(const float *x, int64_t rows, int64_t n,
                          const float *w, float eps, float *y, cudaStream_t s);

/// sum = a + b, then y = rms_norm(sum) * w, per row of n. sum may be a or b.
/// With a tail (rows = 1, n <= 8,192; kiln-fold-router): tailOut[i] =
/// tailIn[i] / that row's rms for i < tailN.
cudaError_t launchAddRmsNorm(const float *a, const float *b, int64_t rows,
                             int64_t n, const float *w, float eps, float *sum,
                             float *y, cudaStream_t s,
                             const float *tailIn = nullptr, int64_t tailN = 0,
                             float *tailOut = nullptr);

/// y = (x - mean) / sqrt(var + eps) * w + bias per row (population
/// variance, two passes); y may be x.
cudaError_t launchLayerNorm(const float *x, int64_t rows, int64_t n,
                            const float *w, const float *bias, float eps,
                            float *y, cudaStream_t s);

/// Rotary embedding of values [offset, offset + dims) of each row by the
/// position read from *position; other values are copied. Pair i turns by
/// position * theta^(-2i / dims), the angle and its cos/sin in double as
/// the CPU does. Interleaved pairs (offset+2i, offset+2i+1); NeoX pairs
/// (offset+i, offset+i+dims/2). y may be x.
cudaError_t launchRope(const float *x, int64_t rows, int64_t n,
                       const int32_t *position, RopeStyle style, float theta,
                       int64_t offset, int64_t dims, float *y, cudaStream_t s);

/// Up to 4-D box copy: y (shape dst) = x (shape src) at `offsets`; rank is
/// the number of dims (1..4), row-major.
cudaError_t launchSlice(const float *x, const int64_t *src, const int64_t *dst,
                        const int64_t *offsets, int rank, float *y,
                        cudaStream_t s);

/// The most inputs launchConcat takes.
constexpr int kMaxConcatParts = 8;

/// Concatenation along the last dim in one kernel: `outer` rows of `total`
/// values, row o of y = row o of parts[0] (runs[0] values), then of
/// parts[1], ... (runs sum to total; count <= kMaxConcatParts). A kernel,
/// not a copy per part: copy nodes in a captured step break the overlapped
/// launches on both sides of them.
cudaError_t launchConcat(const float *const *parts, const int64_t *runs,
                         int count, int64_t outer, int64_t total, float *y,
                         cudaStream_t s);

/// Every launch below that takes a DeviceWeight reads the Blocks layout,
/// except launchLinear and launchDequant, which read every layout, and
/// refuses another (cudaErrorInvalidValue).
///
/// y[hidden] = row *token of a [hidden, vocab] table (table.cols = hidden,
/// table.rows = vocab), decoded. A token outside [0, vocab) faults
/// (TokenOutOfRange) and leaves y unwritten.
cudaError_t launchEmbed(const DeviceWeight &table, const int32_t *token,
                        float *y, FaultSink fault, cudaStream_t s);

/// out = every value of the weight, row-major (bit-exact to gguf-py; every
/// layout).
cudaError_t launchDequant(const DeviceWeight &w, float *out, cudaStream_t s);

/// Mat-vec. y[b][n] = sum_k x[b][k] * W[b * rowsPerBatch * stacked + n][k]
/// for b < batch, n < rowsPerBatch: with stacked = false every batch row
/// uses the same rowsPerBatch = w.rows rows (a 2-D weight); with stacked =
/// true batch row b uses its own matrix, rows b*rowsPerBatch .. (a 3-D
/// weight [K, N, B], rowsPerBatch = N, batch = B). x is [batch][w.cols],
/// y [batch][rowsPerBatch].
/// Rows of a projection read only from a position on (step.fused_linear
/// live_from): while *position < from only rows [0, rows) are computed and
/// the others are left unwritten. `position` must be the step's position
/// input (written between steps only): kernels read it before their
/// predecessor wait, to size their work. Honoured by the q8_0-split kernel
/// and the F32 one (batch 1); every other layout computes every row.
struct LiveRows {
  const int32_t *position = nullptr;
  int32_t from = 0;
  int64_t rows = 0;
};

cudaError_t launchLinear(const float *x, int64_t batch, const DeviceWeight &w,
                         int64_t rowsPerBatch, bool stacked, float *y,
                         cudaStream_t s, const LiveRows *live = nullptr);

/// An input's RMS norm, folded into a mat-vec (step.rms_norm_linear): x
/// becomes x / sqrt(mean(x^2) + eps) * weight. `scratch` (cols floats) holds
/// the normalised input where the layout's kernel cannot form it itself.
struct InputNorm {
  const float *weight = nullptr;
  float eps = 0.f;
  float *scratch = nullptr;
};

/// y = W rms_norm(x) for one input vector of w.cols values (w.rows
/// outputs). The q8_0-split kernel, and the F32 kernel of 16-byte aligned
/// rows (x and g 16-byte aligned too), fold the norm in: it dots W with x * g
/// and divides each row's sum by the rms, whose sum of squares the warps
/// of a row group take from the x values they read anyway (no kernel, no
/// write of the normalised vector); other layouts run launchRmsNorm into
/// norm.scratch, then launchLinear.
cudaError_t launchNormedLinear(const float *x, const InputNorm &norm,
                               const DeviceWeight &w, float *y, cudaStream_t s,
                               const LiveRows *live = nullptr);

/// y = W (silu(gate) * up) for one input vector pair of w.cols values each
/// (step.swiglu_linear). The q8_0-split kernel forms each product value as
/// it loads it (no kernel, no write of the product); other layouts run
/// launchSwiglu into `scratch` (w.cols floats), then launchLinear.
cudaError_t launchSwigluLinear(const float *gate, const float *up,
                               const DeviceWeight &w, float *scratch, float *y,
                               cudaStream_t s);

/// Row *position of the cache becomes entry[width], converted (round to
/// nearest even). A position outside the cache faults (PositionOutOfRange).
cudaError_t launchCacheAppend(const float *entry, const int32_t *position,
                              DeviceCache cache, FaultSink fault,
                              cudaStream_t s);

/// step.norm_rope_append in one block: y = entry[cache.width]; y[0,
/// normDims) = rms norm (bias null) or layer norm (with bias) with w; the
/// rope of launchRope on y (offset, dims); row *position of the cache
/// becomes y, converted. The same math as launchRmsNorm / launchLayerNorm,
/// launchRope and launchCacheAppend in that order, without writing the
/// intermediate vectors. A position outside the cache faults
/// (PositionOutOfRange) and writes nothing.
cudaError_t launchNormRopeAppend(const float *entry, int64_t normDims,
                                 const float *w, const float *bias, float eps,
                                 const int32_t *position, RopeStyle style,
                                 float theta, int64_t offset, int64_t dims,
                                 DeviceCache cache, FaultSink fault,
                                 cudaStream_t s);

/// Absorbed MLA decode attention (CpuKernels.h mlaAttention): cache rows
/// are [latent | rope]; attended positions are 0..*position, or, when
/// `selected` is non-null, selected[0 .. *count) (capacity = the length of
/// `selected`, at least 1; a count outside [0, capacity] faults
/// CountOutOfRange, an entry outside the cache SelectionOutOfRange, a
/// position outside it PositionOutOfRange; the output is then unspecified
/// but no byte outside a buffer is touched). Without a selection a
/// capacity above 0 bounds the attended positions the same way (position
/// + 1 above it faults CountOutOfRange): the same entries in the same
/// order as a selection of 0..*position, for a step that knows every
/// position is selected (a DSA layer below its top-k) and sizes its grid
/// by the selection's length. qLatent [heads][latent], qRope [heads][rope],
/// out [heads][latent]. Split over positions: each cache row is read once
/// for all heads; `scratch` holds mlaScratchFloats(heads, latent,
/// mlaMostEntries(cache.positions, capacity)) floats,
/// 8-byte aligned: first a 64-bit word the kernel's blocks count their
/// arrivals in, which must be zero before the first call (each call leaves
/// its count so, for a call of any shape), then per-chunk partial results.
/// Kernels compiled for GLM-5's widths (512 + 64) run where they apply.
///
/// With `proj` (a Q8_0 weight in the q8_0-split layout, heads * N rows of
/// `latent` values, latent a power of two from 32 to 1,024: a stacked
/// [latent, N, heads] weight such as GLM-5's attn_v_b) each head's output
/// is also projected: out is then [heads][N], head h's values proj's rows
/// h * N .. h * N + N - 1 times its latent output. Two kernels: the chunks,
/// then a cluster a head that combines them and projects (no grid barrier).
/// Anything else as `proj` is refused (cudaErrorInvalidValue). A
/// step.mla_attention with a projection (kiln-fuse-mla-projection) runs
/// this way where its weight qualifies and KILN_CUDA_MLA_PROJECTION=1 (by
/// default MLA, then the stacked mat-vec: docs/cuda.md).
///
/// The most entries one call attends: every position of the cache, or with
/// a capacity above 0 the fewer of the two. With DSA's selection (GLM-5:
/// 2,048) the scratch, the grid and the combine's shared weights are sized
/// by it, not by the cache's length (202,752 positions at GLM-5's whole
/// context).
int64_t mlaMostEntries(int64_t positions, int64_t capacity);
int64_t mlaScratchFloats(int64_t heads, int64_t latent, int64_t entries);
cudaError_t launchMlaAttention(const float *qLatent, const float *qRope,
                               int64_t heads, int64_t latent, int64_t rope,
                               DeviceCache cache, const int32_t *position,
                               const int32_t *selected, const int32_t *count,
                               int64_t capacity, float scale, float *scratch,
                               float *out, FaultSink fault, cudaStream_t s,
                               const DeviceWeight *proj = nullptr);

/// Whether launchMlaAttention takes `proj` as the output projection of
/// `heads` heads of `latent` values (what it refuses otherwise).
bool mlaProjectionFits(const DeviceWeight &proj, int64_t heads, int64_t latent);

/// A rotation of the DSA indexer's query rows (launchRope's, by the
/// position): none when dims is 0.
struct QueryRope {
  RopeStyle style = RopeStyle::Interleaved;
  float theta = 0.f;
  int64_t offset = 0, dims = 0;
};

/// DSA indexer (CpuKernels.h dsaIndexer): score[t] = scale * sum_h w[h] *
/// relu(q[h] . key[t]) for t in 0..*position; the topK best (ties to the
/// lower t) written ascending into selected[topK], zeros after them,
/// *count = min(topK, position + 1). With rope.dims > 0, q[h] is first
/// rotated as launchRope would rotate it (the same bits), by the score
/// kernel itself. `scores` is scratch of cache.positions floats. The
/// selection keeps each block's slice of the keys in shared memory when it
/// takes at most maxStagedBytes (tests pass 0 to run the other path); how
/// it selects, `select`.
constexpr size_t kMaxStagedKeyBytes = 160 * 1024;
constexpr int64_t kMaxOneBlockPositions = 6144;
struct IndexerSelect {
  /// Up to this many attended positions (and at most kMaxOneBlockPositions,
  /// where the two measured level) one block selects alone, without the
  /// cluster's barriers; 0: the cluster always.
  int64_t oneBlockPositions = kMaxOneBlockPositions;
  /// The radix passes stop once the threshold is known by its top bits;
  /// false: all four always. The same selection either way.
  bool earlyStop = true;
  /// Blocks of the cluster, 8 or 16 (a non-portable size; 8 where the GPU
  /// cannot run it); 0: 8. Sixteen are faster past ~100k attended
  /// positions and slower below (docs/perf.md, thirty-first pass). The
  /// same selection either way.
  int clusterBlocks = 0;
};
/// Attended positions from which a step's second graph selects by clusters
/// of 16 blocks (KILN_CUDA_SELECT_BLOCKS=auto, the default;
/// KILN_CUDA_SELECT_WIDE_FROM overrides it): between the thirty-first
/// pass's measurements, 16 blocks +0.04 ms a GLM-5 step at 64k and -0.21
/// ms at 128k (docs/perf.md).
constexpr int64_t kWideSelectFrom = 98304;
/// The selection as before the seventeenth pass (docs/perf.md): by the
/// cluster at every count, four passes always (KILN_CUDA_CLUSTER_SELECT=1).
constexpr IndexerSelect kClusterSelect{0, false};
/// The cluster size launchDsaIndexer's selection takes over a cache of
/// `cachePositions` on the current GPU with `select` (16 asked for where
/// the GPU cannot run such clusters: 8).
cudaError_t dsaSelectBlocks(int64_t cachePositions, IndexerSelect select,
                            size_t maxStagedBytes, int &blocks);
cudaError_t launchDsaIndexer(const float *q, int64_t heads, int64_t dim,
                             const float *headWeights, DeviceCache cache,
                             const int32_t *position, int64_t topK, float scale,
                             float *scores, int32_t *selected, int32_t *count,
                             FaultSink fault, cudaStream_t s,
                             const QueryRope &rope = {},
                             size_t maxStagedBytes = kMaxStagedKeyBytes,
                             IndexerSelect select = {});

/// MoE router (CpuKernels.h moeRouter): logits[e] = x . gate row e (gate
/// [hidden, E]: gate.cols = hidden, gate.rows = E), then sigmoid or
/// softmax, the topK experts by p + bias (bias may be null; ties to the
/// lower id) in descending order of that score into ids, weights[k] =
/// p[ids[k]] (divided by max(their sum, 6.1035e-5) when normalize) times
/// routedScale. `scratch` holds routerScratchFloats(E) floats, all zero
/// before the first call (each call leaves them fit for the next): an
/// arrival count and a generation, the logits, then for GLM-5's shape each
/// logit with its call's tag (8-byte aligned where the scratch is). An F32
/// gate of 16-byte aligned rows (GLM-5's) runs as one kernel; any other as
/// a mat-vec and a one-block choice.
int64_t routerScratchFloats(int64_t experts);

/// kiln-fold-router: one rank's share of the router's logits, out[e] =
/// sum over h of gate[e][h] * g[h] * (p[h] + scale * x[h]) (gate F32 [hidden,
/// E], rows 16-byte aligned; p, x, g 16-byte aligned), one kernel whose
/// gate rows are held in registers across the wait.
cudaError_t launchRouterPartial(const float *p, const float *x,
                                const DeviceWeight &gate, const float *g,
                                float scale, float *out, cudaStream_t s);

/// kiln-fold-router composed (step.linear_router): the rank's share of the
/// router's logits as rows of a matrix made at load, dotted with the
/// concatenation of the linear's input (k values) and the rank's share of
/// the residual (cols - k values): y[e] = sum_c matrix[e][c] * [x ; share][c]
/// for e < rows. The matrix is `rows` rows of `cols` F32 values, rows
/// 16-byte aligned; x and share 16-byte aligned; k and cols multiples of 4.
struct RouterTail {
  const float *matrix = nullptr;
  int64_t rows = 0, cols = 0, k = 0;
  const float *share = nullptr;
  float *y = nullptr;
};

/// step.linear_router: y[0 .. w.rows) = W x as launchLinear (batch 1, the
/// same bits), and tail.y the tail's rows. A q8_0-split weight runs both
/// in one kernel: the first tail.rows blocks each dot one tail row, its
/// loads held in registers across the wait where the early prefetch is on,
/// before their share of W's rows (the grid is the linear's, one wave).
/// Other layouts run launchLinear, then the tail as its own kernel.
cudaError_t launchLinearRouter(const float *x, const DeviceWeight &w,
                               const RouterTail &tail, float *y,
                               cudaStream_t s);

/// How the q8_0-split kernel's tail blocks get their tail row (the calling
/// host thread's setting, read at launch): Held, its first float4s loaded
/// into registers before the wait (where the early prefetch is on); L2,
/// asked of the L2 before the wait and loaded after it, before the block's
/// W rows; Last, the same but after the block's W rows. KILN_CUDA_ROUTER_TAIL
/// = held | l2 | last sets it for a step (CudaBackend.cpp).
enum class RouterTailMode : int { Held = 0, L2 = 1, Last = 2 };
RouterTailMode routerTailMode();
void setRouterTailMode(RouterTailMode mode);

/// Whether launchDsaIndexer scores 32 heads of 128 over an f16 key cache
/// on the tensor cores (the calling host thread's setting, read at launch;
/// on by default): the f32 dot but for rounding, each query split into two
/// f16 parts (StepKernels.cu indexerScoresMmaKernel). KILN_CUDA_INDEXER_MMA
/// = 0 sets it off for a step.
bool indexerMma();
void setIndexerMma(bool on);

/// How launchMlaAttention launches its grid kernel (the calling host
/// thread's setting, read at launch). Every choice gives the same bits;
/// the defaults are the measured best on the H200 (docs/perf.md,
/// thirty-sixth pass), and the plugin reads KILN_CUDA_MLA_* to change them
/// for a step.
struct MlaLaunch {
  /// The kernel lets its dependents be scheduled after its chunks (before
  /// its grid barrier and combine), not at once after its wait, so that the
  /// mat-vecs after it (attn_v_b, attn_output) prefetch their weights beside
  /// its combine, not its row loads (KILN_CUDA_MLA_LATE_DEPENDENTS).
  bool lateDependents = true;
  /// Each block asks for more than half of a multiprocessor's shared
  /// memory, so that no two share one however busy the GPU is when they are
  /// placed (KILN_CUDA_MLA_ALONE).
  bool alone = true;
  /// Without a selection (positions 0 .. position), each block's first
  /// chunk of cache rows but the position's is loaded before the kernel
  /// waits for its predecessor: earlier steps wrote them. The kernels
  /// compiled for a rank's heads only (ModelShapes.h, family mla)
  /// (KILN_CUDA_MLA_EARLY_ROWS).
  bool earlyRows = true;
  /// The kernel compiled for 8 heads of 512 + 64 over an f16 cache
  /// (GLM-5's rank at tp = 8) takes chunks of 16 entries and makes their
  /// scores and partial outputs on the tensor cores, the query and the
  /// weights split into two f16 parts each: the same math rounded in
  /// another order, not the scalar kernel's bits (KILN_CUDA_MLA_MMA=0: the
  /// scalar kernel, chunks of 8).
  bool tensorCores = true;
};
MlaLaunch mlaLaunch();
void setMlaLaunch(const MlaLaunch &m);
/// Launches of the MLA kernel on the tensor cores (MlaLaunch::tensorCores)
/// by the calling host thread so far.
uint64_t mlaTensorCoreLaunches();

/// The registers a thread of the q8_0-split kernel uses without and with
/// the tail (kiln-cuda-ops --bench-router prints them).
cudaError_t linearRouterKernelRegisters(int &plain, int &withTail);

/// The composed router matrix of step.linear_router (StepOps.h's contract),
/// made at load: out is `experts` rows of k + shareCols floats, row e =
/// [M[e][0 .. k), C[e][0 .. shareCols)] with M[e][j] = float(sum over n <
/// hidden, in order, of (double(gate[e][n]) * double(norm[n])) *
/// double(w[n][j])) (no fused multiply-add: the CPU backend's bits) and
/// C[e][j] = gate[e][shareBegin + j] * norm[shareBegin + j]. gate is
/// [experts][hidden], w the linear's weight dequantised, [hidden][k].
cudaError_t launchComposeRouter(const float *gate, const float *norm,
                                const float *w, int64_t experts, int64_t hidden,
                                int64_t k, int64_t shareBegin,
                                int64_t shareCols, float *out, cudaStream_t s);

/// The router's choice alone from its logits (step.moe_choose), as
/// launchMoeRouter makes it after them: one block.
cudaError_t launchMoeChoose(const float *logits, int64_t experts,
                            const float *bias, int64_t topK, Gating gating,
                            bool normalize, float routedScale, int32_t *ids,
                            float *weights, cudaStream_t s);
/// A router's chosen ids handed to the routed experts' kernels without
/// waiting for the router's grid to end (docs/cuda.md, "The router's ids
/// by tags"): launchMoeRouter, given one, fills it in where its kernel
/// publishes them (GLM-5's shape compiled in, no input norm, inside a step
/// with all-reduce epochs that has had a call: the tag is the step's epoch
/// word plus one, which no other step's tags share), else clears it; and
/// launchMoeExperts, given one that is filled in, may poll the words for
/// its ids instead of waiting. `words`: kTaggedIdCopies copies of the topK
/// (id, tag) words, kTaggedIdStride words apart (the experts' 512 blocks
/// spread over as many lines of the L2); `stepWord`: the step's epoch word.
struct TaggedIds {
  const uint64_t *words = nullptr;
  const uint32_t *stepWord = nullptr;
  int64_t k = 0;
};
constexpr int kTaggedIdCopies = 16, kTaggedIdStride = 16;

/// With `norm` (step.rms_norm_router): x is first RMS-normalised with it
/// into `normalised` (x.size values), and the router reads that. The F32
/// router kernel folds the norm in (its rows' warps take the squares from
/// the x values they read, each logit is divided by the rms, and each
/// block writes its share of `normalised`); other gates run
/// launchRmsNorm first.
cudaError_t launchMoeRouter(const float *x, const DeviceWeight &gate,
                            const float *bias, int64_t topK, Gating gating,
                            bool normalize, float routedScale, float *scratch,
                            int32_t *ids, float *weights, cudaStream_t s,
                            const InputNorm *norm = nullptr,
                            float *normalised = nullptr,
                            TaggedIds *tagged = nullptr);

/// Whether launchMoeRouter's GLM-5 form makes its choice in block 0 with
/// one block barrier, each warp ranking its experts by shuffles and warp 0
/// the warps' candidates (StepKernels.cu routerChooseGlm5Warps), instead of
/// through shared memory with three: the same ids and weights, bit for bit.
/// The calling host thread's setting, read at launch; on by default,
/// KILN_CUDA_ROUTER_WARPS = 0 sets it off for a step (docs/perf.md,
/// fifty-eighth pass).
bool routerWarps();
void setRouterWarps(bool on);
/// How many of the calling host thread's launchMoeRouter calls made that
/// choice.
uint64_t routerWarpChoiceLaunches();

/// The routed experts (CpuKernels.h moeExperts), reading only the chosen
/// experts' rows. gate and up are [hidden, F, E] weights (rows E*F), or
/// gate is a fused gate_up [hidden, 2F, E] (rows E*2F; expert e's rows
/// e*2F .. e*2F+F-1 are its gate, the next F its up) and up is null; down
/// is [F, hidden, E] (cols F, rows E*hidden). out[hidden] = sum over
/// k ascending of weights[k] * down_e(silu(gate_e . x) * (up_e . x)),
/// e = ids[k], plus addend[hidden] when it is given (added last, as an add
/// op after the experts would). An id outside [0, E) faults
/// (ExpertOutOfRange) and that expert contributes nothing. `act` is scratch
/// of moeExpertsActFloats(k, F, hidden, shared) floats; out may alias x or
/// the addend.
///
/// With `shared` (kiln-fuse-shared-expert; no addend then), the output
/// also has the shared expert's down_s(silu(gate_s . x) * (up_s . x)) added
/// last, as the addend it replaces. Where the routed experts take the Q4_K /
/// Q5_K kernels and the shared expert is Q8_0 in its split layout with
/// F_s = 256 (GLM-5 at tp=8), it is a ninth expert of weight 1 inside
/// them: its gate/up rows in blocks after the routed ones, its down rows in
/// each down block beside theirs. Otherwise it runs first as the unfused
/// ops' kernels (two mat-vecs, then the swiglu mat-vec) and its output is
/// the addend.
struct SharedExpert {
  DeviceWeight gate, up, down;
};
int64_t moeExpertsActFloats(int64_t k, int64_t ffn, int64_t hidden,
                            const SharedExpert *shared);
/// How many of the calling host thread's launchMoeExperts calls ran a
/// shared expert inside the routed kernels (for the checks and
/// KILN_CUDA_GRAPH_STATS).
uint64_t moeSharedInsideLaunches();
/// How many routed gate/up and down kernels of the calling host thread's
/// launchMoeExperts calls were the bulk-copy kernels (Q4_K, Q5_K, Q2_K,
/// Q3_K rows copied whole into shared memory), not the generic ones.
uint64_t moeBulkLaunches();
/// How many of the calling host thread's launchMoeExperts calls took their
/// router's ids by tags (TaggedIds).
uint64_t moeTaggedIdLaunches();
/// A timing probe (KILN_CUDA_EXPERTS_INT8_X=1; off unless set): the
/// calling host thread's launchMoeExperts calls whose routed gate/up rows
/// are Q4_K of glm5::kHidden values with F = 256 (GLM-5 at tp=8) run the
/// gate/up kernel that rounds x to an int8 grid (groups of 16, each scaled
/// by its largest |x| / 127: quantdot::int8RoundGroups) and dots by `dp4a`.
/// The result is then the experts of the rounded x, not of x: the step no
/// longer follows the CPU reference, so this only measures what activations
/// rounded in the IR would gain (docs/perf.md, fortieth pass).
void setExpertsInt8X(bool on);
bool expertsInt8X();
/// How many of the calling host thread's launchMoeExperts calls ran that
/// kernel (for the checks).
uint64_t moeInt8XLaunches();
cudaError_t launchMoeExperts(const float *x, int64_t hidden, int64_t ffn,
                             int64_t experts, const int32_t *ids,
                             const float *weights, int64_t k,
                             const DeviceWeight &gate, const DeviceWeight *up,
                             const DeviceWeight &down, float *act,
                             const float *addend, float *out, FaultSink fault,
                             cudaStream_t s,
                             const SharedExpert *shared = nullptr,
                             const TaggedIds *tagged = nullptr);

/// Whether the step launches of the calling host thread ask for an
/// overlapped start after their predecessor (programmatic dependent launch,
/// Launch.cuh). On by default.
void setOverlappedLaunches(bool on);
bool overlappedLaunches();

/// Whether the mat-vecs the calling host thread launches ask the L2 for
/// their weights before waiting for their predecessor. On by default; the
/// CUDA plugin turns it off for the ops that follow a collective
/// (backend::followsOrdered): those bytes in flight slow the collective,
/// which is latency-bound, more than they save (docs/perf.md, fourteenth
/// pass).
void setEarlyPrefetch(bool on);
bool earlyPrefetch();
/// Where the early prefetch is off (an op after a collective), how many of
/// its warps' passes of 512 values a q8_0-split mat-vec asks the L2 for
/// before its wait all the same (0: none): a fraction of the bytes beside
/// the collective, where the whole measured slower (docs/perf.md,
/// sixty-first pass). The calling host thread's setting, read at launch;
/// the CUDA plugin sets KILN_CUDA_QUIET_PREFETCH's (default 1).
void setQuietPrefetchPasses(int passes);
int quietPrefetchPasses();

/// Whether the launches of the calling host thread run the kernels compiled
/// for their shapes where there is one, for each family whose bit `families`
/// holds (none unless set; the plugin sets its switch's in enter()).
void setShapeSpecialised(unsigned families);
bool shapeSpecialised(ShapeFamily family);
/// Launches of a fixed-width kernel by the calling host thread so far.
uint64_t shapeSpecialisedLaunches();
/// Counts one such launch (the launch functions call it).
void noteShapeSpecialised();

/// A draw's inputs in device memory (support/DrawKey.h): the sampling
/// words and the position, read when the kernel runs (a captured graph
/// draws with each replay's words); words null: the plain argmax. Bad words
/// are reported to `fault` (SamplingOutOfRange) and the result is -1.
struct DrawInputs {
  const int32_t *words = nullptr;
  const int32_t *position = nullptr;
  FaultSink fault;
  /// The words' count (DrawKey.h: kDrawWords or the adjusting form's;
  /// anything else is the first form's kTemperatureWords; the adjusting
  /// form's adjustments are launchAdjustLogits's, before the draw's
  /// kernels). Only launchArgmax and launchNucleusArgmax,
  /// which see the whole vocabulary, cut (a nucleus, top-k, min-p); the
  /// kernels of a part report a cut as a fault.
  int count = 0;
};

/// y[0, n) = x[0, n) adjusted by the sampling words' adjusting form
/// (DrawKey.h adjustPart: x holds tokens base .. base + n of a vocabulary
/// of `vocab`), read when the kernel runs; bad words are reported to
/// draw.fault (SamplingOutOfRange, the first bad word) and leave y = x.
cudaError_t launchAdjustLogits(const float *x, int64_t n, int64_t base,
                               int64_t vocab, float *y, cudaStream_t s,
                               DrawInputs draw);

/// *out = the index of the largest of n values (ties to the lowest index),
/// or of the largest key of a draw.
cudaError_t launchArgmax(const float *x, int64_t n, int32_t *out,
                         cudaStream_t s, DrawInputs draw = {});

/// One rank's candidate for a distributed argmax: best->value = the
/// largest of its n values (or keys, value i's key made for index base +
/// i), best->index = base + its local index (ties to the lowest).
struct ArgmaxCandidate {
  float value;
  int32_t index;
};
cudaError_t launchArgmaxCandidate(const float *x, int64_t n, int32_t base,
                                  ArgmaxCandidate *best, cudaStream_t s,
                                  DrawInputs draw = {});

/// *out = the index of the best of `ranks` candidates in rank order (a
/// later one wins only when strictly larger).
cudaError_t launchPickCandidate(const ArgmaxCandidate *candidates, int ranks,
                                int32_t *out, cudaStream_t s);

/// The candidate of launchArgmaxCandidate as two floats of a [2 ranks]
/// vector that is zero elsewhere: slots[me] = its value, slots[ranks + me] =
/// its index (exact below 2^24), so that a sum over the ranks' vectors (an
/// all-reduce that adds zeros) gathers every candidate exactly. For ranks
/// that exchange through one GPU's memory (KILN_RUN_ONE_GPU).
cudaError_t launchArgmaxSlots(const float *x, int64_t n, int32_t base,
                              int ranks, int me, float *slots, cudaStream_t s,
                              DrawInputs draw = {});

/// launchArgmax's index by a grid of blocks, for a vocabulary held whole
/// with the words that ask for a cut (DrawKey.h: top-k's in three passes
/// of counts, the nucleus's in three of masses, each summed by the blocks,
/// then the best key among the kept tokens; any other words too, as
/// launchArgmax takes them): eight kernels.
/// `scratch` holds nucleusScratchBytes(n) bytes, zero before the first
/// launch (each launch leaves it so).
uint64_t nucleusScratchBytes(int64_t n);
cudaError_t launchNucleusArgmax(const float *x, int64_t n, int32_t *out,
                                void *scratch, cudaStream_t s,
                                DrawInputs draw = {});

/// launchPickCandidate over the summed slots of launchArgmaxSlots.
cudaError_t launchPickSlots(const float *slots, int ranks, int32_t *out,
                            cudaStream_t s);

/// Reorders an all-gather's rank-major result src[ranks][outer][inner] into
/// dst[outer][ranks][inner] (a gather on a dim after the first).
cudaError_t launchGatherReorder(const float *src, int64_t ranks, int64_t outer,
                                int64_t inner, float *dst, cudaStream_t s);

/// Fills `bytes` bytes of weight data of `type` with random valid blocks
/// (scales finite and small, quants uniform) from `seed`, so a benchmark
/// reads real-looking data without a file.
cudaError_t launchFillRandomBlocks(GGMLType type, uint8_t *data, uint64_t bytes,
                                   uint64_t seed, cudaStream_t s);

/// Fills n values of a cache element type with random values in [-1, 1).
cudaError_t launchFillRandomCache(DeviceCache cache, uint64_t seed,
                                  cudaStream_t s);

} // namespace kiln::cuda

#endif // KILN_BACKENDS_CUDA_STEPKERNELS_H
