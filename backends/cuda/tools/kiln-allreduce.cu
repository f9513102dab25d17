//===- kiln-allreduce.cu - Per-call latency of an in-graph NCCL all-reduce
//--===//
//
// kiln-allreduce [--gpus N] [--calls K] [--bytes B,...]
//
// The collective figure the tp=8 prediction needs: the time one small
// all-reduce adds to a decode step when it sits inside the step's CUDA
// graph. Each GPU gets its own host thread and NCCL rank (as in the CUDA
// backend); K back-to-back all-reduces of B bytes are captured into one
// graph per GPU, the graphs are replayed together, and the replay time over
// K is the per-call latency. The same K calls launched eagerly are timed
// beside it. NCCL is opened at run time (KILN_NCCL_LIBRARY, else
// libnccl.so.2); NCCL_NVLS_ENABLE defaults to 0. Beside NCCL's, the same
// for the CUDA backend's one-shot all-reduce over NVLink peers
// (launchAllReducePeers, up to 32 KiB), where every pair of GPUs can read
// each other's memory: its parts pulled (the default) and pushed
// (KILN_CUDA_PEER_PUSH=1: StepKernels.h PeerExchange).
//
//===----------------------------------------------------------------------===//
#include "Nccl.h"
#include "StepKernels.h"

#include <cuda_runtime.h>

#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace kiln;
using namespace kiln::cuda;

namespace {

#define CHECK_CUDA(call)                                                       \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "kiln-allreduce: error: %s: %s\n", #call,           \
                   cudaGetErrorString(e_));                                    \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

#define CHECK_NCCL(api, call)                                                  \
  do {                                                                         \
    ncclResult_t r_ = (call);                                                  \
    if (r_ != ncclSuccess) {                                                   \
      std::fprintf(stderr, "kiln-allreduce: error: %s: %s\n", #call,           \
                   (api).getErrorString(r_));                                  \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

struct Result {
  double graphUs = 0, eagerUs = 0;
  double peersGraphUs = 0, peersEagerUs = 0;
  double pushGraphUs = 0, pushEagerUs = 0;
};

/// One GPU's part: K all-reduces of `bytes`, captured and eager, timed
/// between barriers so every rank measures the same interval.
void rankMain(const NcclApi &api, ncclUniqueId id, int gpus, int rank,
              int calls, size_t bytes, const PeerExchange *peers,
              const PeerExchange *pushed, std::barrier<> &sync, Result &out) {
  CHECK_CUDA(cudaSetDevice(rank));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ncclComm_t comm;
  CHECK_NCCL(api, api.commInitRank(&comm, gpus, id, rank));
  size_t n = bytes / sizeof(float);
  float *buf;
  CHECK_CUDA(cudaMalloc(&buf, bytes));
  CHECK_CUDA(cudaMemset(buf, 0, bytes));
  auto enqueue = [&] {
    for (int i = 0; i < calls; ++i)
      CHECK_NCCL(api,
                 api.allReduce(buf, buf, n, ncclFloat, ncclSum, comm, stream));
  };
  // NCCL connects peers on the first collectives, which a capture does not
  // allow: one eager call first.
  CHECK_NCCL(api, api.allReduce(buf, buf, n, ncclFloat, ncclSum, comm, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  enqueue();
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  using Clock = std::chrono::steady_clock;
  auto timeIt = [&](auto &&body, int reps) {
    for (int w = 0; w < 3; ++w)
      body();
    CHECK_CUDA(cudaStreamSynchronize(stream));
    sync.arrive_and_wait();
    Clock::time_point t0 = Clock::now();
    for (int r = 0; r < reps; ++r)
      body();
    CHECK_CUDA(cudaStreamSynchronize(stream));
    sync.arrive_and_wait();
    return std::chrono::duration<double>(Clock::now() - t0).count() * 1e6 /
           (double(reps) * calls);
  };
  out.graphUs = timeIt([&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); }, 20);
  out.eagerUs = timeIt(enqueue, 5);
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  // The one-shot kernel by an exchange: K calls captured, then eager.
  auto timePeers = [&](const PeerExchange &p, double &graphUs,
                       double &eagerUs) {
    auto enqueuePeers = [&] {
      for (int i = 0; i < calls; ++i)
        CHECK_CUDA(launchAllReducePeers(p, buf, 1, int64_t(n), true, nullptr,
                                        nullptr, 0.f, buf, nullptr, {},
                                        stream));
    };
    CHECK_CUDA(
        cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    enqueuePeers();
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    graphUs = timeIt([&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); }, 20);
    eagerUs = timeIt(enqueuePeers, 5);
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
  };
  if (peers)
    timePeers(*peers, out.peersGraphUs, out.peersEagerUs);
  if (pushed)
    timePeers(*pushed, out.pushGraphUs, out.pushEagerUs);
  CHECK_CUDA(cudaFree(buf));
  api.commDestroy(comm);
  CHECK_CUDA(cudaStreamDestroy(stream));
}

} // namespace

int main(int argc, char **argv) {
  int gpus = 0, calls = 156;
  std::vector<size_t> sizes = {12 * 1024, 24 * 1024};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char * {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kiln-allreduce: error: %s needs a value\n",
                     a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--gpus") {
      gpus = std::atoi(next());
    } else if (a == "--calls") {
      calls = std::atoi(next());
    } else if (a == "--bytes") {
      sizes.clear();
      std::string list = next();
      for (size_t p = 0; p < list.size();) {
        size_t q = list.find(',', p);
        sizes.push_back(std::stoull(list.substr(p, q - p)));
        p = q == std::string::npos ? list.size() : q + 1;
      }
    } else {
      std::fprintf(stderr, "usage: kiln-allreduce [--gpus N] [--calls K] "
                           "[--bytes B,...]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  int visible = 0;
  CHECK_CUDA(cudaGetDeviceCount(&visible));
  if (gpus == 0)
    gpus = visible;
  if (gpus < 2 || gpus > visible || calls <= 0) {
    std::fprintf(stderr,
                 "kiln-allreduce: error: needs 2 or more GPUs (%d visible, "
                 "%d asked) and --calls > 0\n",
                 visible, gpus);
    return 1;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  Expected<const NcclApi *> api = loadNccl();
  if (!api) {
    std::fprintf(stderr, "kiln-allreduce: error: %s\n",
                 api.error().message().c_str());
    return 1;
  }
  std::printf("NCCL %d from %s, %d GPUs, %d calls per graph\n", (*api)->version,
              (*api)->path.c_str(), gpus, calls);
  // The one-shot all-reduce's exchange on every GPU, each readable by all.
  bool reachable = gpus <= kMaxPeers;
  for (int a = 0; a < gpus && reachable; ++a)
    for (int b = 0; b < gpus; ++b) {
      int can = 1;
      if (a != b)
        CHECK_CUDA(cudaDeviceCanAccessPeer(&can, a, b));
      reachable = reachable && can;
    }
  const int64_t capacity = 8192;
  // With a push region after the pulled slots (no direct slots).
  const uint64_t exchangeBytes = peerExchangeBytes(capacity, 0, gpus);
  std::vector<PeerExchange> peers(static_cast<size_t>(gpus)),
      pushed(static_cast<size_t>(gpus));
  if (reachable) {
    std::vector<uint8_t *> exchange(static_cast<size_t>(gpus));
    for (int a = 0; a < gpus; ++a) {
      CHECK_CUDA(cudaSetDevice(a));
      for (int b = 0; b < gpus; ++b)
        if (a != b)
          CHECK_CUDA(enablePeerAccess(b));
      CHECK_CUDA(cudaMalloc(&exchange[size_t(a)], exchangeBytes));
      CHECK_CUDA(cudaMemset(exchange[size_t(a)], 0, exchangeBytes));
    }
    for (int a = 0; a < gpus; ++a) {
      peers[size_t(a)] = peerExchangeView(exchange, gpus, a, capacity, false);
      pushed[size_t(a)] = peerExchangeView(exchange, gpus, a, capacity, false,
                                           peerSitesStart(capacity));
    }
  }
  for (size_t bytes : sizes) {
    ncclUniqueId id;
    CHECK_NCCL(**api, (*api)->getUniqueId(&id));
    std::barrier<> sync(gpus);
    std::vector<Result> results(gpus);
    std::vector<std::thread> threads;
    const bool oneShot = reachable &&
                         bytes / sizeof(float) <= size_t(capacity) &&
                         bytes % sizeof(float) == 0;
    for (int r = 0; r < gpus; ++r)
      threads.emplace_back(rankMain, std::cref(**api), id, gpus, r, calls,
                           bytes, oneShot ? &peers[size_t(r)] : nullptr,
                           oneShot ? &pushed[size_t(r)] : nullptr,
                           std::ref(sync), std::ref(results[r]));
    for (std::thread &t : threads)
      t.join();
    std::printf("allreduce %zu bytes (%.1f KiB) over %d GPUs: in-graph %.2f "
                "us per call, eager %.2f us per call\n",
                bytes, bytes / 1024.0, gpus, results[0].graphUs,
                results[0].eagerUs);
    if (results[0].peersGraphUs > 0)
      std::printf("allreduce %zu bytes (%.1f KiB) over %d GPUs, one-shot over "
                  "peers: in-graph %.2f us per call, eager %.2f us per call\n",
                  bytes, bytes / 1024.0, gpus, results[0].peersGraphUs,
                  results[0].peersEagerUs);
    if (results[0].pushGraphUs > 0)
      std::printf("allreduce %zu bytes (%.1f KiB) over %d GPUs, one-shot "
                  "pushed: in-graph %.2f us per call, eager %.2f us per call\n",
                  bytes, bytes / 1024.0, gpus, results[0].pushGraphUs,
                  results[0].pushEagerUs);
  }
  return 0;
}
