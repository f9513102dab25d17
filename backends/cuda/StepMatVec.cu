//===- StepMatVec.cu - The mat-vec-shaped step ops ------------------------===//
//
// linear, the routed experts' gate/up and down products, and (through
// launchLinear) the router's logits: every dot product is one warp's
// warpDotRow (QuantDot.cuh) over the weight's own GGUF blocks, or, for a
// linear weight in a split layout (StepKernels.h WeightLayout), one warp's
// pass over its planes (linearQ8SplitKernel, linearKSplitKernel,
// linearNibbleSplitKernel). This file is compiled without --fmad=false: the
// dots may fuse multiply-adds; results agree with the CPU within float
// rounding, as StepKernels.h promises, and are deterministic (fixed lane
// layouts, warp trees and combine orders).
//
// Rows per warp. For the types with a multi-row routine (QuantDot.cuh's
// warpDotRows: Q8_0, Q4_K, Q5_K, Q6_K) a warp dots kRows consecutive rows
// with the same x, so x loads are shared and kRows rows' weight loads are in
// flight together; other types take one row per warp.
//
// Split-K. A matrix with few rows would leave most of the GPU idle, so a
// row group may be cut into `splits` (1..8) segments of whole units
// (unitValues: segmentUnitValues, so that every segment starts 16-aligned in
// x, on a block boundary, and fills whole warp passes), one warp each, in
// the same block of warps (a block is splits * (8 / splits) warps); the
// segments' sums are added in segment order through shared memory. The
// split count depends only on the shapes, so the sums are the same bits on
// every run.
//
// Launch checks are those of StepKernels.cu: invalid host geometry returns
// cudaErrorInvalidValue; no allocation, synchronisation or host read, so
// every launch can be captured in a CUDA graph.
//
//===----------------------------------------------------------------------===//
#include "StepKernels.h"

#include "DeviceCommon.cuh"
#include "Launch.cuh"
#include "MatVec.h"
#include "ModelShapes.h"
#include "QuantDot.cuh"
#include "SplitLayout.h"
#include "Warp.cuh"

#include <climits>
#include <initializer_list>
#include <optional>
#include <type_traits>
#include <vector>

namespace kiln::cuda {

namespace {

/// Most warps per block of every kernel here.
constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * kWarp;
/// Rows per warp where warpDotRows has a multi-row routine.
constexpr int kRows = 4;
/// Split row groups until about this many warps run (an H200 has 132 SMs;
/// multi-row warps hold many loads each, so ~32 warps an SM suffice)...
constexpr int64_t kTargetWarps = 4096;
/// ...but keep at least this many weight bytes per row segment.
constexpr uint64_t kMinSegmentBytes = 512;

/// Where a weight's values live: `rows` rows of `cols` values, rowBytes
/// each, in blocks of blockValues values / blockBytes bytes; rows are split
/// in units of unitValues values.
struct RowGeometry {
  GGMLType type;
  int64_t rows, cols;
  uint64_t rowBytes;
  int32_t blockValues, blockBytes, unitValues;
};

/// Fills `g`; false when the weight is unusable (usableRowBytes).
bool geometryOf(const DeviceWeight &w, RowGeometry &g) {
  std::optional<uint64_t> bytes = usableRowBytes(w);
  if (!bytes)
    return false;
  const GGMLTypeTraits &t = traitsOf(w.type);
  const int32_t blockValues = int32_t(t.blockSize);
  g = RowGeometry{w.type,
                  w.rows,
                  w.cols,
                  *bytes,
                  blockValues,
                  int32_t(t.blockBytes),
                  segmentUnitValues(w.type, blockValues)};
  return true;
}

/// Rows per warp for a weight of `type`: kRows or 1.
int rowsPerWarp(GGMLType type) { return hasMultiRowDot(type) ? kRows : 1; }

/// Segments per row for `groups` row groups (1 .. maxSplits): enough warps
/// for kTargetWarps, no segment under kMinSegmentBytes or a unit, and then
/// the fewest segments with the same longest segment (no idle warps).
int splitsFor(int64_t groups, const RowGeometry &g, int maxSplits) {
  const int64_t units = (g.cols + g.unitValues - 1) / g.unitValues;
  int64_t s = (kTargetWarps + groups - 1) / (groups > 0 ? groups : 1);
  s = s < maxSplits ? s : maxSplits;
  s = s < units ? s : units;
  while (s > 1 && g.rowBytes / uint64_t(s) < kMinSegmentBytes)
    --s;
  if (s <= 1)
    return 1;
  const int64_t longest = (units + s - 1) / s;
  return int((units + longest - 1) / longest);
}

/// Warps per block for `splits` segments per item: whole items only.
int warpsPerBlock(int splits) { return splits * (kWarpsPerBlock / splits); }

/// Segment `part` of `parts` of R rows (row0 + r * rowBytes, r < nrows)
/// dotted with the matching part of x, by the whole warp, into v (0 for an
/// empty segment).
template <int R>
__device__ inline void segmentDots(const RowGeometry &g, const uint8_t *row0,
                                   int nrows, const float *x, int part,
                                   int parts, float (&v)[R]) {
  const int64_t units = (g.cols + g.unitValues - 1) / g.unitValues;
  int64_t begin = units * part / parts * g.unitValues;
  int64_t end = units * (part + 1) / parts * g.unitValues;
  begin = begin < g.cols ? begin : g.cols;
  end = end < g.cols ? end : g.cols;
  if (begin >= end) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      v[r] = 0.f;
    return;
  }
  warpDotRows<R>(g.type, row0 + begin / g.blockValues * g.blockBytes,
                 g.rowBytes, nrows, x + begin, end - begin, v);
}

//===----------------------------------------------------------------------===//
// Linear: item = (row group, b), group-major so a block's warps share weight
// rows when batch > 1; a row group is R consecutive rows n0 .. n0 + R - 1
// (fewer at the end); `splits` consecutive warps take its segments, and
// lane r of the first writes row n0 + r.
//===----------------------------------------------------------------------===//

struct LinearArgs {
  RowGeometry w;
  const uint8_t *data;
  const float *x;
  int64_t batch, rowsPerBatch;
  bool stacked;
  int splits;
  float *y;
  bool prefetch; ///< the weights' early prefetch (earlyPrefetch())
};

/// The end of a row group's dots (every thread of the block calls it): an
/// unsplit item's lane r writes row r's sum; a split item's warps leave
/// their segment sums in `partials` and its first warp adds them in segment
/// order, so the sums are the same bits on every run.
template <int R>
__device__ inline void
storeRowSums(const float (&v)[R], bool valid, int nrows, int64_t out, int part,
             int splits, float (&partials)[kWarpsPerBlock][R], float *y) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (splits == 1) { // uniform over the block
    if (valid)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (lane == r && r < nrows)
          y[out + r] = v[r];
    return;
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r)
      partials[warp][r] = valid ? v[r] : 0.f;
  __syncthreads();
  if (valid && part == 0 && lane < nrows) {
    float sum = partials[warp][lane];
    for (int p = 1; p < splits; ++p)
      sum += partials[warp + p][lane];
    y[out + lane] = sum;
  }
}

/// Lane r < nrows of the calling warp prefetches row r's bytes [begin,
/// end) of `row0` (rows rowBytes apart) into the L2.
__device__ inline void prefetchRows(const uint8_t *row0, uint64_t rowBytes,
                                    int nrows, uint64_t begin, uint64_t end) {
  const int lane = threadIdx.x % kWarp;
  if (lane < nrows && end > begin)
    prefetchL2(row0 + uint64_t(lane) * rowBytes + begin, end - begin);
}

template <int R>
__global__ void __launch_bounds__(kThreads) linearKernel(LinearArgs a) {
  allowDependents();
  __shared__ float partials[kWarpsPerBlock][R];
  const int warp = threadIdx.x / kWarp;
  const int itemsPerBlock = int(blockDim.x / kWarp) / a.splits;
  const int64_t groups = (a.rowsPerBatch + R - 1) / R;
  const int64_t item = int64_t(blockIdx.x) * itemsPerBlock + warp / a.splits;
  const int part = warp % a.splits;
  const bool valid = item < a.batch * groups;
  // This warp's weight bytes, while the predecessor finishes (not after a
  // collective: earlyPrefetch()).
  if (valid && a.prefetch) {
    const int64_t gi = item / a.batch, b = item % a.batch, n0 = gi * R;
    const int rows = int(a.rowsPerBatch - n0 < R ? a.rowsPerBatch - n0 : R);
    const int64_t row = a.stacked ? b * a.rowsPerBatch + n0 : n0;
    const int64_t units = (a.w.cols + a.w.unitValues - 1) / a.w.unitValues;
    int64_t begin = units * part / a.splits * a.w.unitValues;
    int64_t end = units * (part + 1) / a.splits * a.w.unitValues;
    begin = begin < a.w.cols ? begin : a.w.cols;
    end = end < a.w.cols ? end : a.w.cols;
    prefetchRows(a.data + uint64_t(row) * a.w.rowBytes, a.w.rowBytes, rows,
                 uint64_t(begin / a.w.blockValues) * a.w.blockBytes,
                 uint64_t((end + a.w.blockValues - 1) / a.w.blockValues) *
                     a.w.blockBytes);
  }
  waitForPredecessor();
  int64_t out = 0;
  int nrows = 0;
  float v[R];
  if (valid) {
    const int64_t gi = item / a.batch, b = item % a.batch, n0 = gi * R;
    nrows = int(a.rowsPerBatch - n0 < R ? a.rowsPerBatch - n0 : R);
    const int64_t row = a.stacked ? b * a.rowsPerBatch + n0 : n0;
    out = b * a.rowsPerBatch + n0;
    segmentDots<R>(a.w, a.data + uint64_t(row) * a.w.rowBytes, nrows,
                   a.x + b * a.w.cols, part, a.splits, v);
  }
  storeRowSums<R>(v, valid, nrows, out, part, a.splits, partials, a.y);
}

/// Linear of an F32 weight of 16-byte aligned rows, batch 1 (GLM-5's
/// indexer head-weight projection, 6,144 -> 32, beside q_a in one fused
/// op): warp w of a block takes part w % splits of row (block, w /
/// splits) with its first float4s held in registers across the wait
/// (DeviceCommon.cuh holdF32Part), and the block adds its parts in order.
/// The generic kernel's dependent loads left that 0.8 MB projection ~12 us
/// behind its siblings on the path to the indexer.
struct F32LinearArgs {
  const float4 *w;
  const float4 *x;
  int64_t rows, cols4;
  int splits;
  float *y;
  /// LiveRows: while *livePosition < liveFrom only rows < liveRows (null:
  /// every row, always).
  const int32_t *livePosition;
  int32_t liveFrom;
  int64_t liveRows;
  /// kNorm (step.rms_norm_linear): x is first RMS-normalised with these.
  const float4 *normWeight;
  float normEps;
};

/// kNorm: each row dotted with x * g, its sum divided by the rms of x, whose
/// squares the row's warps take from the x values they read anyway (as the
/// q8_0-split kernel's Q8Input::Norm): no norm kernel, no normalised vector.
template <bool kNorm>
__global__ void __launch_bounds__(kThreads) linearF32Kernel(F32LinearArgs a) {
  __shared__ float partials[kWarpsPerBlock];
  // The position is a step input (LiveRows): read before the wait, so rows
  // not needed hold no loads either.
  const int64_t rows =
      a.livePosition && *a.livePosition < a.liveFrom ? a.liveRows : a.rows;
  if constexpr (!kNorm) {
    heldF32Block(a.w, a.x, rows, a.cols4, a.splits, partials, a.y);
  } else {
    __shared__ float squares[kWarpsPerBlock], blockRms;
    heldF32NormedBlock(a.w, a.x, a.normWeight, rows, a.cols4, a.splits,
                       a.normEps, partials, squares, &blockRms, a.y);
  }
}

//===----------------------------------------------------------------------===//
// Linear over the q8_0-split layout (StepKernels.h WeightLayout): the same
// items and split-K as linearKernel, in units of one warp pass of 512
// values: lane l takes values [16 l, 16 l + 16) of the pass, one aligned
// 16-byte quant load and one scale per row (lanes 2m and 2m + 1 share a
// 32-value block's scale), and the 16 x values as four float4 loads shared
// by the R rows. A row's sum is sum over blocks of d * (sum q x).
//===----------------------------------------------------------------------===//

constexpr int64_t kSplitPass = 16 * kWarp;

/// The calling warp's work in a split-layout mat-vec (the items and
/// split-K of linearKernel, in whole warp passes): item (row group, b) of R
/// rows n0 .., its part `part` of `splits`, and its passes [first, last).
struct SplitItem {
  bool valid;
  int nrows, part;
  int64_t b, row, out, first, last;
};

/// splitItem for items of `rows` rows, a count known only at run time.
__device__ inline SplitItem splitItemOf(int rows, int64_t batch,
                                        int64_t rowsPerBatch, bool stacked,
                                        int splits, int64_t passes) {
  const int warp = threadIdx.x / kWarp;
  const int itemsPerBlock = int(blockDim.x / kWarp) / splits;
  const int64_t groups = (rowsPerBatch + rows - 1) / rows;
  const int64_t item = int64_t(blockIdx.x) * itemsPerBlock + warp / splits;
  SplitItem it;
  it.part = warp % splits;
  it.valid = item < batch * groups;
  const int64_t gi = item / batch, n0 = gi * rows;
  it.b = item % batch;
  it.nrows =
      it.valid ? int(rowsPerBatch - n0 < rows ? rowsPerBatch - n0 : rows) : 0;
  it.row = stacked ? it.b * rowsPerBatch + n0 : n0;
  it.out = it.b * rowsPerBatch + n0;
  it.first = passes * it.part / splits;
  it.last = passes * (it.part + 1) / splits;
  return it;
}

template <int R>
__device__ inline SplitItem splitItem(int64_t batch, int64_t rowsPerBatch,
                                      bool stacked, int splits,
                                      int64_t passes) {
  return splitItemOf(R, batch, rowsPerBatch, stacked, splits, passes);
}

/// What linearQ8SplitKernel dots its rows with: x, x RMS-normalised
/// (step.rms_norm_linear), or silu(x) * up (step.swiglu_linear).
enum class Q8Input { Plain, Norm, Swiglu };

struct Q8SplitArgs {
  const int8_t *quants;
  const unsigned short *scales;
  int64_t cols;
  const float *x;
  /// Q8Input::Norm: x is first RMS-normalised with these (InputNorm).
  const float *normWeight;
  float normEps;
  /// Q8Input::Swiglu: the input is silu(x) * up.
  const float *up;
  /// LiveRows: while *livePosition < liveFrom, rowsPerBatch is liveRows
  /// and splits liveSplits (null: every row, always).
  const int32_t *livePosition;
  int32_t liveFrom;
  int64_t liveRows;
  int liveSplits;
  int64_t batch, rowsPerBatch;
  bool stacked;
  int splits;
  float *y;
  /// The warp's passes whose weights it asks the L2 for before its wait
  /// (all where earlyPrefetch(), else quietPrefetchPasses()): 0 none,
  /// INT32_MAX all.
  int prefetchPasses;
  /// step.linear_router's tail (linearQ8SplitKernel's kTail only).
  struct Tail {
    const float4 *w, *share;
    int64_t rows, cols4, k4;
    float *y;
    /// How a block's tail row reaches it (RouterTailMode).
    int mode;
    /// Whether the row may be held before the wait (earlyPrefetch()).
    /// Derivable from prefetchPasses == INT32_MAX, but derived in the
    /// kernel it cost linearQ8SplitTailKernel 8 more bytes of spill on
    /// sm_100 and sm_120 (80 registers either way).
    bool early;
  } tail;
};

/// Float4s of a tail row a lane holds across the wait: a block's warps
/// split a row of GLM-5's (2,048 + 768 values at tp = 8, 704 float4s)
/// into parts of 88 float4s, three a lane.
constexpr int kTailHeld = 3;
/// Blocks a multiprocessor must hold of the kernel with the tail: the plain
/// kernel's three (74 registers a thread on sm_90), so that the tail's
/// registers do not shrink the linear's wave (126 without the bound).
constexpr int kTailBlocksPerSm = 3;

/// The calling warp's part [begin, end) of a tail row of `cols4` float4s,
/// and, where `hold`, its first kTailHeld float4s of row blockIdx.x
/// (weights: no hazard crosses the wait).
__device__ inline void holdTailRow(const Q8SplitArgs::Tail &t, bool hold,
                                   int64_t &begin, int64_t &end,
                                   float4 (&held)[kTailHeld]) {
  const int warps = int(blockDim.x) / kWarp, warp = int(threadIdx.x) / kWarp,
            lane = int(threadIdx.x) % kWarp;
  begin = t.cols4 * warp / warps;
  end = t.cols4 * (warp + 1) / warps;
  if (t.mode != int(RouterTailMode::Held) && hold) {
    // The warp's part of the row asked of the L2 instead (one bulk
    // prefetch by lane 0), loaded after the wait.
    if (lane == 0 && int64_t(blockIdx.x) < t.rows && end > begin)
      prefetchL2(t.w + int64_t(blockIdx.x) * t.cols4 + begin,
                 uint64_t(end - begin) * sizeof(float4));
    hold = false;
  }
  hold = hold && int64_t(blockIdx.x) < t.rows;
  const float4 *r = t.w + (hold ? int64_t(blockIdx.x) : 0) * t.cols4;
#pragma unroll
  for (int k = 0; k < kTailHeld; ++k) {
    const int64_t c = begin + lane + int64_t(k) * kWarp;
    held[k] = hold && c < end ? __ldg(r + c) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

/// The tail's rows blockIdx.x, blockIdx.x + gridDim.x, ..., each dotted
/// with [x ; share] by all the block's warps (their parts added in warp
/// order: the same bits on every run); the first from `held` where it was
/// held. Every thread of the block calls it, after the wait.
__device__ inline void tailRows(const Q8SplitArgs::Tail &t, const float4 *x,
                                bool held1, int64_t begin, int64_t end,
                                const float4 (&held)[kTailHeld]) {
  __shared__ float sums[kWarpsPerBlock];
  const int warps = int(blockDim.x) / kWarp, warp = int(threadIdx.x) / kWarp,
            lane = int(threadIdx.x) % kWarp;
  const auto xAt = [&](int64_t c) {
    return c < t.k4 ? __ldg(x + c) : __ldg(t.share + (c - t.k4));
  };
  for (int64_t row = blockIdx.x; row < t.rows; row += gridDim.x) {
    const float4 *r = t.w + row * t.cols4;
    const bool fromHeld = held1 && row == int64_t(blockIdx.x);
    float sum = 0.f;
    const auto add = [&sum](float4 u, float4 v) { sum = dotAdd4(u, v, sum); };
#pragma unroll
    for (int k = 0; k < kTailHeld; ++k) {
      const int64_t c = begin + lane + int64_t(k) * kWarp;
      if (c < end)
        add(fromHeld ? held[k] : __ldg(r + c), xAt(c));
    }
    for (int64_t c = begin + lane + int64_t(kTailHeld) * kWarp; c < end;
         c += kWarp)
      add(__ldg(r + c), xAt(c));
    sum = warpSum(sum);
    if (lane == 0)
      sums[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = sums[0];
      for (int w = 1; w < warps; ++w)
        total += sums[w];
      t.y[row] = total;
    }
    __syncthreads();
  }
}

template <bool kAlignedX>
__device__ __forceinline__ float4 loadX4(const float *x) {
  if constexpr (kAlignedX)
    return __ldg(reinterpret_cast<const float4 *>(x));
  else
    return make_float4(__ldg(x), __ldg(x + 1), __ldg(x + 2), __ldg(x + 3));
}

__device__ __forceinline__ float4 mul4(float4 a, float4 b) {
  return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}

__device__ __forceinline__ float squares4(float4 a, float s) {
  s = fmaf(a.x, a.x, s);
  s = fmaf(a.y, a.y, s);
  s = fmaf(a.z, a.z, s);
  return fmaf(a.w, a.w, s);
}

/// storeRowSums of W (x * g) for an input normalised on the fly: `sq` is
/// the sum of squares of the x values the calling warp read, so the warps
/// of one item (its `splits` parts) together hold sum(x^2); the item's
/// writer divides each row's sum by rms = sqrt(sum(x^2) / cols + eps).
/// y = (W (x * g)) / rms equals W (x / rms * g), the unfused rms_norm and
/// linear, within rounding.
template <int R>
__device__ inline void
storeNormedRowSums(const float (&v)[R], float sq, bool valid, int nrows,
                   int64_t out, int part, int splits, int64_t cols, float eps,
                   float (&partials)[kWarpsPerBlock][R], float *y) {
  __shared__ float squares[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      partials[warp][r] = valid ? v[r] : 0.f;
    squares[warp] = sq;
  }
  __syncthreads();
  if (valid && part == 0 && lane < nrows) {
    float sum = partials[warp][lane], total = squares[warp];
    for (int p = 1; p < splits; ++p) {
      sum += partials[warp + p][lane];
      total += squares[warp + p];
    }
    y[out + lane] = sum / sqrtf(total / float(cols) + eps);
  }
}

/// silu(g) * u per value, as launchSwiglu writes them.
__device__ __forceinline__ float4 swiglu4(float4 g, float4 u) {
  return make_float4(silu(g.x) * u.x, silu(g.y) * u.y, silu(g.z) * u.z,
                     silu(g.w) * u.w);
}

/// kCols > 0: the kernel for one width (ModelShapes.h), launched only where
/// cols == kCols, x is 16-byte aligned and every item has R rows (the rows,
/// and the live rows, a multiple of R), so that a row's offsets are
/// constants and no row is checked: the same products in the same order as
/// the general kernel (kCols = 0), the same bits.
/// kTail: step.linear_router's tail rows too (tailRows), before the
/// block's share of W's rows (Plain input, x 16-byte aligned).
template <int R, bool kAlignedX, Q8Input kInput, int kCols, bool kTail>
__device__ __forceinline__ void linearQ8SplitBlock(const Q8SplitArgs &a) {
  static_assert(!kTail || (kAlignedX && kInput == Q8Input::Plain));
  constexpr bool kNormX = kInput == Q8Input::Norm;
  constexpr bool kFixed = kCols > 0;
  static_assert(!kFixed || (kAlignedX && kCols % 32 == 0));
  const int64_t cols = kFixed ? int64_t(kCols) : a.cols;
  allowDependents();
  __shared__ float partials[kWarpsPerBlock][R];
  const int lane = threadIdx.x % kWarp;
  // The rows this step needs: fewer, split further, below the live rows'
  // position (LiveRows: a step input, read before the wait).
  int64_t rowsPerBatch = a.rowsPerBatch;
  int splits = a.splits;
  if (a.livePosition && *a.livePosition < a.liveFrom) {
    rowsPerBatch = a.liveRows;
    splits = a.liveSplits;
  }
  const SplitItem it = splitItem<R>(a.batch, rowsPerBatch, a.stacked, splits,
                                    (cols + kSplitPass - 1) / kSplitPass);
  const bool valid = it.valid;
  const int nrows = it.nrows, part = it.part;
  // Whether row r of the item is in the matrix (kFixed: all R of a valid
  // item are).
  const auto rowIn = [&](int r) { return kFixed ? valid : r < nrows; };
  const int64_t b = it.b, row = it.row, out = it.out, first = it.first,
                last = it.last;
  const int8_t *q0 = a.quants + row * cols;
  const unsigned short *d0 = a.scales + row * (cols / 32);
  // This warp's quants and scales (at most a.prefetchPasses passes of them),
  // while the predecessor finishes.
  if (a.prefetchPasses > 0) {
    const int64_t from = first * kSplitPass,
                  whole = last * kSplitPass < cols ? last * kSplitPass : cols,
                  to = whole - from > a.prefetchPasses * int64_t(kSplitPass)
                           ? from + a.prefetchPasses * int64_t(kSplitPass)
                           : whole;
    prefetchRows(reinterpret_cast<const uint8_t *>(q0), uint64_t(cols), nrows,
                 uint64_t(from), uint64_t(to));
    prefetchRows(reinterpret_cast<const uint8_t *>(d0), uint64_t(cols / 16),
                 nrows, uint64_t(from / 16), uint64_t(to / 16));
  }
  float4 held[kTail ? kTailHeld : 1];
  int64_t tailBegin = 0, tailEnd = 0;
  if constexpr (kTail)
    holdTailRow(a.tail, a.tail.early, tailBegin, tailEnd, held);
  waitForPredecessor();
  if constexpr (kTail)
    if (a.tail.mode != int(RouterTailMode::Last))
      tailRows(a.tail, reinterpret_cast<const float4 *>(a.x),
               a.tail.early && a.tail.mode == int(RouterTailMode::Held),
               tailBegin, tailEnd, held);
  float v[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    v[r] = 0.f;
  // kNormX: the squares of the x values this warp reads (every warp of an
  // item, whether its rows are valid or not, reads its part of x).
  float sq = 0.f;
  if (valid || kNormX) {
    const float *x = a.x + b * cols;
    // Two passes at a time, but for the normalised kernel of any width:
    // its x, g and quants of two passes spilled at its 80 registers (the
    // same products in the same order either way; docs/perf.md, 28th pass).
#pragma unroll(kNormX && !kFixed ? 1 : 2)
    for (int64_t p = first; p < last; ++p) {
      const int64_t c = p * kSplitPass + 16 * lane;
      // cols is a multiple of 32: c + 16 <= cols otherwise (kFixed: known
      // false for every lane where the width is whole passes).
      if ((!kFixed || kCols % kSplitPass != 0) && c >= cols)
        continue;
      int4 q[R];
      unsigned short d[R];
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (rowIn(r)) {
          q[r] = __ldg(reinterpret_cast<const int4 *>(q0 + r * cols + c));
          d[r] = __ldg(d0 + r * (cols / 32) + c / 32);
        }
      float4 x0 = loadX4<kAlignedX>(x + c), x1 = loadX4<kAlignedX>(x + c + 4),
             x2 = loadX4<kAlignedX>(x + c + 8),
             x3 = loadX4<kAlignedX>(x + c + 12);
      if constexpr (kInput == Q8Input::Swiglu) {
        const float *u = a.up + b * cols + c;
        x0 = swiglu4(x0, loadX4<kAlignedX>(u));
        x1 = swiglu4(x1, loadX4<kAlignedX>(u + 4));
        x2 = swiglu4(x2, loadX4<kAlignedX>(u + 8));
        x3 = swiglu4(x3, loadX4<kAlignedX>(u + 12));
      }
      if constexpr (kNormX) {
        const float *g = a.normWeight + c;
        sq = squares4(x3, squares4(x2, squares4(x1, squares4(x0, sq))));
        x0 = mul4(x0, loadX4<kAlignedX>(g));
        x1 = mul4(x1, loadX4<kAlignedX>(g + 4));
        x2 = mul4(x2, loadX4<kAlignedX>(g + 8));
        x3 = mul4(x3, loadX4<kAlignedX>(g + 12));
      }
      constexpr float bias = quantdot::kMagic + 128.f;
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (rowIn(r)) {
          float sum = quantdot::dot4(uint32_t(q[r].x) ^ 0x80808080u, bias, x0);
          sum += quantdot::dot4(uint32_t(q[r].y) ^ 0x80808080u, bias, x1);
          sum += quantdot::dot4(uint32_t(q[r].z) ^ 0x80808080u, bias, x2);
          sum += quantdot::dot4(uint32_t(q[r].w) ^ 0x80808080u, bias, x3);
          v[r] = fmaf(quantdot::halfBits(d[r]), sum, v[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
      v[r] = warpSum(v[r]);
  }
  if constexpr (kNormX)
    storeNormedRowSums<R>(v, warpSum(sq), valid, nrows, out, part, splits,
                          cols, a.normEps, partials, a.y);
  else
    storeRowSums<R>(v, valid, nrows, out, part, splits, partials, a.y);
  if constexpr (kTail)
    if (a.tail.mode == int(RouterTailMode::Last)) {
      __syncthreads(); // storeRowSums's partials read before reuse
      tailRows(a.tail, reinterpret_cast<const float4 *>(a.x), false,
               tailBegin, tailEnd, held);
    }
}

template <int R, bool kAlignedX, Q8Input kInput = Q8Input::Plain,
          int kCols = 0>
__global__ void __launch_bounds__(kThreads) linearQ8SplitKernel(Q8SplitArgs a) {
  linearQ8SplitBlock<R, kAlignedX, kInput, kCols, false>(a);
}

/// The kernel with linear_router's tail, held to the plain kernel's blocks
/// a multiprocessor (kTailBlocksPerSm: its own launch bound, so that the
/// plain kernel's stays the compiler's choice; a bound of 1 on it took it
/// from 74 to 94 registers).
__global__ void __launch_bounds__(kThreads, kTailBlocksPerSm)
    linearQ8SplitTailKernel(Q8SplitArgs a) {
  linearQ8SplitBlock<kRows, true, Q8Input::Plain, 0, true>(a);
}

//===----------------------------------------------------------------------===//
// Linear over the K-quant split layouts (q4_k-split, q5_k-split, q6_k-split;
// StepKernels.h WeightLayout): the same items and split-K as linearKernel, in
// units of one warp pass of kKSplitPassBlocks = 4 blocks (1024 values) of
// each row. Lane l takes block g = l / 8 of the pass and, with t = l % 8,
// bytes 16 t .. 16 t + 15 of the block's 128 quant bytes: one aligned
// 16-byte load from the quant plane, so the warp's loads of a row are 512
// contiguous bytes. Those bytes hold 32 values, 16 at x offsets A .. A + 15
// of the block (low nibbles) and 16 at B .. B + 15 (high nibbles):
//   Q4_K / Q5_K: A = 64 c + 16 h, B = A + 32 (c = t / 2, h = t % 2; the low
//     nibbles are sub-block 2c, the high 2c + 1), plus the block's 16-byte
//     head (d, dmin, scales: one load shared by the block's 8 lanes; the
//     warp's heads are 64 contiguous bytes) and, for Q5_K, qh[16 h .. 16 h +
//     15] (one 16-byte load; bits 2c and 2c + 1). The lane sum is
//     quantdot::k45Lane's, as in dotK45Rows over the file's blocks.
//   Q6_K: A = 128 c + 16 m, B = A + 64 (c = t / 4, m = t % 4; sub-blocks 8c
//     + m and 8c + 4 + m), plus qh[32 c + 16 (t % 2) ..] (one 16-byte load;
//     bit pairs 2 (m / 2) and 2 (m / 2) + 4 of each byte), the block's 16
//     int8 scales (one 16-byte load shared by the 8 lanes) and its d (2
//     bytes). The lane sum is (d sc_A) * sum((q - 32) x) + (d sc_B) * ...
// The lane's 32 x values (8 float4, or scalar loads when x is not 16-byte
// aligned) and their two sums are loaded once for the R rows. A row's lane
// sums are added pass by pass in order and reduced by one warpSum, so the
// result is the same bits on every run.
//===----------------------------------------------------------------------===//

constexpr int64_t kKSplitPassBlocks = 4;

struct KSplitArgs {
  const uint8_t *quants;   ///< qs / ql: 128 bytes a block
  const uint8_t *scales;   ///< Q4_K / Q5_K heads, Q6_K int8 scales: 16 a block
  const uint8_t *high;     ///< qh: 32 (Q5_K) or 64 (Q6_K) bytes a block
  const unsigned short *d; ///< Q6_K: f16 d, one a block
  int64_t blocks;          ///< blocks per row (cols / 256)
  const float *x;
  int64_t batch, rowsPerBatch;
  bool stacked;
  int splits;
  float *y;
  bool prefetch; ///< the weights' early prefetch (earlyPrefetch())
};

/// A lane's 32 x values: lo = x[A .. A + 15], hi = x[B .. B + 15] of the
/// block at `x`, and their sums, in loadK45X's order.
template <bool kAlignedX>
__device__ __forceinline__ quantdot::K45X loadSplitX(const float *x, int a,
                                                     int b) {
  quantdot::K45X v;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v.lo[k] = loadX4<kAlignedX>(x + a + 4 * k);
    v.hi[k] = loadX4<kAlignedX>(x + b + 4 * k);
  }
  using quantdot::sum4;
  v.sumLo = (sum4(v.lo[0]) + sum4(v.lo[1])) + (sum4(v.lo[2]) + sum4(v.lo[3]));
  v.sumHi = (sum4(v.hi[0]) + sum4(v.hi[1])) + (sum4(v.hi[2]) + sum4(v.hi[3]));
  return v;
}

/// Lane t's sum for one Q6_K block (see above): ql, qh = its 16-byte pieces,
/// scales = the block's 16 int8 scales, dh = d's bits.
__device__ __forceinline__ float q6SplitLane(uint4 ql, uint4 qh, uint4 scales,
                                             uint32_t dh, int t,
                                             const quantdot::K45X &x) {
  using namespace quantdot;
  const int c = t / 4, m = t % 4;
  const int shiftLo = 2 * (m / 2), shiftHi = shiftLo + 4;
  const uint32_t low[4] = {ql.x, ql.y, ql.z, ql.w};
  const uint32_t high[4] = {qh.x, qh.y, qh.z, qh.w};
  float lo = 0.f, hi = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t qa =
        (low[k] & 0x0F0F0F0Fu) | ((high[k] >> shiftLo) & 0x03030303u) << 4;
    const uint32_t qb = ((low[k] >> 4) & 0x0F0F0F0Fu) |
                        ((high[k] >> shiftHi) & 0x03030303u) << 4;
    lo = dot4Acc(qa, kMagic + 32.f, x.lo[k], lo);
    hi = dot4Acc(qb, kMagic + 32.f, x.hi[k], hi);
  }
  // Scales 8c + m and 8c + 4 + m: byte m of words 2c and 2c + 1; an int8
  // byte u is (u ^ 0x80) - 128, exactly.
  const uint32_t wa = c ? scales.z : scales.x, wb = c ? scales.w : scales.y;
  const float d = halfBits(dh);
  const float dla = d * (smallToFloat(byteOf(wa, m) ^ 0x80u) - 128.f);
  const float dlb = d * (smallToFloat(byteOf(wb, m) ^ 0x80u) - 128.f);
  return fmaf(dla, lo, dlb * hi);
}

template <GGMLType kType, int R, bool kAlignedX>
__global__ void __launch_bounds__(kThreads) linearKSplitKernel(KSplitArgs a) {
  constexpr bool kQ6 = kType == GGMLType::Q6_K;
  constexpr bool kHigh = kType != GGMLType::Q4_K; // a qh plane
  constexpr int64_t kHighBytes = kQ6 ? 64 : 32;
  allowDependents();
  __shared__ float partials[kWarpsPerBlock][R];
  const int lane = threadIdx.x % kWarp;
  const int g = lane / 8, t = lane % 8;
  const SplitItem it =
      splitItem<R>(a.batch, a.rowsPerBatch, a.stacked, a.splits,
                   (a.blocks + kKSplitPassBlocks - 1) / kKSplitPassBlocks);
  const bool valid = it.valid;
  const int nrows = it.nrows, part = it.part;
  const int64_t b = it.b, row = it.row, out = it.out, first = it.first,
                last = it.last;
  // Row `row` of each plane.
  const uint8_t *q0 = a.quants + row * a.blocks * 128;
  const uint8_t *s0 = a.scales + row * a.blocks * 16;
  const uint8_t *h0 = kHigh ? a.high + row * a.blocks * kHighBytes : nullptr;
  const unsigned short *d0 = kQ6 ? a.d + row * a.blocks : nullptr;
  // This warp's share of every plane, while the predecessor finishes (not
  // after a collective: earlyPrefetch()).
  if (a.prefetch) {
    const uint64_t from = uint64_t(first * kKSplitPassBlocks);
    const uint64_t to =
        uint64_t(last * kKSplitPassBlocks < a.blocks ? last * kKSplitPassBlocks
                                                     : a.blocks);
    const uint64_t blocks = uint64_t(a.blocks);
    prefetchRows(q0, blocks * 128, nrows, from * 128, to * 128);
    prefetchRows(s0, blocks * 16, nrows, from * 16, to * 16);
    if constexpr (kHigh)
      prefetchRows(h0, blocks * kHighBytes, nrows, from * kHighBytes,
                   to * kHighBytes);
    if constexpr (kQ6)
      prefetchRows(reinterpret_cast<const uint8_t *>(d0), blocks * 2, nrows,
                   from * 2, to * 2);
  }
  waitForPredecessor();
  float v[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    v[r] = 0.f;
  if (valid) {
    const float *x = a.x + b * a.blocks * 256;
    const int xa =
        kQ6 ? 128 * (t / 4) + 16 * (t % 4) : 64 * (t / 2) + 16 * (t % 2);
    const int xb = xa + (kQ6 ? 64 : 32);
    const int highAt = kQ6 ? 32 * (t / 4) + 16 * (t % 2) : 16 * (t % 2);
    // Not unrolled: R rows' loads are in flight per pass already, and split
    // segments are mostly one or two passes long (as dotK45Rows).
    for (int64_t p = first; p < last; ++p) {
      const int64_t blk = p * kKSplitPassBlocks + g;
      if (blk >= a.blocks) // the row's last pass may hold fewer blocks
        continue;
      // Every row's loads first, then x, then the math.
      uint4 q[R], sc[R], hb[R];
      uint32_t dh[R];
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < nrows) {
          const int64_t at = r * a.blocks + blk;
          q[r] = quantdot::loadStream(q0 + at * 128 + 16 * t);
          sc[r] = quantdot::loadStream(s0 + at * 16);
          hb[r] = uint4{};
          dh[r] = 0u;
          if constexpr (kHigh)
            hb[r] = quantdot::loadStream(h0 + at * kHighBytes + highAt);
          if constexpr (kQ6)
            dh[r] = __ldg(d0 + at);
        }
      const quantdot::K45X xv = loadSplitX<kAlignedX>(x + blk * 256, xa, xb);
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < nrows) {
          if constexpr (kQ6)
            v[r] += q6SplitLane(q[r], hb[r], sc[r], dh[r], t, xv);
          else
            v[r] += quantdot::k45Lane<kHigh>(sc[r], q[r], hb[r], t, xv);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
      v[r] = warpSum(v[r]);
  }
  storeRowSums<R>(v, valid, nrows, out, part, a.splits, partials, a.y);
}

//===----------------------------------------------------------------------===//
// Linear over the 4-bit split layouts of 32-value units (iq4_xs-split,
// iq4_nl-split, q5_0-split, q5_1-split; StepKernels.h WeightLayout): the
// same items and split-K as linearKernel. A unit is 32 values and 16 quant
// bytes, a whole IQ4_NL / Q5_0 / Q5_1 block or one IQ4_XS sub-block; value
// j < 16 is the low nibble of byte j and value j + 16 its high nibble. Per
// pass a lane takes one unit t of each of its rows: one aligned 16-byte
// load from the quant plane (a warp's loads of a row are contiguous), and
// its unit's piece of the other planes:
//   IQ4_NL: d (2 bytes); Q5_0: d (2) and qh (4, bit j the fifth bit of
//     value j); Q5_1: d, m and qh (one 8-byte load); IQ4_XS: its block's
//     8-byte head (d, scales_h, scales_l; one load shared by the block's 8
//     units' lanes).
// The unit's 32 x values (8 float4, or scalar loads when x is not 16-byte
// aligned) and their sum are loaded once for the lane's rows. Lane sums:
//   IQ4_NL / IQ4_XS: dl * sum(kv x), the nibbles mapped to the levels kv
//     (kvalues_iq4nl) by two byte permutes of the table held in four words;
//     dl = d (IQ4_NL) or d * (ls - 32), ls the 6-bit scale of sub-block
//     t % 8 (IQ4_XS);
//   Q5_0: d * sum((q - 16) x), q = nibble | fifth bit << 4;
//   Q5_1: d * sum(q x) + m * sum(x).
// Rows of few units (GLM-5's attn_k_b: 128 values, 4 units a row) would
// leave most lanes of a warp idle, so a row takes L = lanesPerRow lanes, the
// smallest power of two of at least its units (at most 32), and a warp
// takes 32 / L slots of R rows: lane l is unit position t = l % L of slot s
// = l / L, whose rows are n0 + s R + r (r < R). An item is R * 32 / L rows;
// a pass is L units of a row, so for L < 32 one pass covers the row and
// split-K (whole passes) is for L = 32 only. A slot's row sums are reduced
// over its L lanes by a fixed butterfly, so the result is the same bits on
// every run; with L = 32 storeRowSums writes them (adding split segments in
// order), else lane t = 0 of each slot writes its rows.
//===----------------------------------------------------------------------===//

/// Values of a unit of the 4-bit split layouts.
constexpr int64_t kNibbleUnit = 32;

struct NibbleSplitArgs {
  const uint8_t *quants; ///< qs: 16 bytes a unit
  const uint8_t *scales; ///< d (2 a unit), Q5_1 heads (8), IQ4_XS heads (8
                         ///< a block of 8 units)
  const uint8_t *high;   ///< Q5_0: qh, 4 bytes a unit
  int64_t units;         ///< units per row (cols / 32)
  int lanesPerRow;       ///< L: a power of two, at most 32
  const float *x;
  int64_t batch, rowsPerBatch;
  bool stacked;
  int splits;
  float *y;
  bool prefetch; ///< the weights' early prefetch (earlyPrefetch())
};

/// The IQ4_NL / IQ4_XS levels (kvalues_iq4nl) plus 128, as bytes: byte n
/// of word w is level 4 w + n, so the level of nibble v is byte v % 8 of
/// words (v / 8) * 2 and (v / 8) * 2 + 1.
constexpr int kIQ4Level[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};
constexpr uint32_t kIQ4LevelWords[4] = {0x3F2D1801u, 0x766A5D4Fu, 0xA6998D81u,
                                        0xF1D9C5B5u};
constexpr bool iq4WordsHoldTheLevels() {
  for (int v = 0; v < 16; ++v)
    if (((kIQ4LevelWords[v / 4] >> (8 * (v % 4))) & 0xFFu) !=
        uint32_t(kIQ4Level[v] + 128))
      return false;
  return true;
}
static_assert(iq4WordsHoldTheLevels());

/// The levels + 128 of the four nibbles n_i in the bytes of n (each < 16):
/// one byte permute picks level n_i % 8 of the lower half of the table,
/// one of the upper half, and bit 3 of n_i chooses between them.
__device__ __forceinline__ uint32_t iq4Levels(uint32_t n) {
  constexpr uint32_t w0 = kIQ4LevelWords[0], w1 = kIQ4LevelWords[1],
                     w2 = kIQ4LevelWords[2], w3 = kIQ4LevelWords[3];
  const uint32_t v = n & 0x07070707u;
  // Selector nibble i = n_i % 8 (bit 3 clear: no sign replication).
  const uint32_t select = __byte_perm(v | v >> 4, 0u, 0x4420u);
  const uint32_t lower = __byte_perm(w0, w1, select);
  const uint32_t upper = __byte_perm(w2, w3, select);
  const uint32_t high = ((n >> 3) & 0x01010101u) * 0xFFu;
  return (upper & high) | (lower & ~high);
}

/// Bit i of h (i < 4) as bit 4 of byte i: four fifth bits beside their
/// nibbles. The multiply places copies of h 7 bits apart (no carries), so
/// bit i of copy i lands on bit 8 i.
__device__ __forceinline__ uint32_t spreadFifthBits(uint32_t h) {
  return ((h & 0xFu) * 0x00204081u & 0x01010101u) << 4;
}

/// A lane's sum for one unit (see above): qs its 16 quant bytes; head.x =
/// d (low half) and m (Q5_1) or scales_h (IQ4_XS, high half); head.y = qh
/// (Q5_0, Q5_1) or scales_l (IQ4_XS); j the unit's sub-block (IQ4_XS); x
/// its 32 x values (lo: values 0 .. 15, hi: 16 .. 31) and their sums.
template <GGMLType kType>
__device__ __forceinline__ float nibbleUnitSum(uint4 qs, uint2 head, int j,
                                               const quantdot::K45X &x) {
  using namespace quantdot;
  constexpr bool kIQ4 = kType == GGMLType::IQ4_NL || kType == GGMLType::IQ4_XS;
  constexpr bool kFifth = kType == GGMLType::Q5_0 || kType == GGMLType::Q5_1;
  // The quant bytes hold q + 128 (IQ4: level + 128), q (Q5_1), or q with
  // q - 16 the value's factor (Q5_0).
  constexpr float bias = kIQ4                      ? kMagic + 128.f
                         : kType == GGMLType::Q5_0 ? kMagic + 16.f
                                                   : kMagic;
  const uint32_t w[4] = {qs.x, qs.y, qs.z, qs.w};
  float lo = 0.f, hi = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t ql = w[k] & 0x0F0F0F0Fu, qu = (w[k] >> 4) & 0x0F0F0F0Fu;
    if constexpr (kFifth) { // values 4k .. 4k + 3 and 16 + 4k ..
      ql |= spreadFifthBits(head.y >> (4 * k));
      qu |= spreadFifthBits(head.y >> (16 + 4 * k));
    }
    if constexpr (kIQ4) {
      ql = iq4Levels(ql);
      qu = iq4Levels(qu);
    }
    lo = dot4Acc(ql, bias, x.lo[k], lo);
    hi = dot4Acc(qu, bias, x.hi[k], hi);
  }
  const float d = halfBits(head.x & 0xFFFFu);
  if constexpr (kType == GGMLType::Q5_1)
    return fmaf(d, lo + hi, halfBits(head.x >> 16) * (x.sumLo + x.sumHi));
  if constexpr (kType == GGMLType::IQ4_XS) {
    // scales_l nibble j is bits 4j .. of the word; scales_h bits 2j, 2j+1.
    const uint32_t ls =
        ((head.y >> (4 * j)) & 15u) | ((head.x >> (16 + 2 * j)) & 3u) << 4;
    return d * (smallToFloat(ls) - 32.f) * (lo + hi);
  }
  return d * (lo + hi);
}

/// Bytes of the scale plane per unit (IQ4_XS: an 8-byte head per 8 units)
/// and of the qh plane.
template <GGMLType kType>
__host__ __device__ constexpr int64_t nibbleScaleBytes() {
  return kType == GGMLType::IQ4_XS ? 1 : kType == GGMLType::Q5_1 ? 8 : 2;
}
template <GGMLType kType>
__host__ __device__ constexpr int64_t nibbleHighBytes() {
  return kType == GGMLType::Q5_0 ? 4 : 0;
}

/// Unit g's head (nibbleUnitSum): its d, and its other scale and qh bytes.
template <GGMLType kType>
__device__ __forceinline__ uint2 loadNibbleHead(const NibbleSplitArgs &a,
                                                int64_t g) {
  if constexpr (kType == GGMLType::IQ4_XS)
    return __ldg(reinterpret_cast<const uint2 *>(a.scales) + g / 8);
  if constexpr (kType == GGMLType::Q5_1)
    return __ldg(reinterpret_cast<const uint2 *>(a.scales) + g);
  uint2 h;
  h.x = __ldg(reinterpret_cast<const unsigned short *>(a.scales) + g);
  h.y = 0u;
  if constexpr (kType == GGMLType::Q5_0)
    h.y = __ldg(reinterpret_cast<const uint32_t *>(a.high) + g);
  return h;
}

/// Prefetches plane bytes [from, to) of units of rows row .. row + nrows -
/// 1 (`bytes` per unit, `units` a row) into the L2: one range when the
/// segment is whole rows (they are back to back), else per row.
__device__ inline void prefetchUnits(const uint8_t *plane, int64_t bytes,
                                     int64_t units, int64_t row, int nrows,
                                     int64_t from, int64_t to) {
  if (bytes == 0 || nrows == 0)
    return;
  const uint8_t *row0 = plane + uint64_t(row * units * bytes);
  if (from == 0 && to == units) {
    if (threadIdx.x % kWarp == 0)
      prefetchL2(row0, uint64_t(nrows * units * bytes));
    return;
  }
  prefetchRows(row0, uint64_t(units * bytes), nrows, uint64_t(from * bytes),
               uint64_t(to * bytes));
}

template <GGMLType kType, int R, bool kAlignedX>
__global__ void __launch_bounds__(kThreads)
    linearNibbleSplitKernel(NibbleSplitArgs a) {
  allowDependents();
  __shared__ float partials[kWarpsPerBlock][R];
  const int lane = threadIdx.x % kWarp, L = a.lanesPerRow;
  const int slot = lane / L, t = lane % L;
  const SplitItem it = splitItemOf(R * (kWarp / L), a.batch, a.rowsPerBatch,
                                   a.stacked, a.splits, (a.units + L - 1) / L);
  const bool valid = it.valid;
  const int nrows = it.nrows;
  // This warp's share of every plane, while the predecessor finishes (not
  // after a collective: earlyPrefetch()).
  if (a.prefetch) {
    const int64_t from = it.first * L,
                  to = it.last * L < a.units ? it.last * L : a.units;
    prefetchUnits(a.quants, 16, a.units, it.row, nrows, from, to);
    prefetchUnits(a.scales, nibbleScaleBytes<kType>(), a.units, it.row, nrows,
                  from, to);
    prefetchUnits(a.high, nibbleHighBytes<kType>(), a.units, it.row, nrows,
                  from, to);
  }
  waitForPredecessor();
  // This lane's rows are item rows slot * R + r.
  const int mine = nrows - slot * R;
  float v[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    v[r] = 0.f;
  if (valid) {
    const float *x = a.x + it.b * a.units * kNibbleUnit;
    const int64_t row = it.row + slot * R;
    // Not unrolled, as linearKSplitKernel.
    for (int64_t p = it.first; p < it.last; ++p) {
      const int64_t u = p * L + t;
      if (u >= a.units) // the row's last pass may hold fewer units
        continue;
      // Every row's loads first, then x, then the math.
      uint4 q[R];
      uint2 head[R];
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < mine) {
          const int64_t g = (row + r) * a.units + u;
          q[r] = quantdot::loadStream(a.quants + g * 16);
          head[r] = loadNibbleHead<kType>(a, g);
        }
      const quantdot::K45X xv =
          loadSplitX<kAlignedX>(x + u * kNibbleUnit, 0, 16);
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < mine)
          v[r] += nibbleUnitSum<kType>(q[r], head[r], int(u % 8), xv);
    }
  }
  // Every lane takes part (the shuffles need the whole warp).
#pragma unroll
  for (int r = 0; r < R; ++r)
    for (int o = L / 2; o > 0; o /= 2)
      v[r] += __shfl_xor_sync(0xffffffffu, v[r], o);
  if (L == kWarp) { // uniform over the block
    storeRowSums<R>(v, valid, nrows, it.out, it.part, a.splits, partials, a.y);
    return;
  }
  if (valid && t == 0) // one pass, no split: the launch sees to it
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r < mine)
        a.y[it.out + slot * R + r] = v[r];
}

//===----------------------------------------------------------------------===//
// MoE experts, the generic kernels (any weight type; see below for the
// bulk-copy kernels that launchMoeExperts prefers where they apply).
//   gate/up: item (k, row group of R rows f0 ..); its gate dots and its up
//     dots, `splits` segments each, are 2 * splits consecutive warps; lane r
//     of the item's first warp adds the segments in order and writes act =
//     silu(gate) * up for row f0 + r.
//   down: a block takes kDownRows hidden rows h0 ..; its `per` = min(k, 8)
//     warps take experts i0 .. i0 + per - 1 of each chunk of k, each warp
//     all kDownRows rows of its expert (x = act row i, loaded once: for
//     Q4_K / Q5_K rows of one block, each 8-lane group takes every 4th row;
//     else warpDotRows, kRows rows a call). Thread r of the block adds
//     weights[i] * dot for row h0 + r in ascending i (the CPU's order), in
//     a register, writing out[h0 + r] once at the end. The down kernel
//     never reads x and the gate/up kernel has finished reading it, so out
//     may alias x.
//===----------------------------------------------------------------------===//

/// Hidden rows per block of the down kernel.
constexpr int kDownRows = 16;

struct ExpertArgs {
  const float *x;
  int64_t hidden, ffn, experts;
  const int32_t *ids;
  const float *weights;
  int64_t k;
  RowGeometry gate, up, down;
  const uint8_t *gateData, *upData, *downData;
  bool fused;
  int splits, per;
  float *act, *out;
  const float *addend; ///< added to the sum, or null
  FaultSink fault;
  /// The bulk-copy kernels: 256-value blocks per gate/up row; tiles per
  /// block of the down kernel and the shared bytes before its rows.
  int blocksPerRow, downTiles, downHeadBytes;
  /// The shared expert inside the bulk-copy kernels (sharedFfn > 0;
  /// kiln-fuse-shared-expert): its gate, up and down weights in Q8_0's
  /// split layout (quants, then f16 scales, rows back to back), and its act
  /// (sharedFfn values) between the two kernels.
  int64_t sharedFfn;
  const uint8_t *sharedGate, *sharedGateScales, *sharedUp, *sharedUpScales,
      *sharedDown, *sharedDownScales;
  float *sharedAct;
  /// The shared expert's gate/up blocks start their rows' copies before
  /// the predecessor wait (they need no id; earlyPrefetch()).
  bool sharedEarly;
  /// The router's ids by tags (TaggedIds), or null: the bulk-copy kernels'
  /// routed blocks read their ids from these words (the step's epoch word
  /// plus one their tag) instead of after their wait, which they do last.
  const uint64_t *taggedIds;
  const uint32_t *stepWord;
};

/// The tag of this step's TaggedIds (read before the kernel's wait: only
/// the step's last kernel writes the word).
__device__ inline uint32_t taggedIdTag(const ExpertArgs &a) {
  return __ldcg(a.stepWord) + 1u;
}

/// Chosen id `slot` from TaggedIds (this block's copy), or -1 with a fault
/// where it never comes.
__device__ inline int32_t awaitTaggedId(const ExpertArgs &a, int64_t slot,
                                        uint32_t tag) {
  uint32_t id = 0;
  if (!awaitTaggedWord(a.taggedIds +
                           int64_t(blockIdx.x % kTaggedIdCopies) *
                               kTaggedIdStride +
                           slot,
                       tag, 32, &id)) {
    recordFault(a.fault, FaultCode::GridWaitTimeout, a.k, 0);
    return -1;
  }
  return int32_t(id);
}

/// Block 0's first warp reports the first id outside [0, experts) in k
/// order, as the CPU would: 32 ids a round, loaded together, and a ballot
/// (one thread reading them one by one would wait for each in turn, and
/// hold block 0, and so the kernel, back by as many memory round trips).
__device__ inline void reportFirstBadId(const ExpertArgs &a) {
  if (blockIdx.x != 0 || threadIdx.x >= kWarp)
    return;
  const int lane = int(threadIdx.x);
  for (int64_t i0 = 0; i0 < a.k; i0 += kWarp) { // the same for the warp
    const int64_t i = i0 + lane;
    const int32_t id = i < a.k ? a.ids[i] : 0;
    const unsigned bad =
        __ballot_sync(0xffffffffu, i < a.k && (id < 0 || id >= a.experts));
    if (bad) {
      if (lane == __ffs(int(bad)) - 1)
        recordFault(a.fault, FaultCode::ExpertOutOfRange, id, a.experts);
      return;
    }
  }
}

/// A routed gate/up block that polled its id (ExpertArgs::taggedIds) waits
/// for its predecessor before it ends, as every step kernel does (its
/// completion stands for the router's), and block 0 then checks every id.
__device__ inline void finishPolled(const ExpertArgs &a) {
  waitForPredecessor();
  reportFirstBadId(a);
}

template <int R>
__global__ void __launch_bounds__(kThreads) expertGateUpKernel(ExpertArgs a) {
  stepKernelPrologue();
  __shared__ float partials[kWarpsPerBlock][R];
  reportFirstBadId(a);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int perItem = 2 * a.splits;
  const int itemsPerBlock = int(blockDim.x / kWarp) / perItem;
  const int64_t groups = (a.ffn + R - 1) / R;
  const int64_t item = int64_t(blockIdx.x) * itemsPerBlock + warp / perItem;
  const int slot = warp % perItem, part = slot % a.splits;
  const bool isUp = slot >= a.splits;
  const bool inRange = item < a.k * groups;
  bool valid = false;
  int nrows = 0;
  int64_t i = 0, f0 = 0;
  float v[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    v[r] = 0.f;
  if (inRange) {
    i = item / groups;
    f0 = item % groups * R;
    nrows = int(a.ffn - f0 < R ? a.ffn - f0 : R);
    const int64_t e = a.ids[i];
    if (e >= 0 && e < a.experts) {
      valid = true;
      // Fused: expert e's rows are its F gate rows, then its F up rows.
      const int64_t gateRow = a.fused ? e * 2 * a.ffn + f0 : e * a.ffn + f0;
      const int64_t upRow = a.fused ? gateRow + a.ffn : e * a.ffn + f0;
      const RowGeometry &g = isUp ? a.up : a.gate;
      const uint8_t *data = isUp ? a.upData : a.gateData;
      segmentDots<R>(g, data + uint64_t(isUp ? upRow : gateRow) * g.rowBytes,
                     nrows, a.x, part, a.splits, v);
    }
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r)
      partials[warp][r] = v[r];
  __syncthreads();
  if (inRange && slot == 0 && lane < nrows) {
    float g = partials[warp][lane], u = partials[warp + a.splits][lane];
    for (int p = 1; p < a.splits; ++p) {
      g += partials[warp + p][lane];
      u += partials[warp + a.splits + p][lane];
    }
    a.act[i * a.ffn + f0 + lane] = valid ? silu(g) * u : 0.f;
  }
}

/// The dots of down rows h0 .. h0 + kDownRows - 1 of expert e (rows past
/// nrows repeat the last) with x = that expert's act row, by the whole
/// warp, written to dst[kDownRows].
__device__ inline void downDots(const ExpertArgs &a, int64_t e, int64_t h0,
                                int nrows, const float *x, float *dst) {
  const RowGeometry &g = a.down;
  const uint8_t *row0 = a.downData + uint64_t(e * a.hidden + h0) * g.rowBytes;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(row0) | uintptr_t(g.rowBytes) |
        reinterpret_cast<uintptr_t>(x)) &
       15) == 0;
  if (g.cols == 256 && aligned && g.type == GGMLType::Q4_K) {
    warpDotOneBlockRowsK45<false, kDownRows / 4>(row0, g.rowBytes, nrows, x,
                                                 dst);
    return;
  }
  if (g.cols == 256 && aligned && g.type == GGMLType::Q5_K) {
    warpDotOneBlockRowsK45<true, kDownRows / 4>(row0, g.rowBytes, nrows, x,
                                                dst);
    return;
  }
  const int lane = threadIdx.x % kWarp;
  if (!hasMultiRowDot(g.type)) {
    // One row at a time (warpDotRows takes several rows only for the types
    // with a routine for them).
    for (int r = 0; r < kDownRows && r < nrows; ++r) {
      const float v =
          warpDotRow(g.type, row0 + uint64_t(r) * g.rowBytes, x, g.cols);
      if (lane == 0)
        dst[r] = v;
    }
    return;
  }
  for (int r0 = 0; r0 < kDownRows && r0 < nrows; r0 += kRows) {
    float v[kRows];
    warpDotRows<kRows>(g.type, row0 + uint64_t(r0) * g.rowBytes, g.rowBytes,
                       nrows - r0, x, g.cols, v);
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        dst[r0 + r] = v[r];
  }
}

__global__ void __launch_bounds__(kThreads) expertDownKernel(ExpertArgs a) {
  stepKernelPrologue();
  __shared__ float partials[kWarpsPerBlock][kDownRows];
  const int warp = threadIdx.x / kWarp;
  const int64_t h0 = int64_t(blockIdx.x) * kDownRows;
  const int nrows = int(a.hidden - h0 < kDownRows ? a.hidden - h0 : kDownRows);
  const int r = int(threadIdx.x); // the row this thread adds, if < nrows
  // The addend's value, loaded at once (read last).
  const float extra = a.addend && r < nrows ? a.addend[h0 + r] : 0.f;
  float sum = 0.f;
  for (int64_t i0 = 0; i0 < a.k; i0 += a.per) {
    const int64_t i = i0 + warp;
    if (warp < a.per && i < a.k) {
      const int64_t e = a.ids[i];
      if (e >= 0 && e < a.experts) // a bad id faulted in expertGateUpKernel
        downDots(a, e, h0, nrows, a.act + i * a.ffn, partials[warp]);
    }
    __syncthreads();
    if (r < nrows)
      for (int j = 0; j < a.per && i0 + j < a.k; ++j) {
        const int64_t e = a.ids[i0 + j];
        if (e >= 0 && e < a.experts)
          sum += a.weights[i0 + j] * partials[j][r];
      }
    __syncthreads(); // the partials are read before the next chunk's writes
  }
  if (r < nrows)
    a.out[h0 + r] = a.addend ? sum + extra : sum;
}

//===----------------------------------------------------------------------===//
// MoE experts, the bulk-copy kernels (sm_90+; Q4_K, Q5_K, and the 2-bit
// mixes' Q2_K and Q3_K). GLM-5's routed experts (Q4_K gate and up, Q5_K
// down of one 256-value block a row; Q2_K and Q3_K in the 2-bit mix) are
// streamed whole from memory, so these kernels keep every weight byte of a
// block in flight at once and spend as few instructions per byte as they
// can:
//   - a block's weight rows are copied into its shared memory by bulk copies
//     (DeviceCommon.cuh) that hold no registers, one barrier per stage so
//     that the first rows are worked on while later ones still arrive;
//   - a lane keeps its 32 x values in registers for all of its rows, in
//     the Q4_K layout whatever the format (QuantDot.cuh: K45X; for Q2_K and
//     Q3_K, "Q2_K and Q3_K in a Q4_K lane's share"), prescaled for Q4_K and
//     Q5_K ("Prescaled x"), so a quant costs one integer op and one fused
//     multiply-add, and x is read once per warp;
//   - a warp's row sums are reduced together (spreadSums: N - 1 + log2(2 O
//     / N) shuffles for N rows) and added across warps in a fixed order.
//   gate/up: a block takes kPairs row pairs (gate f, up f), f = f0 .., of
//     one chosen expert, and ceil(blocks per row / 4) warps: lane group g of
//     warp w takes 256-value block b = 4 w + g of every row (so a row's
//     warps together cover it once). Stage q is gate row f0 + q and up row
//     f0 + q; warp w's sums go to shared memory, and thread q adds the
//     warps' in order and writes act = silu(gate) * up. A bad id leaves its
//     rows' act 0 (and block 0 reports the first bad id in k order).
//   down (F = 256: one block a row): a block takes downTiles tiles of
//     kDownTile hidden rows h0 ..; warp w takes chosen experts w, w + 8, ...,
//     x = that expert's act row, and lane group g rows 4 g .. 4 g + 3 of
//     each tile. Before waiting for its predecessor (the gate/up kernel,
//     which lets dependents start only once its own wait has passed, so the
//     router that wrote `ids` has finished) thread 0 reads the ids and
//     starts the chosen experts' row copies: the weights never change, and
//     this kernel's rows then stream in while the gate/up kernel works.
//     After the wait, thread r adds weights[i] * dot for row h0 + r in
//     ascending i, as the generic kernel does.
// Every sum has a fixed order: the same bits on every run.
//===----------------------------------------------------------------------===//

/// Row pairs per block of the gate/up kernel: 4 (GLM-5 at tp=8: 512 blocks
/// of 28 KiB) keeps twice the warps in flight of 8, which measured slower
/// (`docs/perf.md`).
constexpr int kPairs = 4;
/// Shared bytes before the gate/up kernel's rows (its kPairs barriers).
constexpr int kPairHeadBytes = 128;
/// Hidden rows per tile of the down kernel, and tiles per block at most.
constexpr int kDownTile = 16;
constexpr int kMaxDownTiles = 8;

/// Lane t's sum for one Q4_K / Q5_K block in shared memory, with the
/// prescaled x (K45Prescaled) or x on the int8 grid (K45Int8X).
template <bool kHigh, class X>
__device__ __forceinline__ float k45SharedBlock(const uint8_t *block, int t,
                                                const X &x) {
  constexpr int kQs = kHigh ? 48 : 16;
  const uint4 head = *reinterpret_cast<const uint4 *>(block);
  const uint4 qs = *reinterpret_cast<const uint4 *>(block + kQs + 16 * t);
  const uint4 qh =
      kHigh ? *reinterpret_cast<const uint4 *>(block + 16 + 16 * (t % 2))
            : uint4{};
  if constexpr (std::is_same_v<X, quantdot::K45Int8X>)
    return quantdot::k45Int8Lane<kHigh>(head, qs, qh, t, x);
  else
    return quantdot::k45PrescaledLane<kHigh>(head, qs, qh, t, x);
}

/// The routed experts' formats the bulk-copy kernels take (the K45
/// kernels: each lane dots its share of a 256-value block in the Q4_K
/// layout of x, QuantDot.cuh): Q4_K and Q5_K with x prescaled, Q2_K and
/// Q3_K (the 2-bit mixes) with x and its runs' sums.
enum class BulkQuant { Q4_K, Q5_K, Q2_K, Q3_K };

template <BulkQuant kQ>
constexpr int kBulkBlockBytes = kQ == BulkQuant::Q4_K   ? 144
                                : kQ == BulkQuant::Q5_K ? 176
                                : kQ == BulkQuant::Q2_K ? 84
                                                        : 110;
template <BulkQuant kQ>
constexpr bool kBulkLowBit = kQ == BulkQuant::Q2_K || kQ == BulkQuant::Q3_K;

/// A lane's x for kQ's blocks: prescaled (Q4_K / Q5_K), else as loaded.
template <BulkQuant kQ>
using BulkX = std::conditional_t<kBulkLowBit<kQ>, quantdot::K45X,
                                 quantdot::K45Prescaled>;

/// Lane t's x share v (loadK45Values's, sums unset) made kQ's.
template <BulkQuant kQ>
__device__ __forceinline__ void bulkX(quantdot::K45X v, BulkX<kQ> &x) {
  if constexpr (kBulkLowBit<kQ>) {
    quantdot::sumK45X(v);
    x = v;
  } else {
    quantdot::prescaleK45<kQ == BulkQuant::Q5_K>(v, x);
  }
}

/// Lane t's sum for one block of kQ in shared memory (the int8-grid x:
/// Q4_K alone).
template <BulkQuant kQ, class X>
__device__ __forceinline__ float bulkBlock(const uint8_t *block, int t,
                                           const X &x) {
  if constexpr (kQ == BulkQuant::Q2_K)
    return quantdot::q2KLane(block, t, x);
  else if constexpr (kQ == BulkQuant::Q3_K)
    return quantdot::q3KLane(block, t, x);
  else
    return k45SharedBlock<kQ == BulkQuant::Q5_K>(block, t, x);
}

/// The bulk-copy format of `type`, if it has one.
std::optional<BulkQuant> bulkQuantOf(GGMLType type) {
  switch (type) {
  case GGMLType::Q4_K: return BulkQuant::Q4_K;
  case GGMLType::Q5_K: return BulkQuant::Q5_K;
  case GGMLType::Q2_K: return BulkQuant::Q2_K;
  case GGMLType::Q3_K: return BulkQuant::Q3_K;
  default: return std::nullopt;
  }
}

/// Row pairs per block of the shared expert's gate/up rows in the gate/up
/// kernel: a Q8_0 row takes 1.06 bytes a value against a Q4_K row's 0.56
/// (Q5_K's 0.69), so 2 pairs fit where the routed blocks' 4 do.
constexpr int kSharedPairs = 2;

/// Shared bytes of the shared expert's rows in a gate/up block (quants and
/// scales of its kSharedPairs gate and up rows of `hidden` values).
__host__ __device__ constexpr uint64_t sharedPairBytes(int64_t hidden) {
  return uint64_t(2 * kSharedPairs) * uint64_t(hidden + hidden / 16);
}

/// Lane t's words of one 256-value block of a Q8_0 row in the split layout
/// (q: the row's quants at the block, d: its scales): its 16 quants of
/// Q8_0 blocks 2c and 2c + 1 (c = t / 2), at byte 16 (t % 2) of each, and
/// those blocks' two f16 scales.
__device__ __forceinline__ void q8SplitK45Words(const uint8_t *q,
                                                const uint8_t *d, int t,
                                                uint4 &lo, uint4 &hi,
                                                uint32_t &scales) {
  const int c = t / 2;
  lo = *reinterpret_cast<const uint4 *>(q + 64 * c + 16 * (t % 2));
  hi = *reinterpret_cast<const uint4 *>(q + 64 * c + 32 + 16 * (t % 2));
  scales = *reinterpret_cast<const uint32_t *>(d + 4 * c);
}

/// Lane t's sum for one 256-value block of a Q8_0 row in the split layout,
/// with the x share of a Q4_K / Q5_K lane (loadK45Values): its two runs of
/// 16 values lie in Q8_0 blocks 2c and 2c + 1 (c = t / 2), at byte 16 (t %
/// 2) of each. q: the row's quants at the 256-value block; d: its scales.
__device__ __forceinline__ float q8SplitK45Lane(const uint8_t *q,
                                                const uint8_t *d, int t,
                                                const quantdot::K45X &x) {
  uint4 lo, hi;
  uint32_t scales;
  q8SplitK45Words(q, d, t, lo, hi, scales);
  const float bias = quantdot::kMagic + 128.f;
  const uint32_t l[4] = {lo.x, lo.y, lo.z, lo.w}, h[4] = {hi.x, hi.y, hi.z,
                                                         hi.w};
  float sumLo = 0.f, sumHi = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    sumLo += quantdot::dot4(l[k] ^ 0x80808080u, bias, x.lo[k]);
    sumHi += quantdot::dot4(h[k] ^ 0x80808080u, bias, x.hi[k]);
  }
  return quantdot::halfBits(scales & 0xFFFFu) * sumLo +
         quantdot::halfBits(scales >> 16) * sumHi;
}

/// The same with the lane's x on the int8 grid (K45Int8X): the quants'
/// products summed exactly as integers by `dp4a`.
__device__ __forceinline__ float q8SplitK45Lane(const uint8_t *q,
                                                const uint8_t *d, int t,
                                                const quantdot::K45Int8X &x) {
  uint4 lo, hi;
  uint32_t scales;
  q8SplitK45Words(q, d, t, lo, hi, scales);
  const int l[4] = {int(lo.x), int(lo.y), int(lo.z), int(lo.w)},
            h[4] = {int(hi.x), int(hi.y), int(hi.z), int(hi.w)};
  int sumLo = 0, sumHi = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    sumLo = __dp4a(l[k], x.lo[k], sumLo);
    sumHi = __dp4a(h[k], x.hi[k], sumHi);
  }
  return fmaf(quantdot::halfBits(scales & 0xFFFFu) * x.dLo, float(sumLo),
              quantdot::halfBits(scales >> 16) * x.dHi * float(sumHi));
}

/// b when kSecond, else a (the x share a kernel's variant dots with).
template <bool kSecond, class A, class B>
__device__ __forceinline__ const auto &pickShare(const A &a, const B &b) {
  if constexpr (kSecond)
    return b;
  else
    return a;
}

/// The end of a gate/up block: each lane's sums v of its 2 kPairs rows (gate
/// rows, then up rows) over its 256-value block, added over the warp's lanes
/// (lane kSpread r ends with row r's) and then over the block's `warps`
/// warps in order through `sums`; act[q] = silu(gate q) * up q for the
/// block's `pairs` pairs.
__device__ __forceinline__ void pairSumsToAct(const float (&v)[2 * kPairs],
                                              float *sums, int warps,
                                              int pairs, float *act) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  constexpr int kSpread = kWarp / (2 * kPairs);
  const float sum = quantdot::spreadSums<2 * kPairs, kWarp / 2>(v, lane);
  if (lane % kSpread == 0)
    sums[warp * 2 * kPairs + lane / kSpread] = sum;
  __syncthreads();
  if (int(threadIdx.x) < pairs) {
    const int q = int(threadIdx.x);
    float g = sums[q], u = sums[kPairs + q];
    for (int w = 1; w < warps; ++w) {
      g += sums[w * 2 * kPairs + q];
      u += sums[w * 2 * kPairs + kPairs + q];
    }
    act[q] = silu(g) * u;
  }
}

/// A block of the gate/up kernel past the routed experts' (kiln-fuse-
/// shared-expert): shared expert rows f0 .. f0 + kSharedPairs - 1 of gate
/// and up, copied as the routed rows are (quants, then scales; with
/// a.sharedEarly before the predecessor wait, since they need no id: the
/// weights never change), dotted with this lane's x (loaded after the
/// wait) and summed in the routed blocks' order; act = silu(gate) * up
/// into a.sharedAct. `warps` as the routed blocks', `active` whether this
/// lane has a 256-value block, kInt8X: x on the int8 grid (the probe). The
/// block's threads run the step prologue here.
template <bool kInt8X = false>
__device__ void sharedGateUpBlock(const ExpertArgs &a, int64_t f0, bool active,
                                  int warps, uint8_t *shared) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp,
            t = lane % 8, b = 4 * warp + lane / 8;
  const int pairs = int(a.sharedFfn - f0 < kSharedPairs ? a.sharedFfn - f0
                                                        : kSharedPairs);
  const uint32_t quantBytes = uint32_t(a.hidden),
                 scaleBytes = uint32_t(a.hidden / 16);
  uint64_t *bars = reinterpret_cast<uint64_t *>(shared);
  // Gate quants, up quants, gate scales, up scales, then warp sums.
  uint8_t *quants = shared + kPairHeadBytes,
          *scales = quants + 2 * kSharedPairs * quantBytes;
  float *sums =
      reinterpret_cast<float *>(scales + 2 * kSharedPairs * scaleBytes);
  if (!a.sharedEarly)
    stepKernelPrologue();
  if (threadIdx.x == 0) {
    for (int q = 0; q < pairs; ++q)
      barrierInit(bars + q);
    barrierInitFence();
    for (int q = 0; q < pairs; ++q) {
      const uint64_t row = uint64_t(f0 + q);
      barrierArriveExpect(bars + q, 2 * (quantBytes + scaleBytes));
      bulkCopy(quants + q * quantBytes, a.sharedGate + row * quantBytes,
               quantBytes, bars + q);
      bulkCopy(quants + (kSharedPairs + q) * quantBytes,
               a.sharedUp + row * quantBytes, quantBytes, bars + q);
      bulkCopy(scales + q * scaleBytes, a.sharedGateScales + row * scaleBytes,
               scaleBytes, bars + q);
      bulkCopy(scales + (kSharedPairs + q) * scaleBytes,
               a.sharedUpScales + row * scaleBytes, scaleBytes, bars + q);
    }
  }
  if (a.sharedEarly)
    stepKernelPrologue();
  quantdot::K45X xv;
  if (active)
    quantdot::loadK45Values(
        reinterpret_cast<const float4 *>(a.x + 256 * int64_t(b)), t, xv);
  quantdot::K45Int8X xi;
  if constexpr (kInt8X)
    if (active)
      quantdot::int8K45(xv, xi);
  const auto &xs = pickShare<kInt8X>(xv, xi);
  __syncthreads(); // the barriers are initialised
  float v[2 * kPairs];
#pragma unroll
  for (int q = 0; q < 2 * kPairs; ++q)
    v[q] = 0.f;
#pragma unroll
  for (int q = 0; q < kSharedPairs; ++q)
    if (q < pairs) {
      barrierWait(bars + q, 0);
      if (active) {
        v[q] = q8SplitK45Lane(quants + q * quantBytes + 256 * b,
                              scales + q * scaleBytes + 16 * b, t, xs);
        v[kPairs + q] = q8SplitK45Lane(
            quants + (kSharedPairs + q) * quantBytes + 256 * b,
            scales + (kSharedPairs + q) * scaleBytes + 16 * b, t, xs);
      }
    }
  pairSumsToAct(v, sums, warps, pairs, a.sharedAct + f0);
}

/// The routed gate/up kernels' body. kHidden > 0: compiled for one hidden
/// width and one expert width kFfn (ModelShapes.h), launched only where
/// hidden == kHidden and ffn == kFfn, with (kHidden / 256 + 3) / 4 warps a
/// block: a row's offsets are constants and every block's pairs are whole.
/// The same products in the same order as the general kernel (kHidden =
/// 0), the same bits. kInt8X (with kHidden > 0; the probe's kernel):
/// each lane rounds its x to the int8 grid while its rows stream in
/// (QuantDot.cuh, "Int8 x"), and its dots are `dp4a`s: W . x' for x' the
/// rounded input (quantdot::int8RoundGroups, groups of 16), not W . x.
template <BulkQuant kQ, int kHidden, int kFfn, bool kInt8X>
__device__ __forceinline__ void expertGateUpK45(const ExpertArgs &a) {
  constexpr bool kFixed = kHidden > 0;
  static_assert(!kFixed || (kHidden % 256 == 0 && kFfn > 0 &&
                            kFfn % kPairs == 0));
  static_assert(kFixed || !kInt8X, "the probe is compiled for fixed shapes");
  static_assert(!kInt8X || kQ == BulkQuant::Q4_K, "the probe is Q4_K's");
  extern __shared__ __align__(128) uint8_t shared[];
  constexpr int kBlockBytes = kBulkBlockBytes<kQ>;
  const int blocksPerRow = kFixed ? kHidden / 256 : a.blocksPerRow;
  const int64_t ffn = kFixed ? int64_t(kFfn) : a.ffn;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp,
            t = lane % 8, b = 4 * warp + lane / 8;
  // kFixed with whole warps of blocks: every lane has one.
  const bool active =
      (kFixed && (kHidden / 256) % 4 == 0) || b < blocksPerRow;
  const int64_t tiles = (ffn + kPairs - 1) / kPairs;
  // The blocks past the routed experts' take the shared expert's rows.
  if (a.sharedFfn > 0 && int64_t(blockIdx.x) >= a.k * tiles) {
    const int warps = kFixed ? (blocksPerRow + 3) / 4 : int(blockDim.x / kWarp);
    sharedGateUpBlock<kInt8X>(
        a, (int64_t(blockIdx.x) - a.k * tiles) * kSharedPairs, active, warps,
        shared);
    return;
  }
  // The router's ids by tags (TaggedIds): thread 0 reads this block's from
  // its words, before the wait, which comes last. x is still safe to read
  // at once: it is the router's input (the router publishes its ids by
  // tags only where it has no norm), written by kernels before the router,
  // which had ended when this kernel was launched (after every router
  // block's own wait).
  const bool polled = a.taggedIds != nullptr; // the same for the grid
  const uint32_t idTag = polled && threadIdx.x == 0 ? taggedIdTag(a) : 0u;
  if (!polled)
    stepKernelPrologue();
  // This lane's x first, so that its loads are in flight with the id's (the
  // copies below wait for the id, and the asm of their barriers keeps any
  // load after them from moving up).
  quantdot::K45X xv;
  if (active)
    quantdot::loadK45Values(
        reinterpret_cast<const float4 *>(a.x + 256 * int64_t(b)), t, xv);
  const int64_t i = blockIdx.x / tiles, f0 = blockIdx.x % tiles * kPairs;
  const int pairs =
      kFixed ? kPairs : int(ffn - f0 < kPairs ? ffn - f0 : kPairs);
  __shared__ int32_t polledId;
  int64_t e = polled ? 0 : a.ids[i];
  const uint32_t rowBytes =
      kFixed ? uint32_t(blocksPerRow * kBlockBytes) : uint32_t(a.gate.rowBytes);
  uint64_t *bars = reinterpret_cast<uint64_t *>(shared);
  // Gate rows f0 .. f0 + kPairs - 1, then the up rows, then warp sums.
  uint8_t *rows = shared + kPairHeadBytes;
  float *sums = reinterpret_cast<float *>(rows + 2 * kPairs * rowBytes);
  if (threadIdx.x == 0) {
    for (int q = 0; q < pairs; ++q)
      barrierInit(bars + q);
    barrierInitFence();
    if (polled)
      polledId = int32_t(e = awaitTaggedId(a, i, idTag));
    if (e >= 0 && e < a.experts) {
      // Fused: expert e's rows are its F gate rows, then its F up rows.
      const int64_t gateRow = a.fused ? e * 2 * ffn + f0 : e * ffn + f0;
      const uint8_t *gate = a.gateData + uint64_t(gateRow) * rowBytes;
      const uint8_t *up = a.fused
                              ? gate + uint64_t(ffn) * rowBytes
                              : a.upData + uint64_t(e * ffn + f0) * rowBytes;
      for (int q = 0; q < pairs; ++q) {
        barrierArriveExpect(bars + q, 2 * rowBytes);
        bulkCopy(rows + q * rowBytes, gate + uint64_t(q) * rowBytes, rowBytes,
                 bars + q);
        bulkCopy(rows + (kPairs + q) * rowBytes, up + uint64_t(q) * rowBytes,
                 rowBytes, bars + q);
      }
    }
  }
  // Prescaled (or rounded to the int8 grid) while the rows stream in.
  std::conditional_t<kInt8X, quantdot::K45Int8X, BulkX<kQ>> xs;
  if (active) {
    if constexpr (kInt8X)
      quantdot::int8K45(xv, xs);
    else
      bulkX<kQ>(xv, xs);
  }
  __syncthreads(); // the barriers are initialised (and the polled id kept)
  if (polled) {
    e = polledId;
    allowDependents();
  }
  const bool valid = e >= 0 && e < a.experts; // the same for the whole block
  // Block 0's check of every id, while its rows stream in: ahead of its
  // own id's load it held that block's copies a round trip behind the
  // others', in a grid of one wave. (Polled, after the wait at the end.)
  if (!polled)
    reportFirstBadId(a);
  if (!valid) {
    if (int(threadIdx.x) < pairs)
      a.act[i * ffn + f0 + threadIdx.x] = 0.f;
    if (polled)
      finishPolled(a);
    return;
  }
  float v[2 * kPairs];
#pragma unroll
  for (int q = 0; q < 2 * kPairs; ++q)
    v[q] = 0.f;
#pragma unroll
  for (int q = 0; q < kPairs; ++q)
    if (q < pairs) {
      barrierWait(bars + q, 0);
      if (active) {
        const uint8_t *block = rows + q * rowBytes + b * kBlockBytes;
        v[q] = bulkBlock<kQ>(block, t, xs);
        v[kPairs + q] = bulkBlock<kQ>(block + kPairs * rowBytes, t, xs);
      }
    }
  pairSumsToAct(v, sums,
                kFixed ? (blocksPerRow + 3) / 4 : int(blockDim.x / kWarp),
                pairs, a.act + i * ffn + f0);
  if (polled)
    finishPolled(a);
}

template <BulkQuant kQ, int kHidden = 0, int kFfn = 0>
__global__ void __launch_bounds__(kThreads)
    expertGateUpK45Kernel(ExpertArgs a) {
  expertGateUpK45<kQ, kHidden, kFfn, false>(a);
}

/// The probe's kernel (setExpertsInt8X): GLM-5's tp=8 routed gate/up
/// rows, Q4_K of 6,144 values with F = 256, x on the int8 grid: a kernel
/// of its own name, so that timelines and ptxas's reports tell it from the
/// fixed-width kernels.
__global__ void __launch_bounds__(kThreads)
    expertGateUpInt8XKernel(ExpertArgs a) {
  expertGateUpK45<BulkQuant::Q4_K, glm5::kHidden, 256, true>(a);
}

/// kHidden > 0: the kernel for one hidden width (a multiple of kDownTile)
/// and kK chosen experts (ModelShapes.h), launched only where hidden ==
/// kHidden, k == kK and a block takes one tile: every block's tile is whole
/// and its rows' offsets are constants. The same products in the same
/// order as the general kernel (kHidden = 0), the same bits.
template <BulkQuant kQ, int kHidden = 0, int kK = 0>
__global__ void __launch_bounds__(kThreads) expertDownK45Kernel(ExpertArgs a) {
  constexpr bool kFixed = kHidden > 0;
  static_assert(!kFixed || (kHidden % kDownTile == 0 && kK > 0));
  extern __shared__ __align__(128) uint8_t shared[];
  const int tilesPer = kFixed ? 1 : a.downTiles, k = kFixed ? kK : int(a.k);
  const int64_t hidden = kFixed ? int64_t(kHidden) : a.hidden;
  const int64_t tiles = (hidden + kDownTile - 1) / kDownTile;
  const int64_t tile0 = int64_t(blockIdx.x) * tilesPer;
  const int nt =
      kFixed ? 1 : int(tiles - tile0 < tilesPer ? tiles - tile0 : tilesPer);
  const int64_t h0 = tile0 * kDownTile;
  const int nrows =
      kFixed ? kDownTile
             : int(hidden - h0 < int64_t(nt) * kDownTile
                       ? hidden - h0
                       : int64_t(nt) * kDownTile);
  constexpr int kRowBytes = kBulkBlockBytes<kQ>; // the 256 values of a row
  const uint32_t rowBytes = kFixed ? uint32_t(kRowBytes)
                                   : uint32_t(a.down.rowBytes),
                 tileBytes = kDownTile * rowBytes;
  // Barriers (a tile's each, then the shared expert's), then the chosen
  // experts (-1: a bad id) and their weights, then rows [tile][slot]
  // [kDownTile rows] and dots [slot][tile * rows]; with the shared expert,
  // then its rows' quants and scales and its dots.
  uint64_t *bars = reinterpret_cast<uint64_t *>(shared);
  int32_t *chosen =
      reinterpret_cast<int32_t *>(shared + 8 * (kMaxDownTiles + 1));
  float *weights = reinterpret_cast<float *>(chosen + k);
  uint8_t *rows = shared + a.downHeadBytes;
  float *dots = reinterpret_cast<float *>(rows + k * tilesPer * tileBytes);
  const bool withShared = a.sharedFfn > 0; // the same for the whole grid
  uint8_t *sharedQuants =
      reinterpret_cast<uint8_t *>(dots + k * tilesPer * kDownTile);
  uint8_t *sharedScales = sharedQuants + tilesPer * kDownTile * 256;
  float *sharedDots =
      reinterpret_cast<float *>(sharedScales + tilesPer * kDownTile * 16);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp,
            g = lane / 8, t = lane % 8, warps = int(blockDim.x / kWarp);
  if (warp == 0) {
    // Before the wait (see above): the ids are final, the weights constant.
    // L2 reads (ld.global.cg): nothing of this kernel's L1 is trusted yet.
    // 32 ids a round, loaded together. With the ids by tags (TaggedIds)
    // the gate/up kernel lets this one start before the router has ended,
    // so they come from the tagged words.
    const uint32_t idTag = a.taggedIds ? taggedIdTag(a) : 0u;
    uint32_t valid = 0;
    for (int s0 = 0; s0 < k; s0 += kWarp) { // the same for the warp
      const int s = s0 + lane;
      int32_t e = s >= k         ? -1
                  : a.taggedIds ? awaitTaggedId(a, s, idTag)
                                : __ldcg(a.ids + s);
      e = e >= 0 && e < a.experts ? e : -1; // faulted by gate/up
      if (s < k)
        chosen[s] = e;
      valid += __popc(__ballot_sync(0xffffffffu, e >= 0));
    }
    __syncwarp(); // chosen[] is written
    if (lane == 0) {
      for (int j = 0; j < nt; ++j)
        barrierInit(bars + j);
      barrierInitFence();
      for (int j = 0; j < nt; ++j) {
        const int64_t r0 = h0 + int64_t(j) * kDownTile;
        const uint32_t bytes =
            uint32_t(hidden - r0 < kDownTile ? hidden - r0 : kDownTile) *
            rowBytes;
        barrierArriveExpect(bars + j, valid * bytes);
        for (int s = 0; s < k; ++s)
          if (chosen[s] >= 0)
            bulkCopy(rows + (j * k + s) * tileBytes,
                     a.downData +
                         (uint64_t(chosen[s]) * hidden + r0) * rowBytes,
                     bytes, bars + j);
      }
      if (withShared) {
        // The shared expert's rows h0 .. of 256 values (Q8_0 split):
        // back to back in both planes, one copy each.
        uint64_t *bar = bars + kMaxDownTiles;
        barrierInit(bar);
        barrierInitFence();
        barrierArriveExpect(bar, uint32_t(nrows) * (256 + 16));
        bulkCopy(sharedQuants, a.sharedDown + uint64_t(h0) * 256,
                 uint32_t(nrows) * 256, bar);
        bulkCopy(sharedScales, a.sharedDownScales + uint64_t(h0) * 16,
                 uint32_t(nrows) * 16, bar);
      }
    }
  }
  __syncthreads(); // the barriers and chosen ids are in place
  stepKernelPrologue();
  // The routing weights, all at once (read in the final sums), and this
  // thread's first row of the addend.
  for (int s = threadIdx.x; s < k; s += blockDim.x)
    weights[s] = a.weights[s];
  const float extra =
      a.addend && int(threadIdx.x) < nrows ? a.addend[h0 + threadIdx.x] : 0.f;
  for (int s = warp; s < k; s += warps) {
    if (chosen[s] < 0) // the same for the whole warp
      continue;
    quantdot::K45X xv;
    quantdot::loadK45Values(
        reinterpret_cast<const float4 *>(a.act + int64_t(s) * 256), t, xv);
    BulkX<kQ> xs;
    bulkX<kQ>(xv, xs);
    for (int j = 0; j < nt; ++j) {
      barrierWait(bars + j, 0);
      const uint8_t *tile = rows + (j * k + s) * tileBytes;
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int r = 4 * g + u;
        v[u] = j * kDownTile + r < nrows
                   ? bulkBlock<kQ>(tile + r * rowBytes, t, xs)
                   : 0.f;
      }
      // Lane 2 u of group g holds row 4 g + u's sum over the 8 lanes.
      const float sum = quantdot::spreadSums<4, 4>(v, lane);
      if (t % 2 == 0)
        dots[(s * tilesPer + j) * kDownTile + 4 * g + t / 2] = sum;
    }
  }
  if (withShared) {
    // The shared expert's rows, warp w taking rows w, w + warps, ...: lane
    // l the values 8 l .. 8 l + 7 (half of Q8_0 block l / 4), then the
    // warp's sum in a fixed tree.
    const float4 *act4 = reinterpret_cast<const float4 *>(a.sharedAct);
    const float4 x0 = act4[2 * lane], x1 = act4[2 * lane + 1];
    const float bias = quantdot::kMagic + 128.f;
    barrierWait(bars + kMaxDownTiles, 0);
    for (int r = warp; r < nrows; r += warps) {
      const uint2 q =
          *reinterpret_cast<const uint2 *>(sharedQuants + r * 256 + 8 * lane);
      const float d = quantdot::halfBits(*reinterpret_cast<const uint16_t *>(
          sharedScales + r * 16 + 2 * (lane / 4)));
      float v = d * (quantdot::dot4(q.x ^ 0x80808080u, bias, x0) +
                     quantdot::dot4(q.y ^ 0x80808080u, bias, x1));
      for (int offset = kWarp / 2; offset > 0; offset /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
      if (lane == 0)
        sharedDots[r] = v;
    }
  }
  __syncthreads();
  for (int r = threadIdx.x; r < nrows; r += blockDim.x) {
    float sum = 0.f;
    for (int s = 0; s < k; ++s)
      if (chosen[s] >= 0)
        sum += weights[s] * dots[s * tilesPer * kDownTile + r];
    // The shared expert's output last, as the add it replaces.
    if (withShared)
      sum += sharedDots[r];
    if (a.addend)
      sum += r == int(threadIdx.x) ? extra : a.addend[h0 + r];
    a.out[h0 + r] = sum;
  }
}

/// Blocks for `items` items of `perBlock` each, or 0 when that does not fit
/// a grid (the caller then refuses the geometry).
unsigned blocksFor(int64_t items, int64_t perBlock) {
  const int64_t blocks = (items + perBlock - 1) / perBlock;
  return blocks <= INT_MAX ? unsigned(blocks) : 0u;
}

/// Launches a split-K mat-vec `kernel` over `items` items, each split
/// a.splits ways: blocks of warpsPerBlock(a.splits) warps, as many as the
/// items need (cudaErrorInvalidValue where that does not fit a grid).
template <typename Args>
cudaError_t launchSplitItems(void (*kernel)(Args), int64_t items,
                             const Args &a, cudaStream_t s) {
  const int warps = warpsPerBlock(a.splits);
  const unsigned blocks = blocksFor(items, warps / a.splits);
  if (blocks == 0)
    return cudaErrorInvalidValue;
  if (cudaError_t e = launchStep(kernel, blocks, warps * kWarp, 0, s, a);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

/// What the bulk-copy expert kernels need of the current device: sm_90+
/// (bulk copies), its multiprocessor count and the shared memory a block
/// may opt into (granted per launch by allowDynamicShared). Attribute
/// queries only: no stream work, so a capture may include them.
struct ExpertDevice {
  bool bulk = false;
  int sms = 0, sharedOptin = 0;
};

ExpertDevice expertDevice() {
  thread_local int cachedDevice = -1;
  thread_local ExpertDevice cached;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  if (device == cachedDevice)
    return cached;
  ExpertDevice d;
  int major = 0;
  const bool answered =
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                             device) == cudaSuccess &&
      cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device) ==
          cudaSuccess &&
      cudaDeviceGetAttribute(&d.sharedOptin,
                             cudaDevAttrMaxSharedMemoryPerBlockOptin,
                             device) == cudaSuccess;
  if (!answered)
    cudaGetLastError();
  d.bulk = answered && major >= 9 && d.sms > 0;
  cachedDevice = device;
  cached = d;
  return d;
}

} // namespace

namespace {

/// The warps of `kernel`, in blocks of kThreads, that the current GPU
/// holds at once (its registers, shared memory and block limits): one
/// wave. Asked of the runtime once per host thread, kernel and device; 0
/// when the runtime cannot say.
int64_t waveWarps(const void *kernel) {
  struct Known {
    const void *kernel;
    int device;
    int64_t warps;
  };
  static thread_local std::vector<Known> known;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    return 0;
  for (const Known &k : known)
    if (k.kernel == kernel && k.device == device)
      return k.warps;
  int processors = 0, resident = 0;
  if (cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount,
                             device) != cudaSuccess ||
      residentBlocks(kernel, kThreads, 0, resident) != cudaSuccess) {
    cudaGetLastError(); // not the launch's error: the caller falls back
    return 0;
  }
  known.push_back(
      {kernel, device, int64_t(processors) * resident * kWarpsPerBlock});
  return known.back().warps;
}

/// Split-K for `items` items of `passes` warp passes each, in whole
/// passes, as splitsFor: enough warps, no idle segment. The split-layout
/// kernels are sized to one wave of `kernel` (kTargetWarps when unknown):
/// a second, partial wave of warps that each make one round trip to
/// memory costs a whole round trip more, where fewer warps with more
/// passes each keep as many bytes in flight (GLM-5 at tp=8 on an H200,
/// whose wave of the q8_0-split kernel is 3,168 warps: 6.23 ms a step at
/// 2,560 and 3,072 target warps, 6.33 at 4,096, 6.68 at 6,144;
/// docs/perf.md).
int splitsForPasses(int64_t items, int64_t passes, const void *kernel) {
  const int64_t wave = waveWarps(kernel);
  const int64_t target = wave > 0 ? wave : kTargetWarps;
  int64_t splits = (target + items - 1) / items;
  splits = splits < kWarpsPerBlock ? splits : kWarpsPerBlock;
  splits = splits < passes ? splits : passes;
  if (splits > 1) {
    const int64_t longest = (passes + splits - 1) / splits;
    splits = (passes + longest - 1) / longest;
  }
  return int(splits > 1 ? splits : 1);
}

/// Whether `live` cuts a batch-1 matrix of `rows` rows to fewer.
bool cutsRows(const LiveRows *live, int64_t rows) {
  return live && live->position && live->rows >= 0 && live->rows < rows;
}

/// Whether one multiprocessor holds at least as many blocks of `fixed` as
/// of `general`, at `threads` threads and `shared` dynamic bytes (each
/// allowed them first, where there are any); asked once per host thread,
/// pair, device and size. A fixed-shape kernel runs only where it does.
template <typename Params>
bool holdsAsMany(void (*fixed)(Params), void (*general)(Params), int threads,
                 size_t shared) {
  struct Known {
    const void *fixed;
    int device, threads;
    size_t shared;
    bool holds;
  };
  static thread_local std::vector<Known> known;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  for (const Known &k : known)
    if (k.fixed == reinterpret_cast<const void *>(fixed) &&
        k.device == device && k.threads == threads && k.shared == shared)
      return k.holds;
  int a = 0, b = 0;
  const bool holds =
      (shared == 0 || (allowDynamicShared(fixed, shared) == cudaSuccess &&
                       allowDynamicShared(general, shared) == cudaSuccess)) &&
      residentBlocks(reinterpret_cast<const void *>(fixed), threads, shared,
                     a) == cudaSuccess &&
      residentBlocks(reinterpret_cast<const void *>(general), threads, shared,
                     b) == cudaSuccess &&
      a >= b;
  if (!holds)
    cudaGetLastError(); // not the launch's error: the general kernel runs
  known.push_back({reinterpret_cast<const void *>(fixed), device, threads,
                   shared, holds});
  return holds;
}

/// The q8_0-split kernel compiled for width `cols`, of the widths in
/// `Widths` (ModelShapes.h), or null.
template <Q8Input kInput, typename Widths>
void (*q8WidthKernel(int64_t cols, Widths widths))(Q8SplitArgs) {
  using Kernel = void (*)(Q8SplitArgs);
  return glm5::pickShape<Kernel>(cols, widths, nullptr, [](auto width) {
    return Kernel(linearQ8SplitKernel<kRows, true, kInput, width.value>);
  });
}

/// launchLinear for the q8_0-split layout (with `norm`: of a normalised
/// input; with `up`: of silu(x) * up; either batch 1).
cudaError_t launchLinearQ8Split(const float *x, int64_t batch,
                                const DeviceWeight &w, int64_t rowsPerBatch,
                                bool stacked, float *y, cudaStream_t s,
                                const InputNorm *norm = nullptr,
                                const float *up = nullptr,
                                const LiveRows *live = nullptr,
                                const RouterTail *tail = nullptr) {
  if (w.type != GGMLType::Q8_0 || w.cols <= 0 || w.cols % 32 || w.rows < 0 ||
      batch < 0 || rowsPerBatch < 0 || !w.data || !w.scales ||
      (reinterpret_cast<uintptr_t>(w.data) & 15) ||
      (reinterpret_cast<uintptr_t>(w.scales) & 1) ||
      w.rows != (stacked ? batch * rowsPerBatch : rowsPerBatch))
    return cudaErrorInvalidValue;
  if (batch * rowsPerBatch == 0)
    return cudaGetLastError();
  Q8SplitArgs a{};
  // After a collective, only the first quietPrefetchPasses() (if any).
  a.prefetchPasses = earlyPrefetch() ? INT32_MAX : quietPrefetchPasses();
  a.quants = reinterpret_cast<const int8_t *>(w.data);
  a.scales = reinterpret_cast<const unsigned short *>(w.scales);
  a.cols = w.cols;
  a.x = x;
  a.batch = batch;
  a.rowsPerBatch = rowsPerBatch;
  a.stacked = stacked;
  a.y = y;
  if (norm) {
    if (batch != 1 || !norm->weight || up)
      return cudaErrorInvalidValue;
    a.normWeight = norm->weight;
    a.normEps = norm->eps;
  }
  if (up) {
    if (batch != 1)
      return cudaErrorInvalidValue;
    a.up = up;
  }
  // Every vector the kernel reads by float4 (x, the norm's weight, up).
  const bool alignedX =
      (w.cols * int64_t(sizeof(float))) % 16 == 0 &&
      ((reinterpret_cast<uintptr_t>(x) |
        (norm ? reinterpret_cast<uintptr_t>(norm->weight) : 0) |
        reinterpret_cast<uintptr_t>(up)) &
       15) == 0;
  using enum Q8Input;
  void (*general)(Q8SplitArgs) =
      norm ? (alignedX ? linearQ8SplitKernel<kRows, true, Norm>
                       : linearQ8SplitKernel<kRows, false, Norm>)
      : up ? (alignedX ? linearQ8SplitKernel<kRows, true, Swiglu>
                       : linearQ8SplitKernel<kRows, false, Swiglu>)
           : (alignedX ? linearQ8SplitKernel<kRows, true>
                       : linearQ8SplitKernel<kRows, false>);
  void (*kernel)(Q8SplitArgs) = general;
  if (tail) {
    // launchLinearRouter checked the tail; this kernel needs x aligned and
    // nothing fused into its input.
    if (!alignedX || norm || up || batch != 1 || stacked || live)
      return cudaErrorInvalidValue;
    a.tail = {reinterpret_cast<const float4 *>(tail->matrix),
              reinterpret_cast<const float4 *>(tail->share),
              tail->rows,
              tail->cols / 4,
              tail->k / 4,
              tail->y,
              int(routerTailMode()),
              earlyPrefetch()};
    void (*const withTail)(Q8SplitArgs) =
        linearQ8SplitTailKernel;
    kernel = withTail;
    // Sized by the plain kernel's wave (its split: launchLinear's bits)
    // unless the tail's registers hold fewer blocks at once.
    if (!holdsAsMany(withTail, general, kThreads, 0))
      general = withTail;
  }
  const bool liveCut = batch == 1 && !stacked && cutsRows(live, rowsPerBatch);
  // The kernel compiled for this width (family q8), where
  // there is one and every item the launch may take (all rows, or the live
  // rows) is whole.
  if (shapeSpecialised(ShapeFamily::Q8) && alignedX && !tail &&
      rowsPerBatch % kRows == 0 &&
      (!liveCut || live->rows % kRows == 0)) {
    void (*fixed)(Q8SplitArgs) =
        norm ? q8WidthKernel<Norm>(w.cols, glm5::Q8NormWidths{})
        : up ? q8WidthKernel<Swiglu>(w.cols, glm5::Q8SwigluWidths{})
             : q8WidthKernel<Plain>(w.cols, glm5::Q8PlainWidths{});
    // Not where it holds fewer blocks at once than the general kernel,
    // whose wave sizes the grid (more registers on some architecture).
    if (fixed && holdsAsMany(fixed, general, kThreads, 0)) {
      kernel = fixed;
      noteShapeSpecialised();
    }
  }
  // Sized by the general kernel's wave, fixed width or not: the two then
  // split alike, so they add in the same order.
  const void *sizing = reinterpret_cast<const void *>(general);
  const int64_t items = batch * ((rowsPerBatch + kRows - 1) / kRows);
  const int64_t passes = (w.cols + kSplitPass - 1) / kSplitPass;
  a.splits = splitsForPasses(items, passes, sizing);
  const int warps = warpsPerBlock(a.splits);
  unsigned blocks = blocksFor(items, warps / a.splits);
  if (blocks == 0)
    return cudaErrorInvalidValue;
  if (liveCut) {
    // The live rows' own split, among those of the same block size (the
    // launch's), and the larger of the two grids.
    const int64_t liveItems = (live->rows + kRows - 1) / kRows;
    int splits = liveItems > 0
                     ? splitsForPasses(liveItems, passes, sizing)
                     : 1;
    while (splits > 1 && warpsPerBlock(splits) != warps)
      --splits;
    if (warpsPerBlock(splits) == warps) {
      a.livePosition = live->position;
      a.liveFrom = live->from;
      a.liveRows = live->rows;
      a.liveSplits = splits;
      const unsigned liveBlocks = blocksFor(liveItems, warps / splits);
      blocks = liveBlocks > blocks ? liveBlocks : blocks;
    }
  }
  if (cudaError_t e = launchStep(kernel, blocks, warps * kWarp, 0, s, a);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

/// linearKSplitKernel's and linearNibbleSplitKernel's planes must be the
/// ones SplitLayout.h describes.
constexpr bool planesAre(GGMLType type, std::initializer_list<uint32_t> sizes) {
  const SplitFormat *f = nullptr;
  for (const SplitFormat &each : kSplitFormats)
    if (each.type == type)
      f = &each;
  if (!f || f->planes != int(sizes.size()))
    return false;
  int p = 0;
  for (uint32_t bytes : sizes)
    if (f->plane[p++].bytes != bytes)
      return false;
  return true;
}
static_assert(planesAre(GGMLType::Q4_K, {128, 16}));
static_assert(planesAre(GGMLType::Q5_K, {128, 16, 32}));
static_assert(planesAre(GGMLType::Q6_K, {128, 16, 64, 2}));

/// launchLinear for the q4_k-split, q5_k-split and q6_k-split layouts.
cudaError_t launchLinearKSplit(const float *x, int64_t batch,
                               const DeviceWeight &w, int64_t rowsPerBatch,
                               bool stacked, float *y, cudaStream_t s) {
  const GGMLType type = splitTypeOf(w.layout);
  const bool q6 = type == GGMLType::Q6_K, high = type != GGMLType::Q4_K;
  if (w.type != type || w.cols <= 0 || w.cols % 256 || w.rows < 0 ||
      batch < 0 || rowsPerBatch < 0 || !w.data || !w.scales ||
      (high && !w.high) || (q6 && !w.d) || !aligned16(w.data) ||
      !aligned16(w.scales) || (high && !aligned16(w.high)) ||
      (q6 && (reinterpret_cast<uintptr_t>(w.d) & 1)) ||
      w.rows != (stacked ? batch * rowsPerBatch : rowsPerBatch))
    return cudaErrorInvalidValue;
  if (batch * rowsPerBatch == 0)
    return cudaGetLastError();
  KSplitArgs a{};
  a.prefetch = earlyPrefetch();
  a.quants = w.data;
  a.scales = w.scales;
  a.high = w.high;
  a.d = reinterpret_cast<const unsigned short *>(w.d);
  a.blocks = w.cols / 256;
  a.x = x;
  a.batch = batch;
  a.rowsPerBatch = rowsPerBatch;
  a.stacked = stacked;
  a.y = y;
  const bool alignedX = aligned16(x);
  void (*kernel)(KSplitArgs) =
      type == GGMLType::Q4_K
          ? (alignedX ? linearKSplitKernel<GGMLType::Q4_K, kRows, true>
                      : linearKSplitKernel<GGMLType::Q4_K, kRows, false>)
      : type == GGMLType::Q5_K
          ? (alignedX ? linearKSplitKernel<GGMLType::Q5_K, kRows, true>
                      : linearKSplitKernel<GGMLType::Q5_K, kRows, false>)
          : (alignedX ? linearKSplitKernel<GGMLType::Q6_K, kRows, true>
                      : linearKSplitKernel<GGMLType::Q6_K, kRows, false>);
  const int64_t items = batch * ((rowsPerBatch + kRows - 1) / kRows);
  a.splits = splitsForPasses(
      items, (a.blocks + kKSplitPassBlocks - 1) / kKSplitPassBlocks,
      reinterpret_cast<const void *>(kernel));
  return launchSplitItems(kernel, items, a, s);
}

static_assert(planesAre(GGMLType::IQ4_XS, {128, 8}));
static_assert(planesAre(GGMLType::IQ4_NL, {16, 2}));
static_assert(planesAre(GGMLType::Q5_0, {16, 2, 4}));
static_assert(planesAre(GGMLType::Q5_1, {16, 8}));

/// launchLinear for the iq4_xs-split, iq4_nl-split, q5_0-split and
/// q5_1-split layouts.
cudaError_t launchLinearNibbleSplit(const float *x, int64_t batch,
                                    const DeviceWeight &w, int64_t rowsPerBatch,
                                    bool stacked, float *y, cudaStream_t s) {
  const GGMLType type = splitTypeOf(w.layout);
  const SplitFormat *f = splitFormatOf(type);
  const bool q50 = type == GGMLType::Q5_0;
  // The scale plane is read 8 bytes at a time for IQ4_XS and Q5_1, else 2.
  const uintptr_t scaleAlign =
      type == GGMLType::IQ4_XS || type == GGMLType::Q5_1 ? 7 : 1;
  if (!f || w.type != type || w.cols <= 0 || w.cols % f->blockValues ||
      w.rows < 0 || batch < 0 || rowsPerBatch < 0 || !w.data || !w.scales ||
      (q50 && !w.high) || !aligned16(w.data) ||
      (reinterpret_cast<uintptr_t>(w.scales) & scaleAlign) ||
      (q50 && (reinterpret_cast<uintptr_t>(w.high) & 3)) ||
      w.rows != (stacked ? batch * rowsPerBatch : rowsPerBatch))
    return cudaErrorInvalidValue;
  if (batch * rowsPerBatch == 0)
    return cudaGetLastError();
  NibbleSplitArgs a{};
  a.prefetch = earlyPrefetch();
  a.quants = w.data;
  a.scales = w.scales;
  a.high = w.high;
  a.units = w.cols / kNibbleUnit;
  a.lanesPerRow = 1;
  while (a.lanesPerRow < kWarp && a.lanesPerRow < a.units)
    a.lanesPerRow *= 2;
  a.x = x;
  a.batch = batch;
  a.rowsPerBatch = rowsPerBatch;
  a.stacked = stacked;
  a.y = y;
  const bool alignedX = aligned16(x);
  void (*kernel)(NibbleSplitArgs) = nullptr;
  switch (type) {
  case GGMLType::IQ4_XS:
    kernel = alignedX ? linearNibbleSplitKernel<GGMLType::IQ4_XS, kRows, true>
                      : linearNibbleSplitKernel<GGMLType::IQ4_XS, kRows, false>;
    break;
  case GGMLType::IQ4_NL:
    kernel = alignedX ? linearNibbleSplitKernel<GGMLType::IQ4_NL, kRows, true>
                      : linearNibbleSplitKernel<GGMLType::IQ4_NL, kRows, false>;
    break;
  case GGMLType::Q5_0:
    kernel = alignedX ? linearNibbleSplitKernel<GGMLType::Q5_0, kRows, true>
                      : linearNibbleSplitKernel<GGMLType::Q5_0, kRows, false>;
    break;
  default: // Q5_1
    kernel = alignedX ? linearNibbleSplitKernel<GGMLType::Q5_1, kRows, true>
                      : linearNibbleSplitKernel<GGMLType::Q5_1, kRows, false>;
    break;
  }
  const int64_t rowsPerItem = kRows * (kWarp / a.lanesPerRow);
  const int64_t items =
      batch * ((rowsPerBatch + rowsPerItem - 1) / rowsPerItem);
  // Narrower rows than a warp are one pass: never split.
  a.splits = a.lanesPerRow == kWarp
                 ? splitsForPasses(items, (a.units + kWarp - 1) / kWarp,
                                   reinterpret_cast<const void *>(kernel))
                 : 1;
  return launchSplitItems(kernel, items, a, s);
}
} // namespace

namespace {

/// Whether linearF32Kernel takes this mat-vec: an F32 weight of 16-byte
/// aligned rows, batch 1, x 16-byte aligned.
bool heldF32Fits(const DeviceWeight &w, int64_t batch, int64_t rowsPerBatch,
                 bool stacked, const float *x) {
  return w.layout == WeightLayout::Blocks && w.type == GGMLType::F32 &&
         batch == 1 && !stacked && w.cols > 0 && w.cols % 4 == 0 &&
         w.rows == rowsPerBatch && w.data && aligned16(w.data) &&
         aligned16(x);
}

/// linearF32Kernel over every row of w (heldF32Fits); with a norm, x
/// RMS-normalised in the kernel (its weight 16-byte aligned).
cudaError_t launchHeldF32(const float *x, const DeviceWeight &w, float *y,
                          cudaStream_t s, const LiveRows *live,
                          const InputNorm *norm) {
  const int64_t rows = w.rows;
  if (rows == 0)
    return cudaGetLastError();
  F32LinearArgs a{reinterpret_cast<const float4 *>(w.data),
                  reinterpret_cast<const float4 *>(x),
                  rows,
                  w.cols / 4,
                  heldF32Splits(w.cols / 4, kWarpsPerBlock),
                  y,
                  nullptr,
                  0,
                  0,
                  nullptr,
                  0.f};
  if (cutsRows(live, rows)) {
    a.livePosition = live->position;
    a.liveFrom = live->from;
    a.liveRows = live->rows;
  }
  if (norm) {
    a.normWeight = reinterpret_cast<const float4 *>(norm->weight);
    a.normEps = norm->eps;
  }
  const int64_t rowsPerBlock = kWarpsPerBlock / a.splits;
  const int64_t blocks = (rows + rowsPerBlock - 1) / rowsPerBlock;
  if (blocks > INT_MAX)
    return cudaErrorInvalidValue;
  if (cudaError_t e = launchStep(norm ? linearF32Kernel<true>
                                      : linearF32Kernel<false>,
                                 unsigned(blocks), kThreads, 0, s, a);
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

} // namespace

cudaError_t launchNormedLinear(const float *x, const InputNorm &norm,
                               const DeviceWeight &w, float *y, cudaStream_t s,
                               const LiveRows *live) {
  if (!norm.weight || w.cols <= 0)
    return cudaErrorInvalidValue;
  if (w.layout == WeightLayout::Q8Split)
    return launchLinearQ8Split(x, 1, w, w.rows, false, y, s, &norm, nullptr,
                               live);
  // An F32 weight's held kernel normalises as it reads x too.
  if (heldF32Fits(w, 1, w.rows, false, x) && aligned16(norm.weight))
    return launchHeldF32(x, w, y, s, live, &norm);
  // Elsewhere the norm's own kernel first, into the scratch.
  if (!norm.scratch)
    return cudaErrorInvalidValue;
  if (cudaError_t e =
          launchRmsNorm(x, 1, w.cols, norm.weight, norm.eps, norm.scratch, s);
      e != cudaSuccess)
    return e;
  return launchLinear(norm.scratch, 1, w, w.rows, false, y, s);
}

cudaError_t launchSwigluLinear(const float *gate, const float *up,
                               const DeviceWeight &w, float *scratch, float *y,
                               cudaStream_t s) {
  if (!gate || !up || w.cols <= 0)
    return cudaErrorInvalidValue;
  if (w.layout == WeightLayout::Q8Split)
    return launchLinearQ8Split(gate, 1, w, w.rows, false, y, s, nullptr, up);
  // Elsewhere the product's own kernel first, into the scratch.
  if (!scratch)
    return cudaErrorInvalidValue;
  if (cudaError_t e = launchSwiglu(gate, up, w.cols, scratch, s);
      e != cudaSuccess)
    return e;
  return launchLinear(scratch, 1, w, w.rows, false, y, s);
}

cudaError_t launchLinear(const float *x, int64_t batch, const DeviceWeight &w,
                         int64_t rowsPerBatch, bool stacked, float *y,
                         cudaStream_t s, const LiveRows *live) {
  switch (w.layout) {
  case WeightLayout::Q8Split:
    return launchLinearQ8Split(x, batch, w, rowsPerBatch, stacked, y, s,
                               nullptr, nullptr, live);
  case WeightLayout::Q4KSplit:
  case WeightLayout::Q5KSplit:
  case WeightLayout::Q6KSplit:
    return launchLinearKSplit(x, batch, w, rowsPerBatch, stacked, y, s);
  case WeightLayout::IQ4XSSplit:
  case WeightLayout::IQ4NLSplit:
  case WeightLayout::Q50Split:
  case WeightLayout::Q51Split:
    return launchLinearNibbleSplit(x, batch, w, rowsPerBatch, stacked, y, s);
  case WeightLayout::Blocks:
    break;
  }
  if (heldF32Fits(w, batch, rowsPerBatch, stacked, x))
    return launchHeldF32(x, w, y, s, live, nullptr);
  LinearArgs a{};
  a.prefetch = earlyPrefetch();
  if (!geometryOf(w, a.w) || batch < 0 || rowsPerBatch < 0 ||
      w.rows != (stacked ? batch * rowsPerBatch : rowsPerBatch))
    return cudaErrorInvalidValue;
  if (batch * rowsPerBatch == 0)
    return cudaGetLastError();
  a.data = w.data;
  a.x = x;
  a.batch = batch;
  a.rowsPerBatch = rowsPerBatch;
  a.stacked = stacked;
  a.y = y;
  const int rows = rowsPerWarp(w.type);
  const int64_t items = batch * ((rowsPerBatch + rows - 1) / rows);
  a.splits = splitsFor(items, a.w, kWarpsPerBlock);
  return launchSplitItems(rows == kRows ? linearKernel<kRows> : linearKernel<1>,
                          items, a, s);
}

namespace {

/// step.linear_router's tail alone (the linear's weight not q8_0-split):
/// block b takes rows b, b + gridDim.x, ... as linearQ8SplitKernel's kTail
/// blocks do, its first row held across the wait.
__global__ void __launch_bounds__(kThreads)
    routerTailKernel(Q8SplitArgs::Tail t, const float4 *x) {
  float4 held[kTailHeld];
  int64_t begin = 0, end = 0;
  holdTailRow(t, true, begin, end, held);
  stepKernelPrologue();
  tailRows(t, x, true, begin, end, held);
}

} // namespace

namespace {
thread_local RouterTailMode tailMode = RouterTailMode::Held;
} // namespace

RouterTailMode routerTailMode() { return tailMode; }
void setRouterTailMode(RouterTailMode mode) { tailMode = mode; }

cudaError_t linearRouterKernelRegisters(int &plain, int &withTail) {
  cudaFuncAttributes a{}, b{};
  if (cudaError_t e = cudaFuncGetAttributes(
          &a, linearQ8SplitKernel<kRows, true, Q8Input::Plain>);
      e != cudaSuccess)
    return e;
  if (cudaError_t e = cudaFuncGetAttributes(
          &b, linearQ8SplitTailKernel);
      e != cudaSuccess)
    return e;
  plain = a.numRegs;
  withTail = b.numRegs;
  return cudaSuccess;
}

cudaError_t launchLinearRouter(const float *x, const DeviceWeight &w,
                               const RouterTail &tail, float *y,
                               cudaStream_t s) {
  if (!x || !y || !tail.matrix || !tail.y || tail.rows <= 0 ||
      tail.k != w.cols || tail.k <= 0 || tail.k % 4 || tail.cols < tail.k ||
      tail.cols % 4 || !aligned16(x) || !aligned16(tail.matrix) ||
      (tail.cols > tail.k && (!tail.share || !aligned16(tail.share))))
    return cudaErrorInvalidValue;
  if (w.layout == WeightLayout::Q8Split)
    return launchLinearQ8Split(x, 1, w, w.rows, false, y, s, nullptr, nullptr,
                               nullptr, &tail);
  if (cudaError_t e = launchLinear(x, 1, w, w.rows, false, y, s);
      e != cudaSuccess)
    return e;
  const Q8SplitArgs::Tail t{reinterpret_cast<const float4 *>(tail.matrix),
                            reinterpret_cast<const float4 *>(tail.share),
                            tail.rows,
                            tail.cols / 4,
                            tail.k / 4,
                            tail.y,
                            int(RouterTailMode::Held)};
  if (tail.rows > INT_MAX)
    return cudaErrorInvalidValue;
  if (cudaError_t e =
          launchStep(routerTailKernel, unsigned(tail.rows), kThreads, 0, s, t,
                     reinterpret_cast<const float4 *>(x));
      e != cudaSuccess)
    return e;
  return cudaGetLastError();
}

namespace {

using ExpertKernel = void (*)(ExpertArgs);

/// make(std::integral_constant<BulkQuant, q>{}): a kernel template's
/// instance for the format q.
template <class Make> ExpertKernel forBulkQuant(BulkQuant q, Make make) {
  switch (q) {
  case BulkQuant::Q4_K:
    return make(std::integral_constant<BulkQuant, BulkQuant::Q4_K>{});
  case BulkQuant::Q5_K:
    return make(std::integral_constant<BulkQuant, BulkQuant::Q5_K>{});
  case BulkQuant::Q2_K:
    return make(std::integral_constant<BulkQuant, BulkQuant::Q2_K>{});
  case BulkQuant::Q3_K:
    return make(std::integral_constant<BulkQuant, BulkQuant::Q3_K>{});
  }
  return nullptr;
}

/// The routed gate/up kernel for rows of `q` of glm5::kHidden values
/// compiled for expert width `ffn`, of those in glm5::ExpertFfnWidths, or
/// null.
ExpertKernel expertWidthKernel(BulkQuant q, int64_t ffn) {
  return forBulkQuant(q, [ffn](auto format) {
    return glm5::pickShape<ExpertKernel>(
        ffn, glm5::ExpertFfnWidths{}, nullptr, [](auto width) {
          return ExpertKernel(expertGateUpK45Kernel<decltype(format)::value,
                                                    glm5::kHidden,
                                                    width.value>);
        });
  });
}

} // namespace

namespace {
thread_local uint64_t sharedInside = 0;
thread_local uint64_t bulkLaunches = 0;
thread_local bool int8X = false;
thread_local uint64_t int8XLaunches = 0;
} // namespace

uint64_t moeSharedInsideLaunches() { return sharedInside; }
uint64_t moeBulkLaunches() { return bulkLaunches; }
thread_local uint64_t taggedIdLaunches = 0;
uint64_t moeTaggedIdLaunches() { return taggedIdLaunches; }
void setExpertsInt8X(bool on) { int8X = on; }
bool expertsInt8X() { return int8X; }
uint64_t moeInt8XLaunches() { return int8XLaunches; }

int64_t moeExpertsActFloats(int64_t k, int64_t ffn, int64_t hidden,
                            const SharedExpert *shared) {
  // The routed experts' act, then the shared expert's: its act inside the
  // bulk-copy kernels, or gate, up, the swiglu's scratch and its output
  // for the separate launches.
  return k * ffn + (shared ? 3 * shared->gate.rows + hidden : 0);
}

cudaError_t launchMoeExperts(const float *x, int64_t hidden, int64_t ffn,
                             int64_t experts, const int32_t *ids,
                             const float *weights, int64_t k,
                             const DeviceWeight &gate, const DeviceWeight *up,
                             const DeviceWeight &down, float *act,
                             const float *addend, float *out, FaultSink fault,
                             cudaStream_t s, const SharedExpert *shared,
                             const TaggedIds *tagged) {
  ExpertArgs a{};
  a.fused = up == nullptr;
  if (hidden <= 0 || ffn <= 0 || experts <= 0 || k < 0 ||
      !geometryOf(gate, a.gate) || !geometryOf(up ? *up : gate, a.up) ||
      !geometryOf(down, a.down) || gate.cols != hidden ||
      gate.rows != experts * ffn * (a.fused ? 2 : 1) ||
      (up && (up->cols != hidden || up->rows != experts * ffn)) ||
      down.cols != ffn || down.rows != experts * hidden ||
      (k > 0 && (!ids || !weights || !act)))
    return cudaErrorInvalidValue;
  if (shared) {
    // The shared expert: gate and up [hidden -> F_s], down [F_s -> hidden];
    // its output is added last, so it takes the addend's place.
    const int64_t sffn = shared->gate.rows;
    if (addend || !act || sffn <= 0 || shared->gate.cols != hidden ||
        shared->up.cols != hidden || shared->up.rows != sffn ||
        shared->down.cols != sffn || shared->down.rows != hidden)
      return cudaErrorInvalidValue;
  }
  a.x = x;
  a.hidden = hidden;
  a.ffn = ffn;
  a.experts = experts;
  a.ids = ids;
  a.weights = weights;
  a.k = k;
  a.gateData = gate.data;
  a.upData = up ? up->data : gate.data;
  a.downData = down.data;
  a.act = act;
  a.out = out;
  a.addend = addend;
  a.fault = fault;
  // Gate and up take the same split and rows per warp (both rows are
  // `hidden` long; several rows a warp only when both have the routine).
  const int rows =
      rowsPerWarp(a.gate.type) == kRows && rowsPerWarp(a.up.type) == kRows
          ? kRows
          : 1;
  const int64_t items = k * ((ffn + rows - 1) / rows);
  const RowGeometry &shorter = a.gate.rowBytes < a.up.rowBytes ? a.gate : a.up;
  a.splits = splitsFor(2 * items, shorter, kWarpsPerBlock / 2);
  a.per = k < kWarpsPerBlock ? (k > 0 ? int(k) : 1) : kWarpsPerBlock;
  const int gateWarps = warpsPerBlock(2 * a.splits);
  const unsigned gateBlocks = blocksFor(items, gateWarps / (2 * a.splits)),
                 downBlocks = blocksFor(hidden, kDownRows);
  if ((k > 0 && gateBlocks == 0) || downBlocks == 0)
    return cudaErrorInvalidValue;

  // The bulk-copy kernels where they apply (Q4_K, Q5_K, Q2_K, Q3_K; sm_90+,
  // 16-aligned data and copies; the gate/up kernel for rows of at most 32
  // blocks, the down kernel for F = 256); every other case takes the
  // generic kernels.
  const ExpertDevice device = k > 0 ? expertDevice() : ExpertDevice{};
  const std::optional<BulkQuant> gateQ =
      a.gate.type == a.up.type ? bulkQuantOf(a.gate.type) : std::nullopt;
  const std::optional<BulkQuant> downQ = bulkQuantOf(a.down.type);
  a.blocksPerRow = int(hidden / 256);
  const int gateFastWarps = (a.blocksPerRow + 3) / 4;
  const int64_t pairTiles = (ffn + kPairs - 1) / kPairs;
  uint64_t gateFastShared =
      kPairHeadBytes + 2 * kPairs * a.gate.rowBytes +
      uint64_t(gateFastWarps) * 2 * kPairs * sizeof(float);
  const bool gateFast = device.bulk && gateQ && a.gate.rowBytes % 16 == 0 &&
                        gateFastWarps <= kWarpsPerBlock && aligned16(x) &&
                        aligned16(a.gateData) && aligned16(a.upData) &&
                        gateFastShared <= uint64_t(device.sharedOptin) &&
                        k * pairTiles <= INT_MAX;
  bool downFast = false;
  uint64_t downFastShared = 0;
  unsigned downFastBlocks = 0;
  // Every tile's copy 16-aligned and a multiple of 16 bytes: rows of 16
  // bytes' multiple (Q4_K, Q5_K), or a whole number of tiles an expert.
  if (device.bulk && ffn == 256 && k <= device.sharedOptin / 256 && downQ &&
      (a.down.rowBytes % 16 == 0 || hidden % kDownTile == 0) &&
      aligned16(a.downData) && aligned16(act)) {
    // The block's shared memory holds its tiles' rows of every chosen
    // expert. (The bound on k above only keeps these sizes in range; the
    // shared memory decides.)
    const int64_t tiles = (hidden + kDownTile - 1) / kDownTile;
    a.downHeadBytes =
        int((8 * (kMaxDownTiles + 1) + 8 * k + 127) / 128 * 128);
    const auto sharedFor = [&](int64_t tilesPer) {
      return uint64_t(a.downHeadBytes) + uint64_t(k * tilesPer * kDownTile) *
                                             (a.down.rowBytes + sizeof(float));
    };
    // One tile a block (GLM-5 at tp=8: 384 blocks of 23 KiB): the kernel
    // is bound by latency, and more blocks in flight beat fewer, longer
    // ones (one block per multiprocessor with 3 tiles each measured slower,
    // `docs/perf.md`).
    const int64_t tilesPer = 1;
    if (sharedFor(tilesPer) <= uint64_t(device.sharedOptin)) {
      downFast = true;
      a.downTiles = int(tilesPer);
      downFastShared = sharedFor(tilesPer);
      downFastBlocks = unsigned((tiles + tilesPer - 1) / tilesPer);
    }
  }

  if (shared) {
    // Inside the bulk-copy kernels where both apply and the shared expert
    // is Q8_0 in its split layout with F_s = 256 (the down kernel's rows of
    // one 256-value block): its gate/up rows in blocks past the routed
    // experts', its down rows beside theirs. Else its own launches first
    // (the unfused ops' kernels), their output then the addend.
    const auto q8Split = [](const DeviceWeight &w) {
      return w.type == GGMLType::Q8_0 && w.layout == WeightLayout::Q8Split &&
             aligned16(w.data) && aligned16(w.scales);
    };
    const int64_t sffn = shared->gate.rows;
    const uint64_t sharedGateBytes =
        kPairHeadBytes + sharedPairBytes(hidden) +
        uint64_t(gateFastWarps) * 2 * kPairs * sizeof(float);
    const bool inside =
        k > 0 && gateFast && downFast && sffn == 256 && hidden % 256 == 0 &&
        q8Split(shared->gate) && q8Split(shared->up) &&
        q8Split(shared->down) && aligned16(act + k * ffn) &&
        sharedGateBytes <= uint64_t(device.sharedOptin) &&
        downFastShared + uint64_t(a.downTiles) * kDownTile *
                                 (256 + 16 + sizeof(float)) <=
            uint64_t(device.sharedOptin);
    if (inside) {
      ++sharedInside;
      a.sharedFfn = sffn;
      a.sharedGate = shared->gate.data;
      a.sharedGateScales = shared->gate.scales;
      a.sharedUp = shared->up.data;
      a.sharedUpScales = shared->up.scales;
      a.sharedDown = shared->down.data;
      a.sharedDownScales = shared->down.scales;
      a.sharedAct = act + k * ffn;
      a.sharedEarly = earlyPrefetch();
      gateFastShared = std::max(gateFastShared, sharedGateBytes);
      downFastShared +=
          uint64_t(a.downTiles) * kDownTile * (256 + 16 + sizeof(float));
    } else {
      float *g = act + k * ffn, *u = g + sffn, *scratch = u + sffn,
            *y = scratch + sffn;
      if (cudaError_t e = launchLinear(x, 1, shared->gate, sffn, false, g, s);
          e != cudaSuccess)
        return e;
      if (cudaError_t e = launchLinear(x, 1, shared->up, sffn, false, u, s);
          e != cudaSuccess)
        return e;
      if (cudaError_t e =
              launchSwigluLinear(g, u, shared->down, scratch, y, s);
          e != cudaSuccess)
        return e;
      a.addend = y;
    }
  }
  if (k > 0) {
    ExpertKernel gateUp =
        gateFast ? forBulkQuant(*gateQ,
                                [](auto format) {
                                  return ExpertKernel(expertGateUpK45Kernel<
                                                      decltype(format)::value>);
                                })
        : rows == kRows ? expertGateUpKernel<kRows>
                        : expertGateUpKernel<1>;
    // The kernel compiled for GLM-5's hidden width and this expert width
    // (family experts), where it holds as many blocks at once.
    if (gateFast && shapeSpecialised(ShapeFamily::Experts) &&
        hidden == glm5::kHidden &&
        a.gate.rowBytes ==
            uint64_t(a.blocksPerRow) * uint64_t(a.gate.blockBytes)) {
      ExpertKernel fixed = expertWidthKernel(*gateQ, ffn);
      if (fixed && holdsAsMany(fixed, gateUp, gateFastWarps * kWarp,
                               gateFastShared)) {
        gateUp = fixed;
        noteShapeSpecialised();
      }
    }
    // The probe's kernel (setExpertsInt8X), compiled for GLM-5's tp=8
    // shape alone.
    if (gateFast && expertsInt8X() && *gateQ == BulkQuant::Q4_K &&
        hidden == glm5::kHidden &&
        ffn == 256 &&
        a.gate.rowBytes ==
            uint64_t(a.blocksPerRow) * uint64_t(a.gate.blockBytes)) {
      gateUp = expertGateUpInt8XKernel;
      ++int8XLaunches;
    }
    if (gateFast) {
      ++bulkLaunches;
      if (cudaError_t e = allowDynamicShared(gateUp, gateFastShared);
          e != cudaSuccess)
        return e;
      // The router's ids by tags, where it published them: the bulk-copy
      // gate/up kernel's routed blocks poll them, and so does the bulk-copy
      // down kernel, which that kernel may then let start before the router
      // has ended.
      if (tagged && tagged->words && tagged->k == k) {
        a.taggedIds = tagged->words;
        a.stepWord = tagged->stepWord;
        ++taggedIdLaunches;
      }
    }
    if (cudaError_t e =
            gateFast
                ? launchStep(gateUp,
                             unsigned(k * pairTiles +
                                      (a.sharedFfn + kSharedPairs - 1) /
                                          kSharedPairs),
                             gateFastWarps * kWarp, gateFastShared, s, a)
                : launchStep(gateUp, gateBlocks, gateWarps * kWarp, 0, s, a);
        e != cudaSuccess)
      return e;
  }
  if (downFast) {
    ++bulkLaunches;
    ExpertKernel kernel = forBulkQuant(*downQ, [](auto format) {
      return ExpertKernel(expertDownK45Kernel<decltype(format)::value>);
    });
    // The kernel compiled for GLM-5's hidden width and top-k
    // (family experts), where it holds as many blocks at once.
    if (shapeSpecialised(ShapeFamily::Experts) && hidden == glm5::kHidden &&
        k == glm5::kTopK &&
        a.downTiles == 1) {
      ExpertKernel fixed = forBulkQuant(*downQ, [](auto format) {
        return ExpertKernel(expertDownK45Kernel<decltype(format)::value,
                                                glm5::kHidden, glm5::kTopK>);
      });
      if (holdsAsMany(fixed, kernel, a.per * kWarp, downFastShared)) {
        kernel = fixed;
        noteShapeSpecialised();
      }
    }
    if (cudaError_t e = allowDynamicShared(kernel, downFastShared);
        e != cudaSuccess)
      return e;
    if (cudaError_t e = launchStep(kernel, downFastBlocks, a.per * kWarp,
                                   downFastShared, s, a);
        e != cudaSuccess)
      return e;
  } else if (cudaError_t e = launchStep(expertDownKernel, downBlocks,
                                        a.per * kWarp, 0, s, a);
             e != cudaSuccess) {
    return e;
  }
  return cudaGetLastError();
}

} // namespace kiln::cuda
