//===- Nccl.h - NCCL, loaded at run time ------------------------*- C++ -*-===//
//
// The CUDA plugin does not link NCCL: a GPU host has its own (a system
// package, a Python wheel's copy), often not where the build machine's
// was, and a single-GPU run needs none. The library is opened with dlopen
// on first use: $KILN_NCCL_LIBRARY when set, else libnccl.so.2 and
// libnccl.so from the loader's search path. Compiled against the toolkit's
// nccl.h; only the calls Kiln makes are resolved.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_CUDA_NCCL_H
#define KILN_BACKENDS_CUDA_NCCL_H

#include "support/Error.h"

#include <nccl.h>

#include <string>

namespace kiln::cuda {

struct NcclApi {
  std::string path; ///< the library opened
  int version = 0;
  ncclResult_t (*getUniqueId)(ncclUniqueId *);
  ncclResult_t (*commInitRank)(ncclComm_t *, int, ncclUniqueId, int);
  ncclResult_t (*commDestroy)(ncclComm_t);
  ncclResult_t (*allReduce)(const void *, void *, size_t, ncclDataType_t,
                            ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*allGather)(const void *, void *, size_t, ncclDataType_t,
                            ncclComm_t, cudaStream_t);
  const char *(*getErrorString)(ncclResult_t);
};

/// The process's NCCL, opened on the first call; an error names every
/// path tried.
Expected<const NcclApi *> loadNccl();

} // namespace kiln::cuda

#endif // KILN_BACKENDS_CUDA_NCCL_H
