//===- KernelImages.cpp - The artifact's kernel images, loaded per GPU ----===//
#include "KernelImages.h"

namespace kiln::cuda {

namespace {
thread_local KernelImages *current = nullptr;
} // namespace

KernelImages::~KernelImages() {
  for (cudaLibrary_t library : libraries_)
    cudaLibraryUnload(library);
}

cudaError_t KernelImages::load(const std::string &name, const void *image,
                               size_t bytes) {
  cudaLibrary_t library = nullptr;
  if (cudaError_t e = cudaLibraryLoadData(&library, image, nullptr, nullptr, 0,
                                          nullptr, nullptr, 0);
      e != cudaSuccess)
    return e;
  libraries_.push_back(library);
  names_.push_back({name, bytes});
  // Every kernel by name now, so a lookup never makes a failing call.
  unsigned count = 0;
  if (cudaError_t e = cudaLibraryGetKernelCount(&count, library);
      e != cudaSuccess)
    return e;
  if (count == 0)
    return cudaErrorInvalidKernelImage;
  std::vector<cudaKernel_t> kernels(count);
  if (count)
    if (cudaError_t e =
            cudaLibraryEnumerateKernels(kernels.data(), count, library);
        e != cudaSuccess)
      return e;
  for (cudaKernel_t kernel : kernels) {
    const char *kernelName = nullptr;
    if (cudaError_t e =
            cudaFuncGetName(&kernelName, reinterpret_cast<void *>(kernel));
        e != cudaSuccess)
      return e;
    byName_.emplace(kernelName, reinterpret_cast<const void *>(kernel));
  }
  return cudaSuccess;
}

const void *KernelImages::kernel(const void *stub) {
  if (auto it = cache_.find(stub); it != cache_.end())
    return it->second;
  const char *name = nullptr;
  if (cudaFuncGetName(&name, stub) != cudaSuccess || !name) {
    cudaGetLastError();
    return nullptr;
  }
  auto it = byName_.find(name);
  if (it == byName_.end())
    return nullptr;
  cache_.emplace(stub, it->second);
  return it->second;
}

void setKernelImages(KernelImages *images) { current = images; }

const void *resolveKernel(const void *stub) {
  return current ? current->kernel(stub) : stub;
}

} // namespace kiln::cuda
