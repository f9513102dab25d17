//===- CpuKernels.cpp - Reference kernels of the CPU backend --------------===//
//
// Every sum here runs in f32 in a fixed order (ascending index) and every
// parallel loop gives each output element to exactly one chunk, so a result
// is the same bits whatever the thread count. Weights are validated (shape
// against bytes, indices against dims) before any parallel work starts, so a
// worker never meets a bad size.
//
//===----------------------------------------------------------------------===//
#include "cpu/CpuKernels.h"

#include "quant/FloatFormats.h"
#include "quant/QuantFormats.h"
#include "support/DrawKey.h"

#include <fmt/core.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <span>

namespace kiln::cpu {

//===----------------------------------------------------------------------===//
// ThreadPool
//===----------------------------------------------------------------------===//

/// Workers 1 .. size-1 each own a thread; chunk 0 runs on the caller. A call
/// publishes (fn, n) under `mutex` and bumps `generation`; each worker runs
/// its chunk of that generation once and counts itself off in `pending`.
struct ThreadPool::State {
  unsigned threads = 1;
  std::vector<std::thread> workers;

  std::mutex callMutex; // one parallelFor at a time
  std::mutex mutex;
  std::condition_variable wake;
  std::condition_variable done;
  const std::function<void(int64_t, int64_t)> *fn = nullptr;
  int64_t n = 0;
  uint64_t generation = 0;
  unsigned pending = 0;
  bool stop = false;

  /// Chunk `i` of [0, n): boundaries depend only on n and `threads`.
  std::pair<int64_t, int64_t> chunk(int64_t count, unsigned i) const {
    // n * i / threads without overflow for any n < 2^63.
    auto bound = [&](unsigned j) {
      return count / threads * j + count % threads * j / threads;
    };
    return {bound(i), bound(i + 1)};
  }

  void workerLoop(unsigned index);
};

namespace {
/// The pool whose chunk the current thread is running, so that a nested
/// parallelFor on the same pool runs inline instead of waiting on itself.
thread_local const void *currentPool = nullptr;
} // namespace

void ThreadPool::State::workerLoop(unsigned index) {
  currentPool = this;
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex);
  while (true) {
    wake.wait(lock, [&] { return stop || generation != seen; });
    if (stop)
      return;
    seen = generation;
    auto [begin, end] = chunk(n, index);
    const auto *work = fn;
    lock.unlock();
    if (begin < end)
      (*work)(begin, end);
    lock.lock();
    if (--pending == 0)
      done.notify_one();
  }
}

ThreadPool::ThreadPool(unsigned threads) : state_(std::make_unique<State>()) {
  state_->threads = std::max(1u, threads);
  for (unsigned i = 1; i < state_->threads; ++i)
    state_->workers.emplace_back([s = state_.get(), i] { s->workerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  for (std::thread &t : state_->workers)
    t.join();
}

unsigned ThreadPool::size() const { return state_->threads; }

void ThreadPool::parallelFor(int64_t n,
                             const std::function<void(int64_t, int64_t)> &fn) {
  if (n <= 0)
    return;
  State &s = *state_;
  // A single thread, or a call from inside one of our own chunks: run the
  // same chunks in order on this thread (same boundaries, same results).
  if (s.threads == 1 || currentPool == &s) {
    for (unsigned i = 0; i < s.threads; ++i)
      if (auto [begin, end] = s.chunk(n, i); begin < end)
        fn(begin, end);
    return;
  }
  std::lock_guard<std::mutex> call(s.callMutex);
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.fn = &fn;
    s.n = n;
    s.pending = s.threads - 1;
    ++s.generation;
  }
  s.wake.notify_all();
  const void *outer = currentPool;
  currentPool = &s;
  if (auto [begin, end] = s.chunk(n, 0); begin < end)
    fn(begin, end);
  currentPool = outer;
  std::unique_lock<std::mutex> lock(s.mutex);
  s.done.wait(lock, [&] { return s.pending == 0; });
  s.fn = nullptr;
}

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

namespace {

/// A weight seen as `rows` rows of `cols` values, each `rowBytes` long; built
/// only by rowsOf(), which checks it against the tensor's byte count.
struct WeightRows {
  int64_t cols = 0;
  int64_t rows = 0;
  uint64_t rowBytes = 0;
};

std::string where(const char *op) { return fmt::format("cpu {}", op); }

std::string dimsText(const std::vector<int64_t> &dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

/// Checks that `w` has `rank` dims, a dequantisable type, and exactly the
/// bytes its dims need; the file may be corrupt or the binder wrong, and a
/// kernel must not read past the tensor either way.
Expected<WeightRows> rowsOf(const WeightView &w, size_t rank, const char *op) {
  if (w.dims.size() != rank)
    return Error(where(op), w.name,
                 fmt::format("expected {} dims, weight has {} {}", rank,
                             w.dims.size(), dimsText(w.dims)));
  for (int64_t d : w.dims)
    if (d <= 0)
      return Error(
          where(op), w.name,
          fmt::format("dims {} must all be positive", dimsText(w.dims)));
  if (!canDequantize(w.type))
    return Error(where(op), w.name,
                 fmt::format("type {} cannot be dequantised", nameOf(w.type)));
  std::optional<uint64_t> rowBytes =
      kiln::rowBytes(w.type, static_cast<uint64_t>(w.dims[0]));
  if (!rowBytes)
    return Error(where(op), w.name,
                 fmt::format("row of {} values is not a whole number of {} "
                             "blocks",
                             w.dims[0], nameOf(w.type)));
  uint64_t rows = 1;
  for (size_t i = 1; i < rank; ++i)
    if (__builtin_mul_overflow(rows, static_cast<uint64_t>(w.dims[i]), &rows))
      return Error(where(op), w.name,
                   fmt::format("dims {} overflow", dimsText(w.dims)));
  uint64_t bytes = 0;
  if (rows > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(rows, *rowBytes, &bytes))
    return Error(where(op), w.name,
                 fmt::format("dims {} overflow", dimsText(w.dims)));
  if (bytes != w.bytes)
    return Error(where(op), w.name,
                 fmt::format("{} {} needs {} bytes, weight has {}",
                             nameOf(w.type), dimsText(w.dims), bytes, w.bytes));
  if (!w.data)
    return Error(where(op), w.name, "weight has no data");
  return WeightRows{w.dims[0], static_cast<int64_t>(rows), *rowBytes};
}

/// Row `row` (already checked against shape.rows) of `w` into out[cols].
Status dequantRow(const WeightView &w, const WeightRows &shape, int64_t row,
                  float *out, const char *op) {
  std::span<const uint8_t> blocks(
      w.data + static_cast<uint64_t>(row) * shape.rowBytes, shape.rowBytes);
  Status s = dequantize(w.type, blocks,
                        std::span<float>(out, static_cast<size_t>(shape.cols)));
  if (!s)
    return Error(where(op), w.name, s.error().message());
  return s;
}

/// The error of the lowest-numbered failing item among parallel chunks, so
/// that the reported error too does not depend on the thread count.
class FirstError {
public:
  void record(int64_t item, Status s) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!s.isOk() && (!error_ || item < item_)) {
      error_ = s.error();
      item_ = item;
    }
  }
  Status status() const { return error_ ? Status(*error_) : Status::ok(); }

private:
  std::mutex mutex_;
  std::optional<Error> error_;
  int64_t item_ = 0;
};

float dot(const float *a, const float *b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i)
    sum += a[i] * b[i];
  return sum;
}

float silu(float g) { return g / (1.0f + std::exp(-g)); }

float readCache(const CacheView &cache, int64_t index) {
  switch (cache.type) {
  case CacheType::F32:
    return static_cast<const float *>(cache.data)[index];
  case CacheType::F16:
    return halfToFloat(static_cast<const uint16_t *>(cache.data)[index]);
  case CacheType::BF16:
    return bf16ToFloat(static_cast<const uint16_t *>(cache.data)[index]);
  }
  return 0.0f;
}

/// Row `position` of `cache` (checked by the caller) as f32 into out[width].
void readCacheRow(const CacheView &cache, int64_t position, float *out) {
  for (int64_t j = 0; j < cache.width; ++j)
    out[j] = readCache(cache, position * cache.width + j);
}

Status checkCache(const CacheView &cache, int64_t width, const char *op) {
  if (!cache.data || cache.positions <= 0)
    return Error(where(op), "cache", "cache is empty");
  if (cache.width != width)
    return Error(where(op), "cache",
                 fmt::format("cache rows hold {} values, expected {}",
                             cache.width, width));
  return Status::ok();
}

Status checkPosition(const CacheView &cache, int64_t position, const char *op) {
  if (position < 0 || position >= cache.positions)
    return Error(where(op), "position",
                 fmt::format("position {} is outside the cache's {} positions",
                             position, cache.positions));
  return Status::ok();
}

/// NaN ranks below everything, so a comparison sort stays well defined.
float rankable(float score) {
  return std::isnan(score) ? -std::numeric_limits<float>::infinity() : score;
}

/// The `k` indices of the highest `scores`, best first; ties go to the lower
/// index.
std::vector<int32_t> topIndices(const std::vector<float> &scores, int64_t k) {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return rankable(scores[a]) > rankable(scores[b]);
  });
  order.resize(static_cast<size_t>(k));
  return order;
}

} // namespace

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

Status embed(const WeightView &table, int32_t token, float *out) {
  Expected<WeightRows> shape = rowsOf(table, 2, "embed");
  if (!shape)
    return shape.status();
  if (token < 0 || token >= shape->rows)
    return Error(where("embed"), table.name,
                 fmt::format("token {} is outside the vocabulary of {}", token,
                             shape->rows));
  return dequantRow(table, *shape, token, out, "embed");
}

Status dequant(const WeightView &w, float *out) {
  Expected<WeightRows> shape =
      rowsOf(w, std::max<size_t>(w.dims.size(), 1), "dequant");
  if (!shape)
    return shape.status();
  for (int64_t r = 0; r < shape->rows; ++r)
    if (Status s = dequantRow(w, *shape, r, out + r * shape->cols, "dequant");
        !s)
      return s;
  return Status::ok();
}

Status linear(const float *x, int64_t batch, const WeightView &w, float *y,
              ThreadPool &pool) {
  const char *op = "linear";
  if (w.dims.size() != 2 && w.dims.size() != 3)
    return Error(where(op), w.name,
                 fmt::format("expected a [K, N] or [K, N, B] weight, got {}",
                             dimsText(w.dims)));
  Expected<WeightRows> shape = rowsOf(w, w.dims.size(), op);
  if (!shape)
    return shape.status();
  const bool stacked = w.dims.size() == 3;
  if (batch < 0 || (stacked && batch != w.dims[2]))
    return Error(where(op), w.name,
                 stacked ? fmt::format("batch {} does not match the weight's "
                                       "{} matrices",
                                       batch, w.dims[2])
                         : fmt::format("batch {} is negative", batch));
  const int64_t k = w.dims[0], n = w.dims[1];

  FirstError error;
  pool.parallelFor(n, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t j = begin; j < end; ++j) {
      if (!stacked) {
        // One dequantised row serves every batch row.
        if (Status s = dequantRow(w, *shape, j, row.data(), op); !s)
          return error.record(j, s);
        for (int64_t b = 0; b < batch; ++b)
          y[b * n + j] = dot(x + b * k, row.data(), k);
        continue;
      }
      for (int64_t b = 0; b < batch; ++b) {
        if (Status s = dequantRow(w, *shape, b * n + j, row.data(), op); !s)
          return error.record(j, s);
        y[b * n + j] = dot(x + b * k, row.data(), k);
      }
    }
  });
  return error.status();
}

float rms(const float *x, int64_t n, float eps) {
  float sumSq = 0.0f;
  for (int64_t i = 0; i < n; ++i)
    sumSq += x[i] * x[i];
  return std::sqrt(sumSq / static_cast<float>(n) + eps);
}

void rmsNorm(const float *x, int64_t rows, int64_t n, const float *w, float eps,
             float *y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    const float divisor = rms(xr, n, eps);
    for (int64_t i = 0; i < n; ++i)
      yr[i] = xr[i] / divisor * w[i];
  }
}

void layerNorm(const float *x, int64_t rows, int64_t n, const float *w,
               const float *b, float eps, float *y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    // Two passes: the variance of centred values does not cancel.
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i)
      sum += xr[i];
    const float mean = sum / static_cast<float>(n);
    float sumSq = 0.0f;
    for (int64_t i = 0; i < n; ++i)
      sumSq += (xr[i] - mean) * (xr[i] - mean);
    const float sd = std::sqrt(sumSq / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i)
      yr[i] = (xr[i] - mean) / sd * w[i] + b[i];
  }
}

void rope(const float *x, int64_t rows, int64_t n, int32_t position,
          RopeStyle style, float theta, int64_t offset, int64_t dims,
          float *y) {
  // A void kernel cannot report a bad geometry: catch it in debug builds and
  // never write outside the row in release ones (the values are then only
  // copied).
  const bool valid = offset >= 0 && dims >= 0 && offset + dims <= n;
  assert(valid && "rope range outside the row");
  const int64_t pairs = valid ? dims / 2 : 0;
  // Angles in double: position * theta^(-2i/dims) reaches 1e5 rad in long
  // contexts, where a float angle would be off by whole hundredths.
  std::vector<float> cosines(static_cast<size_t>(pairs)),
      sines(static_cast<size_t>(pairs));
  for (int64_t i = 0; i < pairs; ++i) {
    double angle =
        static_cast<double>(position) *
        std::pow(static_cast<double>(theta),
                 -2.0 * static_cast<double>(i) / static_cast<double>(dims));
    cosines[i] = static_cast<float>(std::cos(angle));
    sines[i] = static_cast<float>(std::sin(angle));
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    if (yr != xr)
      std::memmove(yr, xr, static_cast<size_t>(n) * sizeof(float));
    for (int64_t i = 0; i < pairs; ++i) {
      const int64_t first =
          style == RopeStyle::Interleaved ? offset + 2 * i : offset + i;
      const int64_t second = style == RopeStyle::Interleaved
                                 ? offset + 2 * i + 1
                                 : offset + i + dims / 2;
      const float a = xr[first], b = xr[second];
      yr[first] = a * cosines[i] - b * sines[i];
      yr[second] = a * sines[i] + b * cosines[i];
    }
  }
}

void add(const float *a, const float *b, int64_t n, float *y) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = a[i] + b[i];
}

void swiglu(const float *g, const float *u, int64_t n, float *y) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = silu(g[i]) * u[i];
}

Status swigluLinear(const float *g, const float *u, int64_t k,
                    const WeightView &w, float *product, float *y,
                    ThreadPool &pool) {
  swiglu(g, u, k, product);
  return linear(product, 1, w, y, pool);
}

Status swigluFfn(const float *x, const WeightView &gate, const WeightView &up,
                 const WeightView &down, float *gateUp, float *product,
                 float *y, ThreadPool &pool) {
  const char *op = "shared expert";
  if (gate.dims.size() != 2 || up.dims != gate.dims || down.dims.size() != 2 ||
      down.dims[0] != gate.dims[1])
    return Error(where(op), down.name,
                 fmt::format("gate {}, up {} and down {} are not [K, F], "
                             "[K, F] and [F, N]",
                             dimsText(gate.dims), dimsText(up.dims),
                             dimsText(down.dims)));
  const int64_t ffn = gate.dims[1];
  if (Status st = linear(x, 1, gate, gateUp, pool); !st)
    return st;
  if (Status st = linear(x, 1, up, gateUp + ffn, pool); !st)
    return st;
  return swigluLinear(gateUp, gateUp + ffn, ffn, down, product, y, pool);
}

int32_t argmax(const float *x, int64_t n) {
  if (n <= 0)
    return -1;
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) // strict: a tie keeps the lower index
      best = i;
  return static_cast<int32_t>(best);
}

Expected<int32_t> drawArgmax(const float *x, int64_t n, int64_t base,
                             const int32_t *words, int count, int32_t position,
                             float &key) {
  draw::DrawParams params;
  int bad = 0;
  if (!draw::readWords(words, count, params, bad))
    return Error(where("argmax"), "sampling",
                 fmt::format("word {} is {:#010x}: {}", bad,
                             uint32_t(words[bad]), draw::kWordsRule));
  if (n <= 0)
    return -1;
  if (params.temperature == 0.0f) {
    const int32_t best = argmax(x, n);
    key = x[best];
    return best;
  }
  if (params.cuts()) {
    if (base != 0)
      return Error(where("argmax"), "sampling",
                   "a nucleus, top-k or min-p is cut from the whole "
                   "vocabulary, not a part");
    return static_cast<int32_t>(
        draw::drawWhole(x, n, params, uint32_t(position), key));
  }
  return static_cast<int32_t>(
      draw::bestKey(x, n, base, 1.0f / params.temperature, params.seed,
                    uint32_t(position), key));
}

Status adjustLogits(const int32_t *words, int count, int64_t vocab,
                    const float *x, int64_t n, int64_t base, float *y) {
  int bad = 0;
  if (!draw::adjustPart(words, count, vocab, x, n, base, y, bad))
    return Error(where("argmax"), "sampling",
                 fmt::format("word {} is {:#010x}: {}", bad,
                             uint32_t(words[bad]), draw::wordRule(bad)));
  return Status::ok();
}

Status cacheAppend(const float *entry, int32_t position, CacheView cache) {
  const char *op = "cache_append";
  if (!cache.data || cache.width <= 0)
    return Error(where(op), "cache", "cache is empty");
  if (position < 0 || position >= cache.positions)
    return Error(where(op), "position",
                 fmt::format("position {} is outside the cache's {} "
                             "positions: the context is full",
                             position, cache.positions));
  const int64_t base = static_cast<int64_t>(position) * cache.width;
  for (int64_t j = 0; j < cache.width; ++j) {
    switch (cache.type) {
    case CacheType::F32:
      static_cast<float *>(cache.data)[base + j] = entry[j];
      break;
    case CacheType::F16:
      static_cast<uint16_t *>(cache.data)[base + j] = floatToHalf(entry[j]);
      break;
    case CacheType::BF16:
      static_cast<uint16_t *>(cache.data)[base + j] = floatToBf16(entry[j]);
      break;
    }
  }
  return Status::ok();
}

Status normRopeAppend(const float *entry, int64_t normDims, const float *w,
                      const float *bias, float eps, int32_t position,
                      RopeStyle style, float theta, int64_t offset,
                      int64_t dims, CacheView cache) {
  const int64_t width = cache.width;
  if (normDims <= 0 || normDims > width || offset < 0 || dims < 0 ||
      offset + dims > width)
    return Error(where("norm_rope_append"), "geometry",
                 fmt::format("norm of {} and rope of [{}, {}) do not fit a "
                             "row of {}",
                             normDims, offset, offset + dims, width));
  if (position < 0 || position >= cache.positions)
    return Error(where("norm_rope_append"), "position",
                 fmt::format("position {} is outside the cache's {} "
                             "positions: the context is full",
                             position, cache.positions));
  std::vector<float> y(entry, entry + std::max<int64_t>(width, 0));
  if (bias)
    layerNorm(entry, 1, normDims, w, bias, eps, y.data());
  else
    rmsNorm(entry, 1, normDims, w, eps, y.data());
  rope(y.data(), 1, width, position, style, theta, offset, dims, y.data());
  return cacheAppend(y.data(), position, cache);
}

Status mlaAttention(const float *qLatent, const float *qRope, int64_t heads,
                    int64_t latent, int64_t rope, const CacheView &cache,
                    int32_t position, const int32_t *selected,
                    const int32_t *count, float scale, float *out,
                    ThreadPool &pool) {
  const char *op = "mla_attention";
  if (heads < 0 || latent < 0 || rope < 0)
    return Error(where(op), "", "negative heads, latent or rope size");
  if (Status s = checkCache(cache, latent + rope, op); !s)
    return s;
  if (Status s = checkPosition(cache, position, op); !s)
    return s;

  // The attended positions, checked once so no head reads outside the cache.
  std::vector<int64_t> attended;
  if (selected) {
    if (!count)
      return Error(where(op), "count", "a selection needs a count");
    if (*count < 0)
      return Error(where(op), "count",
                   fmt::format("count {} is negative", *count));
    for (int32_t i = 0; i < *count; ++i) {
      if (selected[i] < 0 || selected[i] >= cache.positions)
        return Error(where(op), "selected",
                     fmt::format("entry {} is position {}, outside the "
                                 "cache's {} positions",
                                 i, selected[i], cache.positions));
      attended.push_back(selected[i]);
    }
  } else {
    attended.resize(static_cast<size_t>(position) + 1);
    std::iota(attended.begin(), attended.end(), int64_t{0});
  }

  const int64_t width = latent + rope;
  const auto positions = static_cast<int64_t>(attended.size());
  pool.parallelFor(heads, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(width));
    std::vector<float> p(static_cast<size_t>(positions));
    for (int64_t h = begin; h < end; ++h) {
      const float *ql = qLatent + h * latent;
      const float *qr = qRope + h * rope;
      float *o = out + h * latent;
      float maxScore = -std::numeric_limits<float>::infinity();
      for (int64_t t = 0; t < positions; ++t) {
        readCacheRow(cache, attended[t], row.data());
        p[t] =
            (dot(ql, row.data(), latent) + dot(qr, row.data() + latent, rope)) *
            scale;
        maxScore = std::max(maxScore, p[t]);
      }
      float sum = 0.0f;
      for (int64_t t = 0; t < positions; ++t) {
        p[t] = std::exp(p[t] - maxScore);
        sum += p[t];
      }
      std::fill(o, o + latent, 0.0f);
      for (int64_t t = 0; t < positions; ++t) {
        readCacheRow(cache, attended[t], row.data());
        const float weight = p[t] / sum;
        for (int64_t j = 0; j < latent; ++j)
          o[j] += weight * row[j];
      }
    }
  });
  return Status::ok();
}

Status dsaIndexer(const float *q, int64_t heads, int64_t dim,
                  const float *headWeights, const CacheView &cache,
                  int32_t position, int64_t topK, float scale,
                  int32_t *selected, int32_t *count) {
  const char *op = "dsa_indexer";
  if (heads < 0)
    return Error(where(op), "", fmt::format("heads {} is negative", heads));
  if (topK < 0)
    return Error(where(op), "top_k", fmt::format("top k {} is negative", topK));
  if (Status s = checkCache(cache, dim, op); !s)
    return s;
  if (Status s = checkPosition(cache, position, op); !s)
    return s;

  const int64_t positions = static_cast<int64_t>(position) + 1;
  if (positions <= topK) {
    // Every position is selected: no score is needed, and neither the query
    // nor the head weights are read (step.dsa_indexer; a backend may leave
    // them unwritten, live_from).
    for (int64_t t = 0; t < topK; ++t)
      selected[t] = t < positions ? static_cast<int32_t>(t) : 0;
    *count = static_cast<int32_t>(positions);
    return Status::ok();
  }
  std::vector<float> scores(static_cast<size_t>(positions));
  std::vector<float> key(static_cast<size_t>(dim));
  for (int64_t t = 0; t < positions; ++t) {
    readCacheRow(cache, t, key.data());
    float sum = 0.0f;
    for (int64_t h = 0; h < heads; ++h)
      sum += headWeights[h] * std::max(dot(q + h * dim, key.data(), dim), 0.0f);
    scores[t] = scale * sum;
  }
  const int64_t chosen = std::min(topK, positions);
  std::vector<int32_t> top = topIndices(scores, chosen);
  std::sort(top.begin(), top.end());
  std::copy(top.begin(), top.end(), selected);
  std::fill(selected + chosen, selected + topK, 0);
  *count = static_cast<int32_t>(chosen);
  return Status::ok();
}

namespace {

/// A router gate's rows (2-D, rows of `hidden` values), or why not.
Expected<WeightRows> gateRows(const WeightView &gate, int64_t hidden,
                              const char *op) {
  Expected<WeightRows> shape = rowsOf(gate, 2, op);
  if (shape && shape->cols != hidden)
    return Error(where(op), gate.name,
                 fmt::format("rows hold {} values, hidden size is {}",
                             shape->cols, hidden));
  return shape;
}

} // namespace

Status moeRouter(const float *x, int64_t hidden, const WeightView &gate,
                 const float *bias, int64_t topK, Gating gating, bool normalize,
                 float routedScale, int32_t *ids, float *weights) {
  const char *op = "moe_router";
  Expected<WeightRows> shape = gateRows(gate, hidden, op);
  if (!shape)
    return shape.status();
  const int64_t experts = shape->rows;
  if (topK < 0 || topK > experts)
    return Error(
        where(op), gate.name,
        fmt::format("top k {} is outside [0, {}] experts", topK, experts));

  std::vector<float> logits(static_cast<size_t>(experts));
  std::vector<float> row(static_cast<size_t>(hidden));
  for (int64_t e = 0; e < experts; ++e) {
    if (Status s = dequantRow(gate, *shape, e, row.data(), op); !s)
      return s;
    logits[e] = dot(x, row.data(), hidden);
  }
  return moeChoose(logits.data(), experts, bias, topK, gating, normalize,
                   routedScale, ids, weights);
}

Status moeChoose(const float *logits, int64_t experts, const float *bias,
                 int64_t topK, Gating gating, bool normalize, float routedScale,
                 int32_t *ids, float *weights) {
  if (experts <= 0 || topK < 0 || topK > experts)
    return Error(
        where("moe_choose"), "top_k",
        fmt::format("top k {} is outside [0, {}] experts", topK, experts));
  std::vector<float> p(logits, logits + experts);
  if (gating == Gating::Sigmoid) {
    for (float &v : p)
      v = 1.0f / (1.0f + std::exp(-v));
  } else {
    const float maxLogit = *std::max_element(p.begin(), p.end());
    float sum = 0.0f;
    for (float &v : p) {
      v = std::exp(v - maxLogit);
      sum += v;
    }
    for (float &v : p)
      v /= sum;
  }

  // The bias only steers the choice; the weights come from p alone.
  std::vector<float> choice(p);
  if (bias)
    for (int64_t e = 0; e < experts; ++e)
      choice[e] += bias[e];
  std::vector<int32_t> top = topIndices(choice, topK);
  float sum = 0.0f;
  for (int64_t k = 0; k < topK; ++k) {
    ids[k] = top[k];
    weights[k] = p[top[k]];
    sum += weights[k];
  }
  // The floor keeps a router whose chosen probabilities all vanish from
  // dividing by zero (the smallest normal fp16, as ggml uses).
  const float denominator = std::max(sum, 6.1035e-5f);
  for (int64_t k = 0; k < topK; ++k)
    weights[k] =
        (normalize ? weights[k] / denominator : weights[k]) * routedScale;
  return Status::ok();
}

Status routerPartial(const float *partial, const float *residual,
                     int64_t hidden, const WeightView &gate, const float *norm,
                     float residualScale, float *out) {
  const char *op = "router_partial";
  Expected<WeightRows> shape = gateRows(gate, hidden, op);
  if (!shape)
    return shape.status();
  // This rank's part of the normalised sum, before the division by its rms.
  std::vector<float> v(static_cast<size_t>(hidden));
  for (int64_t h = 0; h < hidden; ++h)
    v[h] = norm[h] * (partial[h] + residualScale * residual[h]);
  std::vector<float> row(static_cast<size_t>(hidden));
  for (int64_t e = 0; e < shape->rows; ++e) {
    if (Status s = dequantRow(gate, *shape, e, row.data(), op); !s)
      return s;
    out[e] = dot(row.data(), v.data(), hidden);
  }
  return Status::ok();
}

Status composeRouter(const WeightView &w, const WeightView &gate,
                     const float *norm, int64_t rank, int64_t ranks,
                     std::vector<float> &out, ThreadPool &pool) {
  const char *op = "linear_router";
  Expected<WeightRows> wRows = rowsOf(w, 2, op);
  if (!wRows)
    return wRows.status();
  const int64_t k = wRows->cols, hidden = wRows->rows;
  Expected<WeightRows> gRows = gateRows(gate, hidden, op);
  if (!gRows)
    return gRows.status();
  if (ranks < 1 || hidden % ranks != 0 || rank < 0 || rank >= ranks)
    return Error(where(op), w.name,
                 fmt::format("rank {} of {} does not cut its {} rows evenly",
                             rank, ranks, hidden));
  const int64_t experts = gRows->rows, shareCols = hidden / ranks,
                shareBegin = rank * shareCols, cols = k + shareCols;

  // The weight's and the gate's values, as the step's kernels read them.
  std::vector<float> weight(static_cast<size_t>(hidden * k)),
      gates(static_cast<size_t>(experts * hidden));
  for (int64_t n = 0; n < hidden; ++n)
    if (Status s = dequantRow(w, *wRows, n, weight.data() + n * k, op); !s)
      return s;
  for (int64_t e = 0; e < experts; ++e)
    if (Status s = dequantRow(gate, *gRows, e, gates.data() + e * hidden, op);
        !s)
      return s;

  out.assign(static_cast<size_t>(experts * cols), 0.0f);
  // A few experts a chunk share each pass over the weight's rows; every
  // (e, j) still sums its n in ascending order, whatever the chunking.
  constexpr int64_t kExpertsPerPass = 8;
  const int64_t passes = (experts + kExpertsPerPass - 1) / kExpertsPerPass;
  pool.parallelFor(passes, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(static_cast<size_t>(kExpertsPerPass * k));
    for (int64_t p = begin; p < end; ++p) {
      const int64_t first = p * kExpertsPerPass,
                    count = std::min(kExpertsPerPass, experts - first);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t n = 0; n < hidden; ++n) {
        const float *row = weight.data() + n * k;
        for (int64_t i = 0; i < count; ++i) {
          const double c =
              static_cast<double>(gates[(first + i) * hidden + n]) *
              static_cast<double>(norm[n]);
          double *a = acc.data() + i * k;
          for (int64_t j = 0; j < k; ++j)
            a[j] += c * static_cast<double>(row[j]);
        }
      }
      for (int64_t i = 0; i < count; ++i) {
        const int64_t e = first + i;
        float *o = out.data() + e * cols;
        for (int64_t j = 0; j < k; ++j)
          o[j] = static_cast<float>(acc[i * k + j]);
        for (int64_t j = 0; j < shareCols; ++j)
          o[k + j] = gates[e * hidden + shareBegin + j] * norm[shareBegin + j];
      }
    }
  });
  return Status::ok();
}

void routerTail(const float *matrix, int64_t experts, int64_t k,
                int64_t shareCols, const float *x, const float *share,
                float *out) {
  const int64_t cols = k + shareCols;
  for (int64_t e = 0; e < experts; ++e) {
    const float *row = matrix + e * cols;
    float sum = 0.0f;
    for (int64_t c = 0; c < k; ++c)
      sum += row[c] * x[c];
    for (int64_t j = 0; j < shareCols; ++j)
      sum += row[k + j] * share[j];
    out[e] = sum;
  }
}

Status moeExperts(const float *x, int64_t hidden, const int32_t *ids,
                  const float *weights, int64_t k,
                  const std::vector<const WeightView *> &experts, float *out,
                  ThreadPool &pool) {
  const char *op = "moe_experts";
  if (experts.size() != 2 && experts.size() != 3)
    return Error(where(op), "",
                 fmt::format("expected (gate, up, down) or (gate_up, down) "
                             "weights, got {}",
                             experts.size()));
  for (const WeightView *w : experts)
    if (!w)
      return Error(where(op), "", "missing expert weight");
  const bool fused = experts.size() == 2;
  const WeightView &down = *experts.back();
  Expected<WeightRows> downRows = rowsOf(down, 3, op);
  if (!downRows)
    return downRows.status();
  const int64_t ffn = down.dims[0], numExperts = down.dims[2];
  if (down.dims[1] != hidden)
    return Error(where(op), down.name,
                 fmt::format("dims {} do not match hidden size {}",
                             dimsText(down.dims), hidden));

  // gate and up (or gate_up) must be [hidden, F (or 2F), E].
  std::vector<WeightRows> inRows;
  for (size_t i = 0; i + 1 < experts.size(); ++i) {
    const WeightView &w = *experts[i];
    Expected<WeightRows> rows = rowsOf(w, 3, op);
    if (!rows)
      return rows.status();
    const int64_t expectedRows = fused ? 2 * ffn : ffn;
    if (w.dims[0] != hidden || w.dims[1] != expectedRows ||
        w.dims[2] != numExperts)
      return Error(where(op), w.name,
                   fmt::format("dims {} do not match [{}, {}, {}] (hidden, "
                               "{}, experts) given {} {}",
                               dimsText(w.dims), hidden, expectedRows,
                               numExperts, fused ? "2 * ffn" : "ffn", down.name,
                               dimsText(down.dims)));
    inRows.push_back(*rows);
  }
  if (k < 0)
    return Error(where(op), "", fmt::format("k {} is negative", k));
  for (int64_t i = 0; i < k; ++i)
    if (ids[i] < 0 || ids[i] >= numExperts)
      return Error(where(op), down.name,
                   fmt::format("expert id {} (entry {}) is outside [0, {})",
                               ids[i], i, numExperts));

  // Summed in a buffer so that `out` may alias `x`.
  std::vector<float> sum(static_cast<size_t>(hidden), 0.0f);
  std::vector<float> act(static_cast<size_t>(ffn));
  FirstError error;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t e = ids[i];
    pool.parallelFor(ffn, [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(hidden));
      for (int64_t f = begin; f < end; ++f) {
        // Fused: expert e's rows are its F gate rows then its F up rows.
        const WeightView &gateW = *experts[0];
        const WeightView &upW = fused ? *experts[0] : *experts[1];
        const int64_t gateRow = fused ? e * 2 * ffn + f : e * ffn + f;
        const int64_t upRow = fused ? e * 2 * ffn + ffn + f : e * ffn + f;
        const WeightRows &upShape = fused ? inRows[0] : inRows[1];
        if (Status s = dequantRow(gateW, inRows[0], gateRow, row.data(), op);
            !s)
          return error.record(f, s);
        const float g = dot(x, row.data(), hidden);
        if (Status s = dequantRow(upW, upShape, upRow, row.data(), op); !s)
          return error.record(f, s);
        const float u = dot(x, row.data(), hidden);
        act[f] = silu(g) * u;
      }
    });
    if (Status s = error.status(); !s)
      return s;
    pool.parallelFor(hidden, [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(ffn));
      for (int64_t h = begin; h < end; ++h) {
        if (Status s =
                dequantRow(down, *downRows, e * hidden + h, row.data(), op);
            !s)
          return error.record(h, s);
        sum[h] += weights[i] * dot(act.data(), row.data(), ffn);
      }
    });
    if (Status s = error.status(); !s)
      return s;
  }
  std::copy(sum.begin(), sum.end(), out);
  return Status::ok();
}

} // namespace kiln::cpu
