//===- Bandwidth.cu - Device copy bandwidth: the roofline's denominator ----===//
//
// kiln-bandwidth [--device N] [--iters N]
//
// Measures, for buffer sizes from 1 MiB to 1 GiB, how fast one GPU can
// stream memory: a grid-stride kernel reading and writing 16 bytes per thread
// per iteration, and cudaMemcpyAsync device-to-device, each timed over
// `iters` launches with CUDA events after a warm-up. Reports GB/s counting
// bytes read plus bytes written. A decode step's floor is its bytes read
// divided by this read+write figure (a mat-vec only reads, but a copy of N
// bytes moves 2N through the same DRAM interface).
//
//===----------------------------------------------------------------------===//
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

#define KILN_CUDA_CHECK(call)                                                  \
  do {                                                                         \
    cudaError_t err_ = (call);                                                 \
    if (err_ != cudaSuccess) {                                                 \
      std::fprintf(stderr, "kiln-bandwidth: error: %s failed: %s\n", #call,    \
                   cudaGetErrorString(err_));                                  \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

constexpr int kThreadsPerBlock = 256;

/// 16-byte vectors each thread has in flight per loop trip: enough
/// independent loads to cover DRAM latency with 8 blocks of 256 per SM.
constexpr int kUnroll = 4;

/// Grid-stride copy of 16-byte vectors: fully coalesced 128-bit loads and
/// stores, kUnroll loads issued before the first store of a trip.
__global__ void copyKernel(const int4 *__restrict__ src, int4 *__restrict__ dst,
                           size_t n) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    int4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      dst[i + u * stride] = v[u];
  }
  for (; i < n; i += stride)
    dst[i] = src[i];
}

int parseInt(const char *flag, const char *value) {
  char *end = nullptr;
  long v = std::strtol(value, &end, 10);
  if (!*value || *end || v < 0 || v > 1 << 20) {
    std::fprintf(stderr, "kiln-bandwidth: error: %s: not a count: '%s'\n",
                 flag, value);
    std::exit(2);
  }
  return int(v);
}

} // namespace

int main(int argc, char **argv) {
  int device = 0, iters = 50;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if ((arg == "--device" || arg == "--iters") && i + 1 < argc) {
      int v = parseInt(argv[i], argv[i + 1]);
      (arg == "--device" ? device : iters) = v;
      ++i;
    } else if (arg == "--help" || arg == "-h") {
      std::printf("usage: kiln-bandwidth [--device N] [--iters N]\n"
                  "Device copy bandwidth (read+write GB/s) per buffer size.\n");
      return 0;
    } else {
      std::fprintf(stderr, "kiln-bandwidth: error: unknown argument '%s'\n",
                   argv[i]);
      return 2;
    }
  }
  if (iters == 0)
    iters = 1;

  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::fprintf(stderr, "kiln-bandwidth: error: no CUDA device (%s)\n",
                 err == cudaSuccess ? "none found" : cudaGetErrorString(err));
    return 1;
  }
  if (device >= count) {
    std::fprintf(stderr, "kiln-bandwidth: error: --device %d: only %d device(s)\n",
                 device, count);
    return 2;
  }
  KILN_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop;
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("device %d: %s, sm_%d%d, %d SMs, %.1f GiB\n", device, prop.name,
              prop.major, prop.minor, prop.multiProcessorCount,
              prop.totalGlobalMem / double(1 << 30));

  // Up to 1 GiB: far beyond the 50 MB L2, so the large sizes measure DRAM.
  constexpr size_t kMaxBytes = size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&src, kMaxBytes));
  KILN_CUDA_CHECK(cudaMalloc(&dst, kMaxBytes));
  KILN_CUDA_CHECK(cudaMemset(src, 1, kMaxBytes));
  cudaEvent_t start, stop;
  KILN_CUDA_CHECK(cudaEventCreate(&start));
  KILN_CUDA_CHECK(cudaEventCreate(&stop));
  int blocks = prop.multiProcessorCount * 8;

  std::printf("%10s %14s %14s\n", "bytes", "kernel GB/s", "memcpy GB/s");
  for (size_t bytes = size_t(1) << 20; bytes <= kMaxBytes; bytes *= 4) {
    size_t vectors = bytes / sizeof(int4);
    float ms[2];
    for (int which = 0; which < 2; ++which) {
      auto launch = [&] {
        if (which == 0)
          copyKernel<<<blocks, kThreadsPerBlock>>>(
              static_cast<const int4 *>(src), static_cast<int4 *>(dst), vectors);
        else
          KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes,
                                          cudaMemcpyDeviceToDevice));
      };
      launch(); // warm-up
      KILN_CUDA_CHECK(cudaEventRecord(start));
      for (int it = 0; it < iters; ++it)
        launch();
      KILN_CUDA_CHECK(cudaEventRecord(stop));
      KILN_CUDA_CHECK(cudaEventSynchronize(stop));
      KILN_CUDA_CHECK(cudaGetLastError());
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms[which], start, stop));
    }
    auto gbps = [&](float total) {
      return 2.0 * bytes * iters / (total * 1e-3) / 1e9;
    };
    std::printf("%10zu %14.1f %14.1f\n", bytes, gbps(ms[0]), gbps(ms[1]));
  }
  KILN_CUDA_CHECK(cudaFree(src));
  KILN_CUDA_CHECK(cudaFree(dst));
  return 0;
}
