//===- CpuKernels.h - Reference kernels of the CPU backend ------*- C++ -*-===//
//
// Plain, readable float32 kernels for every step op: the reference every
// other backend is checked against. Weights are read as the file stores them
// and dequantised row by row (dequantise-then-dot); activations are f32;
// caches are f16, bf16 or f32. Every kernel is deterministic: a parallel
// kernel gives each output element to exactly one thread, which computes it
// in a fixed order, so results do not depend on the thread count.
//
// No LLVM/MLIR here: this library is part of the runtime's plugin.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_CPU_CPUKERNELS_H
#define KILN_BACKENDS_CPU_CPUKERNELS_H

#include "quant/QuantTypes.h"
#include "support/Error.h"

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln::cpu {

/// A weight tensor as the GGUF file stores it.
struct WeightView {
  const uint8_t *data = nullptr; ///< first byte of the tensor
  uint64_t bytes = 0;            ///< its size in the file
  GGMLType type = GGMLType::F32;
  std::vector<int64_t> dims; ///< GGUF order: ne[0] (contiguous) first
  std::string name;          ///< for error messages
};

/// Element types a cache may be stored in.
enum class CacheType { F32, F16, BF16 };

/// A cache: `positions` rows of `width` values.
struct CacheView {
  void *data = nullptr;
  CacheType type = CacheType::F16;
  int64_t positions = 0;
  int64_t width = 0;
};

enum class RopeStyle { Interleaved, NeoX };
enum class Gating { Sigmoid, Softmax };

/// A fixed set of worker threads. parallelFor(n, fn) splits [0, n) into one
/// contiguous chunk per thread (chunk boundaries depend only on n and the
/// thread count) and returns when every fn(begin, end) has returned.
class ThreadPool {
public:
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  unsigned size() const;
  void parallelFor(int64_t n, const std::function<void(int64_t, int64_t)> &fn);

private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Row `token` of a `[hidden, vocab]` table, dequantised into out[hidden].
/// A token outside [0, vocab) is an error naming the table.
Status embed(const WeightView &table, int32_t token, float *out);

/// Every value of `w`, row-major (ne[0] fastest), into out.
Status dequant(const WeightView &w, float *out);

/// Mat-vec with a quantised weight, rows dequantised one at a time.
/// 2-D w [K, N]: x is [batch][K], y [batch][N], y[b][n] = sum_k x[b][k] *
///   W[n][k] where W[n] is the n-th row of ne[0] = K values.
/// 3-D w [K, N, B] (one matrix per batch row): batch must be B, and
///   y[b][n] = sum_k x[b][k] * W[b * N + n][k].
/// Accumulates in f32, k ascending.
Status linear(const float *x, int64_t batch, const WeightView &w, float *y,
              ThreadPool &pool);

/// y = x / sqrt(mean(x^2) + eps) * w over each of `rows` rows of n values.
/// y may be x.
void rmsNorm(const float *x, int64_t rows, int64_t n, const float *w,
             float eps, float *y);

/// sqrt(sum(x^2) / n + eps) over n values, the squares summed in f32 with
/// i ascending: what rmsNorm divides a row by, bit for bit.
float rms(const float *x, int64_t n, float eps);

/// y = (x - mean) / sqrt(var + eps) * w + b per row (population variance).
/// y may be x.
void layerNorm(const float *x, int64_t rows, int64_t n, const float *w,
               const float *b, float eps, float *y);

/// Rotary embedding of values [offset, offset + dims) of each row of n
/// values by `position`; others are copied. Pair i (0 <= i < dims / 2)
/// turns by angle position * theta^(-2i / dims), computed in double:
/// Interleaved pairs (offset + 2i, offset + 2i + 1), NeoX pairs
/// (offset + i, offset + i + dims / 2); (a, b) -> (a cos - b sin,
/// a sin + b cos). y may be x.
void rope(const float *x, int64_t rows, int64_t n, int32_t position,
          RopeStyle style, float theta, int64_t offset, int64_t dims,
          float *y);

/// y = a + b; y = silu(g) * u with silu(g) = g / (1 + exp(-g)). y may alias.
void add(const float *a, const float *b, int64_t n, float *y);
void swiglu(const float *g, const float *u, int64_t n, float *y);

/// y = w . (silu(g) * u) with w [k, N]: the product into `product` (k
/// values), then the mat-vec, as step.swiglu then step.linear write them.
Status swigluLinear(const float *g, const float *u, int64_t k,
                    const WeightView &w, float *product, float *y,
                    ThreadPool &pool);

/// A dense SwiGLU FFN (a MoE layer's shared expert): y = down .
/// (silu(gate . x) * (up . x)) with gate and up [K, F] and down [F, N],
/// computed as step.fused_linear of gate and up (into gateUp, 2F values:
/// gate's rows then up's) then step.swiglu_linear (the product into
/// `product`, F values) compute it, so the same bits as those two ops.
Status swigluFfn(const float *x, const WeightView &gate, const WeightView &up,
                 const WeightView &down, float *gateUp, float *product,
                 float *y, ThreadPool &pool);

/// Index of the largest of n values; ties go to the lowest index.
int32_t argmax(const float *x, int64_t n);

/// The largest key of n values (support/DrawKey.h: each value's index in
/// the whole vector is base + i), ties to the lowest index, from the
/// sampling words `words` (`count` of them: DrawKey.h's two forms; a
/// temperature of 0: the values themselves) at `position`: the index (-1
/// for n <= 0) and its key in `key`. A cut (top-p, top-k, min-p) needs
/// the whole vector (base 0). Invalid words are an error naming the word.
Expected<int32_t> drawArgmax(const float *x, int64_t n, int64_t base,
                             const int32_t *words, int count, int32_t position,
                             float &key);

/// y[0, n) = x[0, n) adjusted by the sampling words' adjusting form
/// (DrawKey.h adjustPart: x holds tokens base .. base + n of a vocabulary
/// of `vocab`). Invalid words are an error naming the word.
Status adjustLogits(const int32_t *words, int count, int64_t vocab,
                    const float *x, int64_t n, int64_t base, float *y);

/// Row `position` of `cache` becomes entry[width] (converted, round to
/// nearest even). position outside [0, positions) is an error: the context
/// is full.
Status cacheAppend(const float *entry, int32_t position, CacheView cache);

/// step.norm_rope_append: y = entry (width = cache.width); y[0, normDims)
/// = rmsNorm (bias null) or layerNorm (with bias) of entry[0, normDims)
/// with w; rope of y (offset, dims, as rope above); then cacheAppend of y.
/// The same calls in that order, so the same bits as the ops unfused.
Status normRopeAppend(const float *entry, int64_t normDims, const float *w,
                      const float *bias, float eps, int32_t position,
                      RopeStyle style, float theta, int64_t offset,
                      int64_t dims, CacheView cache);

/// Absorbed MLA decode attention. Cache rows are [latent | rope] (width =
/// latent + rope). Attended positions: 0..position, or, when `selected` is
/// given, selected[0 .. *count). For each head h:
///   s[h,t] = (qLatent[h] . row[t][0:latent] + qRope[h] . row[t][latent:])
///            * scale
///   p = softmax_t(s) (max-subtracted, f32), out[h] = sum_t p[h,t] *
///   row[t][0:latent].
/// qLatent [heads][latent], qRope [heads][rope], out [heads][latent].
/// A position or selected entry outside the cache is an error.
Status mlaAttention(const float *qLatent, const float *qRope, int64_t heads,
                    int64_t latent, int64_t rope, const CacheView &cache,
                    int32_t position, const int32_t *selected,
                    const int32_t *count, float scale, float *out,
                    ThreadPool &pool);

/// DSA indexer over cached keys 0..position (cache width = dim):
///   score[t] = scale * sum_h w[h] * relu(q[h] . key[t])
/// then the topK highest scores (ties to the lower t). Writes the chosen
/// positions in ascending order into selected[topK], zeros after them, and
/// count = min(topK, position + 1). With position + 1 <= topK every
/// position is selected and q and w are not read.
Status dsaIndexer(const float *q, int64_t heads, int64_t dim,
                  const float *headWeights, const CacheView &cache,
                  int32_t position, int64_t topK, float scale,
                  int32_t *selected, int32_t *count);

/// MoE router. gate is [hidden, E]: logit[e] = x . gate row e (f32);
/// p = sigmoid(logit) or softmax(logit); choose the topK experts by
/// p[e] + bias[e] (bias may be null; ties to the lower id), in descending
/// order of that score; weights[k] = p[ids[k]], divided by
/// max(sum of them, 6.1035e-5) when `normalize`, then times routedScale.
Status moeRouter(const float *x, int64_t hidden, const WeightView &gate,
                 const float *bias, int64_t topK, Gating gating,
                 bool normalize, float routedScale, int32_t *ids,
                 float *weights);

/// The router's choice from its logits (step.moe_choose; moeRouter after
/// its dots): p = sigmoid(logits) or softmax(logits), then the topK and
/// their weights exactly as moeRouter chooses them. A topK outside [0,
/// experts] is an error.
Status moeChoose(const float *logits, int64_t experts, const float *bias,
                 int64_t topK, Gating gating, bool normalize, float routedScale,
                 int32_t *ids, float *weights);

/// One rank's share of the router's logits (step.router_partial), gate
/// [hidden, E]: v[h] = norm[h] * (partial[h] + residualScale *
/// residual[h]), each product and sum rounded to f32 in that order, then
/// out[e] = sum over h ascending of gate[e][h] * v[h], accumulated in f32
/// from 0. The gate's rows are read as f32 (exact for an F32 gate).
Status routerPartial(const float *partial, const float *residual,
                     int64_t hidden, const WeightView &gate, const float *norm,
                     float residualScale, float *out);

/// The composed router matrix of step.linear_router (common/StepOps.h's
/// contract): `experts` rows of k + hidden / ranks floats into out, row e
/// = [M[e][0, k), C[e][0, hidden / ranks)], with w the rank's part of the
/// linear's weight [k, hidden] (its rows dequantised as linear reads them),
/// gate [hidden, experts] F32, norm[hidden]:
///   M[e][j] = float(sum over n ascending of (double(gate[e][n]) *
///     double(norm[n])) * double(w[n][j])), no fused multiply-add;
///   C[e][j] = gate[e][rank * hidden / ranks + j] * norm[...] in float.
/// Made once at load; the experts' rows are shared out over `pool`.
Status composeRouter(const WeightView &w, const WeightView &gate,
                     const float *norm, int64_t rank, int64_t ranks,
                     std::vector<float> &out, ThreadPool &pool);

/// The rank's share of the router's logits from the composed matrix
/// (`experts` rows of k + shareCols): out[e] = sum over c ascending of
/// matrix[e][c] * [x ; share][c], accumulated in f32 from 0, x k values
/// and share shareCols.
void routerTail(const float *matrix, int64_t experts, int64_t k,
                int64_t shareCols, const float *x, const float *share,
                float *out);

/// Routed experts: out[hidden] = sum_k weights[k] * down_e(silu(gate_e . x)
/// * (up_e . x)), e = ids[k], k ascending. `experts` is (gate [H, F, E],
/// up [H, F, E], down [F, H, E]) or (gate_up [H, 2F, E], down [F, H, E])
/// where an expert's first F rows of gate_up are its gate and the next F
/// its up. Expert e of a [K, N, E] weight is rows e*N .. e*N + N - 1. Only
/// the chosen experts' rows are read. An id outside [0, E) is an error.
Status moeExperts(const float *x, int64_t hidden, const int32_t *ids,
                  const float *weights, int64_t k,
                  const std::vector<const WeightView *> &experts, float *out,
                  ThreadPool &pool);

} // namespace kiln::cpu

#endif // KILN_BACKENDS_CPU_CPUKERNELS_H
