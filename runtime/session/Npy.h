//===- Npy.h - Writing float32 matrices as .npy files -----------*- C++ -*-===//
#ifndef KILN_RUNTIME_SESSION_NPY_H
#define KILN_RUNTIME_SESSION_NPY_H

#include "support/Error.h"

#include <cstdint>
#include <span>
#include <string>

namespace kiln::runtime {

/// Writes `values` (rows x cols, row-major) as a NumPy .npy file (format
/// 1.0, little-endian float32), atomically.
Status writeNpy(const std::string &path, std::span<const float> values,
                uint64_t rows, uint64_t cols);

} // namespace kiln::runtime

#endif // KILN_RUNTIME_SESSION_NPY_H
