//===- Npy.cpp - Writing float32 matrices as .npy files --------------------===//
#include "session/Npy.h"

#include "support/AtomicFile.h"

#include <fmt/format.h>

namespace kiln::runtime {

Status writeNpy(const std::string &path, std::span<const float> values,
                uint64_t rows, uint64_t cols) {
  if (rows * cols != values.size())
    return Error(path, "shape", "does not match the number of values");
  std::string header = fmt::format(
      "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows,
      cols);
  // Magic (6) + version (2) + length (2) + header + '\n', padded to 64.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string prefix("\x93NUMPY\x01\x00", 8);
  prefix.push_back(char(header.size() & 0xff));
  prefix.push_back(char(header.size() >> 8));
  prefix += header;
  AtomicFile file;
  if (Status st = file.create(path); !st)
    return st;
  if (Status st = file.writeAt(prefix.data(), prefix.size(), 0); !st)
    return st;
  if (Status st = file.writeAt(values.data(), values.size_bytes(),
                               prefix.size());
      !st)
    return st;
  return file.commit();
}

} // namespace kiln::runtime
