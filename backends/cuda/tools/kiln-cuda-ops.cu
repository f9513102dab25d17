//===- kiln-cuda-ops.cu - Check every step kernel against the CPU ---------===//
//
// kiln-cuda-ops [--seed N]        (default seed 1), on the first GPU
// kiln-cuda-ops --bench           times launchLinear at GLM-5 shapes instead:
//   "bench linear TYPE KxN: X us, Y GB/s" (weight bytes / time), then the
//   other step ops ("bench op NAME X us")
// kiln-cuda-ops --bench-moe       times the routed experts alone (L2-warm
//   and from memory): the general kernels, the fixed-shape ones, and the
//   int8-x probe's gate/up kernel (KILN_CUDA_EXPERTS_INT8_X)
// kiln-cuda-ops --bench-dsa       times GLM-5's indexer at 32k and 128k
//   positions of a 128k cache and at 2k-16k of a 16k one, alone, in a
//   graph, then launches it 5 times more outside one (for
//   Nsight Compute: `ncu -k regex:indexer kiln-cuda-ops --bench-dsa`)
// kiln-cuda-ops --bench-chain     times a chain of dependent mat-vecs as the
//   step's kernels and as one persistent kernel (a measurement of that
//   design, not a step kernel; docs/perf.md, thirteenth and fourteenth
//   passes); exits 1 where its f32 outputs differ from the kernels'
// kiln-cuda-ops --bench-images    only --bench's probe of kernel images
//   taking turns (straight and branching code, the L2 turned over between
//   probes by a copy or by weight-like reads, normal or evict-first)
// kiln-cuda-ops --bench-edges     what a second dependency of a kernel in
//   a programmatic chain costs in a graph, when the kernel it names has
//   long finished (a step's cross-branch waits)
// kiln-cuda-ops --bench-router    linear_router at GLM-5's attn_output
//   shape against the linear alone, each way its tail rows load
// kiln-cuda-ops --bench-choice    the router's choice at GLM-5's tp=8
//   shape as its own kernel after the all-reduce and inside it, in a
//   programmatic chain in a graph (exits 1 where their results differ)
// kiln-cuda-ops --bench-params    a programmatic chain of near-empty
//   kernels in a graph by the size of their parameters (16 bytes to 4 KiB),
//   the first graph of the process timed again last
//
// For each op of StepKernels.h: seeded random inputs, the GPU kernel, the
// CPU reference (backends/cpu/CpuKernels.h; a host loop for slice and the
// gather reorder, which have none), and one line per case:
//   op, shape/type, err, tol (why), PASS/FAIL.
// `err` is the largest |gpu - cpu| over the outputs divided by the largest
// |cpu| (so a relative error at the output's own scale; NaN or infinity in
// one and not the other is an infinite error), or, for the exact checks
// (bit-exact outputs, ids, counts, fault words), the number of mismatching
// values with tolerance 0.
//
// Tolerances, where the GPU sums in a different order than the CPU (warp
// trees against ascending loops; both f32): the rounding of a sum of K
// terms grows like sqrt(K) ulps of its partial sums, so a K-term reduction
// is allowed 1e-6 * sqrt(K) (about 8 ulps times sqrt(K)); chained
// reductions add their terms. The mat-vec dots (linear, router logits,
// experts) also fuse multiply-adds and factor block scales out of their
// sums (StepMatVec.cu, QuantDot.cuh): an ulp or so per term, well inside
// the same allowance. Element-wise transcendental ops (silu, rope's
// double cos/sin rounded to f32) are allowed 1e-6 (a few ulps). Decoding
// (embed, dequant), copies, additions and cache conversions are bit-exact.
// Discrete outputs (indexer selection and count, router ids, arg-max) must
// be equal: the inputs are drawn (and redrawn) so the choice is not
// within rounding of a tie, and exact ties are built on purpose where the
// tie rule (lower index wins) is what is being checked.
//
// Exit 1 when any case fails.
//
//===----------------------------------------------------------------------===//
#include "DeviceCommon.cuh"
#include "ModelShapes.h"
#include "QuantDot.cuh"
#include "SplitLayout.h"
#include "StepKernels.h"

#include "cpu/CpuKernels.h"
#include "quant/FloatFormats.h"
#include "quant/QuantFormats.h"
#include "support/DrawKey.h"
#include "support/Random.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

namespace kc = kiln::cuda;
namespace cpu = kiln::cpu;
namespace draw = kiln::draw;
using kiln::GGMLType;

#define CHECK_CUDA(call)                                                       \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "kiln-cuda-ops: error: %s: %s\n", #call,            \
                   cudaGetErrorString(e_));                                    \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

namespace {

//===----------------------------------------------------------------------===//
// Device memory, reporting, comparisons
//===----------------------------------------------------------------------===//

/// A device array of n T, freed on destruction.
template <class T> class DeviceArray {
public:
  /// Zeroed (MLA's and the router's scratch count arrivals from zero).
  explicit DeviceArray(size_t n) : n_(n) {
    CHECK_CUDA(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
    CHECK_CUDA(cudaMemset(p_, 0, std::max<size_t>(n, 1) * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T> &v) : DeviceArray(v.size()) {
    upload(v);
  }
  DeviceArray(DeviceArray &&o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  DeviceArray &operator=(DeviceArray &&) = delete;
  DeviceArray(const DeviceArray &) = delete;
  ~DeviceArray() { cudaFree(p_); }

  T *get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T> &v) {
    if (v.empty())
      return;
    CHECK_CUDA(
        cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    if (n_ == 0)
      return v;
    CHECK_CUDA(
        cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }

private:
  T *p_ = nullptr;
  size_t n_;
};

/// Runs a launch, then waits for it, so an asynchronous fault is caught at
/// the launch that caused it.
void run(cudaError_t launched) {
  CHECK_CUDA(launched);
  CHECK_CUDA(cudaDeviceSynchronize());
}

struct Report {
  int cases = 0, failures = 0;

  void line(const std::string &op, const std::string &what, double err,
            double tol, const std::string &why) {
    const bool ok = err <= tol; // a NaN error fails
    ++cases;
    failures += !ok;
    std::printf("%-16s %-42s err %9.2e  tol %8.2e (%s)  %s\n", op.c_str(),
                what.c_str(), err, tol, why.c_str(), ok ? "PASS" : "FAIL");
  }

  /// A reference that itself failed is a broken case, not a GPU result.
  bool reference(const std::string &op, const kiln::Status &s) {
    if (s)
      return true;
    ++cases;
    ++failures;
    std::printf("%-16s reference failed: %s  FAIL\n", op.c_str(),
                s.error().message().c_str());
    return false;
  }
};

std::string fmtText(const char *format, ...)
    __attribute__((format(printf, 1, 2)));
std::string fmtText(const char *format, ...) {
  char buffer[256];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  return buffer;
}

std::string typeName(GGMLType t) { return std::string(kiln::nameOf(t)); }

/// max |got - want| / max |want|; a NaN or infinity that the other side
/// does not have at the same place is an infinite error.
double relError(const std::vector<float> &got, const std::vector<float> &want) {
  if (got.size() != want.size())
    return std::numeric_limits<double>::infinity();
  double maxRef = 0, maxDiff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float g = got[i], w = want[i];
    if (std::isnan(g) || std::isnan(w) || std::isinf(g) || std::isinf(w)) {
      if (!(std::isnan(g) && std::isnan(w)) && g != w)
        return std::numeric_limits<double>::infinity();
      continue;
    }
    maxRef = std::max(maxRef, std::fabs(double(w)));
    maxDiff = std::max(maxDiff, std::fabs(double(g) - double(w)));
  }
  return maxRef > 0 ? maxDiff / maxRef : maxDiff;
}

/// How many values differ in their bits.
template <class T>
double mismatches(const std::vector<T> &got, const std::vector<T> &want) {
  if (got.size() != want.size())
    return std::numeric_limits<double>::infinity();
  double n = 0;
  for (size_t i = 0; i < got.size(); ++i)
    n += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
  return n;
}

double sumTol(double terms) { return 1e-6 * std::sqrt(terms); }
std::string sumWhy(const char *what, int64_t terms) {
  return fmtText("%s, 1e-6*sqrt(%lld)", what, (long long)terms);
}

std::vector<float> normals(kiln::Rng &rng, size_t n, double sigma,
                           double mean = 0.0) {
  std::vector<float> v(n);
  for (float &x : v)
    x = float(mean + sigma * rng.normal());
  return v;
}

/// The values of one of ModelShapes.h's lists.
template <int... kWidths>
std::vector<int64_t> widthList(std::integer_sequence<int, kWidths...>) {
  return {int64_t(kWidths)...};
}

/// KILN_CUDA_SPECIALISED's switch, every family on or all off, for the
/// launches of this thread while the scope lives (all off again after), and
/// how many kernels compiled for fixed shapes those launches ran.
class FixedShapes {
public:
  explicit FixedShapes(bool on) : before_(kc::shapeSpecialisedLaunches()) {
    kc::setShapeSpecialised(on ? kc::kAllShapeFamilies : 0);
  }
  ~FixedShapes() { kc::setShapeSpecialised(0); }
  FixedShapes(const FixedShapes &) = delete;
  FixedShapes &operator=(const FixedShapes &) = delete;
  uint64_t ran() const { return kc::shapeSpecialisedLaunches() - before_; }

private:
  uint64_t before_;
};

/// The routed experts' int8-x probe (kc::setExpertsInt8X) on while it
/// lives, off again after; ran() counts its kernel's launches meanwhile.
class ExpertsInt8X {
public:
  explicit ExpertsInt8X(bool on) : before_(kc::moeInt8XLaunches()) {
    kc::setExpertsInt8X(on);
  }
  ~ExpertsInt8X() { kc::setExpertsInt8X(false); }
  ExpertsInt8X(const ExpertsInt8X &) = delete;
  ExpertsInt8X &operator=(const ExpertsInt8X &) = delete;
  uint64_t ran() const { return kc::moeInt8XLaunches() - before_; }

private:
  uint64_t before_;
};

/// The indexer's scores off the tensor cores while it lives
/// (kc::setIndexerMma), on again after.
class IndexerMmaOff {
public:
  IndexerMmaOff() { kc::setIndexerMma(false); }
  ~IndexerMmaOff() { kc::setIndexerMma(true); }
  IndexerMmaOff(const IndexerMmaOff &) = delete;
  IndexerMmaOff &operator=(const IndexerMmaOff &) = delete;
};

/// kc::MlaLaunch as `set` changes it while it lives, the setting before
/// again after; ran() counts the tensor-core MLA kernel's launches
/// meanwhile.
class MlaLaunchScope {
public:
  template <class Set>
  explicit MlaLaunchScope(Set set)
      : before_(kc::mlaLaunch()), launches_(kc::mlaTensorCoreLaunches()) {
    kc::MlaLaunch changed = before_;
    set(changed);
    kc::setMlaLaunch(changed);
  }
  ~MlaLaunchScope() { kc::setMlaLaunch(before_); }
  MlaLaunchScope(const MlaLaunchScope &) = delete;
  MlaLaunchScope &operator=(const MlaLaunchScope &) = delete;
  uint64_t ran() const { return kc::mlaTensorCoreLaunches() - launches_; }

private:
  kc::MlaLaunch before_;
  uint64_t launches_;
};

/// MLA's rows all loaded after its wait (kc::MlaLaunch::earlyRows off).
struct MlaEarlyRowsOff : MlaLaunchScope {
  MlaEarlyRowsOff()
      : MlaLaunchScope([](kc::MlaLaunch &m) { m.earlyRows = false; }) {}
};

/// The MLA kernel for 8 heads on the tensor cores
/// (kc::MlaLaunch::tensorCores, the default) on or off.
struct MlaTensorCores : MlaLaunchScope {
  explicit MlaTensorCores(bool on)
      : MlaLaunchScope([on](kc::MlaLaunch &m) { m.tensorCores = on; }) {}
};

//===----------------------------------------------------------------------===//
// Weights and caches: random on the device (the fillers under test), the
// same bytes copied to the host for the reference.
//===----------------------------------------------------------------------===//

struct Weight {
  GGMLType type;
  std::vector<int64_t> dims;
  int64_t rows, cols;
  std::vector<uint8_t> host;
  DeviceArray<uint8_t> device;

  cpu::WeightView view(const char *name) const {
    return {host.data(), host.size(), type, dims, name};
  }
  kc::DeviceWeight dev() const { return {type, rows, cols, device.get()}; }
};

Weight randomWeight(GGMLType type, std::vector<int64_t> dims, uint64_t seed) {
  const int64_t cols = dims[0];
  int64_t rows = 1;
  for (size_t i = 1; i < dims.size(); ++i)
    rows *= dims[i];
  const uint64_t bytes = uint64_t(rows) * *kiln::rowBytes(type, uint64_t(cols));
  DeviceArray<uint8_t> d(bytes);
  run(kc::launchFillRandomBlocks(type, d.get(), bytes, seed, nullptr));
  std::vector<uint8_t> host = d.download();
  return Weight{type, std::move(dims), rows,
                cols, std::move(host), std::move(d)};
}

size_t cacheElementBytes(kc::CacheType t) {
  return t == kc::CacheType::F32 ? 4 : 2;
}

cpu::CacheType cpuCacheType(kc::CacheType t) {
  switch (t) {
  case kc::CacheType::F32:
    return cpu::CacheType::F32;
  case kc::CacheType::F16:
    return cpu::CacheType::F16;
  case kc::CacheType::BF16:
    return cpu::CacheType::BF16;
  }
  return cpu::CacheType::F32;
}

const char *cacheName(kc::CacheType t) {
  return t == kc::CacheType::F32   ? "f32"
         : t == kc::CacheType::F16 ? "f16"
                                   : "bf16";
}

/// Value `index` of cache bytes of `type`, as a float.
float cacheValue(kc::CacheType type, const std::vector<uint8_t> &bytes,
                 int64_t index) {
  switch (type) {
  case kc::CacheType::F32: {
    float f;
    std::memcpy(&f, &bytes[size_t(index) * 4], 4);
    return f;
  }
  case kc::CacheType::F16:
  case kc::CacheType::BF16: {
    uint16_t h;
    std::memcpy(&h, &bytes[size_t(index) * 2], 2);
    return type == kc::CacheType::F16 ? kiln::halfToFloat(h)
                                      : kiln::bf16ToFloat(h);
  }
  }
  return 0.f;
}

struct Cache {
  kc::CacheType type;
  int64_t positions, width;
  std::vector<uint8_t> host;
  DeviceArray<uint8_t> device;

  kc::DeviceCache dev() const { return {device.get(), type, positions, width}; }
  cpu::CacheView view() {
    return {host.data(), cpuCacheType(type), positions, width};
  }
  /// Row `to` becomes a copy of row `from`, on both sides.
  void copyRow(int64_t from, int64_t to) {
    const size_t rowBytes = size_t(width) * cacheElementBytes(type);
    std::memcpy(&host[size_t(to) * rowBytes], &host[size_t(from) * rowBytes],
                rowBytes);
    device.upload(host);
  }
  float value(int64_t index) const { return cacheValue(type, host, index); }
};

Cache randomCache(kc::CacheType type, int64_t positions, int64_t width,
                  uint64_t seed) {
  DeviceArray<uint8_t> d(size_t(positions * width) * cacheElementBytes(type));
  run(kc::launchFillRandomCache({d.get(), type, positions, width}, seed,
                                nullptr));
  std::vector<uint8_t> host = d.download();
  return Cache{type, positions, width, std::move(host), std::move(d)};
}

/// A zeroed device fault record and a cleared first-fault word.
struct Fault {
  DeviceArray<kc::StepFault> word{size_t(1)};
  DeviceArray<uint32_t> first{size_t(1)};
  static constexpr int32_t kOp = 42;

  Fault() { clear(); }
  void clear() {
    CHECK_CUDA(cudaMemset(word.get(), 0, sizeof(kc::StepFault)));
    CHECK_CUDA(cudaMemset(first.get(), 0xff, sizeof(uint32_t)));
  }
  kc::FaultSink sink() const { return {word.get(), kOp, first.get()}; }
  /// The record; a first-fault word that disagrees with it (not kOp after
  /// a fault, not kNoFault without one) shows as a record with a bad op.
  kc::StepFault read() const {
    kc::StepFault f = word.download()[0];
    const uint32_t firstOp = first.download()[0];
    if (firstOp != (f.code ? uint32_t(kOp) : kc::kNoFault)) {
      f.code = f.code ? f.code : -1;
      f.op = -1;
    }
    return f;
  }
};

/// Mismatches between a fault word and the expected one (0 when equal).
double faultMismatch(const kc::StepFault &got, kc::FaultCode code,
                     int64_t value, int64_t limit) {
  if (code == kc::FaultCode::None)
    return got.code != 0;
  return (got.code != int32_t(code)) + (got.op != Fault::kOp) +
         (got.value != value) + (got.limit != limit);
}

//===----------------------------------------------------------------------===//
// Element-wise, norms, rope, slice, gather
//===----------------------------------------------------------------------===//

void checkElementwise(Report &r, kiln::Rng &rng) {
  const int64_t n = 10007;
  std::vector<float> a = normals(rng, n, 3.0), b = normals(rng, n, 3.0);
  DeviceArray<float> da(a), db(b), dy(n);
  std::vector<float> want(n);

  cpu::add(a.data(), b.data(), n, want.data());
  run(kc::launchAdd(da.get(), db.get(), n, dy.get(), nullptr));
  r.line("add", fmtText("n=%lld", (long long)n),
         mismatches(dy.download(), want), 0, "bit-exact: one f32 add");
  run(kc::launchAdd(da.get(), db.get(), n, da.get(), nullptr)); // y = a
  r.line("add", fmtText("n=%lld, y aliases a", (long long)n),
         mismatches(da.download(), want), 0, "bit-exact: one f32 add");

  da.upload(a);
  cpu::swiglu(a.data(), b.data(), n, want.data());
  run(kc::launchSwiglu(da.get(), db.get(), n, dy.get(), nullptr));
  r.line("swiglu", fmtText("n=%lld", (long long)n),
         relError(dy.download(), want), 1e-6, "expf vs std::exp, few ulps");
}

void checkNorms(Report &r, kiln::Rng &rng) {
  const float eps = 1e-5f;
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{3, 6144}, {5, 1000}}) {
    std::vector<float> x = normals(rng, rows * n, 2.0);
    std::vector<float> w = normals(rng, n, 1.0, 1.0);
    std::vector<float> want(x.size());
    cpu::rmsNorm(x.data(), rows, n, w.data(), eps, want.data());
    DeviceArray<float> dx(x), dw(w);
    run(kc::launchRmsNorm(dx.get(), rows, n, dw.get(), eps, dx.get(), nullptr));
    r.line("rms_norm",
           fmtText("%lldx%lld, in place", (long long)rows, (long long)n),
           relError(dx.download(), want), sumTol(double(n)),
           sumWhy("sum of squares order", n));
  }

  {
    const int64_t rows = 2, n = 6144;
    std::vector<float> a = normals(rng, rows * n, 1.0),
                       b = normals(rng, rows * n, 1.0);
    std::vector<float> w = normals(rng, n, 1.0, 1.0);
    std::vector<float> wantSum(a.size()), wantY(a.size());
    cpu::add(a.data(), b.data(), rows * n, wantSum.data());
    cpu::rmsNorm(wantSum.data(), rows, n, w.data(), eps, wantY.data());
    DeviceArray<float> da(a), db(b), dw(w), dy(a.size());
    run(kc::launchAddRmsNorm(da.get(), db.get(), rows, n, dw.get(), eps,
                             da.get(), dy.get(), nullptr)); // sum = a
    r.line("add_rms_norm", "2x6144 sum (aliases a)",
           mismatches(da.download(), wantSum), 0, "bit-exact: one f32 add");
    r.line("add_rms_norm", "2x6144 y", relError(dy.download(), wantY),
           sumTol(double(n)), sumWhy("sum of squares order", n));
  }

  for (auto [rows, n] : {std::pair<int64_t, int64_t>{3, 1000}, {2, 6144}}) {
    // Mean 3, sd 1: the two-pass variance matters.
    std::vector<float> x = normals(rng, rows * n, 1.0, 3.0);
    std::vector<float> w = normals(rng, n, 0.5, 1.0), b = normals(rng, n, 0.5);
    std::vector<float> want(x.size());
    cpu::layerNorm(x.data(), rows, n, w.data(), b.data(), eps, want.data());
    DeviceArray<float> dx(x), dw(w), db(b), dy(x.size());
    run(kc::launchLayerNorm(dx.get(), rows, n, dw.get(), db.get(), eps,
                            dy.get(), nullptr));
    r.line("layer_norm",
           fmtText("%lldx%lld, mean 3", (long long)rows, (long long)n),
           relError(dy.download(), want), 2 * sumTol(double(n)),
           sumWhy("two sums' order, 2x", n));
  }
}

void checkRope(Report &r, kiln::Rng &rng) {
  struct Case {
    cpu::RopeStyle cpuStyle;
    kc::RopeStyle style;
    const char *name;
    int32_t position;
    bool inPlace;
  };
  const Case cases[] = {
      {cpu::RopeStyle::Interleaved, kc::RopeStyle::Interleaved, "interleaved",
       4095, false},
      {cpu::RopeStyle::NeoX, kc::RopeStyle::NeoX, "neox", 4095, false},
      {cpu::RopeStyle::Interleaved, kc::RopeStyle::Interleaved, "interleaved",
       150000, true},
      {cpu::RopeStyle::NeoX, kc::RopeStyle::NeoX, "neox", 150000, true},
  };
  // 8 heads of [128 nope | 64 rope], GLM-5's query layout.
  const int64_t rows = 8, n = 192, offset = 128, dims = 64;
  const float theta = 10000.f;
  for (const Case &c : cases) {
    std::vector<float> x = normals(rng, rows * n, 1.0), want(x.size());
    cpu::rope(x.data(), rows, n, c.position, c.cpuStyle, theta, offset, dims,
              want.data());
    DeviceArray<float> dx(x), dy(x.size());
    DeviceArray<int32_t> pos(std::vector<int32_t>{c.position});
    float *y = c.inPlace ? dx.get() : dy.get();
    run(kc::launchRope(dx.get(), rows, n, pos.get(), c.style, theta, offset,
                       dims, y, nullptr));
    std::vector<float> got = c.inPlace ? dx.download() : dy.download();
    r.line("rope",
           fmtText("%s 8x192 [128,192) pos %d%s", c.name, c.position,
                   c.inPlace ? " in place" : ""),
           relError(got, want), 1e-6, "double cos/sin to f32, 1 ulp");
  }
}

void checkSlice(Report &r, kiln::Rng &rng) {
  struct Case {
    std::vector<int64_t> src, dst, offsets;
  };
  const Case cases[] = {
      {{3, 5, 7, 9}, {2, 3, 4, 5}, {1, 2, 3, 4}},
      {{4, 6, 10}, {4, 2, 10}, {0, 3, 0}},
      {{17, 33}, {5, 33}, {12, 0}},
      {{100}, {37}, {41}},
  };
  for (const Case &c : cases) {
    const int rank = int(c.src.size());
    int64_t srcTotal = 1, dstTotal = 1;
    for (int d = 0; d < rank; ++d) {
      srcTotal *= c.src[d];
      dstTotal *= c.dst[d];
    }
    std::vector<float> x = normals(rng, srcTotal, 1.0), want(dstTotal);
    // Host reference: the CPU backend's row-major walk.
    for (int64_t i = 0; i < dstTotal; ++i) {
      int64_t rest = i, src = 0, stride = 1;
      for (int d = rank - 1; d >= 0; --d) {
        src += (rest % c.dst[d] + c.offsets[d]) * stride;
        rest /= c.dst[d];
        stride *= c.src[d];
      }
      want[i] = x[src];
    }
    DeviceArray<float> dx(x), dy(dstTotal);
    run(kc::launchSlice(dx.get(), c.src.data(), c.dst.data(), c.offsets.data(),
                        rank, dy.get(), nullptr));
    std::string what = "rank " + std::to_string(rank) + " [";
    for (int d = 0; d < rank; ++d)
      what += (d ? "," : "") + std::to_string(c.dst[d]);
    r.line("slice", what + "] of [..]", mismatches(dy.download(), want), 0,
           "bit-exact: a copy");
  }
}

void checkConcat(Report &r, kiln::Rng &rng) {
  struct Case {
    int64_t outer;
    std::vector<int64_t> runs;
  };
  // GLM-5's latent-cache row (512 normed + 64 roped), rows of several
  // parts with an empty one, and the most parts.
  const Case cases[] = {
      {1, {512, 64}}, {3, {7, 0, 130, 1}}, {2, {1, 2, 3, 4, 5, 6, 7, 8}}};
  for (const Case &c : cases) {
    const int count = int(c.runs.size());
    int64_t total = 0;
    for (int64_t run : c.runs)
      total += run;
    std::vector<std::vector<float>> parts;
    std::vector<DeviceArray<float>> dparts;
    std::vector<const float *> pointers;
    for (int64_t run : c.runs) {
      parts.push_back(normals(rng, std::max<int64_t>(c.outer * run, 1), 1.0));
      dparts.emplace_back(parts.back());
    }
    for (DeviceArray<float> &d : dparts)
      pointers.push_back(d.get());
    // Host reference: row o is each part's row o in turn.
    std::vector<float> want;
    for (int64_t o = 0; o < c.outer; ++o)
      for (int p = 0; p < count; ++p)
        want.insert(want.end(), parts[p].begin() + o * c.runs[p],
                    parts[p].begin() + (o + 1) * c.runs[p]);
    DeviceArray<float> dy(size_t(c.outer * total));
    run(kc::launchConcat(pointers.data(), c.runs.data(), count, c.outer, total,
                         dy.get(), nullptr));
    r.line("concat",
           fmtText("%d parts, %lld x %lld", count, (long long)c.outer,
                   (long long)total),
           mismatches(dy.download(), want), 0, "bit-exact: a copy");
  }
}

void checkGatherReorder(Report &r, kiln::Rng &rng) {
  const int64_t ranks = 4, outer = 3, inner = 50;
  std::vector<float> src = normals(rng, ranks * outer * inner, 1.0),
                     want(src.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t q = 0; q < ranks; ++q)
      for (int64_t i = 0; i < inner; ++i)
        want[(o * ranks + q) * inner + i] = src[(q * outer + o) * inner + i];
  DeviceArray<float> ds(src), dd(src.size());
  run(kc::launchGatherReorder(ds.get(), ranks, outer, inner, dd.get(),
                              nullptr));
  r.line("gather_reorder", "4 ranks x 3 outer x 50 inner",
         mismatches(dd.download(), want), 0, "bit-exact: a copy");
}

//===----------------------------------------------------------------------===//
// Weights: fill, dequant, embed, linear
//===----------------------------------------------------------------------===//

const GGMLType kAllTypes[] = {
    GGMLType::F32,  GGMLType::F16,    GGMLType::BF16,  GGMLType::Q4_0,
    GGMLType::Q4_1, GGMLType::Q5_0,   GGMLType::Q5_1,  GGMLType::Q8_0,
    GGMLType::Q2_K, GGMLType::Q3_K,   GGMLType::Q4_K,  GGMLType::Q5_K,
    GGMLType::Q6_K, GGMLType::IQ4_NL, GGMLType::IQ4_XS};

void checkFillAndDequant(Report &r, kiln::Rng &rng) {
  for (GGMLType type : kAllTypes) {
    const uint64_t seed = rng.next();
    Weight w = randomWeight(type, {256, 7}, seed);
    std::vector<float> want(size_t(w.rows * w.cols));
    if (!r.reference("dequant", cpu::dequant(w.view("w"), want.data())))
      continue;
    // The filler's blocks must decode to finite values.
    double bad = 0;
    for (float v : want)
      bad += !std::isfinite(v);
    r.line("fill_blocks", typeName(type) + " [256, 7] values finite", bad, 0,
           "every block valid");
    // Deterministic: the same seed gives the same bytes, another differs.
    Weight again = randomWeight(type, {256, 7}, seed);
    Weight other = randomWeight(type, {256, 7}, seed + 1);
    r.line("fill_blocks", typeName(type) + " same seed, same bytes",
           mismatches(again.host, w.host) + (other.host == w.host), 0,
           "counter-based hash");

    DeviceArray<float> out(want.size());
    run(kc::launchDequant(w.dev(), out.get(), nullptr));
    r.line("dequant", typeName(type) + " [256, 7]",
           mismatches(out.download(), want), 0, "bit-exact with gguf-py");
  }

  for (kc::CacheType t :
       {kc::CacheType::F32, kc::CacheType::F16, kc::CacheType::BF16}) {
    Cache c = randomCache(t, 64, 100, rng.next());
    double bad = 0;
    for (int64_t i = 0; i < c.positions * c.width; ++i) {
      const float v = c.value(i);
      bad += !(v >= -1.f && v < 1.f);
    }
    r.line("fill_cache", std::string(cacheName(t)) + " 64x100 in [-1, 1)", bad,
           0, "range");
  }
}

void checkEmbed(Report &r, kiln::Rng &rng) {
  const int64_t hidden = 512, vocab = 97;
  for (GGMLType type :
       {GGMLType::Q8_0, GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K,
        GGMLType::Q2_K, GGMLType::Q3_K, GGMLType::IQ4_XS, GGMLType::IQ4_NL,
        GGMLType::Q4_0, GGMLType::Q5_1, GGMLType::BF16, GGMLType::F16,
        GGMLType::F32}) {
    Weight table = randomWeight(type, {hidden, vocab}, rng.next());
    const int32_t token = int32_t(rng.below(uint64_t(vocab)));
    std::vector<float> want(hidden);
    if (!r.reference("embed",
                     cpu::embed(table.view("table"), token, want.data())))
      continue;
    DeviceArray<int32_t> dt(std::vector<int32_t>{token});
    DeviceArray<float> dy(hidden);
    Fault fault;
    run(kc::launchEmbed(table.dev(), dt.get(), dy.get(), fault.sink(),
                        nullptr));
    r.line("embed",
           fmtText("%s [%lld, %lld] token %d", typeName(type).c_str(),
                   (long long)hidden, (long long)vocab, token),
           mismatches(dy.download(), want) +
               faultMismatch(fault.read(), kc::FaultCode::None, 0, 0),
           0, "bit-exact with gguf-py");
  }

  // Tokens outside the vocabulary fault and leave y alone.
  Weight table = randomWeight(GGMLType::Q8_0, {hidden, vocab}, rng.next());
  for (int32_t token : {int32_t(vocab), -3}) {
    std::vector<float> sentinel(hidden, 1234.5f);
    DeviceArray<float> dy(sentinel);
    DeviceArray<int32_t> dt(std::vector<int32_t>{token});
    Fault fault;
    run(kc::launchEmbed(table.dev(), dt.get(), dy.get(), fault.sink(),
                        nullptr));
    r.line("embed fault",
           fmtText("Q8_0 vocab %lld, token %d", (long long)vocab, token),
           faultMismatch(fault.read(), kc::FaultCode::TokenOutOfRange, token,
                         vocab) +
               mismatches(dy.download(), sentinel),
           0, "TokenOutOfRange, y untouched");
  }
}

/// The same bytes as `w`, `shift` bytes into a fresh device buffer, so a
/// kernel sees rows at a chosen alignment.
DeviceArray<uint8_t> shiftedCopy(const Weight &w, size_t shift) {
  DeviceArray<uint8_t> d(w.host.size() + shift);
  CHECK_CUDA(cudaMemcpy(d.get() + shift, w.device.get(), w.host.size(),
                        cudaMemcpyDeviceToDevice));
  return d;
}

void checkLinear(Report &r, kiln::Rng &rng) {
  cpu::ThreadPool pool(4);
  struct Shape {
    std::vector<int64_t> dims;
    int64_t batch;
    size_t shift = 0; ///< bytes the weight's data is moved off its alignment
  };
  const auto check = [&](GGMLType type, const Shape &s) {
    const bool stacked = s.dims.size() == 3;
    const int64_t k = s.dims[0], n = s.dims[1];
    Weight w = randomWeight(type, s.dims, rng.next());
    std::vector<float> x = normals(rng, s.batch * k, 1.0), want(s.batch * n);
    if (!r.reference("linear", cpu::linear(x.data(), s.batch, w.view("w"),
                                           want.data(), pool)))
      return;
    DeviceArray<float> dx(x), dy(want.size());
    DeviceArray<uint8_t> moved = shiftedCopy(w, s.shift);
    kc::DeviceWeight dw = w.dev();
    if (s.shift)
      dw.data = moved.get() + s.shift;
    run(kc::launchLinear(dx.get(), s.batch, dw, n, stacked, dy.get(), nullptr));
    std::string what =
        stacked ? fmtText("%s [%lld, %lld, %lld] stacked, batch %lld",
                          typeName(type).c_str(), (long long)k, (long long)n,
                          (long long)s.dims[2], (long long)s.batch)
                : fmtText("%s [%lld, %lld] batch %lld", typeName(type).c_str(),
                          (long long)k, (long long)n, (long long)s.batch);
    if (s.shift)
      what += fmtText(", data +%zu", s.shift);
    // Fused multiply-adds in the dots round once where the CPU rounds
    // twice: under an ulp per term, inside the sum-order allowance.
    r.line("linear", what, relError(dy.download(), want), sumTol(double(k)),
           sumWhy("dot order, fma", k));
  };
  for (GGMLType type :
       {GGMLType::Q8_0, GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K,
        GGMLType::Q2_K, GGMLType::Q3_K, GGMLType::IQ4_XS, GGMLType::Q5_0,
        GGMLType::Q5_1, GGMLType::IQ4_NL, GGMLType::BF16, GGMLType::F16,
        GGMLType::F32})
    // 512 columns: 2 K-quant blocks, one warp per row; 6144: rows split
    // into segments (few rows, long rows).
    for (const Shape &s : {Shape{{512, 37}, 1}, Shape{{512, 37}, 3},
                           Shape{{256, 19, 3}, 3}, Shape{{6144, 37}, 1}})
      check(type, s);
  // Odd lengths: the float paths' scalar tails, x rows off 16-alignment.
  for (GGMLType type : {GGMLType::BF16, GGMLType::F16, GGMLType::F32})
    for (const Shape &s : {Shape{{1001, 5}, 3}, Shape{{1002, 5}, 1, 2}})
      check(type, s);
  // Q8_0 steps are 4 blocks: 1 and 3 blocks leave lanes idle.
  check(GGMLType::Q8_0, Shape{{32, 5}, 2});
  check(GGMLType::Q8_0, Shape{{96, 37}, 1});
  // Rows off the wide loads' alignment: Q8_0 and Q6_K blocks at 2 mod 4
  // everywhere, Q4_K / Q5_K off 16 (the generic fallback).
  check(GGMLType::Q8_0, Shape{{512, 37}, 1, 2});
  check(GGMLType::Q6_K, Shape{{512, 37}, 1, 2});
  check(GGMLType::Q4_K, Shape{{512, 37}, 1, 2});
  check(GGMLType::Q5_K, Shape{{512, 37}, 1, 4});
  // Q3_K's 110-byte blocks alternate 2 and 0 mod 4 from an offset of 2
  // (the aligned-word loads); Q2_K off 4 (the generic fallback).
  check(GGMLType::Q3_K, Shape{{512, 37}, 1, 2});
  check(GGMLType::Q2_K, Shape{{512, 37}, 1, 2});
  // GLM-5 shapes (a tensor-parallel rank of 8): q_a-like Q8_0, 8 stacked
  // Q4_K experts, a dense Q5_K slice.
  check(GGMLType::Q8_0, Shape{{6144, 2048}, 1});
  check(GGMLType::Q4_K, Shape{{6144, 256, 8}, 8});
  check(GGMLType::Q5_K, Shape{{6144, 512}, 1});
  check(GGMLType::Q6_K, Shape{{2048, 1000}, 1});
  // F32 rows held in registers across the wait: GLM-5's indexer head
  // weights (6144 -> 32), and rows longer than the held loads (40 float4 a
  // lane, 8 held).
  check(GGMLType::F32, Shape{{6144, 32}, 1});
  check(GGMLType::F32, Shape{{40960, 3}, 1});
}

/// A weight repacked on the device into its type's split layout, the planes
/// in one allocation as the plugin places them (SplitLayout.h).
struct SplitWeight {
  const kc::SplitFormat *format;
  uint64_t blocks;
  DeviceArray<uint8_t> memory;

  kc::DeviceWeight dev(const Weight &w) const {
    kc::DeviceWeight d{w.type, w.rows, w.cols, nullptr,
                       kc::splitLayoutOf(w.type)};
    for (int p = 0; p < format->planes; ++p)
      d.setPlane(p, memory.get() + kc::splitPlaneStart(*format, p, blocks));
    return d;
  }
  /// The file's blocks rebuilt on the host from the device's planes.
  std::vector<uint8_t> unpack() const {
    std::vector<uint8_t> planes = memory.download(),
                         blocksOut(blocks * format->blockBytes);
    const uint8_t *at[kc::kMaxSplitPlanes] = {};
    for (int p = 0; p < format->planes; ++p)
      at[p] = planes.data() + kc::splitPlaneStart(*format, p, blocks);
    kc::unpackSplitHost(*format, at, blocks, blocksOut.data());
    return blocksOut;
  }
};

SplitWeight repackSplit(const Weight &w) {
  const kc::SplitFormat *f = kc::splitFormatOf(w.type);
  const uint64_t blocks = uint64_t(w.rows * w.cols) / f->blockValues;
  SplitWeight s{
      f, blocks,
      DeviceArray<uint8_t>(kc::splitPlaneStart(*f, f->planes, blocks))};
  const kc::DeviceWeight d = s.dev(w);
  if (w.type == GGMLType::Q8_0) // its own entry point, the same repack
    run(kc::launchRepackQ8Split(w.device.get(), w.rows, w.cols,
                                const_cast<uint8_t *>(d.data),
                                const_cast<uint8_t *>(d.scales), nullptr));
  else
    run(kc::launchRepackSplit(w.device.get(), d, nullptr));
  return s;
}

/// `w` on the device: repacked into its split layout (kept alive in
/// `held`) when `split`, else the file's blocks.
kc::DeviceWeight deviceWeight(const Weight &w, bool split,
                              std::optional<SplitWeight> &held) {
  if (!split)
    return w.dev();
  held.emplace(repackSplit(w));
  return held->dev(w);
}

/// The split device layouts (q8_0-split, q4_k-split, q5_k-split,
/// q6_k-split, iq4_xs-split, iq4_nl-split, q5_0-split, q5_1-split): the
/// repack keeps every byte (the blocks rebuilt from the
/// planes on the host equal the file's), its values are the file's bit for
/// bit, and the mat-vec over it matches the CPU as the block layout's does
/// and gives the same bits when run again, at tensor-parallel GLM-5 shapes,
/// stacked weights, widths of one block or under one warp pass, row counts
/// off the rows a warp takes, and x off 16-byte alignment.
void checkSplitLayouts(Report &r, kiln::Rng &rng) {
  cpu::ThreadPool pool(4);
  struct Shape {
    std::vector<int64_t> dims;
    int64_t batch;
    size_t xShift = 0; ///< floats x is moved off 16-byte alignment
  };
  const std::vector<Shape> q8Shapes = {
      {{512, 37}, 1},    {{512, 37}, 3},     {{96, 37}, 1},
      {{32, 5}, 2},      {{192, 512, 8}, 8}, {{512, 37}, 1, 1},
      {{6144, 2048}, 1}, {{2048, 6144}, 1},  {{6144, 2752}, 1}};
  // K-quants: a pass is 4 blocks (1024 values); 256 and 1280 leave lanes
  // or a pass part idle; 6144 -> 2048 (q_a-like) and 2048 -> 6144 (a
  // row-parallel slice) are tp = 8 GLM-5 shapes.
  const std::vector<Shape> kShapes = {{{256, 37}, 1},     {{256, 5}, 2},
                                      {{512, 37}, 3},     {{1280, 37}, 1},
                                      {{1024, 64, 8}, 8}, {{256, 19, 3}, 3},
                                      {{512, 37}, 1, 1},  {{6144, 37}, 1, 3},
                                      {{6144, 2048}, 1},  {{2048, 6144}, 1}};
  // The 32-value blocks (IQ4_NL, Q5_0, Q5_1): a lane takes a block, and a
  // row of u blocks the smallest power of two >= u lanes (at most 32), so
  // 32, 96, 128 and 512 values put 32, 8, 8 and 2 row slots in a warp (96:
  // a lane of each slot idle); 1056 is two passes, the second of one
  // block; [128, 512, 8] batch 8 is attn_k_b (per head) at tp = 8, [6144,
  // 2048] q_a-like, [2048, 6144] a row-parallel slice.
  const std::vector<Shape> nibbleShapes = {
      {{32, 37}, 1},      {{32, 5}, 2},      {{96, 37}, 1},
      {{128, 37}, 3},     {{512, 37}, 1, 1}, {{1056, 37}, 1},
      {{128, 512, 8}, 8}, {{512, 19, 3}, 3}, {{6144, 37}, 1, 3},
      {{6144, 2048}, 1},  {{2048, 6144}, 1}};
  for (GGMLType type :
       {GGMLType::Q8_0, GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K,
        GGMLType::IQ4_XS, GGMLType::IQ4_NL, GGMLType::Q5_0, GGMLType::Q5_1}) {
    const kc::SplitFormat *format = kc::splitFormatOf(type);
    const std::string op = format->name;
    // IQ4_XS has the K-quants' 256-value blocks (its 8 sub-blocks take the
    // lanes of the 32-value blocks).
    const std::vector<Shape> &shapes = type == GGMLType::Q8_0 ? q8Shapes
                                       : format->blockValues == 32
                                           ? nibbleShapes
                                           : kShapes;
    for (const Shape &s : shapes) {
      const bool stacked = s.dims.size() == 3;
      const int64_t k = s.dims[0], n = s.dims[1];
      Weight w = randomWeight(type, s.dims, rng.next());
      SplitWeight split = repackSplit(w);
      std::string what = fmtText("%s [%lld, %lld", typeName(type).c_str(),
                                 (long long)k, (long long)n);
      if (stacked)
        what += fmtText(", %lld] stacked", (long long)s.dims[2]);
      else
        what += "]";
      what += fmtText(" batch %lld", (long long)s.batch);
      if (s.xShift)
        what += fmtText(", x +%zu floats", s.xShift);

      r.line(op, "repack " + what, mismatches(split.unpack(), w.host), 0,
             "every byte kept");

      std::vector<float> values(size_t(w.rows * w.cols));
      if (!r.reference(op, cpu::dequant(w.view("w"), values.data())))
        continue;
      DeviceArray<float> out(values.size());
      run(kc::launchDequant(split.dev(w), out.get(), nullptr));
      r.line(op, "dequant " + what, mismatches(out.download(), values), 0,
             "bit-exact with gguf-py");

      std::vector<float> x = normals(rng, size_t(s.batch * k), 1.0),
                         want(size_t(s.batch * n));
      if (!r.reference(op, cpu::linear(x.data(), s.batch, w.view("w"),
                                       want.data(), pool)))
        continue;
      std::vector<float> shifted(s.xShift, 0.f);
      shifted.insert(shifted.end(), x.begin(), x.end());
      DeviceArray<float> dx(shifted), dy(want.size()), again(want.size());
      run(kc::launchLinear(dx.get() + s.xShift, s.batch, split.dev(w), n,
                           stacked, dy.get(), nullptr));
      run(kc::launchLinear(dx.get() + s.xShift, s.batch, split.dev(w), n,
                           stacked, again.get(), nullptr));
      const std::vector<float> got = dy.download();
      // Block scales multiply once per block or sub-block where the CPU
      // rounds d * q per value; fused multiply-adds: under an ulp per term.
      r.line(op, "linear " + what, relError(got, want), sumTol(double(k)),
             sumWhy("dot order, fma", k));
      r.line(op, "linear again " + what, mismatches(again.download(), got), 0,
             "deterministic");
    }
    // A weight of another type in this layout, and a width of part blocks,
    // are refused before any launch.
    {
      const GGMLType other =
          type == GGMLType::Q4_K ? GGMLType::Q5_K : GGMLType::Q4_K;
      Weight w = randomWeight(type, {256, 4}, rng.next());
      SplitWeight split = repackSplit(w);
      kc::DeviceWeight wrongType = split.dev(w), partBlock = split.dev(w);
      wrongType.type = other;
      partBlock.cols = format->blockValues / 2;
      DeviceArray<float> x(size_t(256)), y(size_t(4)), out(size_t(1024));
      const double refused =
          (kc::launchLinear(x.get(), 1, wrongType, 4, false, y.get(),
                            nullptr) != cudaErrorInvalidValue) +
          (kc::launchDequant(wrongType, out.get(), nullptr) !=
           cudaErrorInvalidValue) +
          (kc::launchLinear(x.get(), 1, partBlock, 4, false, y.get(),
                            nullptr) != cudaErrorInvalidValue) +
          (kc::launchRepackSplit(w.device.get(), wrongType, nullptr) !=
           cudaErrorInvalidValue);
      r.line(op,
             typeName(other) + fmtText(" weight, %u-value rows: refused",
                                       unsigned(format->blockValues / 2)),
             refused, 0, "cudaErrorInvalidValue");
    }
  }
}

//===----------------------------------------------------------------------===//
// Caches and attention
//===----------------------------------------------------------------------===//

void checkCacheAppend(Report &r, kiln::Rng &rng) {
  const int64_t positions = 16, width = 576;
  const int32_t position = 9;
  for (kc::CacheType t :
       {kc::CacheType::F32, kc::CacheType::F16, kc::CacheType::BF16}) {
    Cache c = randomCache(t, positions, width, rng.next());
    std::vector<float> entry = normals(rng, width, 100.0);
    // Rounding corners: ties to even in f16 and bf16, overflow, subnormals,
    // signed zero, infinities and NaNs with payloads.
    const float specials[] = {1.f + 0x1.0p-11f,
                              1.f + 3 * 0x1.0p-11f,
                              1.f + 0x1.0p-8f,
                              1.f + 3 * 0x1.0p-8f,
                              65520.f,
                              65519.f,
                              1e-6f,
                              3e-8f,
                              1e-40f,
                              -0.f,
                              3.0e38f,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              kiln::floatFromBits(0x7fc00001u),
                              kiln::floatFromBits(0xff812345u),
                              kiln::floatFromBits(0x7f800001u)};
    std::copy(std::begin(specials), std::end(specials), entry.begin());
    DeviceArray<float> de(entry);
    DeviceArray<int32_t> dp(std::vector<int32_t>{position});
    Fault fault;
    run(kc::launchCacheAppend(de.get(), dp.get(), c.dev(), fault.sink(),
                              nullptr));
    if (!r.reference("cache_append",
                     cpu::cacheAppend(entry.data(), position, c.view())))
      continue;
    r.line("cache_append",
           fmtText("%s %lldx%lld at %d, with specials", cacheName(t),
                   (long long)positions, (long long)width, position),
           mismatches(c.device.download(), c.host) +
               faultMismatch(fault.read(), kc::FaultCode::None, 0, 0),
           0, "bit-exact: RNE, NaN as the CPU");

    // The cache is full: fault, nothing written.
    dp.upload({int32_t(positions)});
    run(kc::launchCacheAppend(de.get(), dp.get(), c.dev(), fault.sink(),
                              nullptr));
    r.line("cache_append fault",
           fmtText("%s position %lld of %lld", cacheName(t),
                   (long long)positions, (long long)positions),
           faultMismatch(fault.read(), kc::FaultCode::PositionOutOfRange,
                         positions, positions) +
               mismatches(c.device.download(), c.host),
           0, "PositionOutOfRange, cache untouched");
  }
}

/// step.norm_rope_append against the CPU's (the same calls as the ops
/// unfused): GLM-5's latent row (rms over 512, rope of the last 64) and
/// indexer key (layer norm, rope of the first 64), a NeoX rope crossing the
/// normalised part, a row wider than a block (1,100 values) with angles
/// computed on the device (80 pairs), late positions; then a full cache.
void checkNormRopeAppend(Report &r, kiln::Rng &rng) {
  struct Case {
    kc::CacheType type;
    bool layer, neox;
    int64_t width, normDims, offset, dims, positions;
    int32_t position;
  };
  for (const Case &c :
       {Case{kc::CacheType::F16, false, false, 576, 512, 512, 64, 16, 9},
        Case{kc::CacheType::BF16, true, false, 128, 128, 0, 64, 16, 3},
        Case{kc::CacheType::F32, true, true, 80, 64, 8, 16, 16, 15},
        Case{kc::CacheType::F32, false, false, 1100, 1000, 900, 160, 20000,
             19999},
        Case{kc::CacheType::F16, true, true, 576, 512, 512, 64, 20000,
             16383}}) {
    Cache cache = randomCache(c.type, c.positions, c.width, rng.next());
    std::vector<float> entry = normals(rng, c.width, 3.0),
                       w = normals(rng, c.normDims, 1.0),
                       bias = normals(rng, c.normDims, 0.5);
    const float eps = 1e-5f, theta = 1e6f;
    const cpu::RopeStyle cpuStyle =
        c.neox ? cpu::RopeStyle::NeoX : cpu::RopeStyle::Interleaved;
    const kc::RopeStyle style =
        c.neox ? kc::RopeStyle::NeoX : kc::RopeStyle::Interleaved;
    if (!r.reference("norm_rope_append",
                     cpu::normRopeAppend(entry.data(), c.normDims, w.data(),
                                         c.layer ? bias.data() : nullptr, eps,
                                         c.position, cpuStyle, theta, c.offset,
                                         c.dims, cache.view())))
      continue;
    DeviceArray<float> de(entry), dw(w), db(bias);
    DeviceArray<int32_t> dp(std::vector<int32_t>{c.position});
    Fault fault;
    run(kc::launchNormRopeAppend(de.get(), c.normDims, dw.get(),
                                 c.layer ? db.get() : nullptr, eps, dp.get(),
                                 style, theta, c.offset, c.dims, cache.dev(),
                                 fault.sink(), nullptr));
    // Every row but the position's must be untouched; that row within the
    // norm's summation order, then the element type's rounding (a value
    // near a rounding boundary may go either way: one ulp).
    const std::vector<uint8_t> got = cache.device.download();
    std::vector<float> gotRow, wantRow;
    uint64_t others = 0;
    for (int64_t i = 0; i < c.positions * c.width; ++i) {
      const float g = cacheValue(c.type, got, i), v = cache.value(i);
      if (i / c.width == c.position) {
        gotRow.push_back(g);
        wantRow.push_back(v);
      } else if (g != v && !(std::isnan(g) && std::isnan(v))) {
        ++others;
      }
    }
    const double ulp = c.type == kc::CacheType::F16    ? 0x1.0p-11
                       : c.type == kc::CacheType::BF16 ? 0x1.0p-8
                                                       : 0.0;
    r.line("norm_rope_append",
           fmtText("%s %s over %lld of %lld, %s rope [%lld, %lld) at %d",
                   cacheName(c.type), c.layer ? "layer" : "rms",
                   (long long)c.normDims, (long long)c.width,
                   c.neox ? "neox" : "interleaved", (long long)c.offset,
                   (long long)(c.offset + c.dims), c.position),
           relError(gotRow, wantRow) + double(others) +
               faultMismatch(fault.read(), kc::FaultCode::None, 0, 0),
           3 * sumTol(double(c.normDims)) + ulp,
           fmtText("norm sum order, 3e-6*sqrt(%lld), + one %s ulp",
                   (long long)c.normDims, cacheName(c.type)));
  }
  // The cache is full: fault, nothing written.
  Cache cache = randomCache(kc::CacheType::F16, 16, 576, rng.next());
  std::vector<float> entry = normals(rng, 576, 3.0), w = normals(rng, 512, 1.0);
  DeviceArray<float> de(entry), dw(w);
  DeviceArray<int32_t> dp(std::vector<int32_t>{16});
  Fault fault;
  run(kc::launchNormRopeAppend(de.get(), 512, dw.get(), nullptr, 1e-5f,
                               dp.get(), kc::RopeStyle::Interleaved, 1e6f, 512,
                               64, cache.dev(), fault.sink(), nullptr));
  r.line(
      "norm_rope_append fault", "f16 position 16 of 16",
      faultMismatch(fault.read(), kc::FaultCode::PositionOutOfRange, 16, 16) +
          mismatches(cache.device.download(), cache.host),
      0, "PositionOutOfRange, cache untouched");
}

void checkMlaAttention(Report &r, kiln::Rng &rng) {
  cpu::ThreadPool pool(4);
  const int64_t latent = 512, rope = 64, width = latent + rope;
  const float scale = 1.f / std::sqrt(float(width));

  // A case's count: the selection's, or no selection over the whole
  // cache (kAll), or no selection with the selection's length as the most
  // positions attended (kBounded: a step's MLA below DSA's top-k, where
  // every position is selected).
  static constexpr int32_t kAll = -1, kBounded = -2;
  struct Case {
    kc::CacheType type;
    int32_t position;
    int32_t count;
  };
  // The capacity a case's launch passes: the selection's length, also as
  // the bound of kBounded; none for kAll.
  auto launchCapacity = [](const Case &c, int64_t capacity) {
    return c.count == kAll ? int64_t(0) : capacity;
  };
  // Floats after the scratch that no call may touch, filled with a
  // pattern no kernel writes (a NaN's bits).
  static constexpr size_t kGuard = 1024;
  static constexpr uint32_t kGuardBits = 0x7fc0dead;
  auto guardedScratch = [](int64_t floats) {
    std::vector<float> v(size_t(floats) + kGuard, 0.f);
    const float mark = std::bit_cast<float>(kGuardBits);
    std::fill(v.begin() + floats, v.end(), mark);
    return v;
  };
  // A random query of `heads` heads and the device buffers for a cache of
  // `positions` and a selection of `capacity` entries; the scratch is of
  // exactly the size `entries` attended need (mlaMostEntries), then a
  // guard.
  struct Inputs {
    std::vector<float> ql, qr;
    int64_t scratchFloats;
    DeviceArray<float> dql, dqr, scores, dout;
    DeviceArray<int32_t> dpos, dsel, dcount;
    Inputs(kiln::Rng &rng, int64_t heads, int64_t latent, int64_t rope,
           int64_t capacity, int64_t entries,
           const std::vector<float> &scratch)
        : ql(normals(rng, heads * latent, 1.0)),
          qr(normals(rng, heads * rope, 1.0)),
          scratchFloats(int64_t(scratch.size() - kGuard)), dql(ql), dqr(qr),
          scores(scratch), dout(size_t(heads * latent)), dpos(size_t(1)),
          dsel(size_t(capacity)), dcount(size_t(1)) {}
    /// Guard floats a call overwrote.
    int64_t guardWrites() const {
      const std::vector<float> v = scores.download();
      int64_t n = 0;
      for (size_t i = size_t(scratchFloats); i < v.size(); ++i)
        n += std::bit_cast<uint32_t>(v[i]) != kGuardBits;
      return n;
    }
  };
  auto inputs = [&](int64_t heads, int64_t capacity, int64_t entries) {
    return Inputs(rng, heads, latent, rope, capacity, entries,
                  guardedScratch(kc::mlaScratchFloats(heads, latent, entries)));
  };
  // One case of `heads` heads over a cache of `positions` with a selection
  // of `capacity` entries; on its own scratch, or on `sharedScratch` (sized
  // for at least this shape) with `label` in the case's name. `fixedHeads`:
  // then again with KILN_CUDA_SPECIALISED's kernels, which must run the
  // kernel compiled for these heads and give the same bits.
  auto check = [&](int64_t heads, int64_t positions, int64_t capacity,
                   const Case &c, float *sharedScratch = nullptr,
                   const char *label = "", bool fixedHeads = false) {
    const int64_t bound = launchCapacity(c, capacity);
    Inputs in =
        inputs(heads, capacity, kc::mlaMostEntries(positions, bound));
    auto &[ql, qr, scratchFloats, dql, dqr, scores, dout, dpos, dsel, dcount] =
        in;
    Cache cache = randomCache(c.type, positions, width, rng.next());
    std::vector<int32_t> sel(capacity, 0);
    // Entries anywhere in the cache, repeats allowed (the kernel does not
    // care which positions they are).
    for (int32_t &s : sel)
      s = int32_t(rng.below(uint64_t(positions)));
    if (c.count > 1)
      sel[1] = sel[0];
    std::vector<float> want(heads * latent);
    const int32_t count = c.count;
    if (!r.reference("mla_attention",
                     cpu::mlaAttention(ql.data(), qr.data(), heads, latent,
                                       rope, cache.view(), c.position,
                                       count >= 0 ? sel.data() : nullptr,
                                       count >= 0 ? &count : nullptr, scale,
                                       want.data(), pool)))
      return;
    dpos.upload({c.position});
    dsel.upload(sel);
    dcount.upload({count});
    Fault fault;
    run(kc::launchMlaAttention(
        dql.get(), dqr.get(), heads, latent, rope, cache.dev(), dpos.get(),
        count >= 0 ? dsel.get() : nullptr, count >= 0 ? dcount.get() : nullptr,
        bound, scale, sharedScratch ? sharedScratch : scores.get(),
        dout.get(), fault.sink(), nullptr));
    const int64_t attended = count >= 0 ? count : c.position + 1;
    r.line("mla_attention",
           count >= 0
               ? fmtText("%s %lldx(512+64), %d selected of %lld%s",
                         cacheName(c.type), (long long)heads, count,
                         (long long)positions, label)
               : fmtText("%s %lldx(512+64), positions 0..%d of %lld%s%s",
                         cacheName(c.type), (long long)heads, c.position,
                         (long long)positions,
                         count == kBounded
                             ? fmtText(", at most %lld", (long long)capacity)
                                   .c_str()
                             : "",
                         label),
           relError(dout.download(), want) +
               faultMismatch(fault.read(), kc::FaultCode::None, 0, 0) +
               double(sharedScratch ? 0 : in.guardWrites()),
           sumTol(double(width)) + sumTol(double(attended)),
           fmtText("dot and softmax order, 1e-6*(sqrt(%lld)+sqrt(%lld))",
                   (long long)width, (long long)attended));
    // Bounded: the bits of a selection of every position 0 .. position,
    // which the indexer writes there (same entries, same order).
    if (count == kBounded) {
      std::vector<int32_t> every(size_t(capacity), 0);
      for (int32_t i = 0; i <= c.position; ++i)
        every[size_t(i)] = i;
      dsel.upload(every);
      dcount.upload({c.position + 1});
      const std::vector<float> bounded = dout.download();
      Fault selFault;
      run(kc::launchMlaAttention(
          dql.get(), dqr.get(), heads, latent, rope, cache.dev(), dpos.get(),
          dsel.get(), dcount.get(), capacity, scale,
          sharedScratch ? sharedScratch : scores.get(), dout.get(),
          selFault.sink(), nullptr));
      r.line("mla_attention",
             fmtText("%s %lldx(512+64), positions 0..%d at most %lld: a "
                     "selection of all of them's bits",
                     cacheName(c.type), (long long)heads, c.position,
                     (long long)capacity),
             mismatches(dout.download(), bounded) +
                 faultMismatch(selFault.read(), kc::FaultCode::None, 0, 0),
             0, "same entries, same order");
    }
    // Without a selection the rows before the position are loaded before
    // the kernel's wait by default (the kernels for fixed heads): the bits
    // of all of them after it (KILN_CUDA_MLA_EARLY_ROWS=0).
    if (count < 0) {
      const std::vector<float> early = dout.download();
      Fault lateFault;
      {
        const MlaEarlyRowsOff off;
        run(kc::launchMlaAttention(
            dql.get(), dqr.get(), heads, latent, rope, cache.dev(), dpos.get(),
            nullptr, nullptr, bound, scale,
            sharedScratch ? sharedScratch : scores.get(), dout.get(),
            lateFault.sink(), nullptr));
      }
      r.line("mla_attention",
             fmtText("%s %lldx(512+64), positions 0..%d%s: every row loaded "
                     "after the wait, the same bits",
                     cacheName(c.type), (long long)heads, c.position, label),
             mismatches(dout.download(), early) +
                 faultMismatch(lateFault.read(), kc::FaultCode::None, 0, 0),
             0, "same rows, same products");
    }
    if (!fixedHeads)
      return;
    const std::vector<float> general = dout.download();
    DeviceArray<float> fixedOut(general.size());
    Fault fixedFault;
    uint64_t ran = 0;
    {
      // The scalar kernel for these heads (for 8 the default is the
      // tensor cores', checked below).
      const FixedShapes fixed(true);
      const MlaTensorCores scalar(false);
      run(kc::launchMlaAttention(
          dql.get(), dqr.get(), heads, latent, rope, cache.dev(), dpos.get(),
          count >= 0 ? dsel.get() : nullptr,
          count >= 0 ? dcount.get() : nullptr, bound, scale, scores.get(),
          fixedOut.get(), fixedFault.sink(), nullptr));
      ran = fixed.ran();
    }
    const std::string what =
        fmtText("%s %lldx(512+64), %lld entries: the kernel compiled for %lld "
                "heads",
                cacheName(c.type), (long long)heads, (long long)attended,
                (long long)heads);
    r.line("fixed width", what + " ran", std::fabs(double(ran) - 1.0), 0,
           "launch count");
    r.line("fixed width", what + ": the general kernel's bits",
           mismatches(fixedOut.download(), general) +
               faultMismatch(fixedFault.read(), kc::FaultCode::None, 0, 0) +
               double(in.guardWrites()),
           0, "same products, same order; no fault, guard kept");
    if (heads != 8)
      return;
    // GLM-5's rank at tp = 8 on the tensor cores: against the CPU with the
    // same tolerance (the query and the weights held to ~2^-22 by two f16
    // parts each, f32 sums), the kernel counted, no fault, the guard kept;
    // without a selection its rows all loaded after its wait give the same
    // bits.
    Fault mmaFault, lateFault;
    uint64_t mmaRan = 0;
    std::vector<float> mma, late;
    {
      const FixedShapes fixed(true);
      const MlaTensorCores on(true);
      auto launch = [&](Fault &f) {
        run(kc::launchMlaAttention(
            dql.get(), dqr.get(), heads, latent, rope, cache.dev(), dpos.get(),
            count >= 0 ? dsel.get() : nullptr,
            count >= 0 ? dcount.get() : nullptr, bound, scale, scores.get(),
            fixedOut.get(), f.sink(), nullptr));
        return fixedOut.download();
      };
      mma = launch(mmaFault);
      if (count < 0) {
        const MlaEarlyRowsOff off;
        late = launch(lateFault);
      }
      mmaRan = on.ran();
    }
    const std::string mmaWhat =
        fmtText("f16 8x(512+64), %lld entries%s, tensor cores",
                (long long)attended, count >= 0 ? " selected" : "");
    r.line("mla_attention", mmaWhat,
           relError(mma, want) +
               faultMismatch(mmaFault.read(), kc::FaultCode::None, 0, 0) +
               double(in.guardWrites()) +
               std::fabs(double(mmaRan) - (count < 0 ? 2.0 : 1.0)),
           sumTol(double(width)) + sumTol(double(attended)),
           fmtText("split f16 parts, mma sums, 1e-6*(sqrt(%lld)+sqrt(%lld)); "
                   "its launches counted",
                   (long long)width, (long long)attended));
    if (count < 0)
      r.line("mla_attention", mmaWhat + ", every row loaded after the wait",
             mismatches(late, mma) +
                 faultMismatch(lateFault.read(), kc::FaultCode::None, 0, 0),
             0, "same rows, same products");
  };
  for (const Case &c :
       {Case{kc::CacheType::F16, 250, -1}, Case{kc::CacheType::F16, 299, 37},
        Case{kc::CacheType::F16, 0, -1}, Case{kc::CacheType::F16, 10, 0},
        Case{kc::CacheType::BF16, 200, 64}, Case{kc::CacheType::F32, 120, -1},
        Case{kc::CacheType::F16, 63, kBounded},
        Case{kc::CacheType::BF16, 20, kBounded}})
    check(4, 300, 64, c);
  // GLM-5's 8 local heads over long caches: a full selection of 2,048,
  // counts between, and without a selection more chunks than one wave of
  // the chunk grid takes (one block a multiprocessor on an H200: 132
  // chunks of 8, 1,056 entries), so blocks take several in turn.
  for (const Case &c :
       {Case{kc::CacheType::F16, 4095, 2048},
        Case{kc::CacheType::BF16, 3000, 1100},
        Case{kc::CacheType::F16, 2000, 1025},
        Case{kc::CacheType::F16, 3000, -1}, Case{kc::CacheType::F32, 2500, -1},
        Case{kc::CacheType::F16, 1023, kBounded},
        Case{kc::CacheType::F16, 2047, kBounded}})
    check(8, 4096, 2048, c);
  // The kernels compiled for GLM-5's heads at tp = 8, 4, 2, 1 (f16 cache,
  // KILN_CUDA_SPECIALISED=1): a full selection, and for 8 heads also a
  // partial one and none.
  for (int64_t heads : widthList(kc::glm5::MlaHeadCounts{})) {
    check(heads, 4096, 2048, Case{kc::CacheType::F16, 4095, 2048}, nullptr, "",
          true);
    if (heads == 8) {
      check(heads, 4096, 2048, Case{kc::CacheType::F16, 2000, 1025}, nullptr,
            "", true);
      check(heads, 4096, 2048, Case{kc::CacheType::F16, 1500, -1}, nullptr,
            "", true);
      check(heads, 4096, 2048, Case{kc::CacheType::F16, 1500, kBounded},
            nullptr, "", true);
      // Short: one row, a chunk's rows in part, an empty selection, a
      // partial selection with a repeated entry.
      for (const Case &c :
           {Case{kc::CacheType::F16, 0, kBounded},
            Case{kc::CacheType::F16, 12, kBounded},
            Case{kc::CacheType::F16, 299, 0}, Case{kc::CacheType::F16, 299, 37},
            Case{kc::CacheType::F16, 4095, 1}})
        check(heads, 4096, 2048, c, nullptr, "", true);
    }
  }

  // With the output projection (GLM-5's attn_v_b at tp=8: 256 rows of 512
  // values a head, Q8_0 in the q8_0-split layout), which MLA's launch
  // combines and projects by a cluster of blocks a head: against the CPU's
  // MLA, then its stacked linear; then the same call again, bit for bit.
  // 32 heads: more clusters than fit at once. Other latent widths (any
  // power of two from 32) run the kernels for any shape.
  auto checkProjected = [&](int64_t heads, int64_t positions, int64_t capacity,
                            const Case &c, int64_t n, int64_t lat = 0,
                            int64_t rp = 0) {
    if (lat == 0) { // GLM-5's widths
      lat = latent;
      rp = rope;
    }
    const int64_t bound = launchCapacity(c, capacity);
    const int64_t entries = kc::mlaMostEntries(positions, bound);
    Inputs in(rng, heads, lat, rp, capacity, entries,
              guardedScratch(kc::mlaScratchFloats(heads, lat, entries)));
    Cache cache = randomCache(c.type, positions, lat + rp, rng.next());
    std::vector<int32_t> sel(capacity, 0);
    for (int32_t &e : sel)
      e = int32_t(rng.below(uint64_t(positions)));
    const int32_t count = c.count;
    Weight w = randomWeight(GGMLType::Q8_0, {lat, n, heads}, rng.next());
    SplitWeight split = repackSplit(w);
    const kc::DeviceWeight proj = split.dev(w);
    const cpu::WeightView view = w.view("attn_v_b");
    std::vector<float> latentWant(heads * lat), want(heads * n);
    if (!r.reference("mla_attention",
                     cpu::mlaAttention(in.ql.data(), in.qr.data(), heads, lat,
                                       rp, cache.view(), c.position,
                                       count >= 0 ? sel.data() : nullptr,
                                       count >= 0 ? &count : nullptr, scale,
                                       latentWant.data(), pool)) ||
        !r.reference("mla_attention", cpu::linear(latentWant.data(), heads,
                                                  view, want.data(), pool)))
      return;
    in.dpos.upload({c.position});
    in.dsel.upload(sel);
    in.dcount.upload({count});
    DeviceArray<float> out(size_t(heads * n));
    Fault fault;
    auto launch = [&] {
      return kc::launchMlaAttention(
          in.dql.get(), in.dqr.get(), heads, lat, rp, cache.dev(),
          in.dpos.get(), count >= 0 ? in.dsel.get() : nullptr,
          count >= 0 ? in.dcount.get() : nullptr, bound, scale,
          in.scores.get(), out.get(), fault.sink(), nullptr, &proj);
    };
    run(launch());
    const std::vector<float> got = out.download();
    const int64_t attended = count >= 0 ? count : c.position + 1;
    const std::string what =
        fmtText("%s %lldx(%lld+%lld) -> %lldx%lld, %lld attended, projected",
                cacheName(c.type), (long long)heads, (long long)lat,
                (long long)rp, (long long)heads, (long long)n,
                (long long)attended);
    r.line("mla_attention", what,
           relError(got, want) +
               faultMismatch(fault.read(), kc::FaultCode::None, 0, 0) +
               double(in.guardWrites()),
           sumTol(double(lat + rp)) + sumTol(double(attended)) +
               sumTol(double(lat)),
           fmtText("MLA's orders, then the projection's dots, "
                   "1e-6*(sqrt(%lld)+sqrt(%lld)+sqrt(%lld))",
                   (long long)(lat + rp), (long long)attended,
                   (long long)lat));
    run(launch());
    r.line("mla_attention", what + ", again", mismatches(out.download(), got),
           0, "deterministic");
  };
  checkProjected(8, 4096, 2048, Case{kc::CacheType::F16, 2000, 1025}, 256);
  checkProjected(8, 4096, 2048, Case{kc::CacheType::F16, 4095, 2048}, 256);
  checkProjected(8, 4096, 2048, Case{kc::CacheType::F16, 3000, -1}, 256);
  checkProjected(32, 2048, 2048, Case{kc::CacheType::F16, 1500, -1}, 256);
  checkProjected(3, 300, 64, Case{kc::CacheType::BF16, 200, 40}, 64);
  checkProjected(8, 4096, 2048, Case{kc::CacheType::F16, 2000, 1025}, 300);
  checkProjected(8, 4096, 2048, Case{kc::CacheType::F16, 10, 0}, 256);
  checkProjected(2, 300, 64, Case{kc::CacheType::F16, 250, -1}, 24, 64, 32);
  checkProjected(4, 300, 64, Case{kc::CacheType::F32, 299, 37}, 40, 128, 64);
  checkProjected(4, 300, 64, Case{kc::CacheType::F16, 120, -1}, 16, 32, 16);
  {
    // A projection the kernel does not read is refused before any launch:
    // the file's blocks instead of the split layout, a width that is not
    // the latent's, rows that do not split evenly over the heads.
    const int64_t heads = 2, n = 32;
    Inputs in = inputs(heads, 64, 300);
    Cache cache = randomCache(kc::CacheType::F16, 300, width, rng.next());
    Weight w = randomWeight(GGMLType::Q8_0, {latent, n, heads}, rng.next());
    SplitWeight split = repackSplit(w);
    const kc::DeviceWeight blocks = w.dev();
    kc::DeviceWeight narrow = split.dev(w), uneven = split.dev(w);
    narrow.cols = latent / 2;
    uneven.rows = heads * n - 1;
    DeviceArray<float> out(size_t(heads * n));
    Fault fault;
    double refused = 0;
    for (const kc::DeviceWeight *p :
         std::initializer_list<const kc::DeviceWeight *>{&blocks, &narrow,
                                                         &uneven})
      refused +=
          kc::launchMlaAttention(
              in.dql.get(), in.dqr.get(), heads, latent, rope, cache.dev(),
              in.dpos.get(), nullptr, nullptr, 0, scale, in.scores.get(),
              out.get(), fault.sink(), nullptr, p) != cudaErrorInvalidValue;
    r.line("mla_attention",
           "projection in blocks, half as wide, rows not a multiple of the "
           "heads: refused",
           refused, 0, "cudaErrorInvalidValue");
  }

  // Sized for the largest call made on it below (no selection over every
  // position: the shared-scratch calls).
  const int64_t heads = 4, positions = 300, capacity = 64;
  Inputs in = inputs(heads, capacity, positions);
  auto &[ql, qr, scratchFloats, dql, dqr, scores, dout, dpos, dsel, dcount] =
      in;

  // Faults: nothing out of bounds is read, the first problem is reported.
  Cache cache = randomCache(kc::CacheType::F16, positions, width, rng.next());
  struct FaultCase {
    const char *what;
    int32_t position, count; // count kBounded: no selection, capacity bounds
    bool badEntry;
    kc::FaultCode code;
    int64_t value, limit;
  };
  const FaultCase faultCases[] = {
      {"entries 5 and 9 = 300 of 300", 299, 20, true,
       kc::FaultCode::SelectionOutOfRange, 300, positions},
      {"count 65 of capacity 64", 299, 65, false,
       kc::FaultCode::CountOutOfRange, 65, capacity},
      {"count -1", 299, -1, false, kc::FaultCode::CountOutOfRange, -1,
       capacity},
      {"position 300 of 300", 300, 4, false, kc::FaultCode::PositionOutOfRange,
       300, positions},
      {"no selection, position 64 beyond at most 64", 64, kBounded, false,
       kc::FaultCode::CountOutOfRange, 65, capacity}};
  // Case f's call of `h` heads on `use`'s buffers, over a fresh random
  // selection: the fault it reported.
  auto faultCall = [&](Inputs &use, int64_t h, const FaultCase &f) {
    std::vector<int32_t> sel(capacity);
    for (int32_t &s : sel)
      s = int32_t(rng.below(uint64_t(positions)));
    if (f.badEntry) {
      sel[5] = int32_t(positions);
      sel[9] = -7; // later: entry 5 is the one reported
    }
    use.dpos.upload({f.position});
    use.dsel.upload(sel);
    use.dcount.upload({f.count});
    Fault fault;
    const bool selection = f.count != kBounded;
    run(kc::launchMlaAttention(
        use.dql.get(), use.dqr.get(), h, latent, rope, cache.dev(),
        use.dpos.get(), selection ? use.dsel.get() : nullptr,
        selection ? use.dcount.get() : nullptr, capacity, scale,
        use.scores.get(), use.dout.get(), fault.sink(), nullptr));
    return fault.read();
  };
  for (const FaultCase &f : faultCases)
    r.line("mla fault", f.what,
           faultMismatch(faultCall(in, heads, f), f.code, f.value, f.limit) +
               double(in.guardWrites()),
           0, "first fault reported, nothing after the scratch written");
  // The same faults (but the negative count's) from the kernel for 8 heads
  // on the tensor cores.
  {
    Inputs in8 = inputs(8, capacity, positions);
    for (const FaultCase &f : faultCases) {
      if (f.count == -1)
        continue;
      const FixedShapes fixed(true);
      const MlaTensorCores on(true);
      const auto fault = faultCall(in8, 8, f);
      r.line("mla fault", fmtText("%s, 8 heads on the tensor cores", f.what),
             faultMismatch(fault, f.code, f.value, f.limit) +
                 double(in8.guardWrites()) + std::fabs(double(on.ran()) - 1.0),
             0, "first fault reported, nothing after the scratch written");
    }
  }
  // One scratch for calls of other shapes in turn, after the faulting calls
  // above left their marks on it: the grid barrier's words sit where every
  // shape finds it, and each call, faulting or not, leaves them fit for the
  // next (a call that found them wrong would wait out its timeout and
  // report a fault). After each call the parity names a zero count (the
  // next call's) and the other holds the last call's arrivals.
  auto barrierWords = [&] {
    const std::vector<float> v = scores.download();
    std::array<uint32_t, 3> w{};
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = std::bit_cast<uint32_t>(v[i]);
    return w;
  };
  int64_t calls = 0;
  double wordsWrong = 0;
  for (const auto &[h, c] :
       {std::pair{int64_t(1), Case{kc::CacheType::F16, 299, -1}},
        std::pair{int64_t(4), Case{kc::CacheType::F16, 150, 40}},
        std::pair{int64_t(2), Case{kc::CacheType::BF16, 77, -1}}}) {
    check(h, positions, capacity, c, scores.get(), ", shared scratch");
    const std::array<uint32_t, 3> w = barrierWords();
    ++calls;
    wordsWrong += w[2] > 1 ? 1.0 : double(w[w[2]] != 0) + double(w[w[2] ^ 1] == 0);
  }
  r.line("mla shared scratch",
         fmtText("barrier words after each of %lld cases: the parity's "
                 "count zero, the other the last call's arrivals",
                 (long long)calls),
         wordsWrong, 0, "gridBarrier's protocol");
  r.line("mla shared scratch", "guard after 3 calls of other shapes",
         double(in.guardWrites()), 0, "nothing after the scratch written");
}

/// The indexer's scores in double on the host (for choosing inputs whose
/// top-k boundary is not within rounding of a tie).
std::vector<double> indexerScores(const std::vector<float> &q, int64_t heads,
                                  int64_t dim, const std::vector<float> &w,
                                  const Cache &cache, int64_t attended,
                                  float scale) {
  std::vector<double> s(size_t(attended), 0.0);
  for (int64_t t = 0; t < attended; ++t) {
    double sum = 0;
    for (int64_t h = 0; h < heads; ++h) {
      double dot = 0;
      for (int64_t j = 0; j < dim; ++j)
        dot += double(q[h * dim + j]) * cache.value(t * dim + j);
      sum += w[h] * std::max(dot, 0.0);
    }
    s[t] = scale * sum;
  }
  return s;
}

void checkDsaIndexer(Report &r, kiln::Rng &rng) {
  const int64_t heads = 8, dim = 128, positions = 2000;
  const float scale = 0.25f;
  DeviceArray<float> scores(positions);
  DeviceArray<int32_t> dpos(1), dcount(1);

  struct Case {
    kc::CacheType type;
    int32_t position;
    int64_t topK;
    bool zeroQuery; // every score 0: the tie rule alone decides
    int64_t cachePositions = 2000;
    bool staged = true; // the selection's keys in shared memory
    int64_t heads = 8;  // over 32: a lane scores two heads
    // The query's rope, done by the score kernel (kiln-fuse-indexer-rope):
    // GLM-5's interleaved first 64 values with the query staged, and NeoX
    // values [32, 96) with 100 heads, too many to stage (the one-warp-a-
    // position kernel).
    int64_t ropeDims = 0;
    bool neox = false;
    // An exact tie built across the cut (else the scores as drawn: the
    // selections then find T in fewer than four passes, by its top bits).
    bool tie = true;
  };
  // The eighth case's selection reads its keys from the scores in global
  // memory (launchDsaIndexer's path for caches too long to stage), and
  // spreads 45,000 positions over the cluster's blocks.
  for (const Case &c :
       {Case{kc::CacheType::F16, 1500, 256, false},
        Case{kc::CacheType::BF16, 1999, 64, false},
        Case{kc::CacheType::F32, 700, 1, false},
        Case{kc::CacheType::F16, 100, 256, false},
        Case{kc::CacheType::F16, 1000, 300, true},
        Case{kc::CacheType::F16, 15000, 2048, false, 16384},
        // kMaxOneBlockPositions attended: the most one block selects.
        Case{kc::CacheType::F16, 6143, 2048, false, 8192},
        // No tie: T found early, by one block and by the cluster.
        Case{kc::CacheType::F16, 4095, 2048, false, 8192, true, 8, 0, false,
             false},
        Case{kc::CacheType::F16, 15000, 2048, false, 16384, true, 8, 0, false,
             false},
        Case{kc::CacheType::F16, 1500, 256, false, 2000, true, 40},
        Case{kc::CacheType::F16, 45000, 2048, false, 50000, false},
        // 70,001 positions, 4,376 keys a block of 16 (8,751 of 8): drawn
        // scores with a tie at the cut, and every score 0.
        Case{kc::CacheType::F16, 70000, 2048, false, 70001},
        Case{kc::CacheType::F16, 70000, 2048, true, 70001},
        Case{kc::CacheType::F16, 1500, 256, false, 2000, true, 8, 64},
        Case{kc::CacheType::BF16, 1999, 300, false, 2000, true, 100, 64,
             true},
        // 32 heads (GLM-5's): the kernel by groups of lanes. At 15,001 of
        // 16,384 positions with the rope; 1,991 positions (the last warp's
        // rows fewer than its 16, the second half short); every score 0.
        Case{kc::CacheType::F16, 15000, 2048, false, 16384, true, 32, 64},
        Case{kc::CacheType::BF16, 1990, 300, false, 2000, true, 32},
        Case{kc::CacheType::F16, 1000, 300, true, 2000, true, 32},
        // The tensor cores' scores (f16 keys, 32 heads) with the last
        // tile's 16 rows short (1,991 attended), no rope.
        Case{kc::CacheType::F16, 1990, 300, false, 2000, true, 32}}) {
    const int64_t attended = int64_t(c.position) + 1;
    std::vector<float> q, w;
    const int64_t ropeOffset = c.neox ? 32 : 0;
    const float theta = 1e6f;
    // The query as the indexer scores it: rotated when the case has a rope.
    auto rotated = [&](const std::vector<float> &raw) {
      std::vector<float> out = raw;
      if (c.ropeDims > 0)
        cpu::rope(raw.data(), c.heads, dim, c.position,
                  c.neox ? cpu::RopeStyle::NeoX : cpu::RopeStyle::Interleaved,
                  theta, ropeOffset, c.ropeDims, out.data());
      return out;
    };
    Cache cache = randomCache(c.type, c.cachePositions, dim, rng.next());
    DeviceArray<float> caseScores(size_t(c.cachePositions));
    std::string note;
    bool usable = c.zeroQuery || c.topK >= attended;
    for (int attempt = 0; attempt < 20 && !usable; ++attempt) {
      q = normals(rng, c.heads * dim, 1.0);
      w = normals(rng, c.heads, 0.3, 1.0);
      std::vector<double> s =
          indexerScores(rotated(q), c.heads, dim, w, cache, attended, scale);
      std::vector<int64_t> order(static_cast<size_t>(attended));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return s[a] > s[b]; });
      // Gaps around the boundary well above rounding (2e-5 of the largest
      // score; the f32 scores are good to ~1e-6 of it, and a tighter bound
      // lets the 45,000-position case find a draw): between ranks k-2
      // and k-1, k-1 and k, k and k+1 (the tie built below joins k-1 and
      // k, so its neighbours on both sides must be clear of it).
      const size_t k = size_t(c.topK);
      const double top = std::fabs(s[order[0]]);
      const double gapAbove = k >= 2 ? s[order[k - 2]] - s[order[k - 1]] : top;
      const double gapIn = s[order[k - 1]] - s[order[k]];
      const double gapOut =
          k + 1 < order.size() ? s[order[k]] - s[order[k + 1]] : top;
      if (gapAbove <= 2e-5 * top || gapIn <= 2e-5 * top || gapOut <= 2e-5 * top)
        continue;
      usable = true;
      if (!c.tie) {
        note = ", no tie";
        continue;
      }
      // An exact tie across the boundary: the position ranked just outside
      // gets the key of the one ranked last inside; the lower of the two
      // positions must win on both sides.
      cache.copyRow(order[k - 1], order[k]);
      note = fmtText(", tie %lld=%lld at the cut", (long long)order[k - 1],
                     (long long)order[k]);
    }
    if (c.zeroQuery) {
      q.assign(size_t(c.heads * dim), 0.f);
      w = normals(rng, c.heads, 0.3, 1.0);
      note = ", all scores 0";
    } else if (c.topK >= attended) {
      q = normals(rng, c.heads * dim, 1.0);
      w = normals(rng, c.heads, 0.3, 1.0);
      note = ", all selected";
    }
    if (!usable) {
      r.line("dsa_indexer", "no well-separated draw in 20 tries", 1, 0,
             "test input");
      continue;
    }
    std::vector<int32_t> want(size_t(c.topK), -1);
    int32_t wantCount = -1;
    const std::vector<float> scored = rotated(q);
    if (!r.reference("dsa_indexer",
                     cpu::dsaIndexer(scored.data(), c.heads, dim, w.data(),
                                     cache.view(), c.position, c.topK, scale,
                                     want.data(), &wantCount)))
      continue;
    DeviceArray<float> dq(q), dw(w);
    DeviceArray<int32_t> dsel(std::vector<int32_t>(size_t(c.topK), -1));
    dpos.upload({c.position});
    // The case's indexer into the given scores, selection, count and fault.
    const auto launchCase = [&](float *scoresOut, int32_t *selectedOut,
                                int32_t *countOut, Fault &caseFault,
                                kc::IndexerSelect select = {}) {
      run(kc::launchDsaIndexer(
          dq.get(), c.heads, dim, dw.get(), cache.dev(), dpos.get(), c.topK,
          scale, scoresOut, selectedOut, countOut, caseFault.sink(), nullptr,
          kc::QueryRope{c.neox ? kc::RopeStyle::NeoX
                               : kc::RopeStyle::Interleaved,
                        theta, ropeOffset, c.ropeDims},
          c.staged ? kc::kMaxStagedKeyBytes : 0, select));
    };
    Fault fault;
    launchCase(caseScores.get(), dsel.get(), dcount.get(), fault);
    const std::string rope =
        c.ropeDims > 0
            ? fmtText(", %s rope [%lld, %lld)", c.neox ? "neox" : "interleaved",
                      (long long)ropeOffset,
                      (long long)(ropeOffset + c.ropeDims))
            : std::string();
    const std::string what =
        fmtText("%s %lldx128, pos %d, top %lld%s%s%s", cacheName(c.type),
                (long long)c.heads, c.position, (long long)c.topK,
                note.c_str(), c.staged ? "" : ", keys unstaged", rope.c_str());
    // A launch's selection, count and fault against the CPU's.
    const auto exact = [&](const std::string &label,
                           const std::vector<int32_t> &got,
                           DeviceArray<int32_t> &gotCount, Fault &gotFault) {
      r.line("dsa_indexer", label,
             mismatches(got, want) +
                 mismatches(gotCount.download(),
                            std::vector<int32_t>{wantCount}) +
                 faultMismatch(gotFault.read(), kc::FaultCode::None, 0, 0),
             0, "selection and count exact");
    };
    const std::vector<int32_t> selection = dsel.download();
    exact(what, selection, dcount, fault);
    // The same selection by the cluster alone, with the radix passes'
    // early stop (the default above kMaxOneBlockPositions attended
    // positions) and with all four (KILN_CUDA_CLUSTER_SELECT=1); the launch
    // above selected by one block up to kMaxOneBlockPositions.
    for (const kc::IndexerSelect select :
         {kc::IndexerSelect{0, true, 8}, kc::IndexerSelect{0, true, 16},
          kc::kClusterSelect}) {
      DeviceArray<int32_t> clusterSel(
          std::vector<int32_t>(size_t(c.topK), -1));
      DeviceArray<int32_t> clusterCount(std::vector<int32_t>{-1});
      Fault clusterFault;
      launchCase(caseScores.get(), clusterSel.get(), clusterCount.get(),
                 clusterFault, select);
      exact(what + (select.earlyStop
                        ? fmtText(", by a cluster of %d", select.clusterBlocks)
                        : ", by the cluster, four passes"),
            clusterSel.download(), clusterCount, clusterFault);
    }
    if (c.heads != 32)
      continue;
    // GLM-5's 32 x 128 over f16 keys: the launch above scored on the
    // tensor cores (StepKernels.h setIndexerMma). Its scores against the
    // double sums, each within 2^-16 of its position's sum of |products|,
    // scale * sum_h |w_h| sum_j |q_hj k_tj|: 128 f32 additions round by
    // at most 128 * 2^-24 = 2^-17 of it, and the query's two f16 parts
    // hold it to 2^-23 of each head's largest value; the bound doubled.
    if (c.type == kc::CacheType::F16 && attended > c.topK) {
      const std::vector<float> got = caseScores.download();
      const std::vector<double> want = indexerScores(
          scored, c.heads, dim, w, cache, attended, scale);
      double worst = 0;
      for (int64_t t = 0; t < attended; ++t) {
        double bound = 0;
        for (int64_t h = 0; h < c.heads; ++h) {
          double dot = 0;
          for (int64_t j = 0; j < dim; ++j)
            dot += std::fabs(double(scored[size_t(h * dim + j)]) *
                             cache.value(t * dim + j));
          bound += std::fabs(double(w[size_t(h)])) * dot;
        }
        bound *= std::fabs(double(scale));
        const double err = std::fabs(double(got[size_t(t)]) - want[size_t(t)]);
        worst = std::max(worst, bound > 0 ? err / bound : err);
      }
      r.line("dsa_indexer", what + ": tensor-core scores vs double", worst,
             std::ldexp(1.0, -16), "of each position's sum of |products|");
    }
    // The scores kernels by groups of lanes (the tensor cores' off): the
    // one compiled for dim 128 (KILN_CUDA_SPECIALISED=1) ran, with the
    // general kernel's scores and selection bit for bit, and that
    // selection the CPU's.
    const IndexerMmaOff mmaOff;
    DeviceArray<float> groupScores(size_t(c.cachePositions));
    DeviceArray<int32_t> groupSel(std::vector<int32_t>(size_t(c.topK), -1));
    Fault groupFault;
    launchCase(groupScores.get(), groupSel.get(), dcount.get(), groupFault);
    const std::vector<float> generalScores = groupScores.download();
    const std::vector<int32_t> groupSelection = groupSel.download();
    exact(what + ", scores by groups of lanes", groupSelection, dcount,
          groupFault);
    DeviceArray<float> fixedScores(size_t(c.cachePositions));
    DeviceArray<int32_t> fixedSel(std::vector<int32_t>(size_t(c.topK), -1));
    Fault fixedFault;
    uint64_t ran = 0;
    {
      const FixedShapes fixed(true);
      launchCase(fixedScores.get(), fixedSel.get(), dcount.get(), fixedFault);
      ran = fixed.ran();
    }
    const std::vector<float> gotScores = fixedScores.download();
    r.line("fixed width", what + ": the scores kernel compiled for dim 128 ran",
           std::fabs(double(ran) - 1.0), 0, "launch count");
    r.line("fixed width", what + ": the general kernel's scores and selection",
           mismatches(std::vector<float>(gotScores.begin(),
                                         gotScores.begin() + attended),
                      std::vector<float>(generalScores.begin(),
                                         generalScores.begin() + attended)) +
               mismatches(fixedSel.download(), groupSelection) +
               faultMismatch(fixedFault.read(), kc::FaultCode::None, 0, 0),
           0, "same products, same order");
  }

  // A position past the cache: fault, nothing selected.
  Cache cache = randomCache(kc::CacheType::F16, positions, dim, rng.next());
  std::vector<float> q = normals(rng, heads * dim, 1.0),
                     w = normals(rng, heads, 0.3, 1.0);
  DeviceArray<float> dq(q), dw(w);
  DeviceArray<int32_t> dsel(std::vector<int32_t>(16, -1));
  dpos.upload({int32_t(positions)});
  Fault fault;
  run(kc::launchDsaIndexer(dq.get(), heads, dim, dw.get(), cache.dev(),
                           dpos.get(), 16, scale, scores.get(), dsel.get(),
                           dcount.get(), fault.sink(), nullptr));
  r.line("dsa_indexer fault", "position 2000 of 2000",
         faultMismatch(fault.read(), kc::FaultCode::PositionOutOfRange,
                       positions, positions) +
             mismatches(dcount.download(), std::vector<int32_t>{0}) +
             mismatches(dsel.download(), std::vector<int32_t>(16, 0)),
         0, "PositionOutOfRange, count 0");
}

//===----------------------------------------------------------------------===//
// MoE
//===----------------------------------------------------------------------===//

void checkMoeRouter(Report &r, kiln::Rng &rng) {
  // GLM-5's 256 experts (also of its 6,144 values a row: the kernel
  // compiled for its router, ShapeFamily::Router), and counts that are not a multiple of the
  // kernel's warps (200, 201, 300) or exceed 512 (600); top 8 (the sorting
  // choice, up to 32) and top 40 (the choice in rounds). F32 gates run the
  // one router kernel, the others a mat-vec and the choice kernel.
  // norm: step.rms_norm_router (the CPU's rms_norm, then its router of
  // the normalised vector; the F32 kernel normalises as it reads x, the
  // others run the norm kernel first).
  struct Case {
    GGMLType type;
    cpu::Gating cpuGating;
    kc::Gating gating;
    bool bias, normalize;
    float routedScale;
    int64_t experts;
    int64_t topK = 8;
    bool norm = false;
    int64_t hidden = 512;
  };
  for (const Case &c : {Case{GGMLType::F32, cpu::Gating::Sigmoid,
                             kc::Gating::Sigmoid, true, true, 2.5f, 256},
                        Case{GGMLType::F32, cpu::Gating::Softmax,
                             kc::Gating::Softmax, false, false, 1.f, 256},
                        Case{GGMLType::Q8_0, cpu::Gating::Softmax,
                             kc::Gating::Softmax, true, true, 1.f, 200},
                        Case{GGMLType::BF16, cpu::Gating::Sigmoid,
                             kc::Gating::Sigmoid, false, true, 1.f, 200},
                        Case{GGMLType::F32, cpu::Gating::Sigmoid,
                             kc::Gating::Sigmoid, true, true, 2.5f, 300},
                        Case{GGMLType::F32, cpu::Gating::Softmax,
                             kc::Gating::Softmax, true, true, 1.f, 600},
                        Case{GGMLType::F32, cpu::Gating::Sigmoid,
                             kc::Gating::Sigmoid, true, true, 2.5f, 600, 40},
                        Case{GGMLType::F32, cpu::Gating::Sigmoid,
                             kc::Gating::Sigmoid, true, true, 2.5f, 256, 32},
                        // One router kernel's last block half empty (2 rows
                        // a block of 512-value rows, 201 experts).
                        Case{GGMLType::F32, cpu::Gating::Sigmoid,
                             kc::Gating::Sigmoid, true, true, 2.5f, 201},
                        Case{GGMLType::F32, cpu::Gating::Sigmoid,
                             kc::Gating::Sigmoid, true, true, 2.5f, 256, 8,
                             true},
                        Case{GGMLType::F32, cpu::Gating::Softmax,
                             kc::Gating::Softmax, false, false, 1.f, 201, 8,
                             true},
                        Case{GGMLType::BF16, cpu::Gating::Sigmoid,
                             kc::Gating::Sigmoid, true, true, 1.f, 200, 8,
                             true},
                        Case{GGMLType::F32, cpu::Gating::Sigmoid,
                             kc::Gating::Sigmoid, true, true, 2.5f, 256, 8,
                             false, kc::glm5::kHidden},
                        Case{GGMLType::F32, cpu::Gating::Sigmoid,
                             kc::Gating::Sigmoid, true, true, 2.5f, 256, 8,
                             true, kc::glm5::kHidden}}) {
    const int64_t experts = c.experts, topK = c.topK, hidden = c.hidden;
    const float eps = 1e-5f;
    Weight gate = randomWeight(c.type, {hidden, experts}, rng.next());
    std::vector<float> dequant(size_t(hidden * experts));
    if (!r.reference("moe_router",
                     cpu::dequant(gate.view("gate"), dequant.data())))
      continue;
    std::vector<float> x, bias, g, normed;
    bool usable = false;
    for (int attempt = 0; attempt < 20 && !usable; ++attempt) {
      x = normals(rng, hidden, c.norm ? 3.0 : 0.05);
      bias = c.bias ? normals(rng, experts, 0.05) : std::vector<float>();
      // With the norm, the router reads x normalised (values ~0.05 again).
      normed = x;
      if (c.norm) {
        g = normals(rng, hidden, 0.01, 0.05);
        cpu::rmsNorm(x.data(), 1, hidden, g.data(), eps, normed.data());
      }
      // The choice in double: its order must not be within rounding of a
      // tie anywhere among the first topK + 1.
      std::vector<double> p(static_cast<size_t>(experts));
      double maxLogit = -1e300, sum = 0;
      for (int64_t e = 0; e < experts; ++e) {
        double dot = 0;
        for (int64_t j = 0; j < hidden; ++j)
          dot += double(normed[j]) * dequant[e * hidden + j];
        p[e] = dot;
        maxLogit = std::max(maxLogit, dot);
      }
      for (double &v : p) {
        v = c.gating == kc::Gating::Sigmoid ? 1 / (1 + std::exp(-v))
                                            : std::exp(v - maxLogit);
        sum += v;
      }
      if (c.gating == kc::Gating::Softmax)
        for (double &v : p)
          v /= sum;
      for (int64_t e = 0; e < experts && c.bias; ++e)
        p[e] += bias[e];
      std::vector<double> sorted = p;
      std::sort(sorted.begin(), sorted.end(), std::greater<double>());
      usable = true;
      for (int64_t k = 0; k < topK; ++k)
        usable &= sorted[k] - sorted[k + 1] > 1e-4 * std::fabs(sorted[0]);
    }
    const std::string what =
        fmtText("%s [%lld, %lld] %s%s%s top %lld", typeName(c.type).c_str(),
                static_cast<long long>(hidden), static_cast<long long>(experts),
                c.gating == kc::Gating::Sigmoid ? "sigmoid" : "softmax",
                c.bias ? " +bias" : "", c.normalize ? " norm" : "",
                static_cast<long long>(topK)) +
        (c.norm ? ", rms_norm_router" : "");
    if (!usable) {
      r.line("moe_router", what + " (no separated draw)", 1, 0, "test input");
      continue;
    }
    std::vector<int32_t> wantIds(topK);
    std::vector<float> wantW(topK);
    if (!r.reference("moe_router",
                     cpu::moeRouter(normed.data(), hidden, gate.view("gate"),
                                    c.bias ? bias.data() : nullptr, topK,
                                    c.cpuGating, c.normalize, c.routedScale,
                                    wantIds.data(), wantW.data())))
      continue;
    DeviceArray<float> dx(x), db(c.bias ? bias : std::vector<float>(1)),
        scratch(size_t(kc::routerScratchFloats(experts))), dw(topK),
        other(normals(rng, hidden, 0.05));
    DeviceArray<int32_t> dids(topK);
    DeviceArray<float> dg(c.norm ? g : std::vector<float>(1));
    DeviceArray<float> dnormed(static_cast<size_t>(hidden));
    const kc::InputNorm norm{dg.get(), eps, nullptr};
    // A call on another input first, on the same scratch: the checked
    // result is the second call's, so a count the first left behind, or
    // its logits, would show.
    auto callTwice = [&] {
      for (const DeviceArray<float> *input : {&other, &dx})
        run(kc::launchMoeRouter(input->get(), gate.dev(),
                                c.bias ? db.get() : nullptr, topK, c.gating,
                                c.normalize, c.routedScale, scratch.get(),
                                dids.get(), dw.get(), nullptr,
                                c.norm ? &norm : nullptr,
                                c.norm ? dnormed.get() : nullptr));
    };
    callTwice();
    if (c.norm)
      r.line("moe_router", what + " normalised", relError(dnormed.download(),
                                                          normed),
             sumTol(double(hidden)), sumWhy("sum of squares order", hidden));
    r.line("moe_router", what + " ids", mismatches(dids.download(), wantIds), 0,
           "exact, separated scores");
    r.line("moe_router", what + " weights", relError(dw.download(), wantW),
           2 * sumTol(double(hidden) + double(experts)),
           fmtText("logit and softmax sums, 2e-6*sqrt(%lld+%lld)",
                   (long long)hidden, (long long)experts));
    // GLM-5's router (its 6,144 values a row, its experts and top-k,
    // sigmoid gating) has a kernel compiled for that shape
    // (ShapeFamily::Router): the same input again through it, after a call
    // on the other input (whose tagged logits a wrong tag would take),
    // must give the run-time kernel's ids, weights and norm bit for bit,
    // must have run it both times, and must leave its generation word at
    // its two calls.
    if (c.type == GGMLType::F32 && hidden == kc::glm5::kHidden &&
        experts == kc::glm5::kExperts && topK == kc::glm5::kTopK &&
        c.gating == kc::Gating::Sigmoid) {
      const std::vector<int32_t> ids = dids.download();
      const std::vector<float> weights = dw.download(),
                               normalised = dnormed.download();
      // Both of its choices (kc::setRouterWarps): by its warps with one
      // block barrier (the default), then through shared memory.
      const bool warpsWere = kc::routerWarps();
      uint64_t ran = 0, warpRuns = 0, blockRuns = 0;
      uint32_t generation = 0;
      std::vector<int32_t> warpIds;
      std::vector<float> warpWeights;
      {
        const FixedShapes fixed(true);
        kc::setRouterWarps(true);
        uint64_t before = kc::routerWarpChoiceLaunches();
        callTwice();
        warpRuns = kc::routerWarpChoiceLaunches() - before;
        ran = fixed.ran();
        generation = std::bit_cast<uint32_t>(scratch.download()[1]);
        warpIds = dids.download();
        warpWeights = dw.download();
        kc::setRouterWarps(false);
        before = kc::routerWarpChoiceLaunches();
        callTwice();
        blockRuns = kc::routerWarpChoiceLaunches() - before;
      }
      kc::setRouterWarps(warpsWere);
      r.line("moe_router",
             what + ", GLM-5's shape compiled in (its warps' choice), "
                    "against the run-time shape's kernel",
             mismatches(warpIds, ids) + mismatches(warpWeights, weights) +
                 mismatches(dnormed.download(), normalised) +
                 double(ran != 2) + double(generation != 2) +
                 double(warpRuns != 2),
             0,
             "bit-identical ids, weights and norm, the compiled kernel and "
             "its warps' choice run twice, its generation 2");
      r.line("moe_router",
             what + ", GLM-5's shape compiled in, its choice through "
                    "shared memory (KILN_CUDA_ROUTER_WARPS=0)",
             mismatches(dids.download(), ids) +
                 mismatches(dw.download(), weights) + double(blockRuns != 0),
             0, "bit-identical ids and weights, the warps' choice not run");
    }
  }
}

/// kiln-fold-router's composed form (step.linear_router): the composed
/// matrix against the contract's double loop, bit for bit; the op's linear
/// rows against launchLinear, bit for bit (the same kernel and split); its
/// tail rows against a double dot of the same matrix with [x ; share]. At
/// GLM-5's tp = 8 attn_output shape (rank 3) with the weight q8_0-split
/// (the tail inside the linear's kernel) and in the file's blocks (the
/// tail as its own kernel), and a small shape with more tail rows than
/// the linear's grid has blocks.
void checkLinearRouter(Report &r, kiln::Rng &rng) {
  struct Case {
    int64_t hidden, k, experts, ranks, rank;
    GGMLType type;
    bool split;
  };
  for (const Case &c : {Case{6144, 2048, 256, 8, 3, GGMLType::Q8_0, true},
                        Case{6144, 2048, 256, 8, 3, GGMLType::Q8_0, false},
                        Case{256, 64, 96, 2, 1, GGMLType::Q8_0, true},
                        Case{512, 256, 16, 4, 2, GGMLType::Q4_K, false}}) {
    Weight w = randomWeight(c.type, {c.k, c.hidden}, rng.next());
    Weight gate =
        randomWeight(GGMLType::F32, {c.hidden, c.experts}, rng.next());
    std::vector<float> norm = normals(rng, c.hidden, 0.3, 1.0),
                       x = normals(rng, c.k, 1.0),
                       res = normals(rng, c.hidden, 1.0);
    const int64_t share = c.hidden / c.ranks, begin = c.rank * share,
                  cols = c.k + share;
    // The contract's matrix, on the host.
    std::vector<float> dense(size_t(c.hidden * c.k));
    if (!r.reference("linear_router", cpu::dequant(w.view("w"), dense.data())))
      continue;
    const float *g = reinterpret_cast<const float *>(gate.host.data());
    std::vector<float> want(size_t(c.experts * cols));
    for (int64_t e = 0; e < c.experts; ++e) {
      std::vector<double> acc(size_t(c.k), 0.0);
      for (int64_t n = 0; n < c.hidden; ++n) {
        const double gn = double(g[e * c.hidden + n]) * double(norm[size_t(n)]);
        for (int64_t j = 0; j < c.k; ++j)
          acc[size_t(j)] += gn * double(dense[size_t(n * c.k + j)]);
      }
      for (int64_t j = 0; j < c.k; ++j)
        want[size_t(e * cols + j)] = float(acc[size_t(j)]);
      for (int64_t j = 0; j < share; ++j)
        want[size_t(e * cols + c.k + j)] =
            g[e * c.hidden + begin + j] * norm[size_t(begin + j)];
    }
    DeviceArray<float> dnorm(norm), ddense(dense),
        dm(size_t(c.experts * cols));
    run(kc::launchComposeRouter(reinterpret_cast<const float *>(
                                    gate.device.get()),
                                dnorm.get(), ddense.get(), c.experts,
                                c.hidden, c.k, begin, share, dm.get(),
                                nullptr));
    const std::string what = fmtText(
        "%s%s [%lld, %lld], %lld experts, rank %lld of %lld",
        typeName(c.type).c_str(), c.split ? "-split" : "", (long long)c.k,
        (long long)c.hidden, (long long)c.experts, (long long)c.rank,
        (long long)c.ranks);
    const std::vector<float> composed = dm.download();
    r.line("linear_router", what + ", composed matrix",
           mismatches(composed, want), 0,
           "bit-exact: the contract's double sums in order");

    std::optional<SplitWeight> held;
    const kc::DeviceWeight dw = deviceWeight(w, c.split, held);
    DeviceArray<float> dx(x), dres(res),
        dy(size_t(c.hidden + c.experts)), dlin(size_t(c.hidden));
    run(kc::launchLinear(dx.get(), 1, dw, c.hidden, false, dlin.get(),
                         nullptr));
    const kc::RouterTail tail{dm.get(), c.experts, cols, c.k,
                              dres.get() + begin, dy.get() + c.hidden};
    run(kc::launchLinearRouter(dx.get(), dw, tail, dy.get(), nullptr));
    const std::vector<float> y = dy.download();
    r.line("linear_router", what + ", linear rows",
           mismatches(std::vector<float>(y.begin(), y.begin() + c.hidden),
                      dlin.download()),
           0, "bit-exact: launchLinear's kernel and split");
    std::vector<float> wantTail(size_t(c.experts));
    for (int64_t e = 0; e < c.experts; ++e) {
      double acc = 0;
      for (int64_t j = 0; j < cols; ++j)
        acc += double(composed[size_t(e * cols + j)]) *
               double(j < c.k ? x[size_t(j)] : res[size_t(begin + j - c.k)]);
      wantTail[size_t(e)] = float(acc);
    }
    r.line("linear_router", what + ", tail rows",
           relError(std::vector<float>(y.begin() + c.hidden, y.end()),
                    wantTail),
           2 * sumTol(double(cols)),
           sumWhy("f32 dot against double", cols));
  }
}

/// kiln-fold-router's three kernels. router_partial against a double
/// loop; the one-shot all-reduce's and the add-and-norm's tail against the
/// CPU's rank-order sum divided by a double rms; moe_choose against the
/// router's own choice from the same logits (the router kernel leaves its
/// logits in its scratch): the same ids and weights, bit for bit.
void checkRouterFold(Report &r, kiln::Rng &rng) {
  for (auto [hidden, experts] :
       {std::pair<int64_t, int64_t>{6144, 256}, {1024, 32}}) {
    Weight gate = randomWeight(GGMLType::F32, {hidden, experts}, rng.next());
    std::vector<float> p = normals(rng, hidden, 1.0),
                       x = normals(rng, hidden, 1.0),
                       g = normals(rng, hidden, 0.3, 1.0);
    const float scale = 0.125f;
    const float *gw = reinterpret_cast<const float *>(gate.host.data());
    std::vector<float> want(static_cast<size_t>(experts));
    for (int64_t e = 0; e < experts; ++e) {
      double acc = 0;
      for (int64_t h = 0; h < hidden; ++h)
        acc += double(gw[e * hidden + h]) *
               (double(g[h]) * (double(p[h]) + double(scale) * double(x[h])));
      want[size_t(e)] = float(acc);
    }
    DeviceArray<float> dp(p), dx(x), dg(g), dt(static_cast<size_t>(experts));
    run(kc::launchRouterPartial(dp.get(), dx.get(), gate.dev(), dg.get(),
                                scale, dt.get(), nullptr));
    r.line("router_partial",
           fmtText("F32 [%lld, %lld], scale 1/8", (long long)hidden,
                   (long long)experts),
           relError(dt.download(), want), 2 * sumTol(double(hidden)),
           sumWhy("f32 dot against double, input formed in f32", hidden));
  }

  // The all-reduce's tail: x = n values and a tail of 256, reduced over the
  // (simulated) ranks; the first n added and normalised as without it, the
  // tail divided by that rms. Both collectives' epilogues: the one-shot
  // kernel and the add-and-norm kernel after NCCL's reduction.
  const int64_t n = 6144, tail = 256, capacity = 3 * 6144;
  const float eps = 1e-5f;
  for (int ranks : {2, 8}) {
    std::vector<float> x = normals(rng, n + tail, 1.0),
                       res = normals(rng, n, 1.0),
                       w = normals(rng, n, 1.0, 1.0);
    std::vector<float> reduced = x;
    for (int q = 1; q < ranks; ++q)
      for (size_t i = 0; i < reduced.size(); ++i)
        reduced[i] += x[i];
    std::vector<float> sum(static_cast<size_t>(n)), wantY(static_cast<size_t>(n)), wantLogits(tail);
    cpu::add(res.data(), reduced.data(), n, sum.data());
    cpu::rmsNorm(sum.data(), 1, n, w.data(), eps, wantY.data());
    double ss = 0;
    for (float v : sum)
      ss += double(v) * double(v);
    const double rms = std::sqrt(ss / double(n) + double(eps));
    for (int64_t i = 0; i < tail; ++i)
      wantLogits[size_t(i)] = float(double(reduced[size_t(n + i)]) / rms);

    DeviceArray<uint8_t> exchange(kc::peerExchangeBytes(capacity));
    CHECK_CUDA(cudaMemset(exchange.get(), 0, kc::peerExchangeBytes(capacity)));
    const kc::PeerExchange pe =
        kc::peerExchangeView({exchange.get()}, ranks, 0, capacity, true);
    DeviceArray<float> dx(x), dres(res), dw(w), dout(static_cast<size_t>(n)),
        dy(static_cast<size_t>(n)), dl(static_cast<size_t>(tail));
    run(kc::launchAllReducePeers(pe, dx.get(), 1, n, true, dres.get(),
                                 dw.get(), eps, dout.get(), dy.get(), {},
                                 nullptr, tail, dl.get()));
    const std::string what =
        fmtText("simulated, %d ranks, 1x%lld + tail %lld", ranks,
                (long long)n, (long long)tail);
    r.line("all_reduce_peers", what + ", reduced",
           mismatches(dout.download(), sum), 0,
           "bit-exact: the CPU's rank order, then the add");
    r.line("all_reduce_peers", what + ", normed", relError(dy.download(), wantY),
           sumTol(double(n)), sumWhy("sum of squares order", n));
    r.line("all_reduce_peers", what + ", logits / rms",
           relError(dl.download(), wantLogits), sumTol(double(n)),
           sumWhy("the rms's sum of squares order", n));

    // NCCL's path: the reduced vector given, then add, norm and the tail.
    DeviceArray<float> dred(reduced), dsum(static_cast<size_t>(n)), dy2(static_cast<size_t>(n)),
        dl2(static_cast<size_t>(tail));
    run(kc::launchAddRmsNorm(dres.get(), dred.get(), 1, n, dw.get(), eps,
                             dsum.get(), dy2.get(), nullptr, dred.get() + n,
                             tail, dl2.get()));
    r.line("add_rms_norm", what + " (NCCL's epilogue), logits / rms",
           relError(dl2.download(), wantLogits), sumTol(double(n)),
           sumWhy("the rms's sum of squares order", n));
  }
  // The choice inside the one-shot all-reduce (kiln-fuse-router-choice):
  // the ids and weights the choice kernel makes from the logits the same
  // call wrote, bit for bit; with the tail in one block (GLM-5's 6,144 +
  // 256) and across two (1,024 + 256), with and without a bias, sigmoid
  // and softmax.
  for (auto [cols, bias, softmax] :
       {std::tuple<int64_t, bool, bool>{6144, true, false},
        {6144, false, true},
        {1024, true, false}}) {
    const int64_t experts = 256, topK = 8;
    const int ranks = 8;
    const int64_t cap = 2 * (cols + experts);
    std::vector<float> x = normals(rng, cols + experts, 1.0),
                       res = normals(rng, cols, 1.0),
                       w = normals(rng, cols, 1.0, 1.0);
    DeviceArray<uint8_t> exchange(kc::peerExchangeBytes(cap));
    CHECK_CUDA(cudaMemset(exchange.get(), 0, kc::peerExchangeBytes(cap)));
    const kc::PeerExchange pe =
        kc::peerExchangeView({exchange.get()}, ranks, 0, cap, true);
    DeviceArray<float> dx(x), dres(res), dw(w), db(normals(rng, experts, 0.1)),
        dout(static_cast<size_t>(cols)), dy(static_cast<size_t>(cols)), dl(static_cast<size_t>(experts)),
        w1(static_cast<size_t>(topK)), w2(static_cast<size_t>(topK));
    DeviceArray<int32_t> ids1(static_cast<size_t>(topK)), ids2(static_cast<size_t>(topK));
    kc::RouterChoice choice;
    choice.bias = bias ? db.get() : nullptr;
    choice.topK = topK;
    choice.gating = softmax ? kc::Gating::Softmax : kc::Gating::Sigmoid;
    choice.normalize = true;
    choice.routedScale = 2.5f;
    choice.ids = ids1.get();
    choice.weights = w1.get();
    run(kc::launchAllReducePeers(pe, dx.get(), 1, cols, true, dres.get(),
                                 dw.get(), eps, dout.get(), dy.get(), {},
                                 nullptr, experts, dl.get(), &choice));
    run(kc::launchMoeChoose(dl.get(), experts, choice.bias, topK,
                            choice.gating, true, 2.5f, ids2.get(), w2.get(),
                            nullptr));
    r.line("all_reduce_peers",
           fmtText("simulated, 8 ranks, 1x%lld + tail 256, the choice inside "
                   "(top 8, %s%s)",
                   (long long)cols, softmax ? "softmax" : "sigmoid",
                   bias ? " +bias" : ""),
           mismatches(ids1.download(), ids2.download()) +
               mismatches(w1.download(), w2.download()),
           0, "bit-exact: the choice kernel's code on the same logits");
  }
  // A tail with more than one row is refused.
  {
    DeviceArray<float> a(static_cast<size_t>(2 * 64 + 8)), b(static_cast<size_t>(128)), w(static_cast<size_t>(64)),
        o(static_cast<size_t>(128)), y(static_cast<size_t>(128)), l(static_cast<size_t>(8));
    r.line("add_rms_norm", "a tail on 2 rows",
           kc::launchAddRmsNorm(a.get(), b.get(), 2, 64, w.get(), 1e-5f,
                                o.get(), y.get(), nullptr, a.get() + 128, 8,
                                l.get()) == cudaErrorInvalidValue
               ? 0.0
               : 1.0,
           0, "refused: cudaErrorInvalidValue");
  }

  // moe_choose: the router's own choice from the logits it left.
  for (bool bias : {false, true}) {
    const int64_t hidden = 6144, experts = 256, topK = 8;
    Weight gate = randomWeight(GGMLType::F32, {hidden, experts}, rng.next());
    DeviceArray<float> dx(normals(rng, hidden, 1.0)),
        db(normals(rng, experts, 0.1)),
        scratch(size_t(kc::routerScratchFloats(experts))), w1(topK), w2(topK);
    DeviceArray<int32_t> ids1(topK), ids2(topK);
    CHECK_CUDA(cudaMemset(scratch.get(), 0, 16));
    run(kc::launchMoeRouter(dx.get(), gate.dev(), bias ? db.get() : nullptr,
                            topK, kc::Gating::Sigmoid, true, 2.5f,
                            scratch.get(), ids1.get(), w1.get(), nullptr));
    // The logits follow the router's 16-byte arrival count.
    run(kc::launchMoeChoose(scratch.get() + 4, experts,
                            bias ? db.get() : nullptr, topK,
                            kc::Gating::Sigmoid, true, 2.5f, ids2.get(),
                            w2.get(), nullptr));
    r.line("moe_choose",
           fmtText("256 experts, top 8, sigmoid%s, against the router's "
                   "choice",
                   bias ? " +bias" : ""),
           mismatches(ids2.download(), ids1.download()) +
               mismatches(w2.download(), w1.download()),
           0, "bit-exact: the same choice code on the same logits");
  }
}

/// The choice on exact ties and a NaN, against the CPU and against the
/// order the rules give (larger p + bias first, equal ones by the lower
/// id, NaN never): identical gate rows give identical logits. Experts 60,
/// 61 and 62 have logits 3, 2.5 and 1.5; 5, 17, 100 and 250 share a row
/// (logit 2); 40 and 41 share one (logit 1) across the top-8 boundary;
/// 2's row is NaN; the others are small random rows (|logit| << 1).
void checkMoeRouterTies(Report &r, kiln::Rng &rng) {
  // GLM-5's router shape, so that the kernel compiled for it meets the
  // ties too.
  const int64_t hidden = kc::glm5::kHidden, experts = 256, topK = 8;
  const std::vector<int32_t> want = {60, 61, 5, 17, 100, 250, 62, 40};
  std::vector<float> x = normals(rng, hidden, 0.05);
  double norm2 = 0;
  for (float v : x)
    norm2 += double(v) * v;
  std::vector<float> rows = normals(rng, size_t(hidden * experts), 0.01);
  auto setRow = [&](int64_t e, double logit) {
    for (int64_t j = 0; j < hidden; ++j)
      rows[size_t(e * hidden + j)] = float(x[size_t(j)] * logit / norm2);
  };
  for (auto [e, logit] : {std::pair<int64_t, double>{60, 3.0},
                          {61, 2.5},
                          {62, 1.5},
                          {5, 2.0},
                          {40, 1.0}})
    setRow(e, logit);
  for (int64_t e : {17, 100, 250})
    std::copy_n(rows.begin() + 5 * hidden, hidden, rows.begin() + e * hidden);
  std::copy_n(rows.begin() + 40 * hidden, hidden, rows.begin() + 41 * hidden);
  std::fill_n(rows.begin() + 2 * hidden, hidden, std::nanf(""));
  Weight gate{GGMLType::F32,
              {hidden, experts},
              experts,
              hidden,
              std::vector<uint8_t>(rows.size() * sizeof(float)),
              DeviceArray<uint8_t>(rows.size() * sizeof(float))};
  std::memcpy(gate.host.data(), rows.data(), gate.host.size());
  gate.device.upload(gate.host);
  // A bias equal within each tied group, too small to reorder the groups.
  std::vector<float> bias = normals(rng, experts, 0.001);
  for (int64_t e : {17, 100, 250})
    bias[size_t(e)] = bias[5];
  bias[41] = bias[40];
  for (bool withBias : {false, true}) {
    const std::string what = std::string("F32 [6144, 256] sigmoid") +
                             (withBias ? " +bias" : "") +
                             " norm top 8, tied rows and a NaN row";
    std::vector<int32_t> wantIds(topK);
    std::vector<float> wantW(topK);
    const float *b = withBias ? bias.data() : nullptr;
    if (!r.reference("moe_router",
                     cpu::moeRouter(x.data(), hidden, gate.view("gate"), b,
                                    topK, cpu::Gating::Sigmoid, true, 2.5f,
                                    wantIds.data(), wantW.data())))
      continue;
    r.line("moe_router", what + ": the CPU's ids against the rules",
           mismatches(wantIds, want), 0, "exact");
    DeviceArray<float> dx(x), db(bias),
        scratch(size_t(kc::routerScratchFloats(experts))), dw(topK);
    DeviceArray<int32_t> dids(topK);
    run(kc::launchMoeRouter(dx.get(), gate.dev(), withBias ? db.get() : nullptr,
                            topK, kc::Gating::Sigmoid, true, 2.5f,
                            scratch.get(), dids.get(), dw.get(), nullptr));
    r.line("moe_router", what + " ids", mismatches(dids.download(), wantIds), 0,
           "exact: ties by the lower id, NaN last");
    r.line("moe_router", what + " weights", relError(dw.download(), wantW),
           2 * sumTol(double(hidden) + double(experts)),
           fmtText("logit and softmax sums, 2e-6*sqrt(%lld+%lld)",
                   (long long)hidden, (long long)experts));
    // The same through the kernel compiled for GLM-5's choice (256
    // experts, top 8, sigmoid: ShapeFamily::Router).
    const std::vector<float> weights = dw.download();
    uint64_t ran = 0;
    {
      const FixedShapes fixed(true);
      run(kc::launchMoeRouter(dx.get(), gate.dev(),
                              withBias ? db.get() : nullptr, topK,
                              kc::Gating::Sigmoid, true, 2.5f, scratch.get(),
                              dids.get(), dw.get(), nullptr));
      ran = fixed.ran();
    }
    r.line("moe_router", what + ", GLM-5's shape compiled in: ids",
           mismatches(dids.download(), wantIds) + double(ran != 1), 0,
           "exact, the compiled kernel run");
    r.line("moe_router",
           what + ", GLM-5's shape compiled in: weights against the "
                  "run-time shape's kernel",
           mismatches(dw.download(), weights), 0, "bit-identical");
  }
}

/// Random routed experts: gate and up (or gate_up fused, up empty), each
/// [hidden, ffn (2 ffn fused), experts], and down [ffn, hidden, experts].
struct Experts {
  Weight gate;
  std::optional<Weight> up;
  Weight down;
};

Experts randomExperts(GGMLType gateType, GGMLType downType, bool fused,
                      int64_t hidden, int64_t ffn, int64_t experts,
                      kiln::Rng &rng) {
  Weight gate = randomWeight(gateType, {hidden, fused ? 2 * ffn : ffn, experts},
                             rng.next());
  std::optional<Weight> up;
  if (!fused)
    up.emplace(randomWeight(gateType, {hidden, ffn, experts}, rng.next()));
  Weight down = randomWeight(downType, {ffn, hidden, experts}, rng.next());
  return {std::move(gate), std::move(up), std::move(down)};
}

/// The CPU's moe_experts over `e`.
kiln::Status cpuExperts(const Experts &e, const float *x, int64_t hidden,
                        const int32_t *ids, const float *weights, int64_t k,
                        float *out, cpu::ThreadPool &pool) {
  cpu::WeightView gv = e.gate.view("gate"), dv = e.down.view("down");
  std::optional<cpu::WeightView> uv;
  std::vector<const cpu::WeightView *> ws = {&gv};
  if (e.up) {
    uv = e.up->view("up");
    ws.push_back(&*uv);
  }
  ws.push_back(&dv);
  return cpu::moeExperts(x, hidden, ids, weights, k, ws, out, pool);
}

/// The CPU's moe_experts over `e` of `x` into out[hidden], then, with a
/// shared expert (gate, up, down of `sharedFfn` rows; null: none), its
/// output down(swiglu(gate . x, up . x)) added last, as the fused op does.
kiln::Status cpuExpertsShared(const Experts &e, const float *x, int64_t hidden,
                              const int32_t *ids, const float *weights,
                              int64_t k, const cpu::WeightView *sharedGate,
                              const cpu::WeightView *sharedUp,
                              const cpu::WeightView *sharedDown,
                              int64_t sharedFfn, float *out,
                              cpu::ThreadPool &pool) {
  if (kiln::Status st = cpuExperts(e, x, hidden, ids, weights, k, out, pool);
      !st || !sharedGate)
    return st;
  std::vector<float> g(static_cast<size_t>(sharedFfn)),
      u(static_cast<size_t>(sharedFfn)), act(static_cast<size_t>(sharedFfn)),
      sharedOut(static_cast<size_t>(hidden));
  if (kiln::Status st = cpu::linear(x, 1, *sharedGate, g.data(), pool); !st)
    return st;
  if (kiln::Status st = cpu::linear(x, 1, *sharedUp, u.data(), pool); !st)
    return st;
  cpu::swiglu(g.data(), u.data(), sharedFfn, act.data());
  if (kiln::Status st =
          cpu::linear(act.data(), 1, *sharedDown, sharedOut.data(), pool);
      !st)
    return st;
  cpu::add(out, sharedOut.data(), hidden, out);
  return kiln::Status::ok();
}

void checkMoeExperts(Report &r, kiln::Rng &rng) {
  cpu::ThreadPool pool(4);
  const int64_t hidden = 512, ffn = 256, experts = 8, k = 4;
  struct Case {
    GGMLType gateType, downType;
    bool fused, aliasOut;
    int64_t hidden = 512, ffn = 256, experts = 8, k = 4;
    /// The bulk-copy kernels expected to run on sm_90+ (of gate/up and
    /// down; -1: not checked).
    int bulk = -1;
  };
  for (const Case &c :
       {Case{GGMLType::Q4_K, GGMLType::Q6_K, false, false},
        Case{GGMLType::Q8_0, GGMLType::Q5_0, true, false},
        Case{GGMLType::IQ4_XS, GGMLType::Q8_0, true, true},
        Case{GGMLType::BF16, GGMLType::F16, false, true},
        // GLM-5 on a rank of 8 (UD-Q4_K_XL-like types), fewer experts.
        Case{GGMLType::Q4_K, GGMLType::Q5_K, false, false, 6144, 256, 16, 8},
        // 3 experts a row: 2 rows a block of 8 warps, 2 warps idle.
        Case{GGMLType::Q8_0, GGMLType::Q6_K, true, false, 512, 256, 16, 3},
        // 12 experts: chunks of 8 and 4.
        Case{GGMLType::Q5_K, GGMLType::Q8_0, false, true, 512, 512, 16, 12},
        // The Q4_K / Q5_K kernels (StepMatVec.cu). A GLM-5 tp=8 rank
        // exactly: 8 of 256 experts.
        Case{GGMLType::Q4_K, GGMLType::Q5_K, false, false, 6144, 256, 256, 8},
        // 17 blocks a row (the last gate/up warp has one lane group at
        // work); 272 down tiles, so a last block with fewer tiles.
        Case{GGMLType::Q4_K, GGMLType::Q5_K, true, true, 4352, 256, 16, 8},
        // F = 100: the last gate/up block has 4 of its 8 row pairs.
        Case{GGMLType::Q4_K, GGMLType::F16, false, false, 1024, 100, 16, 8},
        // Q5_K gate/up, Q4_K down, 10 experts: down warps take two each.
        Case{GGMLType::Q5_K, GGMLType::Q4_K, false, false, 1024, 256, 16,
             10},
        // The 2-bit mix (kiln-gguf synth --mix ud-q2_k_xl) on a GLM-5 tp=8
        // rank: Q2_K gate/up, Q3_K down, both in the bulk-copy kernels; and
        // the two swapped, fused. Q3_K rows of 4 blocks (440 bytes, not a
        // multiple of 16) take the general gate/up kernel, of 8 the bulk one.
        Case{GGMLType::Q2_K, GGMLType::Q3_K, false, false, 6144, 256, 256, 8,
             2},
        Case{GGMLType::Q3_K, GGMLType::Q2_K, true, true, 1024, 256, 16, 8, 1},
        Case{GGMLType::Q3_K, GGMLType::Q2_K, true, false, 2048, 256, 16, 8,
             2},
        // 17 blocks a row: Q2_K's 1,428 bytes are not a multiple of 16
        // (the general gate/up kernel); 5 chosen of Q3_K down.
        Case{GGMLType::Q2_K, GGMLType::Q3_K, false, false, 4352, 256, 16, 5,
             1}}) {
    const Experts set = randomExperts(c.gateType, c.downType, c.fused,
                                      c.hidden, c.ffn, c.experts, rng);
    const Weight &gate = set.gate, &down = set.down;
    const std::optional<Weight> &up = set.up;
    std::vector<float> x = normals(rng, c.hidden, 1.0);
    std::vector<int32_t> ids = {5, 2, 7, 2}; // a repeat is allowed
    if (c.k != 4) {
      ids.resize(size_t(c.k));
      for (int32_t &id : ids)
        id = int32_t(rng.below(uint64_t(c.experts)));
      ids.back() = ids.front();
    }
    std::vector<float> weights = normals(rng, c.k, 0.3, 0.5);
    std::vector<float> want(c.hidden);
    if (!r.reference("moe_experts",
                     cpuExperts(set, x.data(), c.hidden, ids.data(),
                                weights.data(), c.k, want.data(), pool)))
      continue;

    DeviceArray<float> dx(x), dw(weights), act(c.k * c.ffn), dout(c.hidden);
    DeviceArray<int32_t> dids(ids);
    kc::DeviceWeight gd = gate.dev(), dd = down.dev(),
                     ud = up ? up->dev() : kc::DeviceWeight{};
    Fault fault;
    float *out = c.aliasOut ? dx.get() : dout.get();
    const uint64_t bulkBefore = kc::moeBulkLaunches();
    run(kc::launchMoeExperts(dx.get(), c.hidden, c.ffn, c.experts, dids.get(),
                             dw.get(), c.k, gd, up ? &ud : nullptr, dd,
                             act.get(), nullptr, out, fault.sink(), nullptr));
    const int bulk = int(kc::moeBulkLaunches() - bulkBefore);
    std::vector<float> got = c.aliasOut ? dx.download() : dout.download();
    const std::string what =
        fmtText("%s %s + down %s, H%lld F%lld E%lld k%lld",
                c.fused ? "gate_up" : "gate/up", typeName(c.gateType).c_str(),
                typeName(c.downType).c_str(), (long long)c.hidden,
                (long long)c.ffn, (long long)c.experts, (long long)c.k);
    const double tol = 2 * (sumTol(double(c.hidden)) + sumTol(double(c.ffn)));
    const std::string why =
        fmtText("gate/up then down dots, 2e-6*(sqrt(%lld)+sqrt(%lld))",
                (long long)c.hidden, (long long)c.ffn);
    // The path as stated (the device has bulk copies: sm_90+, as the
    // shared-expert cases below assume too).
    const bool checkPath = c.bulk >= 0;
    r.line("moe_experts",
           what + (c.aliasOut ? ", out=x" : "") +
               (checkPath ? fmtText(", %d bulk-copy kernels", c.bulk) : ""),
           relError(got, want) +
               faultMismatch(fault.read(), kc::FaultCode::None, 0, 0) +
               (checkPath && bulk != c.bulk ? 1.0 : 0.0),
           tol, why + (checkPath ? "; the path as stated" : ""));

    // With an addend (kiln-fuse-expert-add): the sum plus it, as an add
    // after the experts; where the case aliases, the output is the
    // addend's own buffer.
    std::vector<float> extra = normals(rng, c.hidden, 1.0), wantSum(c.hidden);
    cpu::add(want.data(), extra.data(), c.hidden, wantSum.data());
    DeviceArray<float> dx2(x), dextra(extra);
    float *out2 = c.aliasOut ? dextra.get() : dout.get();
    fault.clear();
    run(kc::launchMoeExperts(dx2.get(), c.hidden, c.ffn, c.experts, dids.get(),
                             dw.get(), c.k, gd, up ? &ud : nullptr, dd,
                             act.get(), dextra.get(), out2, fault.sink(),
                             nullptr));
    r.line("moe_experts",
           what + (c.aliasOut ? " + addend, out=addend" : " + addend"),
           relError(c.aliasOut ? dextra.download() : dout.download(), wantSum) +
               faultMismatch(fault.read(), kc::FaultCode::None, 0, 0),
           tol, why + ", then the add");
  }

  // Bad ids: the first in k order is reported, nothing is read for them.
  Weight gate =
      randomWeight(GGMLType::Q8_0, {hidden, 2 * ffn, experts}, rng.next());
  Weight down =
      randomWeight(GGMLType::Q8_0, {ffn, hidden, experts}, rng.next());
  DeviceArray<float> dx(normals(rng, hidden, 1.0)), dw(normals(rng, k, 0.3)),
      act(k * ffn), dout(hidden);
  DeviceArray<int32_t> dids(std::vector<int32_t>{1, 9, 3, -1});
  Fault fault;
  run(kc::launchMoeExperts(dx.get(), hidden, ffn, experts, dids.get(), dw.get(),
                           k, gate.dev(), nullptr, down.dev(), act.get(),
                           nullptr, dout.get(), fault.sink(), nullptr));
  r.line(
      "moe_experts fault", "ids {1, 9, 3, -1} of 8 experts",
      faultMismatch(fault.read(), kc::FaultCode::ExpertOutOfRange, 9, experts),
      0, "ExpertOutOfRange, first id");

  // The same through the Q4_K / Q5_K kernels; the bad entries add nothing,
  // so the output is the CPU's for the good ones alone (k order kept).
  Weight gate45 =
      randomWeight(GGMLType::Q4_K, {hidden, ffn, experts}, rng.next());
  Weight up45 =
      randomWeight(GGMLType::Q4_K, {hidden, ffn, experts}, rng.next());
  Weight down45 =
      randomWeight(GGMLType::Q5_K, {ffn, hidden, experts}, rng.next());
  std::vector<float> x = normals(rng, hidden, 1.0), w = normals(rng, k, 0.3);
  cpu::WeightView gv = gate45.view("gate"), uv = up45.view("up"),
                  dv = down45.view("down");
  const std::vector<int32_t> goodIds = {1, 3};
  const std::vector<float> goodWeights = {w[0], w[2]};
  std::vector<float> want(hidden);
  if (r.reference("moe_experts",
                  cpu::moeExperts(x.data(), hidden, goodIds.data(),
                                  goodWeights.data(), 2, {&gv, &uv, &dv},
                                  want.data(), pool))) {
    DeviceArray<float> dx45(x), dw45(w);
    kc::DeviceWeight ud = up45.dev();
    fault.clear();
    run(kc::launchMoeExperts(dx45.get(), hidden, ffn, experts, dids.get(),
                             dw45.get(), k, gate45.dev(), &ud, down45.dev(),
                             act.get(), nullptr, dout.get(), fault.sink(),
                             nullptr));
    r.line("moe_experts fault",
           "Q4_K/Q5_K, ids {1, 9, 3, -1} of 8 experts: 1 and 3 only",
           relError(dout.download(), want) +
               faultMismatch(fault.read(), kc::FaultCode::ExpertOutOfRange, 9,
                             experts),
           2 * (sumTol(double(hidden)) + sumTol(double(ffn))),
           "as moe_experts, and ExpertOutOfRange, first id");
  }
}

/// moe_experts with the shared expert inside (kiln-fuse-shared-expert):
/// the routed sum plus down_s(silu(gate_s . x) * (up_s . x)), added last,
/// against the CPU's experts and mat-vecs. The bulk-copy routed kernels
/// (Q4_K, Q5_K, Q2_K, Q3_K) with a Q8_0 shared expert in its split layout and F_s = 256 take it
/// inside (checked by moeSharedInside); the other cases run it first.
void checkMoeSharedExpert(Report &r, kiln::Rng &rng) {
  cpu::ThreadPool pool(4);
  struct Case {
    GGMLType gateType, downType, sharedType;
    bool split, fused, aliasOut;
    int64_t hidden, ffn, experts, k, sharedFfn;
    bool inside;
  };
  for (const Case &c : {
           // A GLM-5 tp=8 rank: 8 of 256 experts, the shared expert's
           // 256 rows of each.
           Case{GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q8_0, true, false,
                false, 6144, 256, 256, 8, 256, true},
           // 17 blocks a row, fused gate_up, out = x.
           Case{GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q8_0, true, true,
                true, 4352, 256, 16, 8, 256, true},
           // Q5_K gate/up, Q4_K down, 10 experts.
           Case{GGMLType::Q5_K, GGMLType::Q4_K, GGMLType::Q8_0, true, false,
                false, 1024, 256, 16, 10, 256, true},
           // The 2-bit mix on a GLM-5 tp=8 rank, and Q3_K gate/up fused.
           Case{GGMLType::Q2_K, GGMLType::Q3_K, GGMLType::Q8_0, true, false,
                false, 6144, 256, 256, 8, 256, true},
           Case{GGMLType::Q3_K, GGMLType::Q2_K, GGMLType::Q8_0, true, true,
                true, 2048, 256, 16, 8, 256, true},
           // F_s = 128: its own launches.
           Case{GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q8_0, true, false,
                false, 1024, 256, 16, 8, 128, false},
           // Q8_0 routed experts (the generic kernels).
           Case{GGMLType::Q8_0, GGMLType::Q8_0, GGMLType::Q8_0, true, true,
                false, 512, 256, 8, 4, 256, false},
           // A shared expert in the file's blocks (Q5_K).
           Case{GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q5_K, false, false,
                false, 1024, 256, 16, 8, 256, false}}) {
    const Experts set = randomExperts(c.gateType, c.downType, c.fused,
                                      c.hidden, c.ffn, c.experts, rng);
    const Weight sg = randomWeight(c.sharedType, {c.hidden, c.sharedFfn},
                                   rng.next()),
                 su = randomWeight(c.sharedType, {c.hidden, c.sharedFfn},
                                   rng.next()),
                 sd = randomWeight(c.sharedType, {c.sharedFfn, c.hidden},
                                   rng.next());
    std::vector<float> x = normals(rng, c.hidden, 1.0);
    std::vector<int32_t> ids(size_t(c.k));
    for (int32_t &id : ids)
      id = int32_t(rng.below(uint64_t(c.experts)));
    std::vector<float> weights = normals(rng, c.k, 0.3, 0.5);

    // The CPU: the routed sum, the shared expert's mat-vecs, the add.
    std::vector<float> want(size_t(c.hidden));
    const cpu::WeightView sgv = sg.view("shared gate"),
                          suv = su.view("shared up"),
                          sdv = sd.view("shared down");
    if (!r.reference("moe_experts",
                     cpuExpertsShared(set, x.data(), c.hidden, ids.data(),
                                      weights.data(), c.k, &sgv, &suv, &sdv,
                                      c.sharedFfn, want.data(), pool)))
      continue;

    std::optional<SplitWeight> hg, hu, hd;
    const kc::SharedExpert shared{deviceWeight(sg, c.split, hg),
                                  deviceWeight(su, c.split, hu),
                                  deviceWeight(sd, c.split, hd)};
    DeviceArray<float> dx(x), dw(weights), dout(c.hidden),
        dact(kc::moeExpertsActFloats(c.k, c.ffn, c.hidden, &shared));
    DeviceArray<int32_t> dids(ids);
    const Weight &gate = set.gate, &down = set.down;
    kc::DeviceWeight ud = set.up ? set.up->dev() : kc::DeviceWeight{};
    Fault fault;
    float *out = c.aliasOut ? dx.get() : dout.get();
    const uint64_t before = kc::moeSharedInsideLaunches();
    run(kc::launchMoeExperts(dx.get(), c.hidden, c.ffn, c.experts, dids.get(),
                             dw.get(), c.k, gate.dev(),
                             set.up ? &ud : nullptr, down.dev(), dact.get(),
                             nullptr, out, fault.sink(), nullptr, &shared));
    const bool inside = kc::moeSharedInsideLaunches() != before;
    std::vector<float> got = c.aliasOut ? dx.download() : dout.download();
    const std::string what = fmtText(
        "%s %s + down %s, shared %s%s F%lld, H%lld F%lld k%lld%s%s",
        c.fused ? "gate_up" : "gate/up", typeName(c.gateType).c_str(),
        typeName(c.downType).c_str(), typeName(c.sharedType).c_str(),
        c.split ? "-split" : "", (long long)c.sharedFfn, (long long)c.hidden,
        (long long)c.ffn, (long long)c.k, c.aliasOut ? ", out=x" : "",
        c.inside ? ", inside" : ", own launches");
    r.line("moe_experts shared", what,
           relError(got, want) +
               faultMismatch(fault.read(), kc::FaultCode::None, 0, 0) +
               (inside == c.inside ? 0.0 : 1.0),
           2 * (sumTol(double(c.hidden)) + sumTol(double(c.ffn)) +
                sumTol(double(c.sharedFfn))),
           fmtText("three chains of dots, 2e-6*(sqrt(%lld)+sqrt(%lld)+"
                   "sqrt(%lld)); the path as stated",
                   (long long)c.hidden, (long long)c.ffn,
                   (long long)c.sharedFfn));
  }
}

/// The timing probe's gate/up kernel (KILN_CUDA_EXPERTS_INT8_X=1,
/// kc::setExpertsInt8X): at GLM-5's tp=8 shape (Q4_K gate/up rows of 6,144,
/// F = 256, Q5_K down), with the shared expert inside and without, the
/// probe's kernel ran and the result is the CPU's experts of the rounded
/// input x' (quantdot::int8RoundGroups, groups of 16), not of x. Beside
/// each line, how far the experts of x' are from those of x (what the
/// rounding costs, for the decision in the IR).
void checkExpertsInt8X(Report &r, kiln::Rng &rng) {
  cpu::ThreadPool pool(4);
  const int64_t hidden = kc::glm5::kHidden, ffn = 256, experts = 16, k = 8,
                sharedFfn = 256;
  for (const bool withShared : {true, false}) {
    const Experts set = randomExperts(GGMLType::Q4_K, GGMLType::Q5_K, false,
                                      hidden, ffn, experts, rng);
    const Weight sg = randomWeight(GGMLType::Q8_0, {hidden, sharedFfn},
                                   rng.next()),
                 su = randomWeight(GGMLType::Q8_0, {hidden, sharedFfn},
                                   rng.next()),
                 sd = randomWeight(GGMLType::Q8_0, {sharedFfn, hidden},
                                   rng.next());
    const std::vector<float> x = normals(rng, hidden, 1.0);
    std::vector<float> rounded = x;
    kc::quantdot::int8RoundGroups(rounded.data(), hidden, 16);
    std::vector<int32_t> ids(static_cast<size_t>(k));
    for (int32_t &id : ids)
      id = int32_t(rng.below(uint64_t(experts)));
    const std::vector<float> weights = normals(rng, k, 0.3, 0.5);

    // The CPU's experts (and shared expert, added last) of `in`.
    const cpu::WeightView sgv = sg.view("shared gate"),
                          suv = su.view("shared up"),
                          sdv = sd.view("shared down");
    const auto cpuOf = [&](const std::vector<float> &in,
                           std::vector<float> &out) {
      out.assign(static_cast<size_t>(hidden), 0.f);
      return cpuExpertsShared(set, in.data(), hidden, ids.data(),
                              weights.data(), k, withShared ? &sgv : nullptr,
                              &suv, &sdv, sharedFfn, out.data(), pool);
    };
    std::vector<float> want, unrounded;
    if (!r.reference("moe_experts int8 x", cpuOf(rounded, want)) ||
        !r.reference("moe_experts int8 x", cpuOf(x, unrounded)))
      continue;

    std::optional<SplitWeight> hg, hu, hd;
    const kc::SharedExpert shared{deviceWeight(sg, true, hg),
                                  deviceWeight(su, true, hu),
                                  deviceWeight(sd, true, hd)};
    const kc::SharedExpert *sharedPtr = withShared ? &shared : nullptr;
    DeviceArray<float> dx(x), dw(weights), dout(static_cast<size_t>(hidden)),
        dact(kc::moeExpertsActFloats(k, ffn, hidden, sharedPtr));
    DeviceArray<int32_t> dids(ids);
    const kc::DeviceWeight ud = set.up->dev();
    Fault fault;
    bool ran = false;
    {
      const FixedShapes fixed(true);
      const ExpertsInt8X int8(true);
      run(kc::launchMoeExperts(dx.get(), hidden, ffn, experts, dids.get(),
                               dw.get(), k, set.gate.dev(), &ud,
                               set.down.dev(), dact.get(), nullptr,
                               dout.get(), fault.sink(), nullptr, sharedPtr));
      ran = int8.ran() == 1;
    }
    const std::vector<float> got = dout.download();
    const std::string what = fmtText(
        "gate/up Q4_K + down Q5_K%s, H%lld F%lld k%lld (x' vs x: %.1e)",
        withShared ? ", shared Q8_0-split inside" : "", (long long)hidden,
        (long long)ffn, (long long)k, relError(want, unrounded));
    r.line("moe_experts int8 x", what,
           relError(got, want) +
               faultMismatch(fault.read(), kc::FaultCode::None, 0, 0) +
               (ran ? 0.0 : 1.0),
           2 * (sumTol(double(hidden)) + sumTol(double(ffn)) +
                (withShared ? sumTol(double(sharedFfn)) : 0.0)),
           fmtText("the CPU on x', as moe_experts shared: 2e-6*(sqrt(%lld)+"
                   "sqrt(%lld)%s); the probe's kernel ran",
                   (long long)hidden, (long long)ffn,
                   withShared ? "+sqrt(256)" : ""));
  }
}

//===----------------------------------------------------------------------===//
// Arg-max
//===----------------------------------------------------------------------===//

void checkArgmax(Report &r, kiln::Rng &rng) {
  const int64_t n = 19360;
  DeviceArray<int32_t> dout(1);
  const float nan = std::numeric_limits<float>::quiet_NaN();

  struct Case {
    const char *what;
    std::vector<float> x;
  };
  std::vector<Case> cases;
  {
    std::vector<float> x = normals(rng, n, 1.0);
    const float top = *std::max_element(x.begin(), x.end()) + 1.f;
    x[12345] = top;
    x[777] = top; // tie: the lower index wins
    cases.push_back({"n=19360, tie at 777 and 12345", x});
    x[3] = nan;
    cases.push_back({"n=19360, NaN at 3 (ignored)", x});
    x[0] = nan;
    cases.push_back({"n=19360, NaN at 0 (wins, as the scan)", x});
    cases.push_back(
        {"n=5, all -inf",
         std::vector<float>(5, -std::numeric_limits<float>::infinity())});
    cases.push_back({"n=0", {}});
  }
  for (const Case &c : cases) {
    DeviceArray<float> dx(c.x);
    const int64_t len = int64_t(c.x.size());
    run(kc::launchArgmax(dx.get(), len, dout.get(), nullptr));
    r.line("argmax", c.what,
           mismatches(dout.download(),
                      std::vector<int32_t>{cpu::argmax(c.x.data(), len)}),
           0, "exact, ties to the lower index");
  }

  // Four ranks' parts: candidates, then the pick, against the whole.
  const int ranks = 4;
  const int64_t part = 5000;
  std::vector<float> x = normals(rng, ranks * part, 1.0);
  const float top = *std::max_element(x.begin(), x.end()) + 1.f;
  x[1 * part + 10] = top; // equal maxima on ranks 1 and 3: rank 1 wins
  x[3 * part + 20] = top;
  x[2 * part + 5] = nan;
  DeviceArray<float> dx(x);
  DeviceArray<kc::ArgmaxCandidate> cands(ranks);
  double bad = 0;
  for (int q = 0; q < ranks; ++q) {
    run(kc::launchArgmaxCandidate(dx.get() + q * part, part, int32_t(q * part),
                                  cands.get() + q, nullptr));
  }
  std::vector<kc::ArgmaxCandidate> got = cands.download();
  for (int q = 0; q < ranks; ++q) {
    const int32_t local = cpu::argmax(x.data() + q * part, part);
    bad += got[q].index != int32_t(q * part) + local;
    bad += std::memcmp(&got[q].value, &x[size_t(q * part + local)],
                       sizeof(float)) != 0;
  }
  r.line("argmax_candidate", "4 ranks x 5000, ties on ranks 1 and 3", bad, 0,
         "exact");
  run(kc::launchPickCandidate(cands.get(), ranks, dout.get(), nullptr));
  r.line("pick_candidate", "4 ranks x 5000 vs argmax of the whole",
         mismatches(dout.download(), std::vector<int32_t>{cpu::argmax(
                                         x.data(), int64_t(x.size()))}),
         0, "exact, earlier rank wins ties");

  // The same candidates as slots of [2 ranks] vectors, zero elsewhere
  // (ranks on one GPU): each rank's vector, their sum (x + 0 = x), the
  // pick.
  std::vector<float> summed(2 * ranks, 0.f);
  double badSlots = 0;
  for (int q = 0; q < ranks; ++q) {
    DeviceArray<float> slots(std::vector<float>(2 * ranks, 0.f));
    run(kc::launchArgmaxSlots(dx.get() + q * part, part, int32_t(q * part),
                              ranks, q, slots.get(), nullptr));
    const std::vector<float> mine = slots.download();
    for (int i = 0; i < 2 * ranks; ++i) {
      const bool own = i == q || i == ranks + q;
      badSlots += !own && mine[size_t(i)] != 0.f;
      summed[size_t(i)] += mine[size_t(i)];
    }
    badSlots += std::memcmp(&mine[size_t(q)], &got[size_t(q)].value,
                            sizeof(float)) != 0;
    badSlots += mine[size_t(ranks + q)] != float(got[size_t(q)].index);
  }
  r.line("argmax_slots", "4 ranks x 5000: each rank's slots as its candidate",
         badSlots, 0, "exact");
  DeviceArray<float> dsummed(summed);
  run(kc::launchPickSlots(dsummed.get(), ranks, dout.get(), nullptr));
  r.line("pick_slots", "4 ranks x 5000, summed slots vs argmax of the whole",
         mismatches(dout.download(), std::vector<int32_t>{cpu::argmax(
                                         x.data(), int64_t(x.size()))}),
         0, "exact, earlier rank wins ties");
}

/// The drawing argmax (DrawKey.h's keys from the sampling words and the
/// position in device memory) against the CPU backend's cpu::drawArgmax,
/// bit for bit: the one block, four ranks' candidates and slots with their
/// bases, the pick of the whole, temperature 0 as the plain argmax, and bad
/// words reported as the SamplingOutOfRange fault with -1 as the result.
void checkDrawnArgmax(Report &r, kiln::Rng &rng) {
  const int ranks = 4;
  const int64_t part = 5000, n = ranks * part;
  std::vector<float> x = normals(rng, n, 3.0);
  x[3] = std::numeric_limits<float>::quiet_NaN(); // never chosen at 3
  x[17] = -std::numeric_limits<float>::infinity();
  const uint64_t seed = rng.next();
  const int32_t position = 1234;
  auto words = [&](float t, int32_t last) {
    int32_t w[4] = {0, int32_t(uint32_t(seed)), int32_t(uint32_t(seed >> 32)),
                    last};
    std::memcpy(&w[0], &t, 4);
    return std::vector<int32_t>(w, w + 4);
  };
  DeviceArray<float> dx(x);
  DeviceArray<int32_t> dpos(std::vector<int32_t>{position});
  DeviceArray<int32_t> dout(1);
  Fault fault;
  for (float t : {0.8f, 0.0f, 2.5f}) {
    const std::vector<int32_t> w = words(t, 0);
    DeviceArray<int32_t> dw(w);
    const kc::DrawInputs draw{dw.get(), dpos.get(), fault.sink()};
    const std::string what = fmtText("T = %g, seed %#llx, position %d", t,
                                     (unsigned long long)seed, position);
    float key = 0;
    kiln::Expected<int32_t> want =
        cpu::drawArgmax(x.data(), n, 0, w.data(), 4, position, key);
    run(kc::launchArgmax(dx.get(), n, dout.get(), nullptr, draw));
    r.line("argmax drawn", what + ", n=20000",
           mismatches(dout.download(), std::vector<int32_t>{want ? *want : -2}),
           0, "exact: cpu::drawArgmax's index");
    // Each rank's candidate: its best key (value) and index from its base.
    DeviceArray<kc::ArgmaxCandidate> cands(ranks);
    double bad = 0;
    std::vector<float> summed(2 * ranks, 0.f);
    for (int q = 0; q < ranks; ++q) {
      run(kc::launchArgmaxCandidate(dx.get() + q * part, part,
                                    int32_t(q * part), cands.get() + q,
                                    nullptr, draw));
      DeviceArray<float> slots(std::vector<float>(2 * ranks, 0.f));
      run(kc::launchArgmaxSlots(dx.get() + q * part, part, int32_t(q * part),
                                ranks, q, slots.get(), nullptr, draw));
      const std::vector<float> mine = slots.download();
      for (int i = 0; i < 2 * ranks; ++i)
        summed[size_t(i)] += mine[size_t(i)];
      float partKey = 0;
      kiln::Expected<int32_t> local = cpu::drawArgmax(
          x.data() + q * part, part, q * part, w.data(), 4, position, partKey);
      const kc::ArgmaxCandidate got = cands.download()[size_t(q)];
      bad += !local || got.index != int32_t(q * part) + *local;
      bad += std::memcmp(&got.value, &partKey, sizeof(float)) != 0;
      bad += std::memcmp(&mine[size_t(q)], &partKey, sizeof(float)) != 0;
      bad += local && mine[size_t(ranks + q)] != float(q * part + *local);
    }
    r.line("argmax drawn candidates", what + ", 4 ranks x 5000 (and slots)",
           bad, 0, "exact: key bits and index");
    run(kc::launchPickCandidate(cands.get(), ranks, dout.get(), nullptr));
    r.line("pick drawn candidates", what + ", vs the whole's draw",
           mismatches(dout.download(), std::vector<int32_t>{want ? *want : -2}),
           0, "exact");
    DeviceArray<float> dsummed(summed);
    run(kc::launchPickSlots(dsummed.get(), ranks, dout.get(), nullptr));
    r.line("pick drawn slots", what + ", vs the whole's draw",
           mismatches(dout.download(), std::vector<int32_t>{want ? *want : -2}),
           0, "exact");
  }
  r.line("argmax drawn faults", "valid words", faultMismatch(fault.read(),
         kc::FaultCode::None, 0, 0), 0, "no fault");
  // Bad words: a negative temperature (word 0), a last word that is not 0.
  for (auto [t, last, index, bits] :
       {std::tuple{-1.0f, 0, 0, int64_t(0xbf800000u)},
        std::tuple{0.8f, 7, 3, int64_t(7)}}) {
    fault.clear();
    DeviceArray<int32_t> dw(words(t, last));
    run(kc::launchArgmax(dx.get(), n, dout.get(), nullptr,
                         kc::DrawInputs{dw.get(), dpos.get(), fault.sink()}));
    r.line("argmax drawn, bad words",
           fmtText("word %d = %#llx: fault and -1", index,
                   (unsigned long long)bits),
           mismatches(dout.download(), std::vector<int32_t>{-1}) +
               faultMismatch(fault.read(), kc::FaultCode::SamplingOutOfRange,
                             index, bits),
           0, "exact");
  }
}

/// The adjusting form's words (DrawKey.h) for `entries`, the penalties
/// and a temperature, with room for `capacity`.
std::vector<int32_t> adjustingWords(int capacity, float t, uint64_t seed,
                                    const draw::Penalties &p,
                                    const std::vector<draw::Adjustment> &e) {
  std::vector<int32_t> w(size_t(draw::adjustingWords(capacity)), 0);
  w[0] = int32_t(draw::floatBits(t));
  w[1] = int32_t(uint32_t(seed));
  w[2] = int32_t(uint32_t(seed >> 32));
  draw::writeAdjustments(w.data(), int(w.size()), p, e.data(), e.size());
  return w;
}

/// The logits' adjustments (launchAdjustLogits, the adjusting form before
/// the draw) against the CPU backend's cpu::adjustLogits, bit for bit (a
/// NaN as a NaN: its payload may differ): GLM-5's vocabulary as one part
/// and as 8 ranks' parts with their bases, 300 adjusted tokens of seeded
/// biases and counts under seeded penalties (the repeat penalty 1 and the
/// others 0 too), and the argmax and the grid's draw of the adjusted
/// whole against cpu::drawArgmax's; bad words (word 6's count, each
/// penalty, the reserved words, each entry's rules) are the
/// SamplingOutOfRange fault naming the word, with the logits copied
/// unadjusted.
void checkAdjustLogits(Report &r, kiln::Rng &rng) {
  const int64_t vocab = 154880;
  std::vector<float> x = normals(rng, static_cast<size_t>(vocab), 3.0);
  const float odd[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN()};
  std::vector<draw::Adjustment> entries;
  std::vector<int32_t> ids;
  while (ids.size() < 300)
    ids.push_back(int32_t(rng.next() % uint64_t(vocab)));
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i < 5)
      x[size_t(ids[i])] = odd[i]; // adjusted odd values
    entries.push_back({ids[i],
                       rng.next() % 3 == 0 ? 0.0f : float(rng.normal() * 20),
                       int32_t(rng.next() % 3 == 0 ? 0 : rng.next() % 9)});
  }
  DeviceArray<float> dx(x), dy{static_cast<size_t>(vocab)};
  DeviceArray<int32_t> dpos(std::vector<int32_t>{77});
  DeviceArray<int32_t> dout(1);
  Fault fault;
  auto sameValues = [](const std::vector<float> &got,
                       const std::vector<float> &want) {
    double bad = got.size() == want.size() ? 0 : 1e9;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i)
      bad += std::isnan(got[i]) && std::isnan(want[i])
                 ? 0
                 : std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
    return bad;
  };
  for (const draw::Penalties &p :
       {draw::Penalties{1.3, 0.7, -0.4}, draw::Penalties{0.6, 0.0, 1.5},
        draw::Penalties{}}) {
    const std::vector<int32_t> w =
        adjustingWords(320, 0.9f, rng.next(), p, entries);
    DeviceArray<int32_t> dw(w);
    const kc::DrawInputs draw{dw.get(), dpos.get(), fault.sink(),
                              int(w.size())};
    const std::string what =
        fmtText("%zu tokens, repeat %g, frequency %g, presence %g",
                entries.size(), p.repeat, p.frequency, p.presence);
    std::vector<float> want(static_cast<size_t>(vocab));
    kiln::Status st = cpu::adjustLogits(w.data(), int(w.size()), vocab,
                                        x.data(), vocab, 0, want.data());
    for (int ranks : {1, 8}) {
      const int64_t part = vocab / ranks;
      for (int q = 0; q < ranks; ++q)
        run(kc::launchAdjustLogits(dx.get() + q * part, part, q * part, vocab,
                                   dy.get() + q * part, nullptr, draw));
      r.line("adjust logits", what + fmtText(", %d part(s)", ranks),
             st ? sameValues(dy.download(), want) : 1e9, 0,
             "exact: cpu::adjustLogits's bits");
    }
    // The draw and the argmax of the adjusted whole.
    for (float t : {0.9f, 0.0f}) {
      std::vector<int32_t> tw = w;
      tw[0] = int32_t(draw::floatBits(t));
      tw[3] = t != 0.0f ? int32_t(draw::floatBits(0.95f)) : 0;
      DeviceArray<int32_t> dtw(tw);
      const kc::DrawInputs td{dtw.get(), dpos.get(), fault.sink(),
                              int(tw.size())};
      run(kc::launchAdjustLogits(dx.get(), vocab, 0, vocab, dy.get(), nullptr,
                                 td));
      DeviceArray<uint8_t> scratch(kc::nucleusScratchBytes(vocab));
      run(t != 0.0f ? kc::launchNucleusArgmax(dy.get(), vocab, dout.get(),
                                              scratch.get(), nullptr, td)
                    : kc::launchArgmax(dy.get(), vocab, dout.get(), nullptr,
                                       td));
      float key = 0;
      kiln::Expected<int32_t> token =
          cpu::drawArgmax(want.data(), vocab, 0, tw.data(), int(tw.size()), 77,
                          key);
      r.line("adjust logits, then the draw",
             what + (t != 0.0f ? ", T 0.9, top-p 0.95" : ", the argmax"),
             token ? mismatches(dout.download(), std::vector<int32_t>{*token})
                   : 1e9,
             0, "exact: cpu::drawArgmax's index");
    }
  }
  r.line("adjust logits faults", "valid words",
         faultMismatch(fault.read(), kc::FaultCode::None, 0, 0), 0,
         "no fault");
  // Bad words: each a fault naming it, its bits the value, y = x.
  const std::vector<draw::Adjustment> two = {{5, 1.0f, 2}, {900, -2.0f, 0}};
  auto bad = [&](int word, int32_t value) {
    std::vector<int32_t> w = adjustingWords(4, 1.0f, 1, {}, two);
    w[size_t(word)] = value;
    return w;
  };
  const int32_t nanLow = int32_t(0x00000000u), nanHigh = int32_t(0x7ff80000u);
  for (auto [name, w, word] :
       {std::tuple{"count above the capacity", bad(6, 5), 6},
        std::tuple{"negative count", bad(6, -1), 6},
        std::tuple{"repeat 0", bad(9, 0), 8},
        std::tuple{"frequency NaN", [&] {
                     std::vector<int32_t> v = bad(10, nanLow);
                     v[11] = nanHigh;
                     return v;
                   }(), 10},
        std::tuple{"reserved word 15", bad(15, 3), 15},
        std::tuple{"id past the vocabulary", bad(19, int32_t(vocab)), 19},
        std::tuple{"ids not ascending", bad(19, 5), 19},
        std::tuple{"bias infinite", bad(17, int32_t(0x7f800000u)), 17},
        std::tuple{"count negative", bad(18, -2), 18}}) {
    fault.clear();
    DeviceArray<int32_t> dw(w);
    run(kc::launchAdjustLogits(dx.get(), vocab, 0, vocab, dy.get(), nullptr,
                               kc::DrawInputs{dw.get(), dpos.get(),
                                              fault.sink(), int(w.size())}));
    std::vector<float> got = dy.download();
    std::vector<float> cpuOut(static_cast<size_t>(vocab));
    const bool cpuRefused = !cpu::adjustLogits(w.data(), int(w.size()), vocab,
                                               x.data(), vocab, 0,
                                               cpuOut.data());
    r.line("adjust logits, bad words",
           fmtText("%s: word %d's fault, the logits as they were", name, word),
           faultMismatch(fault.read(), kc::FaultCode::SamplingOutOfRange, word,
                         int64_t(uint32_t(w[size_t(word)]))) +
               sameValues(got, x) + double(!cpuRefused),
           0, "exact (the CPU refuses too)");
  }
}

/// The nucleus (top-p, the eight words' word 3) cut by the one-block
/// argmax against cpu::drawArgmax, bit for bit: vocabularies of N(0, 3)
/// logits, of GLM-5's 154,880 with a peaked head, and of a few values
/// repeated (ties at the cut), at shares from 1e-6 (the best token alone)
/// to 0.999999; the kernels of a part refuse a nucleus (word 3's fault);
/// bad shares are faults.
void checkNucleusArgmax(Report &r, kiln::Rng &rng) {
  const uint64_t seed = rng.next();
  const int32_t position = 77;
  auto words = [&](float t, float p, float m = 0.0f, int32_t k = 0) {
    int32_t w[8] = {0, int32_t(uint32_t(seed)), int32_t(uint32_t(seed >> 32)),
                    0, k, 0, 0, 0};
    std::memcpy(&w[0], &t, 4);
    std::memcpy(&w[3], &p, 4);
    std::memcpy(&w[5], &m, 4); // min-p
    return std::vector<int32_t>(w, w + 8);
  };
  std::vector<std::pair<std::string, std::vector<float>>> vocabularies;
  vocabularies.emplace_back("20000 N(0, 3)", normals(rng, 20000, 3.0));
  {
    // A head of 40 tokens 6-12 nats above a tail of N(0, 2).
    std::vector<float> v = normals(rng, 154880, 2.0);
    for (int i = 0; i < 40; ++i)
      v[size_t(rng.next() % v.size())] = 6.0f + float(rng.next() % 600) / 100;
    v[5] = std::numeric_limits<float>::quiet_NaN();
    v[9] = -std::numeric_limits<float>::infinity();
    vocabularies.emplace_back("154880 peaked", std::move(v));
  }
  {
    // Eight values over 30000 tokens: every cut falls among equal weights.
    std::vector<float> v(30000);
    for (float &x : v)
      x = float(rng.next() % 8) * 0.5f;
    vocabularies.emplace_back("30000 of 8 values", std::move(v));
  }
  DeviceArray<int32_t> dpos(std::vector<int32_t>{position});
  DeviceArray<int32_t> dout(1);
  Fault fault;
  // One scratch for every launch of the grid's form: each leaves it ready
  // for the next.
  DeviceArray<uint8_t> scratch(std::vector<uint8_t>(
      size_t(kc::nucleusScratchBytes(154880)), uint8_t(0)));
  double gridBad = 0, gridCases = 0;
  for (const auto &[name, x] : vocabularies) {
    DeviceArray<float> dx(x);
    const int64_t n = int64_t(x.size());
    double bad = 0, cases = 0, drawnDiffers = 0;
    for (float t : {1.0f, 0.6f, 1.7f})
      for (auto [p, m, k] : {std::tuple{1e-6f, 0.0f, 0},
                             std::tuple{0.5f, 0.0f, 0},
                             std::tuple{0.9f, 0.0f, 0},
                             std::tuple{0.95f, 0.0f, 0},
                             std::tuple{0.999999f, 0.0f, 0},
                             std::tuple{0.0f, 0.05f, 0},
                             std::tuple{0.0f, 0.5f, 0},
                             std::tuple{0.95f, 0.02f, 0},
                             std::tuple{0.0f, 0.0f, 1},
                             std::tuple{0.0f, 0.0f, 40},
                             std::tuple{0.9f, 0.0f, 40},
                             std::tuple{0.95f, 0.02f, 20},
                             std::tuple{0.0f, 0.05f, 1000},
                             std::tuple{0.5f, 0.0f, 200000}}) {
        const std::vector<int32_t> w = words(t, p, m, k);
        DeviceArray<int32_t> dw(w);
        float key = 0;
        kiln::Expected<int32_t> want =
            cpu::drawArgmax(x.data(), n, 0, w.data(), 8, position, key);
        const kc::DrawInputs draw{dw.get(), dpos.get(), fault.sink(), 8};
        run(kc::launchArgmax(dx.get(), n, dout.get(), nullptr, draw));
        const int32_t got = dout.download()[0];
        bad += !want || got != *want;
        run(kc::launchNucleusArgmax(dx.get(), n, dout.get(), scratch.get(),
                                    nullptr, draw));
        gridBad += !want || dout.download()[0] != *want;
        ++gridCases;
        // The same words without the cut, for the count of draws it moved.
        std::vector<int32_t> plain = w;
        plain[3] = 0;
        plain[4] = 0;
        plain[5] = 0;
        float plainKey = 0;
        kiln::Expected<int32_t> whole =
            cpu::drawArgmax(x.data(), n, 0, plain.data(), 8, position,
                            plainKey);
        drawnDiffers += whole && want && *whole != *want;
        ++cases;
      }
    r.line("argmax nucleus", fmtText("%s, T 1/0.6/1.7 x p 1e-6 .. 0.999999, "
                                     "min-p 0.05 and 0.5, top-k 1 .. 200000, "
                                     "mixes (%.0f of %.0f draws moved by the "
                                     "cut)",
                                     name.c_str(), drawnDiffers, cases),
           bad, 0, "exact: cpu::drawArgmax's index");
  }
  // The grid's form with words that cut nothing: a plain temperature and
  // greedy, as the one block takes them.
  for (float t : {0.8f, 0.0f}) {
    const std::vector<float> &x = vocabularies[1].second;
    DeviceArray<float> dx(x);
    const std::vector<int32_t> w = words(t, 0.0f);
    DeviceArray<int32_t> dw(w);
    float key = 0;
    kiln::Expected<int32_t> want = cpu::drawArgmax(
        x.data(), int64_t(x.size()), 0, w.data(), 8, position, key);
    run(kc::launchNucleusArgmax(dx.get(), int64_t(x.size()), dout.get(),
                                scratch.get(), nullptr,
                                kc::DrawInputs{dw.get(), dpos.get(),
                                               fault.sink(), 8}));
    gridBad += !want || dout.download()[0] != *want;
    ++gridCases;
  }
  r.line("argmax nucleus by a grid", fmtText("the three vocabularies' %.0f "
                                             "draws, a plain T and greedy",
                                             gridCases),
         gridBad, 0, "exact: cpu::drawArgmax's index");
  r.line("argmax nucleus faults", "valid words",
         faultMismatch(fault.read(), kc::FaultCode::None, 0, 0), 0,
         "no fault");
  const std::vector<float> x = normals(rng, 4096, 3.0);
  DeviceArray<float> dx(x);
  // A part's kernels: every cut needs the whole vocabulary, so each is a
  // fault naming its word (its bits as the value) and -1.
  for (auto [name, w, word, bits] :
       {std::tuple{"nucleus", words(1.0f, 0.9f), 3, 0x3f666666u},
        std::tuple{"min-p", words(1.0f, 0.0f, 0.05f), 5, 0x3d4ccccdu},
        std::tuple{"top-k", words(1.0f, 0.0f, 0.0f, 40), 4, 40u}}) {
    fault.clear();
    DeviceArray<int32_t> dw(w);
    DeviceArray<kc::ArgmaxCandidate> cand(1);
    run(kc::launchArgmaxCandidate(dx.get(), 4096, 0, cand.get(), nullptr,
                                  kc::DrawInputs{dw.get(), dpos.get(),
                                                 fault.sink(), 8}));
    r.line(fmtText("argmax %s of a part", name),
           "the candidate kernel: fault, -1",
           double(cand.download()[0].index != -1) +
               faultMismatch(fault.read(), kc::FaultCode::SamplingOutOfRange,
                             word, int64_t(bits)),
           0, "exact");
  }
  // Bad words, each a fault naming it and -1 from both forms: shares of 1,
  // negative and NaN, a share without a temperature (word 3); a min-p above
  // 1 and one without a temperature (word 5); a negative top-k and one
  // without a temperature (word 4).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (auto [t, p, m, k] : {std::tuple{1.0f, 1.0f, 0.0f, 0},
                            std::tuple{1.0f, -0.5f, 0.0f, 0},
                            std::tuple{1.0f, nan, 0.0f, 0},
                            std::tuple{0.0f, 0.9f, 0.0f, 0},
                            std::tuple{1.0f, 0.0f, 1.5f, 0},
                            std::tuple{0.0f, 0.0f, 0.1f, 0},
                            std::tuple{1.0f, 0.0f, 0.0f, -3},
                            std::tuple{0.0f, 0.0f, 0.0f, 5}}) {
    const int word = k != 0 ? 4 : m != 0.0f ? 5 : 3;
    const float value = word == 5 ? m : p;
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    if (word == 4)
      bits = uint32_t(k);
    DeviceArray<int32_t> dw(words(t, p, m, k));
    const kc::DrawInputs draw{dw.get(), dpos.get(), fault.sink(), 8};
    double wrong = 0;
    for (bool grid : {false, true}) {
      fault.clear();
      run(grid ? kc::launchNucleusArgmax(dx.get(), 4096, dout.get(),
                                         scratch.get(), nullptr, draw)
               : kc::launchArgmax(dx.get(), 4096, dout.get(), nullptr, draw));
      wrong += mismatches(dout.download(), std::vector<int32_t>{-1}) +
               faultMismatch(fault.read(), kc::FaultCode::SamplingOutOfRange,
                             word, int64_t(bits));
    }
    r.line("argmax nucleus, bad words",
           fmtText("T %g, top-p %g, min-p %g, top-k %d: word %d's fault, -1 "
                   "(one block and grid)",
                   t, p, m, k, word),
           wrong, 0, "exact");
  }
}

//===----------------------------------------------------------------------===//
// --bench: launchLinear at GLM-5 tensor-parallel (8 ranks) shapes
//===----------------------------------------------------------------------===//

/// `copies` copies of one random weight (`rows` x `cols` of `type`, random
/// valid blocks from `seed`), each its own DeviceWeight: in the file's
/// block layout, or with `split` repacked into the type's split layout,
/// each plane holding every copy's rows copy after copy, so that copy i's
/// rows form one weight in every plane. The benches rotate over copies
/// that together exceed the L2, so each launch reads its weight from memory.
class WeightCopies {
public:
  WeightCopies(GGMLType type, int64_t rows, int64_t cols, uint64_t copies,
               bool split, uint64_t seed)
      : type_(type), rows_(rows), cols_(cols), copies_(copies),
        bytes_(*kiln::rowBytes(type, uint64_t(cols)) * uint64_t(rows)),
        format_(split ? kc::splitFormatOf(type) : nullptr),
        blocks_(format_ ? uint64_t(cols * rows) / format_->blockValues : 0),
        data_(bytes_ * copies),
        planes_(format_ ? kc::splitPlaneStart(*format_, format_->planes,
                                              blocks_ * copies)
                        : 0) {
    run(kc::launchFillRandomBlocks(type, data_.get(), bytes_ * copies,
                                   seed, nullptr));
    if (format_) {
      kc::DeviceWeight all{type, rows * int64_t(copies), cols, nullptr,
                           kc::splitLayoutOf(type)};
      for (int p = 0; p < format_->planes; ++p)
        all.setPlane(p, plane(p, 0));
      run(kc::launchRepackSplit(data_.get(), all, nullptr));
    }
  }

  /// Copy `copy`'s weight.
  kc::DeviceWeight operator[](uint64_t copy) const {
    kc::DeviceWeight w{type_, rows_, cols_,
                       data_.get() + copy * bytes_};
    if (format_) {
      w.layout = kc::splitLayoutOf(type_);
      for (int p = 0; p < format_->planes; ++p)
        w.setPlane(p, plane(p, copy));
    }
    return w;
  }

private:
  uint8_t *plane(int p, uint64_t copy) const {
    return planes_.get() + kc::splitPlaneStart(*format_, p, blocks_ * copies_) +
           kc::splitPlaneBytes(*format_, p, blocks_ * copy);
  }

  GGMLType type_;
  int64_t rows_, cols_;
  uint64_t copies_, bytes_;
  const kc::SplitFormat *format_;
  uint64_t blocks_;
  DeviceArray<uint8_t> data_, planes_;
};

/// Times launchLinear on random valid blocks: kRuns launches captured in a
/// CUDA graph (no launch gaps), rotating over copies of the weight that
/// together exceed the L2 many times over, so every launch reads its weight
/// from memory (one launch per copy where kRuns copies of a small weight,
/// such as attn_k_b's, would fit the L2). GB/s counts the weight's bytes
/// only.
void benchLinear() {
  struct Case {
    GGMLType type;
    int64_t k, n;
    const char *what;
    bool split = false; ///< the type's split device layout
    int64_t heads = 1;  ///< > 1: a stacked weight [k, n, heads], batch heads
    /// The kernel compiled for the width (KILN_CUDA_SPECIALISED=1).
    bool fixed = false;
  };
  const Case cases[] = {
      {GGMLType::Q8_0, 6144, 2048, "q_a-like"},
      {GGMLType::Q8_0, 6144, 2048, "q_a-like, q8_0-split", true},
      {GGMLType::Q8_0, 6144, 2048, "q_a-like, q8_0-split, fixed width", true, 1,
       true},
      {GGMLType::Q8_0, 2048, 6144, "attn_output slice"},
      {GGMLType::Q8_0, 2048, 6144, "attn_output slice, q8_0-split", true},
      {GGMLType::Q8_0, 2048, 6144,
       "attn_output slice, q8_0-split, fixed width", true, 1, true},
      {GGMLType::Q8_0, 6144, 2752, "q_a + kv_a + indexer k, q8_0-split", true},
      {GGMLType::Q8_0, 6144, 2752,
       "q_a + kv_a + indexer k, q8_0-split, fixed width", true, 1, true},
      {GGMLType::Q4_K, 6144, 2048, "expert gate/up rows"},
      {GGMLType::Q4_K, 6144, 2048, "q_a-like, q4_k-split", true},
      {GGMLType::Q5_K, 2048, 6144, "dense down slice"},
      {GGMLType::Q5_K, 2048, 6144, "dense down slice, q5_k-split", true},
      {GGMLType::Q6_K, 6144, 19360, "output head slice"},
      {GGMLType::Q6_K, 6144, 19360, "output head slice, q6_k-split", true},
      {GGMLType::IQ4_XS, 6144, 2048, "q_a-like"},
      {GGMLType::IQ4_XS, 6144, 2048, "q_a-like, iq4_xs-split", true},
      {GGMLType::IQ4_NL, 6144, 2048, "q_a-like"},
      {GGMLType::IQ4_NL, 6144, 2048, "q_a-like, iq4_nl-split", true},
      {GGMLType::Q5_0, 2048, 6144, "attn_output slice"},
      {GGMLType::Q5_0, 2048, 6144, "attn_output slice, q5_0-split", true},
      {GGMLType::Q5_1, 6144, 2048, "q_a-like"},
      {GGMLType::Q5_1, 6144, 2048, "q_a-like, q5_1-split", true},
      {GGMLType::Q5_0, 128, 512, "attn_k_b, 8 heads", false, 8},
      {GGMLType::Q5_0, 128, 512, "attn_k_b, 8 heads, q5_0-split", true, 8},
      {GGMLType::Q5_1, 128, 512, "attn_k_b, 8 heads", false, 8},
      {GGMLType::Q5_1, 128, 512, "attn_k_b, 8 heads, q5_1-split", true, 8},
      {GGMLType::IQ4_NL, 128, 512, "attn_k_b, 8 heads", false, 8},
      {GGMLType::IQ4_NL, 128, 512, "attn_k_b, 8 heads, iq4_nl-split", true, 8},
      {GGMLType::F32, 6144, 256, "router gate"},
  };
  constexpr uint64_t kRotateBytes = uint64_t(256) << 20;
  constexpr int kRuns = 50;
  cudaStream_t stream;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  kiln::Rng rng(7);
  for (const Case &c : cases) {
    const int64_t rows = c.n * c.heads;
    const uint64_t bytes = *kiln::rowBytes(c.type, uint64_t(c.k)) * rows;
    const uint64_t copies =
        std::max<uint64_t>(2, (kRotateBytes + bytes - 1) / bytes);
    const WeightCopies w(c.type, rows, c.k, copies, c.split, rng.next());
    DeviceArray<float> x(normals(rng, c.k * c.heads, 1.0)), y(rows);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    const int runs = int(std::max<uint64_t>(kRuns, copies));
    uint64_t fixedRan = 0;
    {
      const FixedShapes fixed(c.fixed);
      CHECK_CUDA(
          cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < runs; ++i) {
        const kc::DeviceWeight dw = w[uint64_t(i) % copies];
        CHECK_CUDA(kc::launchLinear(x.get(), c.heads, dw, c.n, c.heads > 1,
                                    y.get(), stream));
      }
      CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
      fixedRan = fixed.ran();
    }
    // A fixed-width row that ran the general kernel would time the wrong
    // thing: say so instead.
    if (c.fixed && fixedRan != uint64_t(runs))
      std::printf("bench linear %s %lldx%lld: the fixed-width kernel did not "
                  "run (%s)\n",
                  typeName(c.type).c_str(), (long long)c.k, (long long)c.n,
                  c.what);
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    CHECK_CUDA(cudaGraphLaunch(exec, stream)); // warm-up
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaEventRecord(start, stream));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    const double us = double(ms) * 1e3 / runs;
    const std::string shape =
        c.heads > 1 ? fmtText("%lldx%lldx%lld", (long long)c.k, (long long)c.n,
                              (long long)c.heads)
                    : fmtText("%lldx%lld", (long long)c.k, (long long)c.n);
    std::printf("bench linear %s %s: %.2f us, %.1f GB/s  (%s)\n",
                typeName(c.type).c_str(), shape.c_str(), us,
                double(bytes) / (us * 1e3), c.what);
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

/// A choice as GLM-5's router makes it (sigmoid + bias, normalised, routed
/// scale 2.5), top `topK`, into ids and weights.
kc::RouterChoice sigmoidChoice(const float *bias, int64_t topK, int32_t *ids,
                               float *weights) {
  kc::RouterChoice choice;
  choice.bias = bias;
  choice.topK = topK;
  choice.gating = kc::Gating::Sigmoid;
  choice.normalize = true;
  choice.routedScale = 2.5f;
  choice.ids = ids;
  choice.weights = weights;
  return choice;
}

/// Times one op's launch sequence: kRuns of it captured in a graph, after a
/// warm-up replay. What a step's graph pays per op (memory and node cost).
template <typename Fn>
double timeInGraph(cudaStream_t stream, Fn &&launch, int kRuns = 50) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kRuns; ++i)
    CHECK_CUDA(launch(stream));
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaEventRecord(start, stream));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaEventRecord(stop, stream));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return double(ms) * 1e3 / kRuns;
}

/// --bench-choice: the router's choice at GLM-5's tp = 8 shape (the
/// attention's all-reduce of 6,144 values with a tail of 256 logits, eight
/// ranks simulated, top 8 of 256 by sigmoid + bias) in a graph of 50 links
/// launched with programmatic serialization, as a step's are: per link the
/// all-reduce alone, then followed by the choice kernel (moe_choose), and
/// the all-reduce making the choice itself (kiln-fuse-router-choice).
/// In GLM-5's step the third costs ~4.4 us over the first where the second
/// costs ~3.2 (docs/perf.md, twenty-second pass): whether the kernels alone
/// show that is what this measures. The ids and weights of the two ways
/// are compared after the chains, bit for bit (exit 1 if they differ).
int benchChoice() {
  constexpr int kChain = 50;
  const int64_t cols = 6144, experts = 256, topK = 8;
  const int ranks = 8;
  const int64_t cap = 2 * (cols + experts);
  kiln::Rng rng(17);
  DeviceArray<uint8_t> exchange(kc::peerExchangeBytes(cap));
  CHECK_CUDA(cudaMemset(exchange.get(), 0, kc::peerExchangeBytes(cap)));
  CHECK_CUDA(cudaDeviceSynchronize());
  const kc::PeerExchange pe =
      kc::peerExchangeView({exchange.get()}, ranks, 0, cap, true);
  DeviceArray<float> dx(normals(rng, cols + experts, 1.0)),
      dres(normals(rng, cols, 1.0)), dw(normals(rng, cols, 1.0, 1.0)),
      db(normals(rng, experts, 0.1)), dout(static_cast<size_t>(cols)),
      dy(static_cast<size_t>(cols)), dl(static_cast<size_t>(experts)),
      w1(static_cast<size_t>(topK)), w2(static_cast<size_t>(topK));
  DeviceArray<int32_t> ids1(static_cast<size_t>(topK)),
      ids2(static_cast<size_t>(topK));
  const kc::RouterChoice choice =
      sigmoidChoice(db.get(), topK, ids1.get(), w1.get());
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const float eps = 1e-5f;
  auto reduce = [&](cudaStream_t s, const kc::RouterChoice *c) {
    return kc::launchAllReducePeers(pe, dx.get(), 1, cols, true, dres.get(),
                                    dw.get(), eps, dout.get(), dy.get(), {}, s,
                                    experts, dl.get(), c);
  };
  const double alone =
      timeInGraph(
          stream, [&](cudaStream_t s) { return reduce(s, nullptr); },
          kChain);
  const double separate = timeInGraph(
      stream,
      [&](cudaStream_t s) {
        if (cudaError_t e = reduce(s, nullptr); e != cudaSuccess)
          return e;
        return kc::launchMoeChoose(dl.get(), experts, choice.bias, topK,
                                   choice.gating, choice.normalize,
                                   choice.routedScale, ids2.get(), w2.get(), s);
      },
      kChain);
  const double inside = timeInGraph(
      stream, [&](cudaStream_t s) { return reduce(s, &choice); }, kChain);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("bench choice: a link of the all-reduce (6144 + a tail of 256, "
              "8 ranks simulated) alone %.2f us\n",
              alone);
  std::printf("bench choice: the all-reduce, then moe_choose %.2f us (+%.2f "
              "us the choice)\n",
              separate, separate - alone);
  std::printf("bench choice: the all-reduce making the choice %.2f us (+%.2f "
              "us the choice)\n",
              inside, inside - alone);
  const double wrong = mismatches(ids1.download(), ids2.download()) +
                       mismatches(w1.download(), w2.download());
  std::printf("bench choice: ids and weights of the two ways %s\n",
              wrong == 0 ? "bit-identical" : "DIFFER");
  return wrong == 0 ? 0 : 1;
}

/// --bench-router: step.linear_router at GLM-5's tp = 8 attn_output shape
/// (q8_0-split [2048, 6144], a tail of 256 rows of 2,816 floats), in a
/// graph of 50 back to back, rotating over copies of the weight and of the
/// tail matrix that exceed the L2, against launchLinear alone; each way a
/// tail row reaches its block (RouterTailMode); and the kernels' registers.
void benchRouter() {
  constexpr int kRuns = 50;
  constexpr int64_t k = 2048, n = 6144, experts = 256, share = 768,
                    cols = k + share;
  constexpr uint64_t kRotateBytes = uint64_t(256) << 20;
  const uint64_t bytes = *kiln::rowBytes(GGMLType::Q8_0, uint64_t(k)) * n,
                 tailBytes = uint64_t(experts * cols) * sizeof(float);
  const uint64_t copies = (kRotateBytes + bytes - 1) / bytes;
  kiln::Rng rng(13);
  const WeightCopies w(GGMLType::Q8_0, n, k, copies, true, rng.next());
  DeviceArray<float> tails(size_t(copies * experts * cols)),
      x(normals(rng, k, 1.0)), res(normals(rng, n, 1.0)), y(size_t(n + experts));
  run(kc::launchFillRandomBlocks(GGMLType::F32,
                                 reinterpret_cast<uint8_t *>(tails.get()),
                                 copies * tailBytes, rng.next(), nullptr));
  int plain = 0, withTail = 0;
  run(kc::linearRouterKernelRegisters(plain, withTail));
  std::printf("bench router: q8_0-split kernel registers a thread: %d plain, "
              "%d with the tail\n",
              plain, withTail);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  uint64_t i = 0;
  const double alone = timeInGraph(
      stream,
      [&](cudaStream_t s) {
        return kc::launchLinear(x.get(), 1, w[i++ % copies], n, false, y.get(),
                                s);
      },
      kRuns);
  std::printf("bench router: attn_output q8_0-split 2048x6144 alone: %.2f "
              "us, %.1f GB/s\n",
              alone, double(bytes) / (alone * 1e3));
  for (auto [mode, name] :
       {std::pair{kc::RouterTailMode::Held, "held"},
        std::pair{kc::RouterTailMode::L2, "l2"},
        std::pair{kc::RouterTailMode::Last, "last"}}) {
    kc::setRouterTailMode(mode);
    i = 0;
    const double us = timeInGraph(
        stream,
        [&](cudaStream_t s) {
          const uint64_t c = i++ % copies;
          const kc::RouterTail t{tails.get() + c * experts * cols, experts,
                                 cols, k, res.get() + 3 * share,
                                 y.get() + n};
          return kc::launchLinearRouter(x.get(), w[c], t, y.get(), s);
        },
        kRuns);
    std::printf("bench router: linear_router, tail %-4s: %.2f us (+%.2f), "
                "%.1f GB/s\n",
                name, us, us - alone,
                double(bytes + tailBytes) / (us * 1e3));
  }
  kc::setRouterTailMode(kc::RouterTailMode::Held);
  CHECK_CUDA(cudaStreamDestroy(stream));
}

/// The q8_0-split mat-vecs of a GLM-5 tp=8 layer one after another, as a
/// step runs them (the q_a run, q_b, an attn_v_b-sized one, attn_output, the
/// shared expert's gate/up), rounds of them in one graph, rotating over
/// copies of the weights that exceed the L2: with the general kernel (one
/// image for every width) and with the kernels compiled for each width
/// (three images, each run once a round). Alone, each fixed-width kernel is
/// the faster (benchLinear); in a GLM-5 step they were slower (docs/perf.md,
/// sixteenth pass). This separates the kernels' own speed from their
/// images taking turns.
void benchQ8Mix() {
  struct Shape {
    int64_t k, n;
  };
  const Shape shapes[] = {
      {6144, 2752}, {2048, 2048}, {512, 2048}, {2048, 6144}, {6144, 512}};
  constexpr int kShapes = std::size(shapes);
  constexpr uint64_t kCopies = 4;
  constexpr int kRounds = 25;
  kiln::Rng rng(11);
  std::vector<WeightCopies> weights;
  std::vector<DeviceArray<float>> xs, ys;
  for (const Shape &sh : shapes) {
    weights.emplace_back(GGMLType::Q8_0, sh.n, sh.k, kCopies, true,
                         rng.next());
    xs.emplace_back(normals(rng, sh.k, 1.0));
    ys.emplace_back(sh.n);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const bool fixedWidths : {false, true}) {
    uint64_t ran = 0;
    int round = 0;
    const double us = timeInGraph(
        stream,
        [&](cudaStream_t st) {
          const FixedShapes scope(fixedWidths);
          const uint64_t copy = uint64_t(round++) % kCopies;
          for (int i = 0; i < kShapes; ++i)
            if (cudaError_t e = kc::launchLinear(
                    xs[i].get(), 1, weights[i][copy], shapes[i].n,
                    false, ys[i].get(), st);
                e != cudaSuccess)
              return e;
          ran += scope.ran();
          return cudaSuccess;
        },
        kRounds);
    std::printf("bench q8_0-split, a layer's %d widths in turn (%s): %.2f us "
                "a round, %.2f us a mat-vec%s\n",
                kShapes,
                fixedWidths ? "the kernels compiled for each width"
                            : "the general kernel",
                us, us / kShapes,
                fixedWidths && ran != uint64_t(kShapes) * kRounds
                    ? " (some fixed-width kernels did not run)"
                    : "");
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
}

/// The routed experts of a GLM-5 tp=8 rank (Q4_K gate/up [6144, 256, 256],
/// Q5_K down [256, 6144, 256], 8 chosen of 256), timed in a graph two ways:
/// the same 8 experts every launch (their 22.8 MB stay in the L2), and
/// rotating over 32 disjoint sets of 8 (730 MB in all, so every launch
/// reads its experts from memory, as a decode step does).
/// What --bench-moe's mode runs: 0 the general kernels, 1 those compiled
/// for GLM-5's shapes, 2 those with the int8-x probe's gate/up kernel.
const char *moeBenchKernels(int mode) {
  return mode == 2 ? ", int8 x" : mode == 1 ? ", fixed shapes" : "";
}

void benchMoe() {
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kiln::Rng rng(13);
  Fault fault;
  const int64_t experts = 256, ffn = 256, hidden = 6144, k = 8, sets = 32;
  const uint64_t upBytes =
      *kiln::rowBytes(GGMLType::Q4_K, hidden) * ffn * experts;
  const uint64_t downBytes =
      *kiln::rowBytes(GGMLType::Q5_K, ffn) * hidden * experts;
  DeviceArray<uint8_t> gw(upBytes), uw(upBytes), dw(downBytes);
  for (auto [p, t, b] : {std::tuple{gw.get(), GGMLType::Q4_K, upBytes},
                         std::tuple{uw.get(), GGMLType::Q4_K, upBytes},
                         std::tuple{dw.get(), GGMLType::Q5_K, downBytes}})
    CHECK_CUDA(kc::launchFillRandomBlocks(t, p, b, 3, stream));
  // Set s holds experts s, s + 32, ..., s + 224 in a shuffled order.
  std::vector<int32_t> ids(size_t(sets * k));
  for (int64_t s = 0; s < sets; ++s)
    for (int64_t j = 0; j < k; ++j)
      ids[size_t(s * k + j)] = int32_t(s + sets * ((j * 5 + s) % k));
  DeviceArray<int32_t> dids(ids);
  DeviceArray<float> x(normals(rng, hidden, 1.0)),
      rw(normals(rng, k, 0.3, 0.5)), act(k * ffn), xo(hidden);
  kc::DeviceWeight gd{GGMLType::Q4_K, ffn * experts, hidden, gw.get()};
  kc::DeviceWeight ud{GGMLType::Q4_K, ffn * experts, hidden, uw.get()};
  kc::DeviceWeight dd{GGMLType::Q5_K, hidden * experts, ffn, dw.get()};
  const double moeBytes =
      double(k) * (2.0 * double(upBytes) + double(downBytes)) / double(experts);
  // With the shared expert's output added in the down kernel, as GLM-5's
  // step runs it (kiln-fuse-expert-add); then the same with the kernels
  // compiled for GLM-5's shapes (KILN_CUDA_SPECIALISED=1).
  // Last, the int8-x probe's gate/up kernel (KILN_CUDA_EXPERTS_INT8_X=1).
  DeviceArray<float> shared(normals(rng, hidden, 1.0));
  // The experts of the 32 disjoint sets in turn, from memory, the shared
  // expert's output added: the time of one call.
  const auto coldMoe = [&](const kc::DeviceWeight &g, const kc::DeviceWeight &u,
                           const kc::DeviceWeight &d) {
    int64_t call = 0;
    return timeInGraph(stream, [&](cudaStream_t s) {
      const int32_t *set = dids.get() + (call++ % sets) * k;
      return kc::launchMoeExperts(x.get(), hidden, ffn, experts, set, rw.get(),
                                  k, g, &u, d, act.get(), shared.get(),
                                  xo.get(), fault.sink(), s);
    });
  };
  for (int mode : {0, 1, 2}) {
    const bool fixed = mode > 0;
    const FixedShapes scope(fixed);
    const ExpertsInt8X int8(mode == 2);
    const char *kernels = moeBenchKernels(mode);
    const double warmUs = timeInGraph(stream, [&](cudaStream_t s) {
      return kc::launchMoeExperts(x.get(), hidden, ffn, experts, dids.get(),
                                  rw.get(), k, gd, &ud, dd, act.get(),
                                  shared.get(), xo.get(), fault.sink(), s);
    });
    std::printf("bench op moe_experts Q4_K/Q5_K 6144x256, 8 of 256%-14s "
                "%9.2f us, %.1f GB/s (the chosen experts' bytes, L2-warm: one "
                "set of 8)\n",
                kernels, warmUs, moeBytes / (warmUs * 1e3));
    const double coldUs = coldMoe(gd, ud, dd);
    std::printf("bench op moe_experts Q4_K/Q5_K 6144x256, 8 of 256%-14s "
                "%9.2f us, %.1f GB/s (from memory: 32 disjoint sets of 8 in "
                "turn)\n",
                kernels, coldUs, moeBytes / (coldUs * 1e3));
    if (fixed && scope.ran() == 0)
      std::printf("bench op moe_experts: the fixed-shape kernels did not run\n");
    if (mode == 2 && int8.ran() == 0)
      std::printf("bench op moe_experts: the int8-x kernel did not run\n");
  }
  // The 2-bit mix's experts (Q2_K gate/up, Q3_K down; kiln-gguf synth --mix
  // ud-q2_k_xl) in the bulk-copy kernels, general and fixed shapes.
  {
    const uint64_t lowUp = *kiln::rowBytes(GGMLType::Q2_K, hidden) * ffn *
                           experts,
                   lowDown =
                       *kiln::rowBytes(GGMLType::Q3_K, ffn) * hidden * experts;
    DeviceArray<uint8_t> lg(lowUp), lu(lowUp), ld(lowDown);
    for (auto [p, t, b] : {std::tuple{lg.get(), GGMLType::Q2_K, lowUp},
                           std::tuple{lu.get(), GGMLType::Q2_K, lowUp},
                           std::tuple{ld.get(), GGMLType::Q3_K, lowDown}})
      CHECK_CUDA(kc::launchFillRandomBlocks(t, p, b, 5, stream));
    kc::DeviceWeight lgd{GGMLType::Q2_K, ffn * experts, hidden, lg.get()};
    kc::DeviceWeight lud{GGMLType::Q2_K, ffn * experts, hidden, lu.get()};
    kc::DeviceWeight ldd{GGMLType::Q3_K, hidden * experts, ffn, ld.get()};
    const double lowBytes = double(k) *
                            (2.0 * double(lowUp) + double(lowDown)) /
                            double(experts);
    for (int mode : {0, 1}) {
      const FixedShapes scope(mode == 1);
      const uint64_t bulkBefore = kc::moeBulkLaunches();
      const double us = coldMoe(lgd, lud, ldd);
      std::printf("bench op moe_experts Q2_K/Q3_K 6144x256, 8 of 256%-14s "
                  "%9.2f us, %.1f GB/s (from memory: 32 disjoint sets of 8 "
                  "in turn)\n",
                  moeBenchKernels(mode), us, lowBytes / (us * 1e3));
      if (kc::moeBulkLaunches() == bulkBefore)
        std::printf("bench op moe_experts: the Q2_K/Q3_K bulk-copy kernels "
                    "did not run\n");
      if (mode == 1 && scope.ran() == 0)
        std::printf(
            "bench op moe_experts: the fixed-shape kernels did not run\n");
    }
  }
  // The shared expert inside (kiln-fuse-shared-expert): its gate, up and
  // down (Q8_0 in the split layout, 256 rows at tp=8) as a ninth expert of
  // weight 1, in place of the addend.
  const int64_t sffn = 256;
  const uint64_t sharedBlocks = uint64_t(sffn * hidden / 32);
  std::vector<DeviceArray<uint8_t>> file, planes;
  std::vector<kc::DeviceWeight> sharedWeights;
  for (auto [rows, cols] : {std::pair{sffn, hidden}, std::pair{sffn, hidden},
                            std::pair{hidden, sffn}}) {
    file.emplace_back(sharedBlocks * 34);
    planes.emplace_back(sharedBlocks * 34 + 512);
    CHECK_CUDA(kc::launchFillRandomBlocks(GGMLType::Q8_0, file.back().get(),
                                          sharedBlocks * 34, 5, stream));
    uint8_t *q = planes.back().get(),
            *d = q + (sharedBlocks * 32 + 255) / 256 * 256;
    CHECK_CUDA(kc::launchRepackQ8Split(file.back().get(), rows, cols, q, d,
                                       stream));
    kc::DeviceWeight w{GGMLType::Q8_0, rows, cols, q,
                       kc::WeightLayout::Q8Split};
    w.scales = d;
    sharedWeights.push_back(w);
  }
  const kc::SharedExpert sharedExpert{sharedWeights[0], sharedWeights[1],
                                      sharedWeights[2]};
  DeviceArray<float> sharedAct(
      kc::moeExpertsActFloats(k, ffn, hidden, &sharedExpert));
  const double sharedBytes = double(3 * sharedBlocks * 34);
  for (int mode : {0, 1, 2}) {
    const bool fixed = mode > 0;
    const FixedShapes scope(fixed);
    const ExpertsInt8X int8(mode == 2);
    const char *kernels = moeBenchKernels(mode);
    int64_t call = 0;
    const double coldUs = timeInGraph(stream, [&](cudaStream_t s) {
      const int32_t *set = dids.get() + (call++ % sets) * k;
      return kc::launchMoeExperts(x.get(), hidden, ffn, experts, set, rw.get(),
                                  k, gd, &ud, dd, sharedAct.get(), nullptr,
                                  xo.get(), fault.sink(), s, &sharedExpert);
    });
    std::printf("bench op moe_experts Q4_K/Q5_K 6144x256, 8 of 256 + shared "
                "Q8_0 %s%-14s %9.2f us, %.1f GB/s (from memory: 32 disjoint "
                "sets of 8 in turn)\n",
                kc::moeSharedInsideLaunches() > 0 ? "inside" : "apart",
                kernels, coldUs,
                (moeBytes + sharedBytes) / (coldUs * 1e3));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
}


//===----------------------------------------------------------------------===//
// --bench-chain: 40 dependent q8_0-split mat-vecs (6144 -> 2048, 2048 ->
// 6144 in turn, 13.4 MB each, each op's output the next op's input) timed
// two ways: as the step runs them (launchLinear's kernels in a graph), and
// as one persistent kernel of one block a multiprocessor. There each block
// owns a fixed share of every op's rows: while it computes op l, its rows
// of op l + 1 are already being bulk-copied into its shared memory (two
// buffers), and it waits for op l's input by a count that every block
// raises once its rows of op l - 1 are written, not by a kernel boundary.
// This measures the design (docs/perf.md, thirteenth and fourteenth
// passes), with three kinds of dots: none (copies, counts and writes
// only), f32 x (checked against the kernels' outputs), and int8 x with
// dp4a (one fixed x vector for every op: timing only, its outputs are not
// the chain's); and three probes that take the f32 chain's time apart:
// its dots without the wait, the wait and x without the dots, and the
// count alone (no copies).
//===----------------------------------------------------------------------===//

namespace chain {

using kc::kWarp;
constexpr int kWarps = 16, kThreads = kWarps * kWarp;
/// Rows of a block's share: 6144 -> 2048 gives at most 16 rows of 6144
/// bytes, 2048 -> 6144 47 of 2048; with their Q8_0 scales.
constexpr uint32_t kBuffer = 16 * 6144 + 16 * 6144 / 16;
constexpr int kMaxRows = 48;
/// Rows a warp dots together.
constexpr int kGroup = 8;
/// Ops a chain: the kernel keeps their table in shared memory.
constexpr int kMaxOps = 64;

/// F32NoWait (f32 dots, no wait for the input) and XOnly (the wait and the
/// loads of x, no dots) are probes: timing only.
enum class Dots { None, F32, Int8, F32NoWait, XOnly };

struct Op {
  const int8_t *quants;  ///< q8_0-split plane 0: rows x cols
  const uint8_t *scales; ///< plane 1: rows x cols / 32 f16
  int rows, cols;
  const float *x;
  float *y;
};

struct Args {
  const Op *ops;
  int count;
  unsigned *counts; ///< per op: blocks that have written their rows
  Dots dots;
  const int8_t *xq; ///< Dots::Int8: the x every op reads, and its
  const float *xd;  ///< scales (one per 32 values)
  bool copies;      ///< false: no weight copies (the count alone)
};

/// A block's share of an op's rows: [first, first + n).
__device__ inline int shareOf(const Op &o, int &first) {
  const int per = (o.rows + int(gridDim.x) - 1) / int(gridDim.x);
  first = int(blockIdx.x) * per;
  return max(0, min(per, o.rows - first));
}

/// The dots of a block's n rows (kCols values each, in shared memory:
/// quants q, f16 scales d), split over the block's warps by columns: warp
/// w takes columns [w kCols / kWarps, (w + 1) kCols / kWarps), four a lane
/// a pass, and kGroup rows at a time; each warp's row sums go to partial.
template <Dots kDots, int kCols>
__device__ inline void dots(const Args &a, const int8_t *q,
                            const unsigned short *d, const float *x, int n,
                            float (&partial)[kWarps][kMaxRows]) {
  constexpr int kSpan = kCols / kWarps, kPasses = kSpan / (4 * kWarp);
  static_assert(kSpan % (4 * kWarp) == 0, "whole passes a warp");
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int first = warp * kSpan;
  // Rows a group: more where a row is one pass (more loads in flight
  // before the sums), within the registers where it is three.
  constexpr int kRowsAGroup = kPasses == 1 ? 2 * kGroup : kGroup;
  constexpr int kLanesARow = kWarp / kRowsAGroup;
  float4 xf4[kPasses];
  int xw[kPasses];
  float xs[kPasses];
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int c = first + 4 * kWarp * p + 4 * lane;
    if constexpr (kDots == Dots::F32 || kDots == Dots::XOnly) {
      xf4[p] = __ldcg(reinterpret_cast<const float4 *>(x + c));
    } else {
      xw[p] = __ldcg(reinterpret_cast<const int *>(a.xq + c));
      xs[p] = __ldcg(a.xd + c / 32);
    }
  }
  if constexpr (kDots == Dots::XOnly) { // a use of x, in every row
    float t = 0.f;
#pragma unroll
    for (int p = 0; p < kPasses; ++p)
      t += xf4[p].x + xf4[p].y + xf4[p].z + xf4[p].w;
    for (int r = lane; r < n; r += kWarp)
      partial[warp][r] = t;
    return;
  }
  // Rows past n in the last group read other bytes of the buffer (its
  // scales, or the rest of it); their sums are never written.
  const int8_t *qLane = q + first + 4 * lane;
  const unsigned short *dLane = d + (first + 4 * lane) / 32;
  for (int g = 0; g < n; g += kRowsAGroup) {
    uint32_t w[kRowsAGroup][kPasses];
    unsigned short s[kRowsAGroup][kPasses];
    const int8_t *qg = qLane + g * kCols;
    const unsigned short *dg = dLane + g * (kCols / 32);
#pragma unroll
    for (int u = 0; u < kRowsAGroup; ++u)
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        w[u][p] = *reinterpret_cast<const uint32_t *>(qg + u * kCols +
                                                      4 * kWarp * p);
        s[u][p] = dg[u * (kCols / 32) + kWarp / 8 * p];
      }
    float acc[kRowsAGroup] = {};
#pragma unroll
    for (int u = 0; u < kRowsAGroup; ++u)
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const float scale = kc::quantdot::halfBits(s[u][p]);
        constexpr float kBias = kc::quantdot::kMagic + 128.f;
        if constexpr (kDots != Dots::Int8)
          acc[u] = fmaf(
              scale, kc::quantdot::dot4(w[u][p] ^ 0x80808080u, kBias, xf4[p]),
              acc[u]);
        else
          acc[u] = fmaf(scale * xs[p], float(__dp4a(int(w[u][p]), xw[p], 0)),
                        acc[u]);
      }
    // Lane l ends with row g + l / kLanesARow's sum over the warp's
    // columns.
    const float total =
        kc::quantdot::spreadSums<kRowsAGroup, kWarp / 2>(acc, lane);
    if (lane % kLanesARow == 0 && g + lane / kLanesARow < n)
      partial[warp][g + lane / kLanesARow] = total;
  }
}

__global__ void __launch_bounds__(kThreads, 1) chainKernel(Args a) {
  extern __shared__ __align__(128) uint8_t shared[];
  __shared__ float partial[kWarps][kMaxRows];
  __shared__ Op table[kMaxOps]; // the ops, read once from global
  for (int i = threadIdx.x; i < a.count; i += blockDim.x)
    table[i] = a.ops[i];
  __syncthreads();
  uint64_t *bars = reinterpret_cast<uint64_t *>(shared);
  auto buffer = [&](int l) { return shared + 128 + (l & 1) * kBuffer; };
  // Thread 0: op l's rows of this block into buffer l % 2.
  auto copy = [&](int l) {
    const Op &o = table[l];
    int first = 0;
    const int n = shareOf(o, first);
    const uint32_t quantBytes = uint32_t(n) * uint32_t(o.cols),
                   scaleBytes = uint32_t(n) * uint32_t(o.cols / 16);
    uint64_t *bar = &bars[l & 1];
    if (!a.copies) {
      kc::barrierArriveExpect(bar, 0);
      return;
    }
    kc::barrierArriveExpect(bar, quantBytes + scaleBytes);
    if (n > 0) {
      kc::bulkCopy(buffer(l), o.quants + size_t(first) * o.cols, quantBytes,
                   bar);
      kc::bulkCopy(buffer(l) + quantBytes,
                   o.scales + size_t(first) * (o.cols / 16), scaleBytes, bar);
    }
  };
  if (threadIdx.x == 0) {
    kc::barrierInit(&bars[0]);
    kc::barrierInit(&bars[1]);
    kc::barrierInitFence();
    copy(0);
  }
  __syncthreads();
  for (int l = 0; l < a.count; ++l) {
    const Op o = table[l];
    if (threadIdx.x == 0) {
      if (l + 1 < a.count) // buffer (l + 1) % 2 was op l - 1's: done
        copy(l + 1);
      // Op l's input: every block's rows of op l - 1.
      while (l > 0 && a.dots != Dots::F32NoWait) {
        unsigned now;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                     : "=r"(now)
                     : "l"(a.counts + l - 1)
                     : "memory");
        if (now >= gridDim.x)
          break;
        __nanosleep(20);
      }
    }
    __syncthreads();
    kc::barrierWait(&bars[l & 1], uint32_t((l >> 1) & 1));
    int first = 0;
    const int n = shareOf(o, first);
    const int8_t *q = reinterpret_cast<const int8_t *>(buffer(l));
    const unsigned short *d = reinterpret_cast<const unsigned short *>(
        buffer(l) + size_t(n) * o.cols);
    if (a.dots == Dots::None) {
      if (int(threadIdx.x) < n)
        o.y[first + threadIdx.x] = 0.f;
    } else {
      if (a.dots == Dots::XOnly)
        o.cols == 6144 ? dots<Dots::XOnly, 6144>(a, q, d, o.x, n, partial)
                       : dots<Dots::XOnly, 2048>(a, q, d, o.x, n, partial);
      else if (a.dots == Dots::F32 || a.dots == Dots::F32NoWait)
        o.cols == 6144 ? dots<Dots::F32, 6144>(a, q, d, o.x, n, partial)
                       : dots<Dots::F32, 2048>(a, q, d, o.x, n, partial);
      else
        o.cols == 6144 ? dots<Dots::Int8, 6144>(a, q, d, o.x, n, partial)
                       : dots<Dots::Int8, 2048>(a, q, d, o.x, n, partial);
      __syncthreads();
      if (int(threadIdx.x) < n) {
        float part[4] = {};
#pragma unroll
        for (int w = 0; w < kWarps; ++w)
          part[w % 4] += partial[w][threadIdx.x];
        const float sum = (part[0] + part[1]) + (part[2] + part[3]);
        o.y[first + threadIdx.x] = sum;
      }
    }
    // The block's rows are written (ordered before thread 0's release by
    // the barrier), and its buffer l % 2 is free for op l + 2.
    __syncthreads();
    if (threadIdx.x == 0)
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(a.counts +
                                                                   l)
                   : "memory");
  }
}

} // namespace chain

/// False where the f32 chain's outputs differ from the kernels'.
bool benchChain() {
  using namespace chain;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kiln::Rng rng(21);
  constexpr int kCount = 40;
  static_assert(kCount <= kMaxOps, "the kernel keeps the ops in shared memory");
  std::vector<SplitWeight> planes; // the weights' split layouts, kept alive
  std::vector<DeviceArray<float>> acts;
  std::vector<kc::DeviceWeight> weights;
  acts.emplace_back(normals(rng, 6144, 1.0));
  double bytes = 0;
  for (int l = 0; l < kCount; ++l) {
    const int64_t cols = l % 2 == 0 ? 6144 : 2048, rows = 8192 * 1536 / cols;
    const Weight file = randomWeight(GGMLType::Q8_0, {cols, rows}, 100 + l);
    planes.push_back(repackSplit(file));
    weights.push_back(planes.back().dev(file));
    acts.emplace_back(std::vector<float>(size_t(rows), 0.f));
    bytes += double(file.device.size());
  }
  std::vector<Op> ops;
  for (int l = 0; l < kCount; ++l)
    ops.push_back(Op{reinterpret_cast<const int8_t *>(weights[l].plane(0)),
                     weights[l].plane(1), int(weights[l].rows),
                     int(weights[l].cols), acts[l].get(), acts[l + 1].get()});
  DeviceArray<Op> deviceOps(ops);
  // The probes' L2-resident chain: the first two ops' weights (26.8 MB)
  // over and over, so that its copies come from the L2, not the DRAM.
  std::vector<Op> l2Ops = ops;
  for (int l = 2; l < kCount; ++l) {
    l2Ops[l].quants = ops[l % 2].quants;
    l2Ops[l].scales = ops[l % 2].scales;
  }
  DeviceArray<Op> deviceL2Ops(l2Ops);
  DeviceArray<unsigned> counts(std::vector<unsigned>(kCount, 0u));
  std::vector<int8_t> xq(6144);
  for (int8_t &v : xq)
    v = int8_t(int(rng.next() % 255) - 127);
  DeviceArray<int8_t> deviceXq(xq);
  DeviceArray<float> deviceXd(std::vector<float>(6144 / 32, 0.01f));

  const double kernelsUs = timeInGraph(stream, [&](cudaStream_t s) {
    cudaError_t e = cudaSuccess;
    for (int l = 0; l < kCount && e == cudaSuccess; ++l)
      e = kc::launchLinear(acts[l].get(), 1, weights[l], weights[l].rows,
                           false, acts[l + 1].get(), s);
    return e;
  });
  // The first two ops' outputs, for the check of the f32 chain below (the
  // later ones grow past f32's range: 40 random mat-vecs in a row).
  const std::vector<float> want1 = acts[1].download(),
                           want2 = acts[2].download();
  int processors = 0, major = 0, sharedOptin = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&processors,
                                    cudaDevAttrMultiProcessorCount, 0));
  CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                    0));
  CHECK_CUDA(cudaDeviceGetAttribute(
      &sharedOptin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  const size_t sharedBytes = 128 + 2 * size_t(kBuffer);
  // The persistent kernel needs bulk copies (sm_90+), its two buffers in
  // one block's shared memory, each block's share of every op within a
  // buffer (so enough multiprocessors: 128 or more), and every block
  // resident at once (one a multiprocessor, nothing else on the GPU), as
  // its blocks wait for each other.
  bool sharesFit = processors > 0;
  for (const Op &o : ops) {
    const int64_t per = (o.rows + processors - 1) / std::max(processors, 1);
    sharesFit = sharesFit && per <= kMaxRows &&
                per * o.cols + per * (o.cols / 16) <= int64_t(kBuffer);
  }
  if (major < 9 || !sharesFit ||
      size_t(sharedOptin) < sharedBytes + sizeof(float) * kWarps * kMaxRows +
                                sizeof(Op) * kMaxOps) {
    std::printf("bench chain: kernels in a graph %.2f us an op; the persistent "
                "kernel needs sm_90+, 128 or more multiprocessors and %zu "
                "bytes of shared memory a block (this GPU: sm_%d0, %d, %d): "
                "skipped\n",
                kernelsUs / kCount, sharedBytes, major, processors,
                sharedOptin);
    CHECK_CUDA(cudaStreamDestroy(stream));
    return true;
  }
  CHECK_CUDA(cudaFuncSetAttribute(
      chainKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
      int(sharedBytes)));
  auto persistent = [&](Dots kind, bool copies = true, bool l2 = false) {
    const Op *table = l2 ? deviceL2Ops.get() : deviceOps.get();
    const Args args{table,          kCount,         counts.get(), kind,
                    deviceXq.get(), deviceXd.get(), copies};
    return timeInGraph(stream, [&](cudaStream_t s) {
      if (cudaError_t e =
              cudaMemsetAsync(counts.get(), 0, kCount * sizeof(unsigned), s);
          e != cudaSuccess)
        return e;
      chainKernel<<<processors, kThreads, sharedBytes, s>>>(args);
      return cudaGetLastError();
    });
  };
  const double noneUs = persistent(Dots::None);
  const double f32Us = persistent(Dots::F32);
  double worst = 0, scale = 0;
  for (const auto &[want, got] :
       {std::pair{&want1, acts[1].download()},
        std::pair{&want2, acts[2].download()}})
    for (size_t i = 0; i < want->size(); ++i) {
      worst = std::max(worst, double(std::fabs((*want)[i] - got[i])));
      scale = std::max(scale, double(std::fabs((*want)[i])));
    }
  const double int8Us = persistent(Dots::Int8);
  const double noWaitUs = persistent(Dots::F32NoWait);
  const double xOnlyUs = persistent(Dots::XOnly);
  const double countUs = persistent(Dots::None, false);
  const double xNoCopiesUs = persistent(Dots::XOnly, false);
  const double l2NoneUs = persistent(Dots::None, true, true);
  const double l2XUs = persistent(Dots::XOnly, true, true);
  const double l2NoWaitUs = persistent(Dots::F32NoWait, true, true);
  const double l2F32Us = persistent(Dots::F32, true, true);
  auto line = [&](const char *what, double us) {
    std::printf("bench chain %-46s %6.2f us an op, %6.1f GB/s\n", what,
                us / kCount, bytes / kCount / (us / kCount * 1e3));
  };
  std::printf("bench chain: %d dependent q8_0-split mat-vecs, %.0f MB\n",
              kCount, bytes / 1e6);
  line("kernels in a graph (launchLinear)", kernelsUs);
  line("persistent, no dots (copies, counts, writes)", noneUs);
  line("persistent, f32 dots", f32Us);
  line("persistent, int8 x and dp4a (timing only)", int8Us);
  line("probe: f32 dots, no wait (timing only)", noWaitUs);
  line("probe: wait and x, no dots (timing only)", xOnlyUs);
  std::printf("bench chain %-46s %6.2f us an op\n",
              "probe: the count alone (no copies, no dots)", countUs / kCount);
  std::printf("bench chain %-46s %6.2f us an op\n",
              "probe: the count and x (no copies, no dots)",
              xNoCopiesUs / kCount);
  std::printf("bench chain probe: two ops' weights over and over (from the "
              "L2): no dots %.2f, wait and x %.2f, f32 no wait %.2f, f32 "
              "%.2f us an op\n",
              l2NoneUs / kCount, l2XUs / kCount, l2NoWaitUs / kCount,
              l2F32Us / kCount);
  // The same products summed in another order: 6,144 terms in f32 differ
  // by far less than 1e-5 of the largest value (2e-7 measured); a wrong
  // row, scale or x is off by the value's own size.
  const bool agrees = worst <= 1e-5 * scale;
  std::printf("bench chain check: the f32 chain's first two outputs within "
              "%.2g of the kernels' (largest |value| %.3g; sums in another "
              "order; tolerance 1e-5 of it): %s\n",
              worst, scale, agrees ? "ok" : "FAILED");
  CHECK_CUDA(cudaStreamDestroy(stream));
  return agrees;
}

/// GLM-5's indexer at a tp=8 rank (32 heads of 128, the query's rope, as
/// the step runs it) at 16k positions: the top 2,048 of 16,384, in a
/// graph, then `eager` launches outside one, each waited for (what a kernel
/// profiler attributes one by one).
void benchDsa(int eager) {
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kiln::Rng rng(17);
  Fault fault;
  constexpr int64_t kLong = 16384;
  DeviceArray<uint16_t> keys(kLong * 128);
  kc::DeviceCache cache{keys.get(), kc::CacheType::F16, kLong, 128};
  CHECK_CUDA(kc::launchFillRandomCache(cache, 9, stream));
  DeviceArray<float> q(normals(rng, 32 * 128, 1.0)), hw(normals(rng, 32, 1.0)),
      scores(kLong);
  DeviceArray<int32_t> last(std::vector<int32_t>{int32_t(kLong - 1)}),
      at4k(std::vector<int32_t>{4095}), chosen(2048), count(1);
  // On `cache` into `scores` unless another cache and its scores are given.
  auto launchAt = [&](const int32_t *position, kc::IndexerSelect select,
                      int64_t ropeDims = 64, const kc::DeviceCache *on = nullptr,
                      float *into = nullptr) {
    const kc::DeviceCache keysOf = on ? *on : cache;
    float *scoresOf = into ? into : scores.get();
    return [&, position, select, ropeDims, keysOf, scoresOf](cudaStream_t s) {
      return kc::launchDsaIndexer(
          q.get(), 32, 128, hw.get(), keysOf, position, 2048, 0.1f, scoresOf,
          chosen.get(), count.get(), fault.sink(), s,
          kc::QueryRope{kc::RopeStyle::Interleaved, 1e6f, 0, ropeDims},
          kc::kMaxStagedKeyBytes, select);
    };
  };
  const auto launch = launchAt(last.get(), {});
  // The selection at 16,384 of the 16,384-position cache (by the cluster)
  // and at 4,096 (by one block), the default's and as before the
  // seventeenth pass (KILN_CUDA_CLUSTER_SELECT=1: the cluster, four passes).
  // The scores on the tensor cores (the default) and without them; and
  // probes of the scores' fixed cost: without the query's rope, and at
  // 2,049 positions (one more than the top k).
  DeviceArray<int32_t> at2k(std::vector<int32_t>{2048});
  const struct {
    const int32_t *position;
    kc::IndexerSelect select;
    const char *what;
    bool mma = true;
    int64_t ropeDims = 64;
  } rows[] = {{at4k.get(), {}, "at 4096, no rope", true, 0},
              {at2k.get(), {}, "at 2048, rope"},
              {at4k.get(), {}, "at 4096, no rope, no tensor cores", false, 0},
              {at2k.get(), {}, "at 2048, rope, no tensor cores", false},
              {last.get(), {}, "at 16384, rope"},
              {last.get(), {}, "at 16384, rope, no tensor cores", false},
              {last.get(), kc::kClusterSelect, "at 16384, rope, as before"},
              {at4k.get(), {}, "at 4096, rope"},
              {at4k.get(), {}, "at 4096, rope, no tensor cores", false},
              {at4k.get(), kc::kClusterSelect, "at 4096, rope, as before"}};
  // Long contexts: a cache of 131,072 positions, selected at 32,768 and at
  // its last (the cluster, 4,096 and 16,384 keys a block).
  constexpr int64_t kLonger = 131072;
  DeviceArray<uint16_t> longKeys(kLonger * 128);
  kc::DeviceCache longCache{longKeys.get(), kc::CacheType::F16, kLonger, 128};
  CHECK_CUDA(kc::launchFillRandomCache(longCache, 10, stream));
  DeviceArray<float> longScores(kLonger);
  // Each by a cluster of 16 blocks (KILN_CUDA_SELECT_BLOCKS=16) and by the
  // default's 8.
  for (const int64_t attended : {int64_t(32768), kLonger})
    for (const int blocks : {16, 8}) {
      DeviceArray<int32_t> position(
          std::vector<int32_t>{int32_t(attended - 1)});
      kc::IndexerSelect select;
      select.clusterBlocks = blocks;
      std::printf("bench op %-52s %9.2f us\n",
                  fmtText("dsa_indexer 32x128, top 2048 at %lld, rope, %d "
                          "blocks",
                          (long long)attended, blocks)
                      .c_str(),
                  timeInGraph(stream, launchAt(position.get(), select, 64,
                                               &longCache, longScores.get())));
    }
  for (const auto &row : rows) {
    std::optional<IndexerMmaOff> mmaOff;
    if (!row.mma)
      mmaOff.emplace();
    std::printf(
        "bench op %-52s %9.2f us\n",
        fmtText("dsa_indexer 32x128, top 2048 %s", row.what).c_str(),
        timeInGraph(stream, launchAt(row.position, row.select, row.ropeDims)));
  }
  for (int i = 0; i < eager; ++i) {
    CHECK_CUDA(launch(stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
}

/// The non-mat-vec ops of a GLM-5 decode step at tp=8 shapes (8 local
/// heads, context 1024 of a 2048-position f16 cache), each timed in a graph.
//===----------------------------------------------------------------------===//
// --bench: kernel images taking turns
//===----------------------------------------------------------------------===//

/// Probes of ~8 KB of code each (16 bytes an instruction, about a mat-vec
/// kernel's size), kProbeFmas dependent multiply-adds in all whose constants
/// depend on kImage, so that each instance is an image of its own. Straight
/// (kBranching false): one run of code, as the instruction prefetch likes
/// it. Branching: kProbeBlocks blocks of the multiply-adds, run in the
/// order `order` gives (a permutation read from memory, so the compiler
/// cannot lay them out in it): each block is reached by a jump into code
/// not run just before, as a kernel's peeled pass, loop and reduction are.
/// Launched as the step launches (programmatic: waits for its predecessor,
/// then lets the next start). The result is kept only behind a test that
/// never holds, so nothing is written.
constexpr int kProbeFmas = 512;
constexpr int kProbeBlocks = 16;
constexpr int kProbeImages = 32;

template <int kImage, int kBlock>
__device__ __forceinline__ float probeBlock(float v) {
#pragma unroll
  for (int i = 0; i < kProbeFmas / kProbeBlocks; ++i)
    v = fmaf(v,
             1.f + float((kImage * kProbeBlocks + kBlock) * 64 + i) * 1e-9f,
             0.25f);
  return v;
}

template <int kImage, int... kBlocks>
__device__ __forceinline__ float probeBlockOf(int b, float v,
                                              std::integer_sequence<int,
                                                                    kBlocks...>) {
  ((b == kBlocks ? (v = probeBlock<kImage, kBlocks>(v), 0) : 0), ...);
  return v;
}

template <int kImage, bool kBranching>
__global__ void __launch_bounds__(256)
    imageProbeKernel(const int *order, const float *x, float *y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  float v = x[threadIdx.x];
  if constexpr (kBranching) {
#pragma unroll 1
    for (int i = 0; i < kProbeBlocks; ++i)
      v = probeBlockOf<kImage>(order[i], v,
                               std::make_integer_sequence<int, kProbeBlocks>{});
  } else {
#pragma unroll
    for (int i = 0; i < kProbeFmas; ++i)
      v = fmaf(v, 1.f + float(kImage * kProbeFmas + i) * 1e-9f, 0.25f);
  }
  if (v == 12345.f)
    y[blockIdx.x] = v;
}

using ProbeKernel = void (*)(const int *, const float *, float *);

/// Reads `words` 16-byte words as the step's mat-vecs read their weights
/// (non-coherent, not kept in L1), with the L2's normal eviction priority
/// or, kEvictFirst, marked first to go (`createpolicy` evict_first): a
/// stand-in for a layer's weight stream between two probes. The sum is kept
/// only behind a test that never holds.
template <bool kEvictFirst>
__global__ void __launch_bounds__(256)
    streamReadKernel(const uint4 *data, uint64_t words, float *y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  uint32_t acc = 0;
  uint64_t policy = 0;
  if constexpr (kEvictFirst)
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;"
        : "=l"(policy));
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x;
       i < words; i += uint64_t(gridDim.x) * blockDim.x) {
    uint4 v;
    if constexpr (kEvictFirst)
      asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 "
                   "{%0, %1, %2, %3}, [%4], %5;"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(data + i), "l"(policy));
    else
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 "
                   "{%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(data + i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u)
    y[blockIdx.x] = float(acc);
}

template <bool kBranching, int... kImages>
constexpr std::array<ProbeKernel, sizeof...(kImages)>
probeImages(std::integer_sequence<int, kImages...>) {
  return {imageProbeKernel<kImages, kBranching>...};
}

/// What a kernel boundary costs when the kernels' images take turns, as a
/// step's ~20 kernels a layer do, against one image over and over: chains of
/// 64 probes in a graph, one image or 32 in turn; each again with 64 MB
/// moved between probes, timed alone and taken off: by a device copy (copy
/// engines: the SMs' instruction caches stay, the L2 is turned over as a
/// step's weights turn it over), and by a kernel reading 64 MB as the
/// mat-vecs read weights, with the L2's normal eviction priority and with
/// evict-first. The difference is the image fetch: a cost the step's chain
/// pays at every boundary where the image is not already at hand. Both
/// kinds of probe: straight and branching code.
/// --bench-edges: chains of 64 swiglu kernels of 2,048 values (each link
/// launched with programmatic serialization, as a step's are) in a graph,
/// per link: alone; each link also waiting for an event recorded after one
/// kernel on a second stream at the start (an edge from a kernel that has
/// long finished, as a step's waits across branches mostly are); and only
/// every eighth link so. The difference is what such an edge costs a link:
/// in GLM-5's step a kernel with one lost its early start (docs/perf.md,
/// eighteenth pass).
void benchEdges() {
  constexpr int kChain = 64;
  constexpr int64_t n = 2048;
  kiln::Rng rng(11);
  const size_t values = size_t(n);
  DeviceArray<float> g(normals(rng, n, 1.0)), u(normals(rng, n, 1.0)),
      y(values), side(values);
  cudaStream_t links, other;
  cudaEvent_t fork, sideDone;
  CHECK_CUDA(cudaStreamCreateWithFlags(&links, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  CHECK_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK_CUDA(cudaEventCreateWithFlags(&sideDone, cudaEventDisableTiming));
  // every: each `every`-th link also waits for the side kernel (0: none).
  auto chain = [&](int every) {
    return timeInGraph(
        links,
        [&](cudaStream_t s) -> cudaError_t {
          if (cudaError_t e = cudaEventRecord(fork, s); e != cudaSuccess)
            return e;
          if (cudaError_t e = cudaStreamWaitEvent(other, fork, 0);
              e != cudaSuccess)
            return e;
          if (cudaError_t e =
                  kc::launchSwiglu(g.get(), u.get(), n, side.get(), other);
              e != cudaSuccess)
            return e;
          if (cudaError_t e = cudaEventRecord(sideDone, other);
              e != cudaSuccess)
            return e;
          for (int i = 0; i < kChain; ++i) {
            if (every > 0 && i % every == every - 1)
              if (cudaError_t e = cudaStreamWaitEvent(s, sideDone, 0);
                  e != cudaSuccess)
                return e;
            if (cudaError_t e =
                    kc::launchSwiglu(g.get(), u.get(), n, y.get(), s);
                e != cudaSuccess)
              return e;
          }
          // The side stream joins the chain's end where no link waited.
          return cudaStreamWaitEvent(s, sideDone, 0);
        },
        10) /
           kChain;
  };
  const double alone = chain(0), each = chain(1), eighth = chain(8);
  std::printf("bench edges: a link of a programmatic chain (swiglu of %lld "
              "values) %.2f us\n",
              (long long)n, alone);
  std::printf("bench edges: every link also waiting for a finished kernel on "
              "another stream %.2f us (+%.2f us an edge)\n",
              each, each - alone);
  std::printf("bench edges: every eighth link so %.2f us (+%.2f us an edge)\n",
              eighth, (eighth - alone) * 8);
  CHECK_CUDA(cudaEventDestroy(fork));
  CHECK_CUDA(cudaEventDestroy(sideDone));
  CHECK_CUDA(cudaStreamDestroy(links));
  CHECK_CUDA(cudaStreamDestroy(other));
}

/// The current GPU's multiprocessors.
int multiprocessors() {
  int device = 0, sms = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                                    device));
  return sms;
}

/// Launches `kernel` on `blocks` blocks of 256 threads as a step launches
/// its kernels: programmatic serialization after the stream's previous one.
template <typename Kernel, typename... Args>
cudaError_t launchProgrammatic(cudaStream_t s, unsigned blocks, Kernel kernel,
                               Args... args) {
  cudaLaunchAttribute overlap[1] = {};
  overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(256);
  config.stream = s;
  config.attrs = overlap;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

/// A kernel's parameters of kBytes (a block of words, two of them read),
/// for --bench-params.
template <int kBytes> struct ParamBlock {
  uint32_t w[kBytes / 4];
};

template <int kBytes>
__global__ void __launch_bounds__(256)
    paramProbeKernel(ParamBlock<kBytes> p, float *y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  if (p.w[0] + p.w[kBytes / 4 - 1] == 12345u)
    y[blockIdx.x] = 1.f;
}

/// --bench-params: what the size of a kernel's parameters costs a link of a
/// programmatic chain in a graph (64 links of near-empty kernels, a block a
/// multiprocessor, each graph instantiated and uploaded in turn), and what
/// being the process's first uploaded graph is worth: the 16-byte chain is
/// timed first and again last (docs/perf.md, thirty-third pass: of two graph
/// executables of the same kernels, the one uploaded second replayed
/// slower).
void benchParams() {
  constexpr int kChain = 64;
  DeviceArray<float> y(4096);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const unsigned sms = unsigned(multiprocessors());
  const auto chain = [&](auto kernel, auto block) {
    return timeInGraph(
               stream,
               [&](cudaStream_t s) {
                 for (int i = 0; i < kChain; ++i)
                   if (cudaError_t e =
                           launchProgrammatic(s, sms, kernel, block, y.get());
                       e != cudaSuccess)
                     return e;
                 return cudaSuccess;
               },
               1) /
           kChain;
  };
  const auto size = [&](auto bytes) {
    constexpr int kBytes = decltype(bytes)::value;
    ParamBlock<kBytes> block{};
    block.w[0] = 1;
    std::printf("bench params: %5d bytes: %.3f us a link\n", kBytes,
                chain(paramProbeKernel<kBytes>, block));
  };
  size(std::integral_constant<int, 16>{});
  size(std::integral_constant<int, 256>{});
  size(std::integral_constant<int, 640>{});
  size(std::integral_constant<int, 2048>{});
  size(std::integral_constant<int, 4096>{});
  size(std::integral_constant<int, 16>{});
  CHECK_CUDA(cudaStreamDestroy(stream));
}

void benchImages() {
  constexpr int kChain = 64;
  const auto straight =
      probeImages<false>(std::make_integer_sequence<int, kProbeImages>{});
  const auto branching =
      probeImages<true>(std::make_integer_sequence<int, kProbeImages>{});
  kiln::Rng rng(13);
  DeviceArray<float> x(normals(rng, 256, 1.0)), y(4096);
  // Every block once, each far from the one before it in the image.
  DeviceArray<int32_t> order(std::vector<int32_t>{
      0, 9, 3, 12, 6, 15, 1, 10, 4, 13, 7, 2, 11, 5, 14, 8});
  static_assert(kProbeBlocks == 16);
  constexpr uint64_t kFlush = uint64_t(64) << 20;
  DeviceArray<uint8_t> from(kFlush), to(kFlush);
  CHECK_CUDA(cudaMemset(from.get(), 1, kFlush));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int sms = multiprocessors();
  enum class Flush { None, Copy, Read, ReadEvictFirst };
  // One graph: kChain probes (image i % turns), each after a flush if asked;
  // the time of one probe (timeInGraph times one capture call: kChain).
  const auto chain = [&](const std::array<ProbeKernel, kProbeImages> &images,
                         int turns, Flush flush, bool probes) {
    return timeInGraph(
               stream,
               [&](cudaStream_t s) {
                 const auto *words =
                     reinterpret_cast<const uint4 *>(from.get());
                 const uint64_t count = kFlush / sizeof(uint4);
                 for (int i = 0; i < kChain; ++i) {
                   cudaError_t e = cudaSuccess;
                   if (flush == Flush::Copy)
                     e = cudaMemcpyAsync(to.get(), from.get(), kFlush,
                                         cudaMemcpyDeviceToDevice, s);
                   else if (flush == Flush::Read)
                     e = launchProgrammatic(s, unsigned(4 * sms),
                                streamReadKernel<false>, words, count,
                                y.get());
                   else if (flush == Flush::ReadEvictFirst)
                     e = launchProgrammatic(s, unsigned(4 * sms), streamReadKernel<true>,
                                words, count, y.get());
                   if (e != cudaSuccess)
                     return e;
                   if (!probes)
                     continue;
                   if (e = launchProgrammatic(s, unsigned(sms), images[size_t(i % turns)],
                                  static_cast<const int *>(order.get()),
                                  static_cast<const float *>(x.get()),
                                  y.get());
                       e != cudaSuccess)
                     return e;
                 }
                 return cudaSuccess;
               },
               5) /
           kChain;
  };
  const struct {
    Flush flush;
    const char *what;
  } flushes[] = {{Flush::Copy, "a 64 MB copy"},
                 {Flush::Read, "a 64 MB read by a kernel"},
                 {Flush::ReadEvictFirst, "a 64 MB read by a kernel, evict-first"}};
  for (const bool jumps : {false, true}) {
    const auto &images = jumps ? branching : straight;
    const char *kind = jumps ? "branching" : "straight";
    const double one = chain(images, 1, Flush::None, true),
                 turn = chain(images, kProbeImages, Flush::None, true);
    const auto line = [&](const std::string &what, double us) {
      std::printf("bench images: %s code, %-62s %6.2f us a probe\n", kind,
                  what.c_str(), us);
    };
    line("one image over and over", one);
    line("32 images in turn (in the L2)", turn);
    std::printf("bench images: %s code: an image fetched costs %.2f us a "
                "boundary from the L2 (%d dependent multiply-adds a "
                "probe%s, ~%d KB an image)\n",
                kind, turn - one, kProbeFmas,
                jumps ? ", in 16 blocks run out of order" : "",
                kProbeFmas * 16 / 1024);
    for (const auto &f : flushes) {
      const double alone = chain(images, 1, f.flush, false),
                   oneFlushed = chain(images, 1, f.flush, true) - alone,
                   turnFlushed =
                       chain(images, kProbeImages, f.flush, true) - alone;
      line(std::string("one image, ") + f.what + " between probes",
           oneFlushed);
      line(std::string("32 images in turn, ") + f.what + " between probes",
           turnFlushed);
      std::printf("bench images: %s code: an image fetched costs %.2f us a "
                  "boundary after %s (the flush alone %.2f us)\n",
                  kind, turnFlushed - oneFlushed, f.what, alone);
    }
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
}

void benchOps() {
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kiln::Rng rng(11);
  const int64_t positions = 2048, heads = 8, latent = 512, rope = 64,
                width = latent + rope, at = 1024;
  DeviceArray<int32_t> pos(std::vector<int32_t>{int32_t(at)});
  auto report = [](const char *name, double us) {
    std::printf("bench op %-40s %9.2f us\n", name, us);
  };
  Fault fault;
  // MLA over a 2048-position f16 cache, the indexer's selection of every
  // position 0..1024 (top-k 2048 keeps all of them at this context).
  DeviceArray<uint16_t> cache(positions * width);
  kc::DeviceCache c{cache.get(), kc::CacheType::F16, positions, width};
  CHECK_CUDA(kc::launchFillRandomCache(c, 5, stream));
  std::vector<int32_t> sel(positions, 0);
  for (int64_t i = 0; i <= at; ++i)
    sel[i] = int32_t(i);
  DeviceArray<int32_t> dsel(sel), dcount(std::vector<int32_t>{int32_t(at + 1)});
  DeviceArray<float> ql(normals(rng, heads * latent, 1.0)),
      qr(normals(rng, heads * rope, 1.0)), out(heads * latent),
      scratch(kc::mlaScratchFloats(heads, latent, positions)); // no selection
  // One MLA launch of `h` heads in a graph: with the selection of 0..1024,
  // or without one, up to *position.
  auto timeMla = [&](int64_t h, const int32_t *position, bool selected) {
    return timeInGraph(stream, [&](cudaStream_t s) {
      return kc::launchMlaAttention(
          ql.get(), qr.get(), h, latent, rope, c, position,
          selected ? dsel.get() : nullptr, selected ? dcount.get() : nullptr,
          selected ? positions : 0, 0.07f, scratch.get(), out.get(),
          fault.sink(), s);
    });
  };
  // As the general kernel, then as the kernel compiled for 8 heads
  // (KILN_CUDA_SPECIALISED=1).
  for (bool fixed : {false, true}) {
    const FixedShapes scope(fixed);
    const MlaTensorCores scalar(false);
    report(fixed ? "mla_attention 8x(512+64), 1025 of 2048, fixed heads, "
                   "scalar"
                 : "mla_attention 8x(512+64), 1025 of 2048",
           timeMla(heads, pos.get(), true));
  }
  // The kernel for 8 heads on the tensor cores, with a selection and
  // without.
  {
    const FixedShapes scope(true);
    const MlaTensorCores on(true);
    report("mla_attention 8x(512+64), 1025 of 2048, tensor cores",
           timeMla(heads, pos.get(), true));
    report("mla_attention 8x(512+64), 0..1024, tensor cores",
           timeMla(heads, pos.get(), false));
  }
  {
    const FixedShapes scope(true);
    const MlaTensorCores off(false);
    report("mla_attention 8x(512+64), 0..1024, fixed heads, scalar",
           timeMla(heads, pos.get(), false));
  }
  report("mla_attention 8x(512+64), 0..1024, no selection",
         timeMla(heads, pos.get(), false));
  report("mla_attention 1x(512+64), 0..1024, no selection",
         timeMla(1, pos.get(), false));
  DeviceArray<int32_t> early(std::vector<int32_t>{15});
  report("mla_attention 8x(512+64), 0..15, no selection",
         timeMla(heads, early.get(), false));
  // GLM-5's attn_v_b (256 rows of 512 values a head, q8_0-split) in MLA's
  // launch, against MLA and then the v_b mat-vec as two launches.
  {
    Weight vb = randomWeight(GGMLType::Q8_0, {latent, 256, heads}, rng.next());
    SplitWeight split = repackSplit(vb);
    const kc::DeviceWeight proj = split.dev(vb);
    DeviceArray<float> projScratch(
        size_t(kc::mlaScratchFloats(heads, latent, positions))),
        projected(size_t(heads * 256));
    report("mla_attention + v_b 8x(512+64) -> 8x256, 1025 of 2048, MLA's "
           "launch",
           timeInGraph(stream, [&](cudaStream_t s) {
             return kc::launchMlaAttention(
                 ql.get(), qr.get(), heads, latent, rope, c, pos.get(),
                 dsel.get(), dcount.get(), positions, 0.07f, projScratch.get(),
                 projected.get(), fault.sink(), s, &proj);
           }));
    report("mla_attention, then linear v_b 8x256: two launches",
           timeInGraph(stream, [&](cudaStream_t s) {
             const cudaError_t e = kc::launchMlaAttention(
                 ql.get(), qr.get(), heads, latent, rope, c, pos.get(),
                 dsel.get(), dcount.get(), positions, 0.07f, scratch.get(),
                 out.get(), fault.sink(), s);
             return e != cudaSuccess
                        ? e
                        : kc::launchLinear(out.get(), heads, proj, 256, true,
                                           projected.get(), s);
           }));
  }
  // The indexer: 32 heads of 128 over a [2048, 128] f16 key cache.
  DeviceArray<uint16_t> keys(positions * 128);
  kc::DeviceCache k{keys.get(), kc::CacheType::F16, positions, 128};
  CHECK_CUDA(kc::launchFillRandomCache(k, 6, stream));
  DeviceArray<float> q(normals(rng, 32 * 128, 1.0)), hw(normals(rng, 32, 1.0)),
      scores(positions);
  DeviceArray<int32_t> chosen(2048), count(1);
  report("dsa_indexer 32x128, top 2048 at 1024",
         timeInGraph(stream, [&](cudaStream_t s) {
           return kc::launchDsaIndexer(q.get(), 32, 128, hw.get(), k, pos.get(),
                                       2048, 0.1f, scores.get(), chosen.get(),
                                       count.get(), fault.sink(), s);
         }));
  report("dsa_indexer 32x128, top 256 at 1024",
         timeInGraph(stream, [&](cudaStream_t s) {
           return kc::launchDsaIndexer(q.get(), 32, 128, hw.get(), k, pos.get(),
                                       256, 0.1f, scores.get(), chosen.get(),
                                       count.get(), fault.sink(), s);
         }));
  benchDsa(0); // GLM-5 at 16k positions
  DeviceArray<float> v(normals(rng, 6144, 1.0)), w(normals(rng, 6144, 1.0)),
      y(6144), sum(6144), ring(2 * 6144), qrow(normals(rng, heads * 192, 1.0));
  report("rope 8x192 (64 rotated)", timeInGraph(stream, [&](cudaStream_t s) {
           return kc::launchRope(qrow.get(), heads, 192, pos.get(),
                                 kc::RopeStyle::Interleaved, 1e6f, 128, 64,
                                 qrow.get(), s);
         }));
  report("rms_norm 6144", timeInGraph(stream, [&](cudaStream_t s) {
           return kc::launchRmsNorm(v.get(), 1, 6144, w.get(), 1e-5f, y.get(),
                                    s);
         }));
  report("add_rms_norm 6144", timeInGraph(stream, [&](cudaStream_t s) {
           return kc::launchAddRmsNorm(v.get(), y.get(), 1, 6144, w.get(),
                                       1e-5f, sum.get(), y.get(), s);
         }));
  {
    // The one-shot all-reduce of a simulated tp=8 rank: its own part read
    // once for each of 8 ranks, added and normalised (one kernel).
    const int64_t capacity = 6144;
    DeviceArray<uint8_t> exchange(kc::peerExchangeBytes(capacity));
    CHECK_CUDA(cudaMemset(exchange.get(), 0, kc::peerExchangeBytes(capacity)));
    const kc::PeerExchange p =
        kc::peerExchangeView({exchange.get()}, 8, 0, capacity, true);
    report("all_reduce_peers + add_rms_norm 6144, 8 ranks simulated",
           timeInGraph(stream, [&](cudaStream_t s) {
             return kc::launchAllReducePeers(p, v.get(), 1, 6144, true,
                                             sum.get(), w.get(), 1e-5f,
                                             sum.get(), y.get(), {}, s);
           }));
    report("all_reduce_peers 6144 sum, 8 ranks simulated",
           timeInGraph(stream, [&](cudaStream_t s) {
             return kc::launchAllReducePeers(p, v.get(), 1, 6144, true, nullptr,
                                             nullptr, 0.f, sum.get(), nullptr,
                                             {}, s);
           }));
    report("ring traffic 8 ranks + add_rms_norm 6144",
           timeInGraph(stream, [&](cudaStream_t s) {
             if (cudaError_t e = kc::launchRingTraffic(
                     v.get(), 6144, 2 * 6144 * 7 / 8, ring.get(), s);
                 e != cudaSuccess)
               return e;
             return kc::launchAddRmsNorm(sum.get(), ring.get(), 1, 6144,
                                         w.get(), 1e-5f, sum.get(), y.get(), s);
           }));
  }
  report("swiglu 2048", timeInGraph(stream, [&](cudaStream_t s) {
           return kc::launchSwiglu(v.get(), w.get(), 2048, y.get(), s);
         }));
  report("cache_append 576 f16", timeInGraph(stream, [&](cudaStream_t s) {
           return kc::launchCacheAppend(v.get(), pos.get(), c, fault.sink(), s);
         }));
  report("copy 24 KiB (cudaMemcpyAsync D2D)",
         timeInGraph(stream, [&](cudaStream_t s) {
           return cudaMemcpyAsync(y.get(), v.get(), 6144 * sizeof(float),
                                  cudaMemcpyDeviceToDevice, s);
         }));
  // The router of a tp=8 rank (F32 gate [6144, 256], top 8); the routed
  // experts follow (benchMoe).
  const int64_t experts = 256, hidden = 6144;
  DeviceArray<uint8_t> gate(*kiln::rowBytes(GGMLType::F32, hidden) * experts);
  CHECK_CUDA(kc::launchFillRandomBlocks(GGMLType::F32, gate.get(), gate.size(),
                                        9, stream));
  DeviceArray<int32_t> ids(8);
  DeviceArray<float> rw(8),
      routerScratch(size_t(kc::routerScratchFloats(experts))),
      bias(normals(rng, experts, 0.1));
  kc::DeviceWeight g{GGMLType::F32, experts, hidden, gate.get()};
  report(
      "moe_router F32 6144x256 top 8", timeInGraph(stream, [&](cudaStream_t s) {
        return kc::launchMoeRouter(v.get(), g, bias.get(), 8,
                                   kc::Gating::Sigmoid, true, 2.5f,
                                   routerScratch.get(), ids.get(), rw.get(), s);
      }));
  CHECK_CUDA(cudaStreamDestroy(stream));
  benchMoe();
}

/// Where two ranks of the all-reduce checks run: GPUs 0 and 1 where they
/// read each other's memory, else both on GPU 0 (as kiln-run --one-gpu
/// runs a group's ranks).
struct TwoRanks {
  bool two = false;
  int gpu[2] = {0, 0};
  std::string where;
};
TwoRanks twoRanks() {
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  int can01 = 0, can10 = 0;
  if (devices >= 2) {
    CHECK_CUDA(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CHECK_CUDA(cudaDeviceCanAccessPeer(&can10, 1, 0));
  }
  TwoRanks t;
  t.two = can01 && can10;
  t.gpu[1] = t.two ? 1 : 0;
  t.where = t.two ? "GPUs 0 and 1" : "two ranks on GPU 0";
  return t;
}

/// Direct slots' reuse (StepKernels.h PeerExchange), as a step runs them:
/// two ranks (two GPUs that read each other's memory, else both on GPU 0),
/// each one captured graph of kSteps steps back to back, no host sync
/// between. A step bumps a counter vector, then kCalls times writes a part
/// (its rank's base vector for the call plus the counter) with launchAdd
/// into the call's site, as a producer would, and all-reduces it with a
/// residual add; the step's last call keeps the copy into the parities, as
/// the backend leaves it (its slots are read after its flag). A site
/// written again while the other rank still reads it would show as a wrong
/// sum in a later step. Every output against the host's rank-order sums,
/// and the ranks' against each other. `flat`: the all-reduces by blocks
/// that are not a cluster (the backend's default); `push`: the parts
/// pushed (KILN_CUDA_PEER_PUSH=1; the sites then only hold x).
void checkDirectSlotsInGraphs(Report &r, kiln::Rng &rng, bool flat,
                              bool push) {
  kc::setPeerClusters(!flat);
  constexpr int kSteps = 24, kCalls = 4;
  const int64_t n = 6144, capacity = 6144;
  const TwoRanks place = twoRanks();
  const bool two = place.two;
  const int *gpu = place.gpu;
  const int64_t start = kc::peerSitesStart(capacity);
  const uint64_t bytes = kc::peerExchangeBytes(capacity, (kCalls - 1) * n, 2);
  // Per rank: its base parts (one a call), the residual, ones, the counter,
  // the parity call's input, the outputs (one a step and call).
  std::vector<std::vector<std::vector<float>>> base(2);
  std::vector<float> res = normals(rng, n, 1.0), ones(size_t(n), 1.f);
  for (int q = 0; q < 2; ++q)
    for (int c = 0; c < kCalls; ++c)
      base[size_t(q)].push_back(normals(rng, n, 1.0));
  struct Rank {
    std::unique_ptr<DeviceArray<uint8_t>> exchange;
    std::vector<std::unique_ptr<DeviceArray<float>>> bases;
    std::unique_ptr<DeviceArray<float>> res, ones, counter, input, outs;
    cudaStream_t stream = nullptr;
    cudaGraphExec_t exec = nullptr;
  };
  Rank ranks[2];
  for (int d = 0; d < 2; ++d) {
    Rank &k = ranks[d];
    CHECK_CUDA(cudaSetDevice(gpu[d]));
    if (two)
      CHECK_CUDA(kc::enablePeerAccess(gpu[1 - d]));
    CHECK_CUDA(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking));
    k.exchange = std::make_unique<DeviceArray<uint8_t>>(bytes);
    CHECK_CUDA(cudaMemset(k.exchange->get(), 0, bytes));
    for (const std::vector<float> &b : base[size_t(d)])
      k.bases.push_back(std::make_unique<DeviceArray<float>>(b));
    k.res = std::make_unique<DeviceArray<float>>(res);
    k.ones = std::make_unique<DeviceArray<float>>(ones);
    k.counter = std::make_unique<DeviceArray<float>>(size_t(n));
    CHECK_CUDA(cudaMemset(k.counter->get(), 0, n * sizeof(float)));
    k.input = std::make_unique<DeviceArray<float>>(size_t(n));
    k.outs =
        std::make_unique<DeviceArray<float>>(size_t(kSteps * kCalls * n));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  for (int d = 0; d < 2; ++d) {
    Rank &k = ranks[d];
    CHECK_CUDA(cudaSetDevice(gpu[d]));
    const kc::PeerExchange p = kc::peerExchangeView(
        {ranks[0].exchange->get(), ranks[1].exchange->get()}, 2, d, capacity,
        false, push ? start + (kCalls - 1) * n : -1);
    cudaGraph_t graph;
    CHECK_CUDA(
        cudaStreamBeginCapture(k.stream, cudaStreamCaptureModeThreadLocal));
    for (int step = 0; step < kSteps; ++step) {
      CHECK_CUDA(kc::launchAdd(k.counter->get(), k.ones->get(), n,
                               k.counter->get(), k.stream));
      for (int c = 0; c < kCalls; ++c) {
        const bool direct = c + 1 < kCalls;
        const int64_t site = direct ? start + c * n : -1;
        float *part = direct ? p.slots[d] + site : k.input->get();
        CHECK_CUDA(kc::launchAdd(k.bases[size_t(c)]->get(), k.counter->get(),
                                 n, part, k.stream));
        CHECK_CUDA(kc::launchAllReducePeers(
            p, part, 1, n, true, k.res->get(), nullptr, 0.f,
            k.outs->get() + (step * kCalls + c) * n, nullptr, {}, k.stream, 0,
            nullptr, nullptr, site));
      }
    }
    CHECK_CUDA(cudaStreamEndCapture(k.stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&k.exec, graph, 0));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }
  // Both launched before either is waited for (each waits for the other's
  // flags).
  for (int d = 0; d < 2; ++d) {
    CHECK_CUDA(cudaSetDevice(gpu[d]));
    CHECK_CUDA(cudaGraphLaunch(ranks[d].exec, ranks[d].stream));
  }
  std::vector<std::vector<float>> got(2);
  for (int d = 0; d < 2; ++d) {
    CHECK_CUDA(cudaSetDevice(gpu[d]));
    CHECK_CUDA(cudaStreamSynchronize(ranks[d].stream));
    got[size_t(d)] = ranks[d].outs->download();
    CHECK_CUDA(cudaGraphExecDestroy(ranks[d].exec));
    CHECK_CUDA(cudaStreamDestroy(ranks[d].stream));
  }
  double wrong = 0;
  for (int step = 0; step < kSteps; ++step)
    for (int c = 0; c < kCalls; ++c)
      for (int64_t i = 0; i < n; ++i) {
        // The counter after step + 1 bumps, each part as launchAdd makes
        // it, then rank 0's plus rank 1's, then the residual's add.
        const float counter = float(step + 1);
        const float p0 = base[0][size_t(c)][size_t(i)] + counter,
                    p1 = base[1][size_t(c)][size_t(i)] + counter;
        const float want = res[size_t(i)] + (p0 + p1);
        const size_t at = size_t((step * kCalls + c) * n + i);
        wrong += got[0][at] != want;
      }
  CHECK_CUDA(cudaSetDevice(0));
  kc::setPeerClusters(true);
  const std::string ranksAre =
      place.where + (flat ? ", no cluster" : "") + (push ? ", pushed" : "");
  r.line("all_reduce_peers",
         fmtText("%s, direct slots in one graph of %d steps of %d calls "
                 "(the last by the parities), 1x6144 + add",
                 ranksAre.c_str(), kSteps, kCalls),
         wrong, 0, "bit-exact: the host's rank-order sums, every output");
  r.line("all_reduce_peers",
         ranksAre + ", direct slots in one graph, rank 0 against rank 1",
         double(mismatches(got[0], got[1])), 0,
         "bit-identical: the same sums in the same order");
}

/// The one-shot all-reduce (launchAllReducePeers) against the CPU
/// backend's rank-order combine: simulated alone (every rank's slots this
/// rank's own: x combined with itself once per rank), and, where two GPUs
/// can read each other's memory, for real across them. Each case runs
/// three calls, so both parities of the exchange and a reuse are covered.
void checkAllReducePeers(Report &r, kiln::Rng &rng) {
  const float eps = 1e-5f;
  const int64_t capacity = 3 * 6144;
  // The CPU's combine of `parts` in rank order, then the fused add and norm.
  auto reference = [&](const std::vector<std::vector<float>> &parts, bool sum) {
    std::vector<float> acc = parts[0];
    for (size_t q = 1; q < parts.size(); ++q)
      for (size_t i = 0; i < acc.size(); ++i)
        acc[i] = sum ? acc[i] + parts[q][i] : std::max(acc[i], parts[q][i]);
    return acc;
  };
  // fused: the residual add and the norm (all_reduce_add_rms_norm); add:
  // the residual add alone (all_reduce_add).
  struct Case {
    int ranks;
    int64_t rows, n;
    bool sum, fused, add = false;
  };
  // direct: x written into the exchange's sites first (as its producer
  // would with direct slots, the backend's default), each call reading every rank's
  // part there, two sites taken in turn over four calls; the same combine.
  // flat: by blocks that are not a cluster (the backend's default), the
  // fused norm's parts through the exchange; each such call is run again
  // by the cluster on the same inputs, whose outputs must be the same bits.
  // stepEpochs: the calls in steps of two (kc::beginStepEpochs), each call's
  // epoch from the steps' word and its place in its step, the word advanced
  // by each step's last launch; the same sums, so the same checks, and the
  // word must end at the calls made.
  auto check = [&](const Case &c, bool direct, bool flat,
                   bool stepEpochs = false) {
    kc::setPeerClusters(!flat);
    DeviceArray<uint32_t> epochBase(size_t(1));
    CHECK_CUDA(cudaMemset(epochBase.get(), 0, sizeof(uint32_t)));
    int32_t stepCalls = 0;
    const bool added = c.fused || c.add;
    const int64_t values = c.rows * c.n, start = kc::peerSitesStart(capacity);
    const int64_t sites[2] = {start, start + (values + 31) / 32 * 32};
    const uint64_t bytes =
        kc::peerExchangeBytes(capacity, direct ? 2 * (sites[1] - start) : 0);
    DeviceArray<uint8_t> exchange(bytes);
    CHECK_CUDA(cudaMemset(exchange.get(), 0, bytes));
    const kc::PeerExchange p =
        kc::peerExchangeView({exchange.get()}, c.ranks, 0, capacity, true);
    const int calls = direct ? 4 : 3;
    const std::string what = fmtText(
        "simulated, %s%s%s%d ranks, %lldx%lld %s",
        stepEpochs ? "step epochs, " : "", direct ? "direct slots, " : "",
        flat ? "no cluster, " : "", c.ranks, (long long)c.rows, (long long)c.n,
        c.fused ? "+ add + rms_norm"
        : c.add ? "+ add"
        : c.sum ? "sum"
                : "max");
    double outErr = 0, yErr = 0, clusterDiff = 0, shapedDiff = 0;
    // GLM-5's shape (one row of its hidden width over 8, 4 or 2 ranks)
    // also has a flat kernel compiled for it (ShapeFamily::AllReduce):
    // each such call is run again through it, and must give the same bits.
    const bool glm5Shape =
        flat && (c.ranks == 8 || c.ranks == 4 || c.ranks == 2) &&
        c.rows == 1 && c.n == kc::glm5::kHidden;
    uint64_t shapedRan = 0;
    for (int call = 0; call < calls; ++call) {
      std::vector<float> x = normals(rng, values, 1.0),
                         res = normals(rng, values, 1.0),
                         w = normals(rng, c.n, 1.0, 1.0);
      std::vector<float> want =
          reference(std::vector<std::vector<float>>(size_t(c.ranks), x), c.sum);
      std::vector<float> wantY(want.size());
      if (added)
        cpu::add(res.data(), want.data(), values, want.data());
      if (c.fused)
        cpu::rmsNorm(want.data(), c.rows, c.n, w.data(), eps, wantY.data());
      DeviceArray<float> dx(x), dres(res), dw(w), dout(x.size()), dy(x.size());
      const float *in = dx.get();
      const int64_t site = direct ? sites[call % 2] : -1;
      if (direct) {
        CHECK_CUDA(cudaMemcpy(p.slots[0] + site, x.data(),
                              x.size() * sizeof(float),
                              cudaMemcpyHostToDevice));
        in = p.slots[0] + site;
      }
      if (stepEpochs && call % 2 == 0)
        kc::beginStepEpochs(epochBase.get());
      auto reduce = [&] {
        run(kc::launchAllReducePeers(
            p, in, c.rows, c.n, c.sum, added ? dres.get() : nullptr,
            c.fused ? dw.get() : nullptr, eps, dout.get(),
            c.fused ? dy.get() : nullptr, {}, nullptr, 0, nullptr, nullptr,
            site));
      };
      reduce();
      const std::vector<float> gotOut = dout.download(),
                               gotY = c.fused ? dy.download()
                                              : std::vector<float>();
      outErr = std::max(outErr, double(mismatches(gotOut, want)));
      if (c.fused)
        yErr = std::max(yErr, relError(gotY, wantY));
      if (flat) {
        kc::setPeerClusters(true);
        reduce();
        kc::setPeerClusters(false);
        clusterDiff += double(mismatches(dout.download(), gotOut));
        if (c.fused)
          clusterDiff += double(mismatches(dy.download(), gotY));
      }
      if (glm5Shape) {
        const FixedShapes fixed(true);
        reduce();
        shapedRan += fixed.ran();
        shapedDiff += double(mismatches(dout.download(), gotOut));
        if (c.fused)
          shapedDiff += double(mismatches(dy.download(), gotY));
      }
      if (stepEpochs && (call % 2 == 1 || call == calls - 1)) {
        const int32_t made = kc::endStepEpochs();
        stepCalls += made;
        run(kc::launchAdvanceEpochs(epochBase.get(), made, nullptr));
      }
    }
    if (stepEpochs)
      r.line("all_reduce_peers", what + ", the steps' epoch word",
             std::fabs(double(epochBase.download()[0]) - double(stepCalls)),
             0, "exact: every call counted once");
    const std::string runs = fmtText(" (%d calls)", calls);
    r.line("all_reduce_peers", what + ", reduced" + runs, outErr, 0,
           "bit-exact: the CPU's rank order");
    if (c.fused)
      r.line("all_reduce_peers", what + ", normed" + runs, yErr,
             sumTol(double(c.n)), sumWhy("sum of squares order", c.n));
    if (flat)
      r.line("all_reduce_peers", what + ", against the cluster" + runs,
             clusterDiff, 0, "bit-identical: the same parts, the same order");
    if (glm5Shape)
      r.line("all_reduce_peers",
             what + ", GLM-5's shape compiled in, against the run-time "
                    "shape's kernel" +
                 runs,
             shapedDiff + std::fabs(double(shapedRan) - calls), 0,
             "bit-identical, the compiled kernel run each call");
    kc::setPeerClusters(true);
  };
  for (const Case &c :
       {Case{1, 1, 6144, true, true}, Case{8, 1, 6144, true, true},
        Case{8, 3, 1000, true, true}, Case{8, 1, 6144, true, false},
        Case{4, 2, 300, false, false}, Case{2, 4, 2000, true, true},
        Case{8, 1, 6144, true, false, true}, Case{1, 1, 6144, true, false, true},
        Case{8, 3, 1000, true, false, true},
        Case{2, 1, 6001, true, false, true}})
    check(c, false, false);
  for (const Case &c :
       {Case{8, 1, 6144, true, true}, Case{8, 1, 6144, true, false, true},
        Case{2, 4, 2000, true, true}, Case{4, 2, 300, false, false},
        Case{1, 1, 6001, true, false, true}})
    check(c, true, false);
  // Without a cluster (the fused norm's parts through the exchange), from
  // the parities and from direct slots.
  for (bool direct : {false, true})
    for (const Case &c :
         {Case{8, 1, 6144, true, false, true}, Case{8, 3, 1000, true, false, true},
          Case{4, 2, 300, false, false}, Case{8, 1, 6144, true, false},
          Case{1, 1, 6001, true, false, true}, Case{1, 1, 6144, true, true},
          Case{8, 1, 6144, true, true}, Case{8, 3, 1000, true, true},
          Case{2, 4, 2000, true, true}, Case{4, 1, 6144, true, true},
          Case{2, 1, 6144, true, false, true}})
      check(c, direct, true);
  // Each call's epoch from the steps' word (the backend's default in a
  // step), with and without a cluster, from sites and from the parities.
  for (auto [direct, flat] : {std::pair{true, true}, std::pair{false, true},
                              std::pair{true, false}})
    for (const Case &c :
         {Case{8, 1, 6144, true, true}, Case{8, 3, 1000, true, true},
          Case{1, 1, 6144, true, false, true}, Case{4, 2, 300, false, false}})
      check(c, direct, flat, true);
  {
    // A site before the sites' start, or an x elsewhere than the site, is
    // refused before any launch.
    const int64_t start = kc::peerSitesStart(capacity);
    DeviceArray<uint8_t> exchange(kc::peerExchangeBytes(capacity, 6144));
    const kc::PeerExchange p =
        kc::peerExchangeView({exchange.get()}, 8, 0, capacity, true);
    DeviceArray<float> x(size_t(64)), out(size_t(64));
    auto refuses = [&](const float *in, int64_t site) {
      return kc::launchAllReducePeers(p, in, 1, 64, true, nullptr, nullptr,
                                      0.f, out.get(), nullptr, {}, nullptr, 0,
                                      nullptr, nullptr,
                                      site) == cudaErrorInvalidValue;
    };
    const double wrong = !refuses(p.slots[0] + 64, 64) +
                         !refuses(x.get(), start) +
                         !refuses(p.slots[0] + start + 32, start);
    r.line("all_reduce_peers",
           "direct slots: a site in the parities, x away from its site (3)",
           wrong, 0, "refused: cudaErrorInvalidValue");
  }
  {
    // A residual add after a max is refused before any launch.
    DeviceArray<uint8_t> exchange(kc::peerExchangeBytes(capacity));
    const kc::PeerExchange p =
        kc::peerExchangeView({exchange.get()}, 8, 0, capacity, true);
    DeviceArray<float> x(size_t(64)), res(size_t(64)), out(size_t(64));
    const double refused =
        kc::launchAllReducePeers(p, x.get(), 1, 64, false, res.get(), nullptr,
                                 0.f, out.get(), nullptr, {},
                                 nullptr) != cudaErrorInvalidValue;
    r.line("all_reduce_peers", "max + add: refused", refused, 0,
           "cudaErrorInvalidValue");
  }

  // Two ranks, for real: each its own part, both launched before either is
  // waited for (each kernel waits for the other's flag). On two GPUs that
  // read each other's memory, else both on GPU 0 on two streams (as
  // kiln-run --one-gpu runs a group's ranks).
  const TwoRanks place = twoRanks();
  const bool two = place.two;
  const int *gpu = place.gpu;
  const std::string ranksAre = place.where;
  const int64_t rows = 1, n = 6144;
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> exchange;
  cudaStream_t streams[2] = {};
  for (int d = 0; d < 2; ++d) {
    CHECK_CUDA(cudaSetDevice(gpu[d]));
    if (two)
      CHECK_CUDA(kc::enablePeerAccess(gpu[1 - d]));
    CHECK_CUDA(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
    // With room for two direct slots of n values, and a push region.
    exchange.push_back(std::make_unique<DeviceArray<uint8_t>>(
        kc::peerExchangeBytes(capacity, 2 * n, 2)));
    CHECK_CUDA(cudaMemset(exchange.back()->get(), 0,
                          kc::peerExchangeBytes(capacity, 2 * n, 2)));
  }
  // By the parities, by direct slots (each rank's part written into its
  // site first, two sites in turn), and pushed (KILN_CUDA_PEER_PUSH=1).
  for (int mode = 0; mode < 3; ++mode) {
  const bool direct = mode == 1, push = mode == 2;
  const int64_t start = kc::peerSitesStart(capacity);
  double outErr = 0, yErr = 0, differ = 0;
  for (int call = 0; call < 3; ++call) {
    std::vector<std::vector<float>> parts = {normals(rng, n, 1.0),
                                             normals(rng, n, 1.0)};
    std::vector<float> res = normals(rng, n, 1.0),
                       w = normals(rng, n, 1.0, 1.0);
    std::vector<float> want = reference(parts, true), wantY(n);
    cpu::add(res.data(), want.data(), n, want.data());
    cpu::rmsNorm(want.data(), rows, n, w.data(), eps, wantY.data());
    std::vector<std::unique_ptr<DeviceArray<float>>> keep;
    std::vector<float *> outs, ys;
    // Every array made before the first launch (an allocation may wait
    // for the GPU, whose kernel waits for the other rank's).
    for (int d = 0; d < 2; ++d) {
      CHECK_CUDA(cudaSetDevice(gpu[d]));
      for (const std::vector<float> *v : {&parts[size_t(d)], &res, &w})
        keep.push_back(std::make_unique<DeviceArray<float>>(*v));
      keep.push_back(std::make_unique<DeviceArray<float>>(size_t(n)));
      keep.push_back(std::make_unique<DeviceArray<float>>(size_t(n)));
      outs.push_back(keep[keep.size() - 2]->get());
      ys.push_back(keep[keep.size() - 1]->get());
    }
    // Direct: each rank's part into its site, before any launch.
    for (int d = 0; direct && d < 2; ++d) {
      CHECK_CUDA(cudaSetDevice(gpu[d]));
      float *slot = reinterpret_cast<float *>(exchange[size_t(d)]->get()) +
                    start + (call % 2) * n;
      CHECK_CUDA(cudaMemcpy(slot, parts[size_t(d)].data(), n * sizeof(float),
                            cudaMemcpyHostToDevice));
    }
    for (int d = 0; d < 2; ++d) {
      CHECK_CUDA(cudaSetDevice(gpu[d]));
      const kc::PeerExchange p = kc::peerExchangeView(
          {exchange[0]->get(), exchange[1]->get()}, 2, d, capacity, false,
          push ? start + 2 * n : -1);
      const size_t at = size_t(d) * 5;
      const int64_t site = direct ? start + (call % 2) * n : -1;
      const float *x = direct ? p.slots[d] + site : keep[at]->get();
      // Not run(): it would wait for this rank's kernel, which waits for
      // the other's, not launched yet.
      CHECK_CUDA(kc::launchAllReducePeers(
          p, x, rows, n, true, keep[at + 1]->get(), keep[at + 2]->get(), eps,
          outs[size_t(d)], ys[size_t(d)], {}, streams[d], 0, nullptr, nullptr,
          site));
    }
    std::vector<std::vector<float>> gotY;
    for (int d = 0; d < 2; ++d) {
      CHECK_CUDA(cudaSetDevice(gpu[d]));
      CHECK_CUDA(cudaStreamSynchronize(streams[d]));
      std::vector<float> out(static_cast<size_t>(n)), y(static_cast<size_t>(n));
      CHECK_CUDA(cudaMemcpy(out.data(), outs[size_t(d)], n * sizeof(float),
                            cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(y.data(), ys[size_t(d)], n * sizeof(float),
                            cudaMemcpyDeviceToHost));
      outErr = std::max(outErr, double(mismatches(out, want)));
      yErr = std::max(yErr, relError(y, wantY));
      gotY.push_back(std::move(y));
    }
    differ = std::max(differ, double(mismatches(gotY[0], gotY[1])));
    keep.clear();
  }
  CHECK_CUDA(cudaSetDevice(0));
  const std::string how = ranksAre + (direct ? ", direct slots"
                                      : push ? ", pushed"
                                             : "");
  r.line("all_reduce_peers",
         how + ", 1x6144 + add + rms_norm, reduced (3 calls)", outErr, 0,
         "bit-exact: the CPU's rank order");
  r.line("all_reduce_peers", how + ", normed (3 calls)", yErr,
         sumTol(double(n)), sumWhy("sum of squares order", n));
  r.line("all_reduce_peers", how + ", normed, rank 0 against rank 1",
         differ, 0, "bit-identical: the same sums in the same order");
  }

  // The router's choice inside the all-reduce between the same two ranks,
  // many calls (small's shape: 1,024 values, a tail of 32 experts, top 8,
  // with a bias): each rank's ids and weights against the choice kernel's
  // from rank 0's logits, and the ranks' logits against each other (the
  // kernel itself, called again and again; the step's wrong runs of the
  // twenty-first pass were races at load, docs/perf.md).
  {
    const int64_t cn = 1024, tail = 32, topK = 8, calls = 200;
    std::vector<std::unique_ptr<DeviceArray<float>>> in, res, wt, sum, y, lg,
        wsel;
    std::vector<std::unique_ptr<DeviceArray<int32_t>>> ids;
    DeviceArray<float> bias(normals(rng, tail, 0.1));
    DeviceArray<int32_t> refIds(static_cast<size_t>(topK));
    DeviceArray<float> refW(static_cast<size_t>(topK));
    for (int d = 0; d < 2; ++d) {
      CHECK_CUDA(cudaSetDevice(gpu[d]));
      in.push_back(std::make_unique<DeviceArray<float>>(size_t(cn + tail)));
      res.push_back(std::make_unique<DeviceArray<float>>(size_t(cn)));
      wt.push_back(std::make_unique<DeviceArray<float>>(size_t(cn)));
      sum.push_back(std::make_unique<DeviceArray<float>>(size_t(cn)));
      y.push_back(std::make_unique<DeviceArray<float>>(size_t(cn)));
      lg.push_back(std::make_unique<DeviceArray<float>>(size_t(tail)));
      wsel.push_back(std::make_unique<DeviceArray<float>>(size_t(topK)));
      ids.push_back(std::make_unique<DeviceArray<int32_t>>(size_t(topK)));
    }
    double wrongIds = 0, wrongWeights = 0, ranksDiffer = 0;
    for (int64_t call = 0; call < calls; ++call) {
      const std::vector<float> resV = normals(rng, cn, 1.0),
                               wV = normals(rng, cn, 1.0, 1.0);
      for (int d = 0; d < 2; ++d) {
        CHECK_CUDA(cudaSetDevice(gpu[d]));
        in[size_t(d)]->upload(normals(rng, cn + tail, 1.0));
        res[size_t(d)]->upload(resV);
        wt[size_t(d)]->upload(wV);
      }
      for (int d = 0; d < 2; ++d) {
        CHECK_CUDA(cudaSetDevice(gpu[d]));
        const kc::PeerExchange p = kc::peerExchangeView(
            {exchange[0]->get(), exchange[1]->get()}, 2, d, capacity, false);
        const kc::RouterChoice choice = sigmoidChoice(
            bias.get(), topK, ids[size_t(d)]->get(), wsel[size_t(d)]->get());
        CHECK_CUDA(kc::launchAllReducePeers(
            p, in[size_t(d)]->get(), 1, cn, true, res[size_t(d)]->get(),
            wt[size_t(d)]->get(), eps, sum[size_t(d)]->get(),
            y[size_t(d)]->get(), {}, streams[d], tail, lg[size_t(d)]->get(),
            &choice));
      }
      for (int d = 0; d < 2; ++d) {
        CHECK_CUDA(cudaSetDevice(gpu[d]));
        CHECK_CUDA(cudaStreamSynchronize(streams[d]));
      }
      CHECK_CUDA(cudaSetDevice(gpu[0]));
      CHECK_CUDA(kc::launchMoeChoose(lg[0]->get(), tail, bias.get(), topK,
                                     kc::Gating::Sigmoid, true, 2.5f,
                                     refIds.get(), refW.get(), nullptr));
      CHECK_CUDA(cudaDeviceSynchronize());
      const std::vector<int32_t> wantIds = refIds.download();
      const std::vector<float> wantW = refW.download();
      for (int d = 0; d < 2; ++d) {
        CHECK_CUDA(cudaSetDevice(gpu[d]));
        wrongIds += mismatches(ids[size_t(d)]->download(), wantIds) > 0;
        wrongWeights += mismatches(wsel[size_t(d)]->download(), wantW) > 0;
      }
      CHECK_CUDA(cudaSetDevice(gpu[0]));
      const std::vector<float> l0 = lg[0]->download();
      CHECK_CUDA(cudaSetDevice(gpu[1]));
      ranksDiffer += mismatches(lg[1]->download(), l0) > 0;
    }
    // The arrays go at the scope's end (freed by address, whichever GPU
    // is current).
    for (int d = 0; d < 2; ++d) {
      CHECK_CUDA(cudaSetDevice(gpu[d]));
      CHECK_CUDA(cudaStreamDestroy(streams[d]));
    }
    CHECK_CUDA(cudaSetDevice(0));
    const std::string what = ranksAre + ", 1024 + a tail of 32, choice of 8, " +
                             std::to_string(calls) + " calls";
    r.line("all_reduce_peers", what + ": calls with ids unlike moe_choose's",
           wrongIds, 0, "exact: the same code on the same logits");
    r.line("all_reduce_peers", what + ": calls with weights unlike moe_choose's",
           wrongWeights, 0, "exact: the same code on the same logits");
    r.line("all_reduce_peers", what + ": calls with rank 1's logits unlike rank 0's",
           ranksDiffer, 0, "bit-identical: the same sums in the same order");
  }
}

/// rms_norm_linear: launchNormedLinear against the CPU's rms_norm then
/// linear. The q8_0-split kernel normalises as it reads x (the GLM-5 q_b
/// shape among them), and so does the F32 kernel of 16-byte aligned rows
/// (GLM-5's indexer head weights, 6,144 -> 32); the other layouts, and F32
/// rows of 98 values, run the norm kernel into scratch.
void checkNormedLinear(Report &r, kiln::Rng &rng) {
  cpu::ThreadPool pool(4);
  struct Case {
    GGMLType type;
    int64_t k, n;
    bool split;
  };
  for (const Case &c : {Case{GGMLType::Q8_0, 2048, 6144, true},
                        Case{GGMLType::Q8_0, 512, 37, true},
                        Case{GGMLType::Q8_0, 6144, 200, true},
                        Case{GGMLType::Q4_K, 1024, 64, true},
                        Case{GGMLType::IQ4_XS, 1024, 64, true},
                        Case{GGMLType::Q5_1, 512, 37, true},
                        Case{GGMLType::Q8_0, 512, 37, false},
                        Case{GGMLType::F32, 96, 17, false},
                        Case{GGMLType::F32, 6144, 32, false},
                        Case{GGMLType::F32, 98, 5, false}}) {
    Weight w = randomWeight(c.type, {c.k, c.n}, rng.next());
    const std::string what =
        fmtText("%s [%lld, %lld]%s", typeName(c.type).c_str(), (long long)c.k,
                (long long)c.n, c.split ? ", split layout" : "");
    std::vector<float> x = normals(rng, size_t(c.k), 3.0),
                       g = normals(rng, size_t(c.k), 1.0), normed(size_t(c.k)),
                       want(size_t(c.n));
    const float eps = 1e-5f;
    cpu::rmsNorm(x.data(), 1, c.k, g.data(), eps, normed.data());
    if (!r.reference(
            "rms_norm_linear",
            cpu::linear(normed.data(), 1, w.view("w"), want.data(), pool)))
      continue;
    std::optional<SplitWeight> split;
    const kc::DeviceWeight dw = deviceWeight(w, c.split, split);
    DeviceArray<float> dx(x), dg(g), scratch(size_t(c.k)), dy(want.size()),
        again(want.size());
    const kc::InputNorm norm{dg.get(), eps, scratch.get()};
    run(kc::launchNormedLinear(dx.get(), norm, dw, dy.get(), nullptr));
    run(kc::launchNormedLinear(dx.get(), norm, dw, again.get(), nullptr));
    const std::vector<float> got = dy.download();
    // The norm's sum of squares in another order (one block's tree) and
    // fused multiply-adds in the dots: an ulp or two per term.
    r.line("rms_norm_linear", "vs rms_norm + linear " + what,
           relError(got, want), 2 * sumTol(double(c.k)),
           sumWhy("norm and dot order, fma, x2", c.k));
    r.line("rms_norm_linear", "again " + what,
           mismatches(again.download(), got), 0, "deterministic");
  }
}

/// swiglu_linear: launchSwigluLinear against the CPU's swiglu then linear.
/// The q8_0-split kernel forms silu(gate) * up as it loads x (GLM-5's
/// shared expert down at tp=8 among the shapes, and gate and up off 16-byte
/// alignment for the scalar loads); the other layouts run the swiglu kernel
/// into scratch.
void checkSwigluLinear(Report &r, kiln::Rng &rng) {
  cpu::ThreadPool pool(4);
  struct Case {
    GGMLType type;
    int64_t k, n;
    bool split, aligned = true;
  };
  for (const Case &c : {Case{GGMLType::Q8_0, 256, 6144, true},
                        Case{GGMLType::Q8_0, 2048, 768, true},
                        Case{GGMLType::Q8_0, 512, 37, true},
                        Case{GGMLType::Q8_0, 256, 100, true, false},
                        Case{GGMLType::Q4_K, 1024, 64, true},
                        Case{GGMLType::Q8_0, 512, 37, false},
                        Case{GGMLType::F32, 96, 17, false}}) {
    Weight w = randomWeight(c.type, {c.k, c.n}, rng.next());
    const std::string what =
        fmtText("%s [%lld, %lld]%s%s", typeName(c.type).c_str(), (long long)c.k,
                (long long)c.n, c.split ? ", split layout" : "",
                c.aligned ? "" : ", gate and up 4 bytes off 16-byte alignment");
    std::vector<float> gate = normals(rng, size_t(c.k), 3.0),
                       up = normals(rng, size_t(c.k), 1.0),
                       product(size_t(c.k)), want(size_t(c.n));
    cpu::swiglu(gate.data(), up.data(), c.k, product.data());
    if (!r.reference(
            "swiglu_linear",
            cpu::linear(product.data(), 1, w.view("w"), want.data(), pool)))
      continue;
    std::optional<SplitWeight> split;
    const kc::DeviceWeight dw = deviceWeight(w, c.split, split);
    // Unaligned: the vectors one float into their buffers.
    const size_t at = c.aligned ? 0 : 1;
    std::vector<float> g(at, 0.f), u(at, 0.f);
    g.insert(g.end(), gate.begin(), gate.end());
    u.insert(u.end(), up.begin(), up.end());
    DeviceArray<float> dg(g), du(u), scratch(size_t(c.k)), dy(want.size()),
        again(want.size());
    run(kc::launchSwigluLinear(dg.get() + at, du.get() + at, dw, scratch.get(),
                               dy.get(), nullptr));
    run(kc::launchSwigluLinear(dg.get() + at, du.get() + at, dw, scratch.get(),
                               again.get(), nullptr));
    const std::vector<float> got = dy.download();
    // Each product value within an ulp or two (the device's expf), the
    // dots in another order with fused multiply-adds: as for the norm.
    r.line("swiglu_linear", "vs swiglu + linear " + what, relError(got, want),
           2 * sumTol(double(c.k)), sumWhy("expf, dot order, fma, x2", c.k));
    r.line("swiglu_linear", "again " + what, mismatches(again.download(), got),
           0, "deterministic");
  }
}

/// live_from: the q8_0-split and F32 kernels below a projection's live
/// position compute its first rows only and leave the others as they were;
/// at or past it, every row. GLM-5's q_b at tp=8 (2,048 rows always, the
/// indexer's 4,096 from position 2,048), plain and with the input's norm,
/// runs whose every row is live from a position, and GLM-5's F32 indexer
/// head weights (6,144 -> 32).
void checkLiveRows(Report &r, kiln::Rng &rng) {
  cpu::ThreadPool pool(4);
  struct Case {
    int64_t k, n, liveRows;
    int32_t from, position;
    bool norm;
    GGMLType type = GGMLType::Q8_0;
  };
  for (const Case &c :
       {Case{2048, 6144, 2048, 2048, 1023, false},
        Case{2048, 6144, 2048, 2048, 2048, false},
        Case{2048, 6144, 2048, 2048, 1023, true},
        Case{2048, 6144, 2048, 2048, 5000, true},
        Case{512, 100, 37, 64, 63, true}, Case{512, 100, 0, 64, 0, false},
        Case{6144, 32, 0, 2048, 1023, false, GGMLType::F32},
        Case{6144, 32, 0, 2048, 2048, false, GGMLType::F32},
        Case{96, 17, 5, 64, 10, false, GGMLType::F32}}) {
    Weight w = randomWeight(c.type, {c.k, c.n}, rng.next());
    std::vector<float> x = normals(rng, size_t(c.k), 3.0),
                       g = normals(rng, size_t(c.k), 1.0), input(size_t(c.k)),
                       want(size_t(c.n));
    const float eps = 1e-5f;
    if (c.norm)
      cpu::rmsNorm(x.data(), 1, c.k, g.data(), eps, input.data());
    else
      input = x;
    if (!r.reference("live rows", cpu::linear(input.data(), 1, w.view("w"),
                                              want.data(), pool)))
      continue;
    const bool skip = c.position < c.from;
    // Rows left unwritten keep this mark.
    constexpr float kMark = -12345.f;
    if (skip)
      std::fill(want.begin() + c.liveRows, want.end(), kMark);
    // Q8_0 in its split layout; F32 in the file's (the held-rows kernel).
    std::optional<SplitWeight> split;
    const kc::DeviceWeight dw =
        deviceWeight(w, c.type == GGMLType::Q8_0, split);
    DeviceArray<float> dx(x), dg(g), scratch(size_t(c.k)),
        dy(std::vector<float>(size_t(c.n), kMark));
    DeviceArray<int32_t> pos(std::vector<int32_t>{c.position});
    const kc::LiveRows live{pos.get(), c.from, c.liveRows};
    if (c.norm)
      run(kc::launchNormedLinear(dx.get(),
                                 kc::InputNorm{dg.get(), eps, scratch.get()},
                                 dw, dy.get(), nullptr, &live));
    else
      run(kc::launchLinear(dx.get(), 1, dw, c.n, false, dy.get(), nullptr,
                           &live));
    const std::vector<float> got = dy.download();
    // The computed rows as the plain kernel's (the same tolerance), the
    // others exactly the mark.
    const std::vector<float> gotLive(got.begin(), got.begin() + c.liveRows),
        wantLive(want.begin(), want.begin() + c.liveRows),
        gotRest(got.begin() + c.liveRows, got.end()),
        wantRest(want.begin() + c.liveRows, want.end());
    const double err =
        (c.liveRows > 0 ? relError(gotLive, wantLive) : 0.0) +
        (skip ? double(mismatches(gotRest, wantRest))
              : (gotRest.empty() ? 0.0 : relError(gotRest, wantRest)));
    r.line("live rows",
           fmtText("%s [%lld, %lld]%s, rows %lld.. live from %d, at %d: %s",
                   typeName(c.type).c_str(), (long long)c.k, (long long)c.n,
                   c.norm ? " normed" : "", (long long)c.liveRows, c.from,
                   c.position, skip ? "first rows only" : "every row"),
           err, 2 * sumTol(double(c.k)),
           sumWhy("dot order, fma, x2; skipped rows untouched", c.k));
  }
}

/// The q8_0-split kernels compiled for GLM-5's widths (ModelShapes.h, run
/// with KILN_CUDA_SPECIALISED=1): at every width of the three lists, with
/// the switch on, the fixed-width kernel ran (the launch count the
/// plugin reports went up by one) and gave the general kernel's bits (the
/// same products in the same order) and the CPU's values within the
/// general kernel's tolerance; live rows below and past their position
/// likewise; and where it must not run (a row count off the rows a warp
/// takes, a width not in the lists) the general kernel did.
void checkWidthKernels(Report &r, kiln::Rng &rng) {
  cpu::ThreadPool pool(4);
  enum class Input { Plain, Norm, Swiglu };
  struct Case {
    Input input;
    int64_t k, n, batch = 1;
    bool fixed = true; ///< the fixed-width kernel must run
    int64_t liveRows = -1;
    int32_t from = 0, position = 0;
  };
  std::vector<Case> cases;
  // attn_k_b and attn_v_b as GLM-5's tp=8 rank has them: 8 heads stacked,
  // 512 latent rows of 192 nope values, 256 value rows of 512 latent ones.
  for (int64_t k : widthList(kc::glm5::Q8PlainWidths{}))
    cases.push_back(k == kc::glm5::kNope     ? Case{Input::Plain, k, 512, 8}
                    : k == kc::glm5::kLatent ? Case{Input::Plain, k, 256, 8}
                                             : Case{Input::Plain, k, 64});
  for (int64_t k : widthList(kc::glm5::Q8NormWidths{}))
    cases.push_back(Case{Input::Norm, k, 64});
  for (int64_t k : widthList(kc::glm5::Q8SwigluWidths{}))
    cases.push_back(Case{Input::Swiglu, k, 64});
  // q_b with the indexer's rows at tp=8: 2,048 live rows of 6,144 below
  // position 2,048, every row from it.
  cases.push_back(Case{Input::Norm, 2048, 6144, 1, true, 2048, 2048, 1023});
  cases.push_back(Case{Input::Norm, 2048, 6144, 1, true, 2048, 2048, 2048});
  // The general kernel: 37 rows (the last warp's item short), live rows
  // off the rows a warp takes, a width not in the lists.
  cases.push_back(Case{Input::Plain, 2048, 37, 1, false});
  cases.push_back(Case{Input::Norm, 2048, 64, 1, false, 30, 2048, 1023});
  cases.push_back(Case{Input::Plain, 3072, 64, 1, false});
  for (const Case &c : cases) {
    const bool stacked = c.batch > 1;
    const std::vector<int64_t> dims =
        stacked ? std::vector<int64_t>{c.k, c.n, c.batch}
                : std::vector<int64_t>{c.k, c.n};
    Weight w = randomWeight(GGMLType::Q8_0, dims, rng.next());
    const int64_t outs = c.batch * c.n;
    std::vector<float> x = normals(rng, size_t(c.batch * c.k), 3.0),
                       g = normals(rng, size_t(c.k), 1.0), input(x.size()),
                       want(static_cast<size_t>(outs));
    const float eps = 1e-5f;
    if (c.input == Input::Norm)
      cpu::rmsNorm(x.data(), 1, c.k, g.data(), eps, input.data());
    else if (c.input == Input::Swiglu)
      cpu::swiglu(x.data(), g.data(), c.k, input.data());
    else
      input = x;
    if (!r.reference("fixed width", cpu::linear(input.data(), c.batch,
                                                w.view("w"), want.data(), pool)))
      continue;
    const bool skip = c.liveRows >= 0 && c.position < c.from;
    constexpr float kMark = -12345.f; // rows left unwritten keep it
    if (skip)
      std::fill(want.begin() + c.liveRows, want.end(), kMark);
    SplitWeight split = repackSplit(w);
    const kc::DeviceWeight dw = split.dev(w);
    DeviceArray<float> dx(x), dg(g), scratch(size_t(c.k));
    DeviceArray<int32_t> pos(std::vector<int32_t>{c.position});
    const kc::LiveRows live{pos.get(), c.from, c.liveRows};
    const kc::LiveRows *liveArg = c.liveRows >= 0 ? &live : nullptr;
    // One launch with the switch as given: its output, and how many
    // fixed-width kernels it ran.
    const auto launch = [&](bool on) {
      DeviceArray<float> dy(std::vector<float>(size_t(outs), kMark));
      const FixedShapes fixed(on);
      if (c.input == Input::Norm)
        run(kc::launchNormedLinear(dx.get(),
                                   kc::InputNorm{dg.get(), eps, scratch.get()},
                                   dw, dy.get(), nullptr, liveArg));
      else if (c.input == Input::Swiglu)
        run(kc::launchSwigluLinear(dx.get(), dg.get(), dw, scratch.get(),
                                   dy.get(), nullptr));
      else
        run(kc::launchLinear(dx.get(), c.batch, dw, c.n, stacked, dy.get(),
                             nullptr, liveArg));
      return std::pair{dy.download(), fixed.ran()};
    };
    const auto [general, generalRan] = launch(false);
    const auto [got, ran] = launch(true);
    std::string what = fmtText(
        "Q8_0 [%lld, %lld", (long long)c.k, (long long)c.n);
    what += stacked ? fmtText(", %lld] stacked", (long long)c.batch) : "]";
    what += c.input == Input::Norm     ? " normed"
            : c.input == Input::Swiglu ? " swiglu"
                                       : "";
    if (c.liveRows >= 0)
      what += fmtText(", rows %lld.. live from %d, at %d", (long long)c.liveRows,
                      c.from, c.position);
    r.line("fixed width",
           fmtText("%s: %s", what.c_str(),
                   c.fixed ? "the fixed-width kernel ran"
                           : "the general kernel ran"),
           double(generalRan) + std::fabs(double(ran) - (c.fixed ? 1.0 : 0.0)),
           0, "launch count");
    r.line("fixed width", what + ": the general kernel's bits",
           mismatches(got, general), 0, "same products, same order");
    // Computed rows as the general kernel's tolerance allows; rows left
    // out below their live position exactly the mark.
    const size_t live0 = skip ? size_t(c.liveRows) : want.size();
    const std::vector<float> gotLive(got.begin(), got.begin() + live0),
        wantLive(want.begin(), want.begin() + live0),
        gotRest(got.begin() + live0, got.end()),
        wantRest(want.begin() + live0, want.end());
    r.line("fixed width", what + ": vs the CPU",
           relError(gotLive, wantLive) + mismatches(gotRest, wantRest),
           2 * sumTol(double(c.k)),
           sumWhy("norm/swiglu and dot order, fma, x2", c.k));
  }
}

/// The routed gate/up kernels compiled for GLM-5's hidden width and each
/// expert width, and the down kernel for its hidden width and top-k
/// (ModelShapes.h, KILN_CUDA_SPECIALISED=1): Q4_K, Q5_K, Q2_K and Q3_K
/// gate/up (fused and not), 16 experts, 8 chosen with a repeat; the fixed-width kernels
/// ran, the whole op gave the general kernels' bits and the CPU's values
/// within moe_experts' tolerance; at a hidden width not in the list, the
/// general kernels ran.
void checkExpertWidthKernels(Report &r, kiln::Rng &rng) {
  cpu::ThreadPool pool(4);
  struct Case {
    GGMLType gateType, downType;
    bool fused;
    int64_t hidden, ffn;
    bool fixed = true;
  };
  std::vector<Case> cases;
  for (int64_t ffn : widthList(kc::glm5::ExpertFfnWidths{})) {
    cases.push_back(
        Case{GGMLType::Q4_K, GGMLType::Q5_K, false, kc::glm5::kHidden, ffn});
    cases.push_back(
        Case{GGMLType::Q5_K, GGMLType::Q4_K, true, kc::glm5::kHidden, ffn});
    // The 2-bit mix's formats, and the two swapped.
    cases.push_back(
        Case{GGMLType::Q2_K, GGMLType::Q3_K, false, kc::glm5::kHidden, ffn});
    cases.push_back(
        Case{GGMLType::Q3_K, GGMLType::Q2_K, true, kc::glm5::kHidden, ffn});
  }
  cases.push_back(Case{GGMLType::Q4_K, GGMLType::Q5_K, false, 4096, 256, false});
  const int64_t experts = 16, k = 8;
  for (const Case &c : cases) {
    const Experts set = randomExperts(c.gateType, c.downType, c.fused,
                                      c.hidden, c.ffn, experts, rng);
    const std::optional<Weight> &up = set.up;
    std::vector<float> x = normals(rng, c.hidden, 1.0);
    std::vector<int32_t> ids(static_cast<size_t>(k));
    for (int32_t &id : ids)
      id = int32_t(rng.below(uint64_t(experts)));
    ids.back() = ids.front(); // a repeat is allowed
    std::vector<float> weights = normals(rng, k, 0.3, 0.5);
    std::vector<float> want(static_cast<size_t>(c.hidden));
    if (!r.reference("fixed width",
                     cpuExperts(set, x.data(), c.hidden, ids.data(),
                                weights.data(), k, want.data(), pool)))
      continue;
    DeviceArray<float> dx(x), dw(weights), act(size_t(k * c.ffn));
    DeviceArray<int32_t> dids(ids);
    const kc::DeviceWeight gd = set.gate.dev(), dd = set.down.dev(),
                           ud = up ? up->dev() : kc::DeviceWeight{};
    const auto launch = [&](bool on) {
      DeviceArray<float> dout(size_t(c.hidden));
      Fault fault;
      const FixedShapes fixed(on);
      run(kc::launchMoeExperts(dx.get(), c.hidden, c.ffn, experts, dids.get(),
                               dw.get(), k, gd, up ? &ud : nullptr, dd,
                               act.get(), nullptr, dout.get(), fault.sink(),
                               nullptr));
      return std::tuple{dout.download(), fixed.ran(),
                        faultMismatch(fault.read(), kc::FaultCode::None, 0, 0)};
    };
    const auto [general, generalRan, generalFault] = launch(false);
    const auto [got, ran, fault] = launch(true);
    const std::string what = fmtText(
        "%s %s + down %s, H%lld F%lld E%lld k%lld",
        c.fused ? "gate_up" : "gate/up", typeName(c.gateType).c_str(),
        typeName(c.downType).c_str(), (long long)c.hidden, (long long)c.ffn,
        (long long)experts, (long long)k);
    // gate/up, and down where its fast kernel runs (width 256: tp = 8).
    // Q3_K's fixed down kernel takes 80 registers to the general one's 64
    // on sm_90, so it holds fewer blocks and the launch keeps the general
    // one (holdsAsMany): either count is right for it.
    const double expected = c.fixed ? (c.ffn == 256 ? 2.0 : 1.0) : 0.0;
    const bool downMayStayGeneral =
        c.fixed && c.ffn == 256 && c.downType == GGMLType::Q3_K;
    const double miss = downMayStayGeneral && ran == 1
                            ? 0.0
                            : std::fabs(double(ran) - expected);
    r.line("fixed width",
           what + (!c.fixed ? ": the general kernels ran"
                   : downMayStayGeneral
                       ? fmtText(": the fixed-width gate/up kernel ran, and "
                                 "%s down kernel",
                                 ran == 2 ? "the fixed" : "the general")
                   : c.ffn == 256
                       ? ": the fixed-width gate/up and down kernels ran"
                       : ": the fixed-width gate/up kernel ran"),
           double(generalRan) + miss, 0, "launch count");
    r.line("fixed width", what + ": the general kernels' bits",
           mismatches(got, general) + generalFault + fault, 0,
           "same products, same order; no fault");
    r.line("fixed width", what + ": vs the CPU", relError(got, want),
           2 * (sumTol(double(c.hidden)) + sumTol(double(c.ffn))),
           fmtText("as moe_experts, 2e-6*(sqrt(%lld)+sqrt(%lld))",
                   (long long)c.hidden, (long long)c.ffn));
  }
}

/// GLM-5's router handing its ids to the routed experts by tags
/// (kc::TaggedIds): two steps with all-reduce epochs (one simulated
/// all-reduce each, so that the steps' word advances), each the router at
/// GLM-5's shape and then the experts (Q4_K gate/up, Q5_K down, F = 256:
/// the bulk-copy kernels, compiled for the shape) polling the router's
/// tagged ids. The second step's input differs, so stale tags would show.
/// Each step's output and ids against the same experts launched after it
/// without the tags (waiting for the router's end): the same bits.
void checkTaggedIds(Report &r, kiln::Rng &rng) {
  const int64_t hidden = kc::glm5::kHidden, experts = kc::glm5::kExperts,
                k = kc::glm5::kTopK, ffn = 256, capacity = 6144, small = 64;
  const FixedShapes fixed(true);
  Weight gate = randomWeight(GGMLType::F32, {hidden, experts}, rng.next());
  const Experts set = randomExperts(GGMLType::Q4_K, GGMLType::Q5_K, false,
                                    hidden, ffn, experts, rng);
  const kc::DeviceWeight gd = set.gate.dev(), ud = set.up->dev(),
                         dd = set.down.dev();
  DeviceArray<float> db(normals(rng, experts, 0.1)),
      scratch(size_t(kc::routerScratchFloats(experts))), dw(k),
      act(size_t(k * ffn)), out{size_t(hidden)}, plain{size_t(hidden)},
      dsmall(normals(rng, small, 1.0)), dsmallOut{size_t(small)};
  DeviceArray<int32_t> ids(k);
  DeviceArray<uint32_t> epochBase(size_t(1));
  const uint64_t bytes = kc::peerExchangeBytes(capacity, 0);
  DeviceArray<uint8_t> exchange(bytes);
  const kc::PeerExchange p =
      kc::peerExchangeView({exchange.get()}, 8, 0, capacity, true);
  const bool clusters = kc::peerClusters();
  kc::setPeerClusters(false);
  double published = 0, polled = 0, diff = 0, faults = 0;
  for (int step = 0; step < 2; ++step) {
    DeviceArray<float> dx(normals(rng, hidden, 1.0));
    kc::beginStepEpochs(epochBase.get());
    run(kc::launchAllReducePeers(p, dsmall.get(), 1, small, true, nullptr,
                                 nullptr, 1e-5f, dsmallOut.get(), nullptr, {},
                                 nullptr));
    kc::TaggedIds tagged;
    run(kc::launchMoeRouter(dx.get(), gate.dev(), db.get(), k,
                            kc::Gating::Sigmoid, true, 2.5f, scratch.get(),
                            ids.get(), dw.get(), nullptr, nullptr, nullptr,
                            &tagged));
    published += tagged.words != nullptr;
    const uint64_t before = kc::moeTaggedIdLaunches();
    Fault fault, plainFault;
    run(kc::launchMoeExperts(dx.get(), hidden, ffn, experts, ids.get(),
                             dw.get(), k, gd, &ud, dd, act.get(), nullptr,
                             out.get(), fault.sink(), nullptr, nullptr,
                             &tagged));
    polled += double(kc::moeTaggedIdLaunches() - before);
    run(kc::launchAdvanceEpochs(epochBase.get(), kc::endStepEpochs(),
                                nullptr));
    run(kc::launchMoeExperts(dx.get(), hidden, ffn, experts, ids.get(),
                             dw.get(), k, gd, &ud, dd, act.get(), nullptr,
                             plain.get(), plainFault.sink(), nullptr));
    diff += double(mismatches(out.download(), plain.download()));
    faults += faultMismatch(fault.read(), kc::FaultCode::None, 0, 0) +
              faultMismatch(plainFault.read(), kc::FaultCode::None, 0, 0);
  }
  kc::setPeerClusters(clusters);
  r.line("tagged ids",
         "GLM-5's router and experts (Q4_K / Q5_K, F 256), two steps: the "
         "router published its ids both times, the experts polled them",
         std::fabs(published - 2) + std::fabs(polled - 2), 0, "launch count");
  r.line("tagged ids",
         "the experts by tags against the same experts after the router's end",
         diff + faults, 0, "bit-identical output, no fault");
}

} // namespace

int main(int argc, char **argv) {
  uint64_t seed = 1;
  bool bench = false, benchMoeOnly = false, benchDsaOnly = false,
       benchChainOnly = false, benchImagesOnly = false,
       benchEdgesOnly = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (std::string(argv[i]) == "--bench") {
      bench = true;
    } else if (std::string(argv[i]) == "--bench-moe") {
      benchMoeOnly = true;
    } else if (std::string(argv[i]) == "--bench-dsa") {
      benchDsaOnly = true;
    } else if (std::string(argv[i]) == "--bench-chain") {
      benchChainOnly = true;
    } else if (std::string(argv[i]) == "--bench-images") {
      benchImagesOnly = true;
    } else if (std::string(argv[i]) == "--bench-edges") {
      benchEdgesOnly = true;
    } else if (std::string(argv[i]) == "--bench-router") {
      benchRouter();
      return 0;
    } else if (std::string(argv[i]) == "--bench-choice") {
      return benchChoice();
    } else if (std::string(argv[i]) == "--bench-params") {
      benchParams();
      return 0;
    } else {
      std::fprintf(stderr, "usage: kiln-cuda-ops [--seed N] [--bench | "
                           "--bench-moe | --bench-dsa | --bench-chain | "
                           "--bench-images | --bench-edges | --bench-router | "
                           "--bench-choice | --bench-params]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "kiln-cuda-ops: error: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d), seed %llu\n", prop.name, prop.major,
              prop.minor, (unsigned long long)seed);

  if (benchMoeOnly) {
    benchMoe();
    return 0;
  }
  if (benchDsaOnly) {
    benchDsa(5);
    return 0;
  }
  if (benchChainOnly)
    return benchChain() ? 0 : 1;
  if (benchImagesOnly) {
    benchImages();
    return 0;
  }
  if (benchEdgesOnly) {
    benchEdges();
    return 0;
  }
  if (bench) {
    benchLinear();
    benchQ8Mix();
    benchImages();
    benchEdges();
    benchOps();
    return 0;
  }

  kiln::Rng rng(seed);
  Report report;
  checkElementwise(report, rng);
  checkNorms(report, rng);
  checkRope(report, rng);
  checkSlice(report, rng);
  checkConcat(report, rng);
  checkGatherReorder(report, rng);
  checkFillAndDequant(report, rng);
  checkEmbed(report, rng);
  checkLinear(report, rng);
  checkSplitLayouts(report, rng);
  checkCacheAppend(report, rng);
  checkNormRopeAppend(report, rng);
  checkMlaAttention(report, rng);
  checkDsaIndexer(report, rng);
  checkMoeRouter(report, rng);
  checkMoeRouterTies(report, rng);
  checkMoeExperts(report, rng);
  checkExpertsInt8X(report, rng);
  checkMoeSharedExpert(report, rng);
  checkRouterFold(report, rng);
  checkLinearRouter(report, rng);
  checkArgmax(report, rng);
  checkDrawnArgmax(report, rng);
  checkNucleusArgmax(report, rng);
  checkAdjustLogits(report, rng);
  checkNormedLinear(report, rng);
  checkSwigluLinear(report, rng);
  checkLiveRows(report, rng);
  checkWidthKernels(report, rng);
  checkExpertWidthKernels(report, rng);
  checkTaggedIds(report, rng);
  checkAllReducePeers(report, rng);
  checkDirectSlotsInGraphs(report, rng, false, false);
  checkDirectSlotsInGraphs(report, rng, true, false);
  checkDirectSlotsInGraphs(report, rng, false, true);
  checkDirectSlotsInGraphs(report, rng, true, true);

  std::printf("kiln-cuda-ops: %d of %d cases passed (seed %llu)\n",
              report.cases - report.failures, report.cases,
              (unsigned long long)seed);
  return report.failures ? 1 : 0;
}
