//===- GGUFWriter.cpp - Writing GGUF files atomically
//----------------------===//
#include "gguf/GGUFWriter.h"

#include "gguf/GGUFFile.h"
#include "support/AtomicFile.h"
#include "support/CheckedMath.h"

#include <fmt/core.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <random>
#include <unistd.h>
#include <unordered_set>

static_assert(std::endian::native == std::endian::little,
              "the writer stores values in host byte order");

namespace kiln::gguf {
namespace {

/// Everything write() needs, computed once: the header bytes (up to the
/// data section) and where each tensor goes.
struct Layout {
  std::vector<uint8_t> header;
  uint64_t dataOffset = 0;
  std::vector<uint64_t> offsets; ///< Relative to the data section.
  std::vector<uint64_t> bytes;
  uint64_t tensorBytes = 0; ///< Sum of bytes (progress total).
  uint64_t fileSize = 0;
};

template <typename T> void put(std::vector<uint8_t> &out, T v) {
  uint8_t raw[sizeof(T)];
  std::memcpy(raw, &v, sizeof(T));
  out.insert(out.end(), raw, raw + sizeof(T));
}

void putString(std::vector<uint8_t> &out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

/// Checks that every array element has the array's element type.
Status checkValue(const Value &v, const std::string &key) {
  if (!v.isArray())
    return Status::ok();
  for (const Value &e : v.elements()) {
    if (e.type() != v.elementType())
      return Error("", key,
                   fmt::format("array of {} holds a {} element",
                               valueTypeName(v.elementType()),
                               valueTypeName(e.type())));
    if (Status s = checkValue(e, key); !s)
      return s;
  }
  return Status::ok();
}

// Values are written without their type tag here; the caller writes the tag
// of top-level values (array elements carry none).
void putValue(std::vector<uint8_t> &out, const Value &v) {
  switch (v.type()) {
  case ValueType::UInt8:
  case ValueType::Int8:
  case ValueType::Bool:
    put<uint8_t>(out, static_cast<uint8_t>(*v.asInt() & 0xff));
    break;
  case ValueType::UInt16:
  case ValueType::Int16:
    put<uint16_t>(out, static_cast<uint16_t>(*v.asInt() & 0xffff));
    break;
  case ValueType::UInt32:
  case ValueType::Int32:
    put<uint32_t>(out, static_cast<uint32_t>(*v.asInt() & 0xffffffff));
    break;
  case ValueType::UInt64:
    put<uint64_t>(out, *v.asUInt());
    break;
  case ValueType::Int64:
    put<int64_t>(out, *v.asInt());
    break;
  case ValueType::Float32:
    put<float>(out, static_cast<float>(*v.asFloat()));
    break;
  case ValueType::Float64:
    put<double>(out, *v.asFloat());
    break;
  case ValueType::String:
    putString(out, *v.asString());
    break;
  case ValueType::Array:
    put<uint32_t>(out, static_cast<uint32_t>(v.elementType()));
    put<uint64_t>(out, v.elements().size());
    for (const Value &e : v.elements())
      putValue(out, e);
    break;
  }
}

bool isPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

Expected<Layout> plan(uint32_t alignment, const Metadata &metadata,
                      const std::vector<TensorSpec> &tensors) {
  if (!isPowerOfTwo(alignment))
    return Error("", std::string(kAlignmentKey),
                 fmt::format("alignment {} is not a power of two", alignment));
  Metadata effective;
  std::unordered_set<std::string_view> keys;
  bool hasAlignment = false;
  for (const auto &[key, value] : metadata) {
    if (!keys.insert(key).second)
      return Error("", key, "duplicate metadata key");
    if (Status s = checkValue(value, key); !s)
      return s.error();
    if (key == kAlignmentKey) {
      if (value.type() != ValueType::UInt32 || *value.asUInt() != alignment)
        return Error("", key,
                     fmt::format("metadata says {} but the writer aligns to "
                                 "{} (uint32)",
                                 value.type() == ValueType::UInt32
                                     ? fmt::format("{}", *value.asUInt())
                                     : std::string(valueTypeName(value.type())),
                                 alignment));
      hasAlignment = true;
    }
  }

  Layout layout;
  std::vector<uint8_t> &h = layout.header;
  bool addAlignment = alignment != kDefaultAlignment && !hasAlignment;
  put<uint32_t>(h, 0x46554747); // "GGUF"
  put<uint32_t>(h, 3);
  put<uint64_t>(h, tensors.size());
  put<uint64_t>(h, metadata.size() + (addAlignment ? 1 : 0));
  for (const auto &[key, value] : metadata) {
    putString(h, key);
    put<uint32_t>(h, static_cast<uint32_t>(value.type()));
    putValue(h, value);
  }
  if (addAlignment) {
    putString(h, kAlignmentKey);
    put<uint32_t>(h, static_cast<uint32_t>(ValueType::UInt32));
    put<uint32_t>(h, alignment);
  }

  std::unordered_set<std::string_view> names;
  uint64_t next = 0;
  for (const TensorSpec &t : tensors) {
    if (!names.insert(t.name).second)
      return Error("", t.name, "duplicate tensor name");
    if (t.dims.empty() || t.dims.size() > kMaxDims)
      return Error(
          "", t.name,
          fmt::format("{} dimensions (1 to {})", t.dims.size(), kMaxDims));
    std::optional<uint64_t> rows = 1;
    for (size_t d = 0; d < t.dims.size(); ++d) {
      if (t.dims[d] == 0)
        return Error("", t.name, fmt::format("dimension {} is 0", d));
      if (d > 0)
        rows = rows ? checkedMul(*rows, t.dims[d]) : std::nullopt;
    }
    if (t.dims[0] % traitsOf(t.type).blockSize != 0)
      return Error("", t.name,
                   fmt::format("ne[0] = {} is not a multiple of the {} block "
                               "size {}",
                               t.dims[0], nameOf(t.type),
                               traitsOf(t.type).blockSize));
    std::optional<uint64_t> row = rowBytes(t.type, t.dims[0]);
    std::optional<uint64_t> bytes =
        row && rows ? checkedMul(*row, *rows) : std::nullopt;
    std::optional<uint64_t> end =
        bytes ? checkedAdd(next, *bytes) : std::nullopt;
    std::optional<uint64_t> padded =
        end ? checkedAlignUp(*end, alignment) : std::nullopt;
    if (!padded)
      return Error("", t.name, "data size overflows 64 bits");
    putString(h, t.name);
    put<uint32_t>(h, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims)
      put<uint64_t>(h, d);
    put<uint32_t>(h, static_cast<uint32_t>(t.type));
    put<uint64_t>(h, next);
    layout.offsets.push_back(next);
    layout.bytes.push_back(*bytes);
    layout.tensorBytes += *bytes; // <= padded total, cannot overflow.
    next = *padded;
  }
  // Pad the header to the data section (as gguf-py and llama.cpp do, even
  // when there are no tensors).
  std::optional<uint64_t> dataOffset = checkedAlignUp(h.size(), alignment);
  std::optional<uint64_t> size =
      dataOffset ? checkedAdd(*dataOffset, next) : std::nullopt;
  if (!size)
    return Error("", "", "file size overflows 64 bits");
  layout.dataOffset = *dataOffset;
  h.resize(*dataOffset, 0);
  layout.fileSize = *size;
  return layout;
}

} // namespace

void GGUFWriter::addMetadata(std::string key, Value value) {
  metadata_.emplace_back(std::move(key), std::move(value));
}

void GGUFWriter::addTensor(TensorSpec spec) {
  tensors_.push_back(std::move(spec));
}

Expected<uint64_t> GGUFWriter::fileSize() const {
  Expected<Layout> layout = plan(alignment_, metadata_, tensors_);
  if (!layout)
    return layout.error();
  return layout->fileSize;
}

Status GGUFWriter::write(const std::string &path, const TensorFill &fill,
                         const WriteProgress &progress) const {
  Expected<Layout> layout = plan(alignment_, metadata_, tensors_);
  if (!layout)
    return layout.error().withWhere(path);
  AtomicFile file;
  if (Status s = file.create(path); !s)
    return s;
  // Full length first: padding and, without `fill`, all tensor data stay
  // holes that read as zeros and take no disk.
  if (Status s = file.resize(layout->fileSize); !s)
    return s;
  if (Status s = file.writeAt(layout->header.data(), layout->header.size(), 0);
      !s)
    return s;
  uint64_t done = 0;
  // Tensors are produced and written a chunk of whole blocks at a time: the
  // chunk stays in cache between the fill and the write, and memory use is
  // bounded whatever the tensor's size.
  std::vector<uint8_t> buffer;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    uint64_t bytes = layout->bytes[i];
    if (fill) {
      uint64_t blockBytes = traitsOf(tensors_[i].type).blockBytes;
      uint64_t chunk = std::max<uint64_t>(1, kFillChunkBytes / blockBytes) *
                       blockBytes;
      for (uint64_t offset = 0; offset < bytes; offset += chunk) {
        uint64_t n = std::min(chunk, bytes - offset);
        buffer.resize(n);
        if (Status s = fill(i, offset, std::span<uint8_t>(buffer)); !s)
          return Error(path, tensors_[i].name, s.error().message());
        if (Status s = file.writeAt(buffer.data(), n,
                                    layout->dataOffset + layout->offsets[i] +
                                        offset);
            !s)
          return s;
        if (progress)
          progress(done + offset + n, layout->tensorBytes);
      }
    }
    done += bytes;
    // With `fill`, the last chunk already reported this tensor's end.
    if (progress && (!fill || bytes == 0))
      progress(done, layout->tensorBytes);
  }
  return file.commit();
}

} // namespace kiln::gguf
