//===- GGUFFile.h - Reading GGUF files and split sets -----------*- C++ -*-===//
//
// GGUFFile opens one GGUF v2/v3 file: it maps the file, parses and validates
// the header, metadata and tensor infos, and touches no tensor byte until a
// caller asks for a tensor's data. Every count, length and offset in the file
// is untrusted: each is bounded by the bytes that remain before anything is
// allocated, combined only through checked arithmetic, and any violation is
// returned as one kiln::Error naming the file, the key or tensor, and the
// problem. GGUFModel joins the parts of a split set (NAME-0000k-of-0000n.gguf,
// keys split.no / split.count / split.tensors.count) into one model.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_GGUF_GGUFFILE_H
#define KILN_GGUF_GGUFFILE_H

#include "gguf/GGUFValue.h"
#include "quant/QuantTypes.h"
#include "support/Error.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kiln::gguf {

/// The metadata key that sets the data alignment (uint32, a power of two).
inline constexpr std::string_view kAlignmentKey = "general.alignment";
/// The alignment when general.alignment is absent.
inline constexpr uint32_t kDefaultAlignment = 32;
/// Split-set keys, as llama.cpp's gguf-split and gguf-py write them.
inline constexpr std::string_view kSplitNoKey = "split.no";
inline constexpr std::string_view kSplitCountKey = "split.count";
inline constexpr std::string_view kSplitTensorsCountKey = "split.tensors.count";
/// Most dims a GGUF tensor may have (ggml's GGML_MAX_DIMS).
inline constexpr uint32_t kMaxDims = 4;
/// Deepest nesting of arrays of arrays the reader accepts (bounds recursion).
inline constexpr unsigned kMaxArrayDepth = 8;
/// Most array elements the metadata of one file may hold in all. A parsed
/// element takes far more memory than its bytes in the file, so the remaining
/// file size alone would let a crafted multi-GB file demand tens of GB; real
/// models hold about a million (vocabulary, merges, token types).
inline constexpr uint64_t kMaxMetadataElements = uint64_t(1) << 24;

/// One tensor as described by its info record, validated against the file.
struct TensorInfo {
  std::string name;
  GGMLType type = GGMLType::F32;
  std::vector<uint64_t> dims; ///< ne[0] (innermost) first; each >= 1.
  uint64_t offset = 0;        ///< Relative to the data section, as stored.
  uint64_t fileOffset = 0;    ///< Absolute offset of the first byte.
  uint64_t bytes = 0;         ///< Size of the data.
  uint64_t elements = 0;      ///< Product of dims.
};

/// A file's place in a split set (from the split.* keys).
struct SplitInfo {
  uint32_t index = 0;        ///< split.no, 0-based.
  uint32_t count = 1;        ///< split.count.
  uint64_t totalTensors = 0; ///< split.tensors.count, over all parts.
};

/// One open, validated GGUF file. Cheap to copy (the mapping is shared).
class GGUFFile {
public:
  /// Maps `path` and validates its structure; `path` is used verbatim in
  /// error messages.
  static Expected<GGUFFile> open(const std::string &path);

  /// Parses an in-memory image (tests, the fuzzer), named `name` in errors.
  static Expected<GGUFFile> fromBytes(std::string name,
                                      std::vector<uint8_t> bytes);

  const std::string &path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t fileSize() const;
  /// Absolute offset of the data section (aligned end of the tensor infos).
  uint64_t dataOffset() const { return dataOffset_; }

  /// Metadata in file order.
  const Metadata &metadata() const { return metadata_; }
  /// The value of `key`, or nullptr.
  const Value *find(std::string_view key) const;

  /// Tensor infos in file order.
  const std::vector<TensorInfo> &tensors() const { return tensors_; }
  /// The tensor named `name`, or nullptr.
  const TensorInfo *findTensor(std::string_view name) const;
  /// The bytes of a tensor of this file, read through the mapping on access
  /// (the reader itself never touches them).
  std::span<const uint8_t> tensorData(const TensorInfo &tensor) const;

  /// This file's split keys, or nullopt when it carries none.
  const std::optional<SplitInfo> &split() const { return split_; }

private:
  struct Storage;
  static Expected<GGUFFile> parse(std::string path,
                                  std::shared_ptr<const Storage> storage);

  std::string path_;
  std::shared_ptr<const Storage> storage_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t dataOffset_ = 0;
  Metadata metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensorIndex_;
  std::optional<SplitInfo> split_;
};

/// A tensor of a model: which part holds it and its index in that part.
struct TensorRef {
  uint32_t part = 0;
  uint32_t index = 0;
};

/// A model: one GGUF file, or every part of a split set, seen as one.
class GGUFModel {
public:
  /// Opens a model. One path of a split set opens all its parts (found by
  /// the NAME-0000k-of-0000n.gguf name); several paths must be exactly the
  /// parts of one set, in any order.
  static Expected<GGUFModel> open(const std::vector<std::string> &paths);

  /// Joins already open files (any order) and checks that they form one
  /// model: a single file, or a complete and consistent split set.
  static Expected<GGUFModel> fromParts(std::vector<GGUFFile> parts);

  /// The parts, ordered by split.no.
  const std::vector<GGUFFile> &parts() const { return parts_; }
  /// The model's metadata: that of the first part, which holds it.
  const Metadata &metadata() const { return parts_.front().metadata(); }
  const Value *find(std::string_view key) const {
    return parts_.front().find(key);
  }

  /// Every tensor of every part, parts in order.
  const std::vector<TensorRef> &tensors() const { return tensors_; }
  const TensorInfo &info(TensorRef ref) const {
    return parts_[ref.part].tensors()[ref.index];
  }
  /// The tensor named `name`, or nullopt.
  std::optional<TensorRef> findTensor(std::string_view name) const;
  std::span<const uint8_t> tensorData(TensorRef ref) const {
    return parts_[ref.part].tensorData(info(ref));
  }

private:
  std::vector<GGUFFile> parts_;
  std::vector<TensorRef> tensors_;
  std::unordered_map<std::string, TensorRef> tensorIndex_;
};

/// Splits "dir/NAME-00002-of-00005.gguf" into its parts, or nullopt when the
/// name does not follow the split naming.
struct SplitName {
  std::string prefix;  ///< "dir/NAME"
  uint32_t number = 0; ///< 2 (1-based, as in the name)
  uint32_t count = 0;  ///< 5
};
std::optional<SplitName> parseSplitName(std::string_view path);
/// "dir/NAME-00002-of-00005.gguf" for ("dir/NAME", 2, 5).
std::string splitPartName(std::string_view prefix, uint32_t number,
                          uint32_t count);

/// `text` made safe for a one-line message: control and non-ASCII bytes
/// escaped, long text shortened.
std::string printable(std::string_view text);

} // namespace kiln::gguf

#endif // KILN_GGUF_GGUFFILE_H
