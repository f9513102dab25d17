//===- kiln-cuda-matvec.cu - Check and time the GPU mat-vec kernels --------===//
//
// kiln-cuda-matvec [--seed N]        checks, then times, on the first GPU
//
// Check: random matrices quantised with Kiln's quantisers (Q8_0, Q4_K) are
// repacked into the device layout; the GPU dequantiser must reproduce
// kiln::dequantize (bit-exact with gguf-py) bit for bit, and the mat-vec
// must match a double-precision product of those values within 1e-5
// relative (float32 accumulation over at most 16384 terms, different order).
// Time: GLM-5-sized matrices, 200 back-to-back launches between CUDA events;
// prints bytes read per launch, microseconds, and GB/s against the device's
// copy bandwidth (kiln-bandwidth). Exit 1 on any mismatch.
//
//===----------------------------------------------------------------------===//
#include "MatVec.h"

#include "quant/QuantFormats.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace kiln;
using namespace kiln::cuda;

#define CHECK_CUDA(call)                                                       \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "kiln-cuda-matvec: error: %s: %s\n", #call,         \
                   cudaGetErrorString(e_));                                    \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

namespace {

struct Matrix {
  PackedMatrix packed;
  std::vector<float> values; // the file's values, via kiln::dequantize
  DeviceMatrix device;
  uint8_t *dq = nullptr, *ds = nullptr;
};

/// A matrix's GGUF bytes. Checked matrices are quantised from random
/// values by Kiln's quantisers (realistic blocks); timed ones, too large
/// for the host quantisers (about a million values a second), are random
/// valid blocks: random quant bytes, finite random scales.
std::vector<uint8_t> ggufBytes(GGMLType type, int64_t rows, int64_t cols,
                               std::mt19937 &rng, bool quantised) {
  uint64_t rb = *rowBytes(type, uint64_t(cols));
  std::vector<uint8_t> gguf(size_t(rb * rows));
  if (!quantised) {
    for (uint8_t &b : gguf)
      b = uint8_t(rng());
    // Overwrite every block's f16 scales with finite values in [1e-3, 2e-3).
    uint32_t blockBytes = traitsOf(type).blockBytes;
    int scales = type == GGMLType::Q4_K ? 2 : 1;
    for (size_t at = 0; at < gguf.size(); at += blockBytes)
      for (int k = 0; k < scales; ++k) {
        uint16_t h = uint16_t(0x1419 + rng() % 0x3ff); // about 1e-3..2e-3
        std::memcpy(&gguf[at + 2 * k], &h, 2);
      }
    return gguf;
  }
  std::normal_distribution<float> normal(0.f, 0.05f);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (float &v : row)
      v = normal(rng);
    if (Status st = quantize(type, row, std::span(gguf).subspan(r * rb, rb));
        !st) {
      std::fprintf(stderr, "quantize: %s\n", st.error().message().c_str());
      std::exit(1);
    }
  }
  return gguf;
}

/// The largest |y - W x| over the rows, W x in double, relative to the
/// largest sum of |terms| of a row (the scale float32 rounding works at).
double productError(const std::vector<float> &w, const std::vector<float> &x,
                    const std::vector<float> &y, int64_t rows, int64_t cols) {
  double worst = 0, scale = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0, mag = 0;
    for (int64_t c = 0; c < cols; ++c) {
      sum += double(w[r * cols + c]) * x[c];
      mag += std::fabs(double(w[r * cols + c]) * x[c]);
    }
    worst = std::max(worst, std::fabs(y[r] - sum));
    scale = std::max(scale, mag);
  }
  return worst / scale;
}

Matrix make(GGMLType type, int64_t rows, int64_t cols, std::mt19937 &rng,
            bool quantised = true) {
  std::vector<uint8_t> gguf = ggufBytes(type, rows, cols, rng, quantised);
  Matrix m;
  if (quantised) {
  m.values.resize(size_t(rows * cols));
  if (Status st = dequantize(type, gguf, m.values); !st) {
    std::fprintf(stderr, "dequantize: %s\n", st.error().message().c_str());
    std::exit(1);
  }
  }
  Expected<PackedMatrix> p = packMatrix(type, rows, cols, gguf);
  if (!p) {
    std::fprintf(stderr, "pack: %s\n", p.error().message().c_str());
    std::exit(1);
  }
  m.packed = std::move(*p);
  CHECK_CUDA(cudaMalloc(&m.dq, m.packed.quants.size()));
  CHECK_CUDA(cudaMalloc(&m.ds, m.packed.scales.size()));
  CHECK_CUDA(cudaMemcpy(m.dq, m.packed.quants.data(), m.packed.quants.size(),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(m.ds, m.packed.scales.data(), m.packed.scales.size(),
                        cudaMemcpyHostToDevice));
  m.device = {type, rows, cols, m.dq, m.ds};
  return m;
}

void release(Matrix &m) {
  cudaFree(m.dq);
  cudaFree(m.ds);
}

bool check(GGMLType type, int64_t rows, int64_t cols, std::mt19937 &rng,
           int rowsPerWarp) {
  Matrix m = make(type, rows, cols, rng);
  float *dout, *dx, *dy;
  CHECK_CUDA(cudaMalloc(&dout, m.values.size() * sizeof(float)));
  CHECK_CUDA(launchDequant(m.device, dout, nullptr));
  std::vector<float> got(m.values.size());
  CHECK_CUDA(cudaMemcpy(got.data(), dout, got.size() * sizeof(float),
                        cudaMemcpyDeviceToHost));
  bool exact = std::memcmp(got.data(), m.values.data(),
                           got.size() * sizeof(float)) == 0;

  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(cols)), y(static_cast<size_t>(rows));
  for (float &v : x)
    v = normal(rng);
  CHECK_CUDA(cudaMalloc(&dx, x.size() * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&dy, y.size() * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(dx, x.data(), x.size() * sizeof(float),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(launchMatVecRows(m.device, dx, dy, rowsPerWarp, nullptr));
  CHECK_CUDA(cudaMemcpy(y.data(), dy, y.size() * sizeof(float),
                        cudaMemcpyDeviceToHost));
  double rel = productError(m.values, x, y, rows, cols);
  bool ok = exact && rel <= 1e-5;
  std::printf("check %-5s %6lld x %-6lld (%d rows/warp) dequant %s, mat-vec "
              "max error %.2e of the largest |terms| sum: %s\n",
              std::string(nameOf(type)).c_str(), (long long)rows,
              (long long)cols, rowsPerWarp, exact ? "bit-exact" : "DIFFERS", rel,
              ok ? "ok" : "FAIL");
  cudaFree(dout);
  cudaFree(dx);
  cudaFree(dy);
  release(m);
  return ok;
}

/// The generic path: every type left in the file's layout. Types Kiln can
/// quantise are quantised from random values; Q2_K and Q3_K (no quantiser)
/// are random bytes with their fp16 scales made finite.
bool checkGeneric(GGMLType type, std::mt19937 &rng) {
  const int64_t rows = 37, cols = 512;
  uint64_t rb = *rowBytes(type, uint64_t(cols));
  std::vector<uint8_t> gguf;
  if (canQuantize(type)) {
    gguf = ggufBytes(type, rows, cols, rng, /*quantised=*/true);
  } else {
    gguf.resize(size_t(rb * rows));
    for (uint8_t &b : gguf)
      b = uint8_t(rng());
    uint32_t bb = traitsOf(type).blockBytes;
    std::vector<int> halves = type == GGMLType::Q2_K ? std::vector<int>{80, 82}
                                                     : std::vector<int>{108};
    for (size_t at = 0; at < gguf.size(); at += bb)
      for (int off : halves) {
        uint16_t h = uint16_t(0x1419 + rng() % 0x3ff);
        std::memcpy(&gguf[at + off], &h, 2);
      }
  }
  std::vector<float> want(size_t(rows * cols));
  if (Status st = dequantize(type, gguf, want); !st) {
    std::fprintf(stderr, "dequantize: %s\n", st.error().message().c_str());
    return false;
  }
  uint8_t *dw;
  float *dout, *dx, *dy;
  CHECK_CUDA(cudaMalloc(&dw, gguf.size()));
  CHECK_CUDA(cudaMemcpy(dw, gguf.data(), gguf.size(), cudaMemcpyHostToDevice));
  GenericMatrix w{type, rows, cols, dw};
  CHECK_CUDA(cudaMalloc(&dout, want.size() * sizeof(float)));
  CHECK_CUDA(launchDequantGeneric(w, dout, nullptr));
  std::vector<float> got(want.size());
  CHECK_CUDA(cudaMemcpy(got.data(), dout, got.size() * sizeof(float),
                        cudaMemcpyDeviceToHost));
  bool exact =
      std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(cols)), y(static_cast<size_t>(rows));
  for (float &v : x)
    v = normal(rng);
  CHECK_CUDA(cudaMalloc(&dx, x.size() * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&dy, y.size() * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(dx, x.data(), x.size() * sizeof(float),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(launchMatVecGeneric(w, dx, dy, nullptr));
  CHECK_CUDA(cudaMemcpy(y.data(), dy, y.size() * sizeof(float),
                        cudaMemcpyDeviceToHost));
  double rel = productError(want, x, y, rows, cols);
  bool ok = exact && rel <= 1e-5;
  std::printf("check generic %-6s %3lld x %lld dequant %s, mat-vec max error "
              "%.2e: %s\n",
              std::string(nameOf(type)).c_str(), (long long)rows,
              (long long)cols, exact ? "bit-exact" : "DIFFERS", rel,
              ok ? "ok" : "FAIL");
  cudaFree(dw);
  cudaFree(dout);
  cudaFree(dx);
  cudaFree(dy);
  return ok;
}

void bench(const char *what, GGMLType type, int64_t rows, int64_t cols,
           std::mt19937 &rng, int rowsPerWarp) {
  Matrix m = make(type, rows, cols, rng, /*quantised=*/false);
  float *dx, *dy;
  CHECK_CUDA(cudaMalloc(&dx, size_t(cols) * sizeof(float)));
  CHECK_CUDA(cudaMemset(dx, 0, size_t(cols) * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&dy, size_t(rows) * sizeof(float)));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 20; ++i)
    CHECK_CUDA(launchMatVecRows(m.device, dx, dy, rowsPerWarp, nullptr));
  constexpr int kLaunches = 200;
  CHECK_CUDA(cudaEventRecord(start));
  for (int i = 0; i < kLaunches; ++i)
    CHECK_CUDA(launchMatVecRows(m.device, dx, dy, rowsPerWarp, nullptr));
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  double us = ms * 1000.0 / kLaunches;
  double bytes = double(m.packed.quants.size() + m.packed.scales.size());
  std::printf("bench %-34s %-5s %d rows/warp %6lld x %-6lld %8.2f MB %8.2f us "
              "%6.0f GB/s\n",
              what, std::string(nameOf(type)).c_str(), rowsPerWarp,
              (long long)rows,
              (long long)cols, bytes / 1e6, us, bytes / us / 1e3);
  cudaFree(dx);
  cudaFree(dy);
  release(m);
}

} // namespace

int main(int argc, char **argv) {
  unsigned seed = 20261130;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--seed" && i + 1 < argc)
      seed = unsigned(std::strtoul(argv[++i], nullptr, 10));
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "kiln-cuda-matvec: error: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d), seed %u\n", prop.name, prop.major,
              prop.minor, seed);
  std::mt19937 rng(seed);
  bool ok = true;
  for (int r : {1, 2, 4, 8})
    for (GGMLType type : {GGMLType::Q8_0, GGMLType::Q4_K}) {
      ok &= check(type, 64, 256, rng, r);
      ok &= check(type, 333, 6144, rng, r);
      ok &= check(type, 32, 16384, rng, r);
    }
  for (GGMLType type :
       {GGMLType::F32, GGMLType::F16, GGMLType::BF16, GGMLType::Q4_0,
        GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q5_1, GGMLType::Q8_0,
        GGMLType::Q2_K, GGMLType::Q3_K, GGMLType::Q4_K, GGMLType::Q5_K,
        GGMLType::Q6_K, GGMLType::IQ4_NL, GGMLType::IQ4_XS})
    ok &= checkGeneric(type, rng);
  if (!ok) {
    std::printf("kiln-cuda-matvec: checks failed; not timing\n");
    return 1;
  }
  // GLM-5 shapes (rows = output features, cols = ne[0]), at every
  // rows-per-warp choice (the library picks 2, or 4 from 32768 rows).
  for (int r : {1, 2, 4, 8}) {
    bench("attn_q_a (6144 -> 2048)", GGMLType::Q8_0, 2048, 6144, rng, r);
    bench("attn_q_b (2048 -> 16384)", GGMLType::Q8_0, 16384, 2048, rng, r);
    bench("attn_output (16384 -> 6144)", GGMLType::Q8_0, 6144, 16384, rng, r);
    bench("dense ffn_up (6144 -> 12288)", GGMLType::Q4_K, 12288, 6144, rng, r);
    bench("tp8 expert gate (6144 -> 256)", GGMLType::Q4_K, 256, 6144, rng, r);
    bench("8 experts' gate (6144 -> 16384)", GGMLType::Q4_K, 16384, 6144, rng,
          r);
    bench("large (6144 -> 65536)", GGMLType::Q4_K, 65536, 6144, rng, r);
  }
  return ok ? 0 : 1;
}
