//===- InfoCommand.cpp - kiln-gguf info: metadata and tensor table
//---------===//
//
// Reads only the header region of each file (through the reader's mapping),
// so it answers in milliseconds however large the tensor data is.
//
//===----------------------------------------------------------------------===//
#include "gguf/GGUFFile.h"
#include "tool/Commands.h"

#include <fmt/core.h>

#include <vector>

namespace kiln::gguf::tool {
namespace {

constexpr std::string_view kUsage =
    "usage: kiln-gguf info FILE... [--json]\n"
    "  Prints the metadata and the tensor table of a GGUF model. Several\n"
    "  files, or one part of a NAME-0000k-of-0000n.gguf split set, open as\n"
    "  one model. --json prints everything (full metadata values, tensor\n"
    "  name/type/dims/offset/bytes/part) as one JSON object.\n";

std::string dimsText(const std::vector<uint64_t> &dims) {
  std::string out = "{";
  for (size_t i = 0; i < dims.size(); ++i)
    out += fmt::format("{}{}", i ? ", " : "", dims[i]);
  return out + "}";
}

std::string metadataJson(const Metadata &metadata) {
  std::string out = "{";
  bool first = true;
  for (const auto &[key, value] : metadata) {
    out += fmt::format("{}\n    {}: {}", first ? "" : ",", jsonString(key),
                       jsonValue(value));
    first = false;
  }
  return out + (first ? "}" : "\n  }");
}

void printJson(const GGUFModel &model) {
  std::string out = "{\n  \"parts\": [";
  for (size_t p = 0; p < model.parts().size(); ++p) {
    const GGUFFile &f = model.parts()[p];
    out += fmt::format("{}\n    {{\"path\": {}, \"version\": {}, "
                       "\"alignment\": {}, \"data_offset\": {}, "
                       "\"file_size\": {}, \"tensor_count\": {}, "
                       "\"metadata\": {}}}",
                       p ? "," : "", jsonString(f.path()), f.version(),
                       f.alignment(), f.dataOffset(), f.fileSize(),
                       f.tensors().size(), metadataJson(f.metadata()));
  }
  out += "\n  ],\n  \"metadata\": " + metadataJson(model.metadata());
  out += ",\n  \"tensors\": [";
  bool first = true;
  for (TensorRef ref : model.tensors()) {
    const TensorInfo &t = model.info(ref);
    std::string dims;
    for (size_t i = 0; i < t.dims.size(); ++i)
      dims += fmt::format("{}{}", i ? ", " : "", t.dims[i]);
    out += fmt::format("{}\n    {{\"name\": {}, \"type\": \"{}\", "
                       "\"type_id\": {}, \"dims\": [{}], \"offset\": {}, "
                       "\"file_offset\": {}, \"bytes\": {}, \"part\": {}}}",
                       first ? "" : ",", jsonString(t.name), nameOf(t.type),
                       static_cast<uint32_t>(t.type), dims, t.offset,
                       t.fileOffset, t.bytes, ref.part);
    first = false;
  }
  out += first ? "]\n}\n" : "\n  ]\n}\n";
  fmt::print("{}", out);
}

void printText(const GGUFModel &model) {
  for (const GGUFFile &f : model.parts())
    fmt::print("{}: GGUF v{}, {} bytes, alignment {}, {} metadata keys, {} "
               "tensors\n",
               f.path(), f.version(), f.fileSize(), f.alignment(),
               f.metadata().size(), f.tensors().size());
  fmt::print("\nmetadata:\n");
  for (const auto &[key, value] : model.metadata()) {
    std::string type(valueTypeName(value.type()));
    if (value.isArray())
      type += fmt::format("[{}]", valueTypeName(value.elementType()));
    fmt::print("  {} ({}) = {}\n", printable(key), type, summarizeValue(value));
  }
  fmt::print("\ntensors ({}):\n", model.tensors().size());
  fmt::print("  {:<48} {:<8} {:<28} {:>14} {:>5}\n", "name", "type", "dims",
             "bytes", "part");
  for (TensorRef ref : model.tensors()) {
    const TensorInfo &t = model.info(ref);
    fmt::print("  {:<48} {:<8} {:<28} {:>14} {:>5}\n", printable(t.name),
               nameOf(t.type), dimsText(t.dims), t.bytes, ref.part + 1);
  }
}

} // namespace

int runInfo(int argc, char **argv) {
  bool json = false;
  std::vector<std::string> paths;
  for (int i = 0; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--json") {
      json = true;
    } else if (arg == "--help" || arg == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    } else if (arg.starts_with("-") && arg != "-") {
      return usageError("info", fmt::format("unknown option '{}'", arg),
                        kUsage);
    } else {
      paths.emplace_back(arg);
    }
  }
  if (paths.empty())
    return usageError("info", "no file given", kUsage);
  Expected<GGUFModel> model = GGUFModel::open(paths);
  if (!model)
    return reportError(model.error());
  if (json)
    printJson(*model);
  else
    printText(*model);
  return 0;
}

} // namespace kiln::gguf::tool
