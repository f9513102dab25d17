//===- GGUFFile.cpp - Reading GGUF files and split sets
//--------------------===//
#include "gguf/GGUFFile.h"

#include "support/CheckedMath.h"

#include <fmt/core.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_set>

static_assert(std::endian::native == std::endian::little,
              "the reader maps little-endian GGUF data directly");

namespace kiln::gguf {

/// The bytes of a file: a read-only private mapping, or an owned copy for
/// in-memory images.
struct GGUFFile::Storage {
  const uint8_t *data = nullptr;
  uint64_t size = 0;
  void *mapping = nullptr;
  std::vector<uint8_t> owned;

  Storage() = default;
  Storage(const Storage &) = delete;
  Storage &operator=(const Storage &) = delete;
  ~Storage() {
    if (mapping)
      munmap(mapping, size);
  }
};

namespace {

// Smallest encodings, used to bound counts read from the file before any
// allocation: a KV is a key length, a type and at least one value byte; a
// tensor info is a name length, n_dims, a type and an offset.
constexpr uint64_t kMinKVBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;
constexpr uint64_t kHeaderBytes = 4 + 4 + 8 + 8;

uint64_t minEncodedSize(ValueType type) {
  if (std::optional<uint64_t> size = scalarSize(type))
    return *size;
  if (type == ValueType::String)
    return 8;   // Length; the bytes may be empty.
  return 4 + 8; // Array: element type and count.
}

/// A bounds-checked reader over the header region; the first failure is kept
/// and every later read fails.
class Parser {
public:
  Parser(const std::string &where, const uint8_t *data, uint64_t size)
      : where_(where), data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  bool failed() const { return error_.has_value(); }
  Error takeError() { return std::move(*error_); }

  bool fail(std::string_view field, std::string problem) {
    if (!error_)
      error_ = Error(where_, printable(field), std::move(problem));
    return false;
  }

  template <typename T>
  bool read(T &out, std::string_view field, std::string_view what) {
    if (remaining() < sizeof(T))
      return fail(field, fmt::format("file ends inside the {} (at byte {} of "
                                     "{})",
                                     what, pos_, size_));
    std::memcpy(&out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  bool readString(std::string &out, std::string_view field,
                  std::string_view what) {
    uint64_t length = 0;
    if (!read(length, field, fmt::format("{} length", what)))
      return false;
    if (length > remaining())
      return fail(field, fmt::format("{} of {} bytes is longer than the rest "
                                     "of the file ({} bytes)",
                                     what, length, remaining()));
    out.assign(reinterpret_cast<const char *>(data_ + pos_), length);
    pos_ += length;
    return true;
  }

  bool readValue(ValueType type, std::string_view field, unsigned depth,
                 Value &out);

private:
  const std::string &where_;
  const uint8_t *data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t elementBudget_ = kMaxMetadataElements;
  std::optional<Error> error_;
};

template <typename T>
bool readScalar(Parser &p, std::string_view field, ValueType type, Value &out) {
  T v{};
  if (!p.read(v, field, fmt::format("{} value", valueTypeName(type))))
    return false;
  if constexpr (std::is_floating_point_v<T>) {
    out = type == ValueType::Float32 ? Value::f32(v) : Value::f64(v);
  } else if constexpr (std::is_signed_v<T>) {
    out = Value::signedInt(type, v);
  } else {
    out = Value::unsignedInt(type, v);
  }
  return true;
}

bool Parser::readValue(ValueType type, std::string_view field, unsigned depth,
                       Value &out) {
  switch (type) {
  case ValueType::UInt8:
    return readScalar<uint8_t>(*this, field, type, out);
  case ValueType::Int8:
    return readScalar<int8_t>(*this, field, type, out);
  case ValueType::UInt16:
    return readScalar<uint16_t>(*this, field, type, out);
  case ValueType::Int16:
    return readScalar<int16_t>(*this, field, type, out);
  case ValueType::UInt32:
    return readScalar<uint32_t>(*this, field, type, out);
  case ValueType::Int32:
    return readScalar<int32_t>(*this, field, type, out);
  case ValueType::UInt64:
    return readScalar<uint64_t>(*this, field, type, out);
  case ValueType::Int64:
    return readScalar<int64_t>(*this, field, type, out);
  case ValueType::Float32:
    return readScalar<float>(*this, field, type, out);
  case ValueType::Float64:
    return readScalar<double>(*this, field, type, out);
  case ValueType::Bool: {
    uint8_t v = 0;
    if (!read(v, field, "bool value"))
      return false;
    // Anything but 0 or 1 means the value stream is out of step.
    if (v > 1)
      return fail(field, fmt::format("bool value {} is neither 0 nor 1", v));
    out = Value::boolean(v);
    return true;
  }
  case ValueType::String: {
    std::string s;
    if (!readString(s, field, "string"))
      return false;
    out = Value::string(std::move(s));
    return true;
  }
  case ValueType::Array: {
    if (depth >= kMaxArrayDepth)
      return fail(field,
                  fmt::format("arrays nested deeper than {}", kMaxArrayDepth));
    uint32_t rawElement = 0;
    uint64_t count = 0;
    if (!read(rawElement, field, "array element type") ||
        !read(count, field, "array length"))
      return false;
    if (!isValidValueType(rawElement))
      return fail(field,
                  fmt::format("unknown array element type {}", rawElement));
    auto element = static_cast<ValueType>(rawElement);
    // Bound the allocation by what the rest of the file could hold.
    if (count > remaining() / minEncodedSize(element))
      return fail(field,
                  fmt::format("array of {} {} elements is longer than "
                              "the rest of the file ({} bytes)",
                              count, valueTypeName(element), remaining()));
    if (count > elementBudget_)
      return fail(field, fmt::format("metadata holds more than {} array "
                                     "elements in all",
                                     kMaxMetadataElements));
    elementBudget_ -= count;
    std::vector<Value> elements;
    elements.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      Value v;
      if (!readValue(element, field, depth + 1, v))
        return false;
      elements.push_back(std::move(v));
    }
    out = Value::array(element, std::move(elements));
    return true;
  }
  }
  return fail(field, "unknown value type");
}

bool isPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::string errnoText(int err) { return std::strerror(err); }

} // namespace

std::string printable(std::string_view text) {
  constexpr size_t kMaxShown = 96;
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= kMaxShown) {
      out += fmt::format("... ({} bytes)", text.size());
      break;
    }
    auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f)
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

uint64_t GGUFFile::fileSize() const { return storage_->size; }

Expected<GGUFFile> GGUFFile::open(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Error(path, "", fmt::format("cannot open: {}", errnoText(errno)));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Error(path, "", fmt::format("cannot stat: {}", errnoText(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error(path, "", "not a regular file");
  }
  auto storage = std::make_shared<Storage>();
  storage->size = static_cast<uint64_t>(st.st_size);
  if (storage->size > 0) {
    // A private read-only mapping: parsing the header faults in only its
    // pages; tensor pages are read when a caller touches them.
    void *m = mmap(nullptr, storage->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return Error(path, "", fmt::format("cannot map: {}", errnoText(err)));
    }
    storage->mapping = m;
    storage->data = static_cast<const uint8_t *>(m);
  }
  ::close(fd); // The mapping keeps the file's pages reachable.
  return parse(path, std::move(storage));
}

Expected<GGUFFile> GGUFFile::fromBytes(std::string name,
                                       std::vector<uint8_t> bytes) {
  auto storage = std::make_shared<Storage>();
  storage->owned = std::move(bytes);
  storage->data = storage->owned.data();
  storage->size = storage->owned.size();
  return parse(std::move(name), std::move(storage));
}

Expected<GGUFFile> GGUFFile::parse(std::string path,
                                   std::shared_ptr<const Storage> storage) {
  GGUFFile file;
  file.path_ = std::move(path);
  file.storage_ = std::move(storage);
  const std::string &where = file.path_;
  const uint64_t fileSize = file.storage_->size;
  Parser p(where, file.storage_->data, fileSize);

  // --- Header ---------------------------------------------------------------
  char magic[4];
  if (!p.read(magic, "magic", "magic"))
    return p.takeError();
  if (std::memcmp(magic, "GGUF", 4) != 0)
    return Error(where, "magic",
                 fmt::format("not a GGUF file (starts with \"{}\")",
                             printable(std::string_view(magic, 4))));
  uint32_t version;
  if (!p.read(version, "version", "version"))
    return p.takeError();
  if (version == 1)
    return Error(where, "version",
                 "GGUF version 1 is not supported (only versions 2 and 3)");
  if (version != 2 && version != 3) {
    std::string hint;
    uint32_t swapped = __builtin_bswap32(version);
    if (swapped == 2 || swapped == 3)
      hint = " (a big-endian file? only little-endian is supported)";
    return Error(where, "version",
                 fmt::format("unsupported GGUF version {}{}", version, hint));
  }
  file.version_ = version;
  uint64_t tensorCount, kvCount;
  if (!p.read(tensorCount, "tensor_count", "tensor count") ||
      !p.read(kvCount, "kv_count", "metadata count"))
    return p.takeError();
  if (kvCount > p.remaining() / kMinKVBytes)
    return Error(where, "kv_count",
                 fmt::format("metadata count {} cannot fit in the remaining "
                             "{} bytes",
                             kvCount, p.remaining()));
  if (tensorCount > p.remaining() / kMinTensorInfoBytes)
    return Error(where, "tensor_count",
                 fmt::format("tensor count {} cannot fit in the remaining {} "
                             "bytes",
                             tensorCount, p.remaining()));

  // --- Metadata -------------------------------------------------------------
  file.metadata_.reserve(kvCount);
  std::unordered_set<std::string> keys;
  for (uint64_t i = 0; i < kvCount; ++i) {
    std::string key;
    std::string keyField = fmt::format("metadata key #{}", i);
    if (!p.readString(key, keyField, "key"))
      return p.takeError();
    uint32_t rawType;
    if (!p.read(rawType, key, "value type"))
      return p.takeError();
    if (!isValidValueType(rawType))
      return Error(where, printable(key),
                   fmt::format("unknown value type {}", rawType));
    Value value;
    if (!p.readValue(static_cast<ValueType>(rawType), key, 0, value))
      return p.takeError();
    if (!keys.insert(key).second)
      return Error(where, printable(key), "duplicate metadata key");
    file.metadata_.emplace_back(std::move(key), std::move(value));
  }

  if (const Value *align = file.find(kAlignmentKey)) {
    if (align->type() != ValueType::UInt32)
      return Error(
          where, std::string(kAlignmentKey),
          fmt::format("must be uint32, not {}", valueTypeName(align->type())));
    uint64_t a = *align->asUInt();
    if (!isPowerOfTwo(a))
      return Error(where, std::string(kAlignmentKey),
                   fmt::format("alignment {} is not a power of two", a));
    file.alignment_ = static_cast<uint32_t>(a);
  }

  // Split keys: each must be an integer; split.no must lie below split.count.
  if (file.find(kSplitCountKey) || file.find(kSplitNoKey) ||
      file.find(kSplitTensorsCountKey)) {
    uint64_t fields[3];
    std::string_view names[3] = {kSplitNoKey, kSplitCountKey,
                                 kSplitTensorsCountKey};
    for (int k = 0; k < 3; ++k) {
      const Value *v = file.find(names[k]);
      if (!v)
        return Error(where, std::string(names[k]),
                     "missing (the file has other split.* keys)");
      std::optional<uint64_t> u = v->asUInt();
      if (!u || !isIntegerType(v->type()) || (k < 2 && *u > UINT32_MAX))
        return Error(where, std::string(names[k]),
                     fmt::format("must be a non-negative integer, not {}",
                                 valueTypeName(v->type())));
      fields[k] = *u;
    }
    if (fields[1] == 0)
      return Error(where, std::string(kSplitCountKey), "split.count is 0");
    if (fields[0] >= fields[1])
      return Error(where, std::string(kSplitNoKey),
                   fmt::format("split.no {} is not below split.count {}",
                               fields[0], fields[1]));
    file.split_ = SplitInfo{static_cast<uint32_t>(fields[0]),
                            static_cast<uint32_t>(fields[1]), fields[2]};
  }

  // --- Tensor infos ---------------------------------------------------------
  if (tensorCount > p.remaining() / kMinTensorInfoBytes)
    return Error(where, "tensor_count",
                 fmt::format("tensor count {} cannot fit in the remaining {} "
                             "bytes",
                             tensorCount, p.remaining()));
  file.tensors_.reserve(tensorCount);
  std::vector<uint32_t> rawTypes;
  rawTypes.reserve(tensorCount);
  for (uint64_t i = 0; i < tensorCount; ++i) {
    TensorInfo t;
    if (!p.readString(t.name, fmt::format("tensor #{}", i), "tensor name"))
      return p.takeError();
    const std::string &name = t.name;
    uint32_t nDims;
    if (!p.read(nDims, name, "dimension count"))
      return p.takeError();
    if (nDims > kMaxDims)
      return Error(where, printable(name),
                   fmt::format("{} dimensions (at most {})", nDims, kMaxDims));
    t.dims.resize(nDims);
    for (uint32_t d = 0; d < nDims; ++d)
      if (!p.read(t.dims[d], name, "dimensions"))
        return p.takeError();
    uint32_t rawType;
    if (!p.read(rawType, name, "type") || !p.read(t.offset, name, "offset"))
      return p.takeError();
    rawTypes.push_back(rawType);
    if (!file.tensorIndex_.emplace(t.name, file.tensors_.size()).second)
      return Error(where, printable(name), "duplicate tensor name");
    file.tensors_.push_back(std::move(t));
  }

  std::optional<uint64_t> dataOffset = checkedAlignUp(p.pos(), file.alignment_);
  if (!dataOffset)
    return Error(where, "tensor infos", "data section offset overflows");
  file.dataOffset_ = *dataOffset;

  // --- Tensor geometry and placement ---------------------------------------
  for (size_t i = 0; i < file.tensors_.size(); ++i) {
    TensorInfo &t = file.tensors_[i];
    std::string field = printable(t.name);
    std::optional<GGMLTypeTraits> traits = lookupGGMLType(rawTypes[i]);
    if (!traits)
      return Error(where, field,
                   fmt::format("unknown ggml type id {}", rawTypes[i]));
    t.type = traits->type;
    std::optional<uint64_t> elements = 1;
    std::optional<uint64_t> rows = 1; // Product of dims after ne[0].
    for (size_t d = 0; d < t.dims.size(); ++d) {
      if (t.dims[d] == 0)
        return Error(where, field, fmt::format("dimension {} is 0", d));
      elements = checkedMul(*elements, t.dims[d]);
      if (d > 0 && rows)
        rows = checkedMul(*rows, t.dims[d]);
      if (!elements)
        return Error(where, field, "product of dimensions overflows 64 bits");
    }
    t.elements = *elements;
    uint64_t ne0 = t.dims.empty() ? 1 : t.dims[0];
    if (ne0 % traits->blockSize != 0)
      return Error(where, field,
                   fmt::format("ne[0] = {} is not a multiple of the {} block "
                               "size {}",
                               ne0, traits->name, traits->blockSize));
    std::optional<uint64_t> row = rowBytes(t.type, ne0);
    std::optional<uint64_t> bytes =
        row ? checkedMul(*row, *rows) : std::nullopt;
    if (!bytes)
      return Error(where, field, "data size overflows 64 bits");
    t.bytes = *bytes;
    if (t.offset % file.alignment_ != 0)
      return Error(where, field,
                   fmt::format("data offset {} is not a multiple of the "
                               "alignment {}",
                               t.offset, file.alignment_));
    std::optional<uint64_t> start = checkedAdd(file.dataOffset_, t.offset);
    std::optional<uint64_t> end =
        start ? checkedAdd(*start, t.bytes) : std::nullopt;
    if (!end || *end > fileSize)
      return Error(where, field,
                   fmt::format("data (offset {}, {} bytes, data section at "
                               "{}) lies past the end of the file ({} bytes)",
                               t.offset, t.bytes, file.dataOffset_, fileSize));
    t.fileOffset = *start;
  }

  // Tensors may be stored in any order but must not share bytes.
  std::vector<size_t> order(file.tensors_.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return file.tensors_[a].offset < file.tensors_[b].offset;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo &prev = file.tensors_[order[k - 1]];
    const TensorInfo &cur = file.tensors_[order[k]];
    if (prev.offset + prev.bytes > cur.offset)
      return Error(
          where, printable(cur.name),
          fmt::format("data overlaps that of tensor {}", printable(prev.name)));
  }
  return file;
}

const Value *GGUFFile::find(std::string_view key) const {
  for (const auto &[k, v] : metadata_)
    if (k == key)
      return &v;
  return nullptr;
}

const TensorInfo *GGUFFile::findTensor(std::string_view name) const {
  auto it = tensorIndex_.find(std::string(name));
  return it == tensorIndex_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> GGUFFile::tensorData(const TensorInfo &tensor) const {
  // Bounds were checked when the file was opened.
  return {storage_->data + tensor.fileOffset, tensor.bytes};
}

// --- Split sets
// ---------------------------------------------------------------

std::optional<SplitName> parseSplitName(std::string_view path) {
  // NAME-00002-of-00005.gguf: 5 digits, "-of-", 5 digits, ".gguf".
  constexpr std::string_view kSuffix = ".gguf";
  constexpr size_t kTail = 1 + 5 + 4 + 5 + 5; // "-00002-of-00005.gguf"
  if (path.size() <= kTail || path.substr(path.size() - 5) != kSuffix)
    return std::nullopt;
  std::string_view tail = path.substr(path.size() - kTail);
  auto digits = [](std::string_view s, uint32_t &out) {
    out = 0;
    for (char c : s) {
      if (c < '0' || c > '9')
        return false;
      out = out * 10 + static_cast<uint32_t>(c - '0');
    }
    return true;
  };
  SplitName name;
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-" ||
      !digits(tail.substr(1, 5), name.number) ||
      !digits(tail.substr(10, 5), name.count))
    return std::nullopt;
  name.prefix = std::string(path.substr(0, path.size() - kTail));
  return name;
}

std::string splitPartName(std::string_view prefix, uint32_t number,
                          uint32_t count) {
  return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, number, count);
}

Expected<GGUFModel> GGUFModel::fromParts(std::vector<GGUFFile> parts) {
  if (parts.empty())
    return Error("", "", "no GGUF file given");
  GGUFModel model;
  bool single =
      parts.size() == 1 && (!parts[0].split() || parts[0].split()->count == 1);
  if (!single) {
    for (const GGUFFile &part : parts)
      if (!part.split())
        return Error(part.path(), std::string(kSplitCountKey),
                     "given with other files but not part of a split set");
    const SplitInfo &first = *parts[0].split();
    for (const GGUFFile &part : parts) {
      const SplitInfo &s = *part.split();
      if (s.count != first.count)
        return Error(part.path(), std::string(kSplitCountKey),
                     fmt::format("split.count {} differs from {} in {}",
                                 s.count, first.count, parts[0].path()));
      if (s.totalTensors != first.totalTensors)
        return Error(part.path(), std::string(kSplitTensorsCountKey),
                     fmt::format("split.tensors.count {} differs from {} in "
                                 "{}",
                                 s.totalTensors, first.totalTensors,
                                 parts[0].path()));
      // A part renamed to another slot would silently reorder tensors.
      if (std::optional<SplitName> name = parseSplitName(part.path()))
        if (name->number != s.index + 1 || name->count != s.count)
          return Error(part.path(), std::string(kSplitNoKey),
                       fmt::format("file name says part {} of {} but the "
                                   "file is split.no {} of split.count {}",
                                   name->number, name->count, s.index,
                                   s.count));
    }
    std::sort(parts.begin(), parts.end(),
              [](const GGUFFile &a, const GGUFFile &b) {
                return a.split()->index < b.split()->index;
              });
    for (size_t i = 1; i < parts.size(); ++i)
      if (parts[i].split()->index == parts[i - 1].split()->index)
        return Error(parts[i].path(), std::string(kSplitNoKey),
                     fmt::format("split.no {} is also that of {}",
                                 parts[i].split()->index, parts[i - 1].path()));
    for (uint32_t i = 0; i < first.count; ++i)
      if (i >= parts.size() || parts[i].split()->index != i)
        return Error(parts[0].path(), std::string(kSplitCountKey),
                     fmt::format("split part {} of {} (split.no {}) is "
                                 "missing",
                                 i + 1, first.count, i));
    uint64_t held = 0;
    for (const GGUFFile &part : parts)
      held += part.tensors().size();
    if (held != first.totalTensors)
      return Error(parts[0].path(), std::string(kSplitTensorsCountKey),
                   fmt::format("split.tensors.count is {} but the parts "
                               "hold {} tensors",
                               first.totalTensors, held));
  }
  model.parts_ = std::move(parts);
  for (uint32_t p = 0; p < model.parts_.size(); ++p) {
    const std::vector<TensorInfo> &tensors = model.parts_[p].tensors();
    for (uint32_t i = 0; i < tensors.size(); ++i) {
      TensorRef ref{p, i};
      auto [it, inserted] = model.tensorIndex_.emplace(tensors[i].name, ref);
      if (!inserted)
        return Error(model.parts_[p].path(), printable(tensors[i].name),
                     fmt::format("tensor also in {}",
                                 model.parts_[it->second.part].path()));
      model.tensors_.push_back(ref);
    }
  }
  return model;
}

Expected<GGUFModel> GGUFModel::open(const std::vector<std::string> &paths) {
  if (paths.empty())
    return Error("", "", "no GGUF file given");
  std::vector<GGUFFile> parts;
  for (const std::string &path : paths) {
    Expected<GGUFFile> file = GGUFFile::open(path);
    if (!file)
      return file.error();
    parts.push_back(std::move(*file));
  }
  // One part of a split set named: find its siblings by name.
  if (parts.size() == 1 && parts[0].split() && parts[0].split()->count > 1) {
    const SplitInfo s = *parts[0].split();
    std::optional<SplitName> name = parseSplitName(paths[0]);
    if (!name)
      return Error(paths[0], std::string(kSplitCountKey),
                   fmt::format("part {} of a {}-part split set, but the name "
                               "does not end in -0000k-of-0000n.gguf, so the "
                               "other parts cannot be found (name them all)",
                               s.index + 1, s.count));
    for (uint32_t k = 1; k <= s.count; ++k) {
      if (k == s.index + 1)
        continue;
      std::string sibling = splitPartName(name->prefix, k, s.count);
      if (access(sibling.c_str(), F_OK) != 0)
        return Error(paths[0], std::string(kSplitCountKey),
                     fmt::format("split part {} of {} is missing ({} not "
                                 "found)",
                                 k, s.count, sibling));
      Expected<GGUFFile> file = GGUFFile::open(sibling);
      if (!file)
        return file.error();
      parts.push_back(std::move(*file));
    }
  }
  return fromParts(std::move(parts));
}

std::optional<TensorRef> GGUFModel::findTensor(std::string_view name) const {
  auto it = tensorIndex_.find(std::string(name));
  if (it == tensorIndex_.end())
    return std::nullopt;
  return it->second;
}

} // namespace kiln::gguf
