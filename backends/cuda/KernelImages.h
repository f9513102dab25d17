//===- KernelImages.h - The artifact's kernel images, per GPU ---*- C++ -*-===//
//
// kiln-compile --target=cuda:ARCHS copies the step kernels' images (one
// fatbin per architecture and kernel source, built by nvcc with the
// project) into the artifact as payloads "cuda"/"sm_XX/NAME.fatbin". The
// plugin loads the images for each rank's GPU into a KernelImages, and
// every step launch (launchStep, Launch.cuh) runs the kernel of the same
// name from those images rather than the copy compiled into the plugin:
// what runs is what the artifact carries.
//
// A kernel is found by the mangled name of the plugin's own host stub
// (cudaFuncGetName) among the kernels each image holds (listed at load),
// so both sides are built from the same sources; a kernel the images lack
// makes the launch fail with cudaErrorSymbolNotFound, which the plugin
// reports naming the op.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_CUDA_KERNELIMAGES_H
#define KILN_BACKENDS_CUDA_KERNELIMAGES_H

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace kiln::cuda {

class KernelImages {
public:
  KernelImages() = default;
  KernelImages(const KernelImages &) = delete;
  KernelImages &operator=(const KernelImages &) = delete;
  ~KernelImages();

  /// Loads one image (a fatbin or cubin in memory, which must stay alive
  /// while loaded: the artifact's bytes).
  cudaError_t load(const std::string &name, const void *image, size_t bytes);

  /// The kernel named like host stub `stub` in the loaded images (cast
  /// for cudaLaunchKernelExC), or nullptr.
  const void *kernel(const void *stub);

  /// Each loaded image's name and size, in load order.
  const std::vector<std::pair<std::string, size_t>> &loaded() const {
    return names_;
  }
  /// Distinct kernels found so far.
  size_t resolved() const { return cache_.size(); }

private:
  std::vector<cudaLibrary_t> libraries_;
  std::vector<std::pair<std::string, size_t>> names_;
  std::unordered_map<std::string, const void *> byName_;
  std::unordered_map<const void *, const void *> cache_;
};

/// The images the calling host thread's step launches use (null: the
/// kernels compiled into this library, as the check tools run them).
void setKernelImages(KernelImages *images);

/// The function a launch of host stub `stub` runs: from the thread's
/// images when set (nullptr when they lack it), else the stub itself.
const void *resolveKernel(const void *stub);

} // namespace kiln::cuda

#endif // KILN_BACKENDS_CUDA_KERNELIMAGES_H
