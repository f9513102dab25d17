//===- SynthCommand.cpp - `kiln-gguf synth`: write a synthetic GLM-5 -------===//
#include "synth/SynthCommand.h"

#include "gguf/GGUFWriter.h"
#include "support/CheckedMath.h"
#include "support/Progress.h"
#include "synth/GLM5Metadata.h"
#include "synth/GLM5Spec.h"
#include "support/Random.h"
#include "synth/TensorSynth.h"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

namespace kiln::synth {
namespace {

constexpr std::string_view kUsage = R"(usage: kiln-gguf synth OUT.gguf [options]

Writes a synthetic GLM-5 (glm-dsa) model with llama.cpp's metadata keys and
tensor names, a small byte-level BPE tokenizer and random but realistic
weights. Each tensor's bytes depend only on (seed, tensor name, type).

options:
  --preset tiny|small|glm5   model dimensions (default tiny)
  --mix NAME                 per-tensor types: f32, f16, q8_0, tiny,
                             ud-q4_k_xl, ud-q2_k_xl (default: tiny for the
                             tiny preset, ud-q4_k_xl otherwise)
  --type ROLE=TYPE           override one role's type, e.g. ffn_down_exps=q6_k
                             (repeatable; ROLE is the tensor name without
                             "blk.N." and ".weight")
  --seed N                   random seed (default 0)
  --split N                  write N files OUT-0000k-of-0000N.gguf
  --shuffle                  random tensor order (same tensors, same bytes)
  --fused-gate-up            one ffn_gate_up_exps tensor (gate rows first)
  --no-expert-weights-norm   expert_weights_norm = false: the router keeps
                             the chosen experts' weights unnormalised
  --metadata-only            full-length file whose tensor data is a hole
                             (sparse: no disk used)
  --alignment N              data alignment, a power of two (default 32)
  --quiet                    no progress bar or summary
dimension overrides (each --NAME N):
  )";

struct Options {
  std::string out;
  std::string preset = "tiny";
  std::optional<std::string> mix;
  std::vector<std::string> typeOverrides;
  std::vector<std::pair<std::string, std::string>> dimOverrides;
  uint64_t seed = 0;
  uint64_t split = 1;
  bool shuffle = false;
  bool fusedGateUp = false;
  bool noWeightsNorm = false;
  bool metadataOnly = false;
  uint64_t alignment = 32;
  bool quiet = false;
};

int usageError(const std::string &message) {
  fmt::print(stderr, "kiln-gguf: error: synth: {}\n", message);
  return 2;
}

std::optional<uint64_t> parseCount(std::string_view s) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size())
    return std::nullopt;
  return v;
}

/// The file names of the parts: OUT itself, or OUT-0000k-of-0000n.gguf.
std::vector<std::string> partNames(const std::string &out, uint64_t n) {
  if (n == 1)
    return {out};
  std::string stem = out;
  if (stem.ends_with(".gguf"))
    stem.resize(stem.size() - 5);
  std::vector<std::string> names;
  for (uint64_t k = 1; k <= n; ++k)
    names.push_back(fmt::format("{}-{:05d}-of-{:05d}.gguf", stem, k, n));
  return names;
}

int run(const Options &opt) {
  auto fail = [](const Error &e) {
    fmt::print(stderr, "kiln-gguf: error: {}\n", e.message());
    return 1;
  };
  Expected<GLM5Dims> dims = presetDims(opt.preset);
  if (!dims)
    return fail(dims.error());
  dims->weightsNorm = !opt.noWeightsNorm;
  for (const auto &[name, value] : opt.dimOverrides)
    if (Status s = overrideDim(*dims, name, value); !s)
      return fail(s.error());
  Expected<Mix> mix =
      namedMix(opt.mix.value_or(opt.preset == "tiny" ? "tiny" : "ud-q4_k_xl"));
  if (!mix)
    return fail(mix.error());
  for (const std::string &o : opt.typeOverrides)
    if (Status s = overrideMixRole(*mix, o); !s)
      return fail(s.error());
  Expected<std::vector<SynthTensor>> tensors =
      glm5Tensors(*dims, *mix, LayoutOptions{opt.fusedGateUp});
  if (!tensors)
    return fail(tensors.error());

  if (opt.shuffle) {
    // Fisher-Yates with its own stream: the order changes, never the bytes.
    Rng rng(fnv1a("shuffle", opt.seed));
    for (size_t i = tensors->size(); i > 1; --i)
      std::swap((*tensors)[i - 1], (*tensors)[rng.below(i)]);
  }
  if (opt.split > tensors->size())
    return usageError(fmt::format("--split {}: the model has only {} tensors",
                                  opt.split, tensors->size()));

  std::vector<uint64_t> sizes;
  uint64_t totalBytes = 0;
  for (const SynthTensor &t : *tensors) {
    Expected<TensorSize> size = sizeOf(t);
    if (!size)
      return fail(size.error());
    sizes.push_back(size->bytes);
    auto sum = checkedAdd(totalBytes, size->bytes);
    if (!sum)
      return fail(Error("", t.name, "model size overflows"));
    totalBytes = *sum;
  }

  // Parts hold consecutive tensors of about equal bytes; part k ends at the
  // first tensor whose running total reaches k/n of the whole.
  std::vector<size_t> partEnd;
  {
    uint64_t running = 0;
    size_t part = 0;
    for (size_t i = 0; i < tensors->size(); ++i) {
      running += sizes[i];
      size_t remainingTensors = tensors->size() - i - 1;
      size_t remainingParts = opt.split - part - 1;
      bool quotaReached = double(running) >=
                          double(totalBytes) * double(part + 1) / double(opt.split);
      if (remainingParts > 0 &&
          (quotaReached || remainingTensors == remainingParts)) {
        partEnd.push_back(i + 1);
        ++part;
      }
    }
    partEnd.push_back(tensors->size());
  }

  SynthTokenizer tok = makeTokenizer(dims->vocab);
  gguf::Metadata metadata = glm5Metadata(
      *dims, tok,
      fmt::format("kiln synthetic GLM-5 (preset {}, mix {}, seed {})",
                  opt.preset, mix->name, opt.seed));

  std::vector<std::string> names = partNames(opt.out, opt.split);
  ProgressBar progress("synth", totalBytes,
                       !opt.quiet && !opt.metadataOnly &&
                           isatty(STDERR_FILENO) == 1);
  uint64_t doneBefore = 0;
  size_t first = 0;
  std::vector<std::string> written;
  for (uint64_t part = 0; part < opt.split; ++part) {
    gguf::GGUFWriter writer(uint32_t(opt.alignment));
    if (part == 0)
      for (const auto &[key, value] : metadata)
        writer.addMetadata(key, value);
    if (opt.split > 1) {
      writer.addMetadata("split.no",
                         gguf::Value::unsignedInt(gguf::ValueType::UInt16, part));
      writer.addMetadata("split.count", gguf::Value::unsignedInt(
                                            gguf::ValueType::UInt16, opt.split));
      writer.addMetadata("split.tensors.count",
                         gguf::Value::i32(int32_t(tensors->size())));
    }
    size_t last = partEnd[part];
    for (size_t i = first; i < last; ++i)
      writer.addTensor({(*tensors)[i].name, (*tensors)[i].type,
                        (*tensors)[i].dims});
    gguf::TensorFill fill;
    // The writer asks for each tensor's chunks in order; one synthesiser
    // lives from a tensor's first chunk to its last.
    std::optional<TensorSynthesizer> current;
    if (!opt.metadataOnly)
      fill = [&, first](size_t index, uint64_t offset,
                        std::span<uint8_t> out) -> Status {
        if (offset == 0) {
          Expected<TensorSynthesizer> s =
              TensorSynthesizer::create(opt.seed, (*tensors)[first + index]);
          if (!s)
            return s.error();
          current.emplace(std::move(*s));
        }
        return current->next(out);
      };
    Status s = writer.write(names[part], fill,
                            [&](uint64_t done, uint64_t) {
                              progress.update(doneBefore + done);
                            });
    if (!s) {
      for (const std::string &w : written)
        std::remove(w.c_str());
      return fail(s.error().where().empty() ? s.error().withWhere(names[part])
                                            : s.error());
    }
    written.push_back(names[part]);
    for (size_t i = first; i < last; ++i)
      doneBefore += sizes[i];
    first = last;
  }
  progress.finish();
  if (!opt.quiet) {
    double seconds = progress.elapsedSeconds();
    fmt::print("wrote {} ({} file{}, {} tensors, {} of tensor data{}) in {:.2f} s",
               opt.split == 1 ? names[0] : opt.out + " as " + names[0] + "...",
               opt.split, opt.split == 1 ? "" : "s", tensors->size(),
               formatBytes(totalBytes),
               opt.metadataOnly ? ", not written: metadata only" : "", seconds);
    if (!opt.metadataOnly && seconds > 0)
      fmt::print(" ({}/s)", formatBytes(uint64_t(double(totalBytes) / seconds)));
    fmt::print("\n");
  }
  return 0;
}

} // namespace

int runSynthCommand(int argc, char **argv) {
  Options opt;
  std::vector<std::string_view> dimFlags = dimNames();
  for (int i = 0; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&]() -> std::optional<std::string_view> {
      if (i + 1 >= argc)
        return std::nullopt;
      return std::string_view(argv[++i]);
    };
    auto countFlag = [&](uint64_t &target) -> bool {
      std::optional<std::string_view> v = value();
      std::optional<uint64_t> n = v ? parseCount(*v) : std::nullopt;
      if (!n)
        return false;
      target = *n;
      return true;
    };
    if (arg == "--help" || arg == "-h") {
      fmt::print("{}", kUsage);
      for (std::string_view d : dimFlags)
        fmt::print("--{} ", d);
      fmt::print("\n");
      return 0;
    } else if (arg == "--preset" || arg == "--mix" || arg == "--type") {
      std::optional<std::string_view> v = value();
      if (!v)
        return usageError(fmt::format("{} needs a value", arg));
      if (arg == "--preset")
        opt.preset = std::string(*v);
      else if (arg == "--mix")
        opt.mix = std::string(*v);
      else
        opt.typeOverrides.emplace_back(*v);
    } else if (arg == "--seed" || arg == "--split" || arg == "--alignment") {
      uint64_t &target = arg == "--seed"    ? opt.seed
                         : arg == "--split" ? opt.split
                                            : opt.alignment;
      if (!countFlag(target))
        return usageError(fmt::format("{} needs a non-negative integer", arg));
    } else if (arg == "--shuffle") {
      opt.shuffle = true;
    } else if (arg == "--fused-gate-up") {
      opt.fusedGateUp = true;
    } else if (arg == "--no-expert-weights-norm") {
      opt.noWeightsNorm = true;
    } else if (arg == "--metadata-only") {
      opt.metadataOnly = true;
    } else if (arg == "--quiet") {
      opt.quiet = true;
    } else if (arg.starts_with("--") &&
               std::find(dimFlags.begin(), dimFlags.end(), arg.substr(2)) !=
                   dimFlags.end()) {
      std::optional<std::string_view> v = value();
      if (!v)
        return usageError(fmt::format("{} needs a value", arg));
      opt.dimOverrides.emplace_back(std::string(arg.substr(2)), std::string(*v));
    } else if (arg.starts_with("-")) {
      return usageError(fmt::format("unknown option '{}'", arg));
    } else if (opt.out.empty()) {
      opt.out = std::string(arg);
    } else {
      return usageError(fmt::format("unexpected argument '{}'", arg));
    }
  }
  if (opt.out.empty())
    return usageError("missing OUT.gguf (see --help)");
  if (opt.split == 0 || opt.split > 99999)
    return usageError("--split must be between 1 and 99999");
  if (opt.alignment == 0 || (opt.alignment & (opt.alignment - 1)) ||
      opt.alignment > (1u << 30))
    return usageError(
        fmt::format("--alignment {} is not a power of two up to 2^30",
                    opt.alignment));
  return run(opt);
}

} // namespace kiln::synth
