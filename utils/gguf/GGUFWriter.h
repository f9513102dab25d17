//===- GGUFWriter.h - Writing GGUF files atomically -------------*- C++ -*-===//
//
// Writes one GGUF v3 file: header, metadata, tensor infos, then each tensor's
// bytes at its aligned offset. Tensor bytes are produced on demand by a
// callback, a chunk at a time, so multi-GB files are streamed, never held
// in memory. The file appears under its final name only when complete
// (written to a temporary file beside it, then renamed): a failure or crash
// leaves no half-written output.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_GGUF_GGUFWRITER_H
#define KILN_GGUF_GGUFWRITER_H

#include "gguf/GGUFValue.h"
#include "quant/QuantTypes.h"
#include "support/Error.h"

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace kiln::gguf {

/// A tensor to write: its name, type and dims (GGUF order: ne[0], the
/// innermost, first).
struct TensorSpec {
  std::string name;
  GGMLType type = GGMLType::F32;
  std::vector<uint64_t> dims;
};

/// Produces bytes of tensor `index` (in the order tensors were added): `out`
/// receives the bytes from `offset` on. Chunks of one tensor come in order,
/// each a whole number of the type's blocks, covering the tensor exactly.
using TensorFill = std::function<Status(size_t index, uint64_t offset,
                                        std::span<uint8_t> out)>;

/// Bytes the writer asks a TensorFill for at a time (rounded down to whole
/// blocks).
inline constexpr uint64_t kFillChunkBytes = uint64_t(8) << 20;

/// Progress: bytes of tensor data written so far and in total.
using WriteProgress = std::function<void(uint64_t done, uint64_t total)>;

class GGUFWriter {
public:
  /// `alignment` must be a power of two (written as general.alignment when
  /// it is not the default 32).
  explicit GGUFWriter(uint32_t alignment = 32) : alignment_(alignment) {}

  /// Adds a metadata key (keys must be unique; checked by write()).
  void addMetadata(std::string key, Value value);
  /// Declares a tensor; data offsets follow declaration order.
  void addTensor(TensorSpec spec);

  /// Bytes the finished file will have (checked arithmetic), or an error for
  /// an invalid tensor spec (bad dims, ne[0] not a multiple of the block).
  Expected<uint64_t> fileSize() const;

  /// Writes the file to `path` atomically. With `fill` empty the tensor data
  /// is left as a hole (a sparse file of the full length: every bounds check
  /// passes, no disk is used), for metadata-only models.
  Status write(const std::string &path, const TensorFill &fill,
               const WriteProgress &progress = nullptr) const;

private:
  uint32_t alignment_;
  Metadata metadata_;
  std::vector<TensorSpec> tensors_;
};

} // namespace kiln::gguf

#endif // KILN_GGUF_GGUFWRITER_H
