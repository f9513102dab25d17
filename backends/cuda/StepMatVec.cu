//===- StepMatVec.cu - The mat-vec-shaped step ops ------------------------===//
//
// linear, the routed experts' gate/up and down products, and (through
// launchLinear) the router's logits: every dot product is one warp's
// warpDotRow (QuantDot.cuh) over the weight's own GGUF blocks. This file is
// compiled without --fmad=false: the dots may fuse multiply-adds; results
// agree with the CPU within float rounding, as StepKernels.h promises, and
// are deterministic (fixed lane layouts, warp trees and combine orders).
//
// Split-K. A matrix with few rows would leave most of the GPU idle with one
// warp per row, so a row may be cut into `splits` segments of whole units
// (unitValues: 128 values or one block, whichever is larger, so that every
// segment starts 16-aligned in x and on a block boundary in the row), one
// warp each, in the same block of warps; the segments' sums are added in
// segment order through shared memory. The split count depends only on the
// shapes, so the sums are the same bits on every run.
//
// Launch checks are those of StepKernels.cu: invalid host geometry returns
// cudaErrorInvalidValue; no allocation, synchronisation or host read, so
// every launch can be captured in a CUDA graph.
//
//===----------------------------------------------------------------------===//
#include "StepKernels.h"

#include "MatVec.h"
#include "QuantDot.cuh"
#include "Warp.cuh"

#include <climits>
#include <optional>

namespace kiln::cuda {

namespace {

/// Warps per block of every kernel here.
constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * kWarp;
/// Split rows until about this many warps run (an H200 holds 132 x 64)...
constexpr int64_t kTargetWarps = 8192;
/// ...but keep at least this many weight bytes per segment.
constexpr uint64_t kMinSegmentBytes = 1024;
/// Split granularity, in values, for types with smaller blocks.
constexpr int32_t kMinUnitValues = 128;

/// Where a weight's values live: `rows` rows of `cols` values, rowBytes
/// each, in blocks of blockValues values / blockBytes bytes; rows are split
/// in units of unitValues values.
struct RowGeometry {
  GGMLType type;
  int64_t rows, cols;
  uint64_t rowBytes;
  int32_t blockValues, blockBytes, unitValues;
};

/// As StepKernels.cu's geometryOf: false when the type, the row length or
/// the sizes are unusable.
bool geometryOf(const DeviceWeight &w, RowGeometry &g) {
  if (!canRunGeneric(w.type) || w.rows < 0 || w.cols <= 0 ||
      w.cols > INT32_MAX || (w.rows > 0 && !w.data))
    return false;
  std::optional<uint64_t> bytes = rowBytes(w.type, uint64_t(w.cols));
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
                  blockValues > kMinUnitValues ? blockValues : kMinUnitValues};
  return true;
}

/// Segments per row for `dots` row dots (1, 2, 4, ... up to maxSplits).
int splitsFor(int64_t dots, const RowGeometry &g, int maxSplits) {
  const int64_t units = (g.cols + g.unitValues - 1) / g.unitValues;
  int s = 1;
  while (s < maxSplits && dots * 2 * s <= kTargetWarps &&
         g.rowBytes / uint64_t(2 * s) >= kMinSegmentBytes && units >= 2 * s)
    s *= 2;
  return s;
}

/// Claims the step's fault word (first claimer wins) and fills in the rest
/// (as StepKernels.cu).
__device__ void recordFault(FaultSink sink, FaultCode code, int64_t value,
                            int64_t limit) {
  if (!sink.fault)
    return;
  if (atomicCAS(&sink.fault->code, 0, int32_t(code)) == 0) {
    sink.fault->op = sink.op;
    sink.fault->value = value;
    sink.fault->limit = limit;
  }
}

__device__ inline float silu(float g) { return g / (1.f + expf(-g)); }

/// Segment `part` of `parts` of a row dotted with the matching part of x,
/// by the whole warp (0 for an empty segment).
__device__ inline float segmentDot(const RowGeometry &g, const uint8_t *row,
                                   const float *x, int part, int parts) {
  const int64_t units = (g.cols + g.unitValues - 1) / g.unitValues;
  int64_t begin = units * part / parts * g.unitValues;
  int64_t end = units * (part + 1) / parts * g.unitValues;
  begin = begin < g.cols ? begin : g.cols;
  end = end < g.cols ? end : g.cols;
  if (begin >= end)
    return 0.f;
  return warpDotRow(g.type, row + begin / g.blockValues * g.blockBytes,
                    x + begin, end - begin);
}

//===----------------------------------------------------------------------===//
// Linear: item = (n, b), n-major so a block's warps share weight rows when
// batch > 1; `splits` consecutive warps take the segments of one item.
//===----------------------------------------------------------------------===//

struct LinearArgs {
  RowGeometry w;
  const uint8_t *data;
  const float *x;
  int64_t batch, rowsPerBatch;
  bool stacked;
  int splits;
  float *y;
};

__global__ void __launch_bounds__(kThreads) linearKernel(LinearArgs a) {
  __shared__ float partials[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t item =
      int64_t(blockIdx.x) * (kWarpsPerBlock / a.splits) + warp / a.splits;
  const int part = warp % a.splits;
  const bool valid = item < a.batch * a.rowsPerBatch;
  int64_t out = 0;
  float v = 0.f;
  if (valid) {
    const int64_t n = item / a.batch, b = item % a.batch;
    const int64_t row = a.stacked ? b * a.rowsPerBatch + n : n;
    out = b * a.rowsPerBatch + n;
    v = segmentDot(a.w, a.data + uint64_t(row) * a.w.rowBytes,
                   a.x + b * a.w.cols, part, a.splits);
  }
  if (a.splits == 1) { // uniform over the block
    if (valid && lane == 0)
      a.y[out] = v;
    return;
  }
  if (lane == 0)
    partials[warp] = v;
  __syncthreads();
  if (valid && lane == 0 && part == 0) {
    float sum = partials[warp];
    for (int p = 1; p < a.splits; ++p)
      sum += partials[warp + p];
    a.y[out] = sum;
  }
}

//===----------------------------------------------------------------------===//
// MoE experts.
//   gate/up: item (k, f); its gate dot and its up dot, `splits` segments
//     each, are 2 * splits consecutive warps; the first thread of the item
//     adds the segments in order and writes act = silu(gate) * up.
//   down: block of hidden rows; `per` = min(k, 8) consecutive warps take
//     one row's experts i0 .. i0 + per - 1 of each chunk of k, and the
//     row's first thread adds weights[i] * dot in ascending i (the CPU's
//     order), in a register, writing out[h] once at the end. The down kernel
//     never reads x and the gate/up kernel has finished reading it, so out
//     may alias x.
//===----------------------------------------------------------------------===//

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
  FaultSink fault;
};

__global__ void __launch_bounds__(kThreads) expertGateUpKernel(ExpertArgs a) {
  __shared__ float partials[kWarpsPerBlock];
  if (blockIdx.x == 0 && threadIdx.x == 0)
    // One thread reports the first bad id in k order, as the CPU would.
    for (int64_t i = 0; i < a.k; ++i)
      if (a.ids[i] < 0 || a.ids[i] >= a.experts) {
        recordFault(a.fault, FaultCode::ExpertOutOfRange, a.ids[i], a.experts);
        break;
      }
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int perItem = 2 * a.splits;
  const int64_t item =
      int64_t(blockIdx.x) * (kWarpsPerBlock / perItem) + warp / perItem;
  const int slot = warp % perItem, part = slot % a.splits;
  const bool isUp = slot >= a.splits;
  const bool inRange = item < a.k * a.ffn;
  bool valid = false;
  float v = 0.f;
  if (inRange) {
    const int64_t i = item / a.ffn, f = item % a.ffn;
    const int64_t e = a.ids[i];
    if (e >= 0 && e < a.experts) {
      valid = true;
      // Fused: expert e's rows are its F gate rows, then its F up rows.
      const int64_t gateRow = a.fused ? e * 2 * a.ffn + f : e * a.ffn + f;
      const int64_t upRow = a.fused ? gateRow + a.ffn : e * a.ffn + f;
      v = isUp ? segmentDot(a.up, a.upData + uint64_t(upRow) * a.up.rowBytes,
                            a.x, part, a.splits)
               : segmentDot(a.gate,
                            a.gateData + uint64_t(gateRow) * a.gate.rowBytes,
                            a.x, part, a.splits);
    }
  }
  if (lane == 0)
    partials[warp] = v;
  __syncthreads();
  if (inRange && lane == 0 && slot == 0) {
    float g = partials[warp], u = partials[warp + a.splits];
    for (int p = 1; p < a.splits; ++p) {
      g += partials[warp + p];
      u += partials[warp + a.splits + p];
    }
    a.act[item] = valid ? silu(g) * u : 0.f;
  }
}

__global__ void __launch_bounds__(kThreads) expertDownKernel(ExpertArgs a) {
  __shared__ float partials[kWarpsPerBlock];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int rowsPerBlock = kWarpsPerBlock / a.per;
  const int local = warp / a.per, slot = warp % a.per;
  const int64_t h = int64_t(blockIdx.x) * rowsPerBlock + local;
  const bool active = local < rowsPerBlock && h < a.hidden;
  float sum = 0.f;
  for (int64_t i0 = 0; i0 < a.k; i0 += a.per) {
    const int64_t i = i0 + slot;
    float v = 0.f;
    if (active && i < a.k) {
      const int64_t e = a.ids[i];
      if (e >= 0 && e < a.experts) // a bad id faulted in expertGateUpKernel
        v = warpDotRow(a.down.type,
                       a.downData + uint64_t(e * a.hidden + h) * a.down.rowBytes,
                       a.act + i * a.ffn, a.ffn);
    }
    if (lane == 0)
      partials[warp] = v;
    __syncthreads();
    if (active && lane == 0 && slot == 0)
      for (int j = 0; j < a.per && i0 + j < a.k; ++j) {
        const int64_t e = a.ids[i0 + j];
        if (e >= 0 && e < a.experts)
          sum += a.weights[i0 + j] * partials[warp + j];
      }
    __syncthreads(); // the partials are read before the next chunk's writes
  }
  if (active && lane == 0 && slot == 0)
    a.out[h] = sum;
}

/// Blocks for `items` items of `perBlock` each, or 0 when that does not fit
/// a grid (the caller then refuses the geometry).
unsigned blocksFor(int64_t items, int64_t perBlock) {
  const int64_t blocks = (items + perBlock - 1) / perBlock;
  return blocks <= INT_MAX ? unsigned(blocks) : 0u;
}

} // namespace

cudaError_t launchLinear(const float *x, int64_t batch, const DeviceWeight &w,
                         int64_t rowsPerBatch, bool stacked, float *y,
                         cudaStream_t s) {
  LinearArgs a{};
  if (!geometryOf(w, a.w) || batch < 0 || rowsPerBatch < 0 ||
      w.rows != (stacked ? batch * rowsPerBatch : rowsPerBatch))
    return cudaErrorInvalidValue;
  const int64_t items = batch * rowsPerBatch;
  if (items == 0)
    return cudaGetLastError();
  a.data = w.data;
  a.x = x;
  a.batch = batch;
  a.rowsPerBatch = rowsPerBatch;
  a.stacked = stacked;
  a.splits = splitsFor(items, a.w, kWarpsPerBlock);
  a.y = y;
  const unsigned blocks = blocksFor(items, kWarpsPerBlock / a.splits);
  if (blocks == 0)
    return cudaErrorInvalidValue;
  linearKernel<<<blocks, kThreads, 0, s>>>(a);
  return cudaGetLastError();
}

cudaError_t launchMoeExperts(const float *x, int64_t hidden, int64_t ffn,
                             int64_t experts, const int32_t *ids,
                             const float *weights, int64_t k,
                             const DeviceWeight &gate, const DeviceWeight *up,
                             const DeviceWeight &down, float *act, float *out,
                             FaultSink fault, cudaStream_t s) {
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
  a.fault = fault;
  // Gate and up take the same split (both rows are `hidden` long).
  const RowGeometry &shorter =
      a.gate.rowBytes < a.up.rowBytes ? a.gate : a.up;
  a.splits = splitsFor(2 * k * ffn, shorter, kWarpsPerBlock / 2);
  a.per = k < kWarpsPerBlock ? (k > 0 ? int(k) : 1) : kWarpsPerBlock;
  const unsigned gateBlocks =
                     blocksFor(k * ffn, kWarpsPerBlock / (2 * a.splits)),
                 downBlocks = blocksFor(hidden, kWarpsPerBlock / a.per);
  if ((k > 0 && gateBlocks == 0) || downBlocks == 0)
    return cudaErrorInvalidValue;
  if (k > 0) {
    expertGateUpKernel<<<gateBlocks, kThreads, 0, s>>>(a);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
      return e;
  }
  expertDownKernel<<<downBlocks, kThreads, 0, s>>>(a);
  return cudaGetLastError();
}

} // namespace kiln::cuda
