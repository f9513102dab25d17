//===- Artifact.h - Kiln's deployable artifact, in memory -------*- C++ -*-===//
//
// The contents of a .kiln file as plain structs, shared by the compiler (which
// fills and writes them) and the runtime and its plugins (which read them).
// On disk it is a FlatBuffer (Artifact.fbs) behind a checksummed header; the
// reader verifies both and every cross-reference before returning.
// No LLVM/MLIR here.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_ARTIFACT_ARTIFACT_H
#define KILN_RUNTIME_ARTIFACT_ARTIFACT_H

#include "quant/QuantTypes.h"
#include "support/Error.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::artifact {

/// The .kiln format version this code writes and reads.
inline constexpr uint32_t kFormatVersion = 1;
/// Bytes of the fixed header before the FlatBuffer.
inline constexpr uint64_t kHeaderBytes = 32;

enum class DType : uint8_t { F32 = 0, F16 = 1, BF16 = 2, I32 = 3 };
enum class BufferKind : uint8_t {
  Arena = 0,
  View = 1,
  Weight = 2,
  State = 3,
  Input = 4,
  Output = 5
};
enum class AttrKind : uint8_t { Int = 0, Float = 1, String = 2, Ints = 3, Bool = 4 };

std::string_view nameOf(DType type);
std::string_view nameOf(BufferKind kind);
/// Bytes of one element.
uint64_t elementBytes(DType type);

struct Buffer {
  std::string name;
  BufferKind kind = BufferKind::Arena;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  int64_t offset = 0;   ///< Arena: byte offset; View: element offset in base
  int32_t base = -1;    ///< View: the viewed buffer (an earlier index)
  int32_t binding = -1; ///< Weight: index into Artifact::weights

  /// Elements (product of the shape; 1 for a 0-d buffer).
  uint64_t elements() const;
  /// Bytes (elements times the element size).
  uint64_t bytes() const { return elements() * elementBytes(dtype); }
};

struct Attr {
  std::string name;
  AttrKind kind = AttrKind::Int;
  int64_t intValue = 0; ///< Int, Bool
  double floatValue = 0;
  std::string stringValue;
  std::vector<int64_t> ints;
};

struct Op {
  std::string kind; ///< the step op's mnemonic: "linear", "rms_norm", ...
  std::vector<int32_t> operands; ///< buffer indices: ins, then outs
  uint32_t numOuts = 0;
  std::vector<Attr> attrs;

  const Attr *attr(std::string_view name) const;
  std::span<const int32_t> ins() const {
    return std::span<const int32_t>(operands).first(operands.size() - numOuts);
  }
  std::span<const int32_t> outs() const {
    return std::span<const int32_t>(operands).last(numOuts);
  }
};

struct Step {
  std::string name;
  uint64_t arenaBytes = 0;
  uint64_t alignment = 0;
  uint64_t peakLiveBytes = 0;
  std::vector<Buffer> buffers;
  std::vector<Op> ops;

  /// Index of the Input/Output slot named `name`, if any.
  std::optional<int32_t> slot(BufferKind kind, std::string_view name) const;
};

struct WeightBinding {
  std::string tensor;
  GGMLType type = GGMLType::F32;
  std::vector<int64_t> dims; ///< GGUF order, as the file must have them
  int32_t sliceDim = -1;     ///< -1: the whole tensor
  int64_t sliceBegin = 0;
  int64_t sliceEnd = 0;
  std::string layout = "gguf";
  /// The sliced dim is this many equal groups (a fused gate/up: 2), each
  /// cut at [sliceBegin, sliceEnd) of the group; the part is the groups'
  /// cuts in group order.
  int32_t sliceGroups = 1;
  /// Above 0: of every rowPeriod rows of dim 1 of the (sliced) tensor, the
  /// binding holds rows [rowBegin, rowEnd) (kiln-split-projections).
  int64_t rowPeriod = 0;
  int64_t rowBegin = 0;
  int64_t rowEnd = 0;
};

/// The dims a rank holds of a binding: the file's dims with the sliced dim
/// cut to (sliceEnd - sliceBegin) * sliceGroups, then dim 1 cut to
/// rowEnd - rowBegin of every rowPeriod. validate() has checked them.
std::vector<int64_t> localDims(const WeightBinding &b);

/// The file's index on dim `d` of a binding's local index `i` on it.
int64_t fileIndex(const WeightBinding &b, size_t d, int64_t i);

struct RankPlan {
  uint32_t rank = 0;
  std::vector<Step> steps;
  const Step *step(std::string_view name) const;
};

struct ConfigEntry {
  std::string key;
  bool isFloat = false;
  int64_t intValue = 0;
  double floatValue = 0;
};

struct Payload {
  std::string backend;
  std::string name;
  std::vector<uint8_t> data;
};

struct Artifact {
  std::string producer;
  std::string target;
  std::string modelArch;
  std::vector<ConfigEntry> config;
  uint64_t contextLength = 0;
  uint32_t ranks = 1;
  std::vector<RankPlan> rankPlans;
  std::vector<WeightBinding> weights;
  std::vector<Payload> payloads;

  const ConfigEntry *configEntry(std::string_view key) const;
};

/// The file's bytes: header (magic, version, payload size, checksum) and the
/// FlatBuffer. Fails only on an artifact that would not pass validate().
Expected<std::vector<uint8_t>> serialize(const Artifact &artifact);

/// Serialises and writes atomically (a temporary file renamed into place).
Status writeArtifact(const Artifact &artifact, const std::string &path);

/// Reads, checks the header, the checksum, the FlatBuffer and every
/// cross-reference. Errors name the file, the field and the problem.
Expected<Artifact> readArtifact(const std::string &path);

/// As readArtifact, from bytes already in memory; `where` names them.
Expected<Artifact> parseArtifact(std::span<const uint8_t> bytes,
                                 const std::string &where);

/// The semantic checks readArtifact applies after decoding: indices in
/// range, sizes consistent, names unique, views inside their bases, arena
/// buffers inside the arena, writes only to writable buffers.
Status validate(const Artifact &artifact, const std::string &where);

/// 64-bit FNV-1a of `bytes`: the header's checksum.
uint64_t checksum(std::span<const uint8_t> bytes);

} // namespace kiln::artifact

#endif // KILN_RUNTIME_ARTIFACT_ARTIFACT_H
