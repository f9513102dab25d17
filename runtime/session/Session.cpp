//===- Session.cpp - A loaded model: artifact, weights, backend rank -------===//
#include "session/Session.h"
#include "support/DrawKey.h"

#include "support/Progress.h"

#include <fmt/format.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>

namespace kiln::runtime {

namespace {

constexpr const char *kDecodeStep = "decode_step";

std::string dimsText(const std::vector<int64_t> &dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

/// Every binding must name a tensor of the set with exactly the type and
/// dims the artifact was compiled for: a file from another quantisation or
/// another model is refused before any compute.
Status checkBindings(const artifact::Artifact &a, const gguf::GGUFModel &model,
                     std::vector<kiln_weight_bytes> &out) {
  const std::string &where = model.parts().front().path();
  for (const artifact::WeightBinding &b : a.weights) {
    std::optional<gguf::TensorRef> ref = model.findTensor(b.tensor);
    if (!ref)
      return Error(where, "tensor '" + b.tensor + "'",
                   "is missing (the artifact binds it): wrong weights file?");
    const gguf::TensorInfo &info = model.info(*ref);
    std::string field = fmt::format("tensor '{}'", b.tensor);
    if (info.type != b.type)
      return Error(model.parts()[ref->part].path(), field,
                   fmt::format("has type {}, the artifact was compiled for {}",
                               nameOf(info.type), nameOf(b.type)));
    std::vector<int64_t> dims(info.dims.begin(), info.dims.end());
    if (dims != b.dims)
      return Error(model.parts()[ref->part].path(), field,
                   fmt::format("has dims {}, the artifact was compiled for {}",
                               dimsText(dims), dimsText(b.dims)));
    std::span<const uint8_t> data = model.tensorData(*ref);
    out.push_back({data.data(), data.size()});
  }
  return Status::ok();
}

/// Reads every bound tensor's bytes into memory (they are memory-mapped:
/// this is where the file is actually read), in chunks, with a progress
/// bar. The backend then copies from memory. Returns the bytes read.
uint64_t readWeights(const std::vector<kiln_weight_bytes> &weights,
                     bool progress) {
  // Each tensor once (a binding per rank may name the same tensor).
  std::set<std::pair<const void *, uint64_t>> unique;
  uint64_t total = 0;
  for (const kiln_weight_bytes &w : weights)
    if (unique.insert({w.data, w.bytes}).second)
      total += w.bytes;
  ProgressBar bar("loading weights", total, progress && isatty(2));
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  constexpr uint64_t kChunk = uint64_t(64) << 20;
  uint64_t done = 0;
  volatile uint8_t sink = 0;
  for (auto [data, bytes] : unique) {
    const uint8_t *p = static_cast<const uint8_t *>(data);
    for (uint64_t at = 0; at < bytes; at += kChunk) {
      uint64_t n = std::min(kChunk, bytes - at);
      // Ask for the chunk ahead of the reads (page-aligned start).
      uintptr_t begin = uintptr_t(p + at) & ~uintptr_t(page - 1);
      madvise(reinterpret_cast<void *>(begin), uintptr_t(p + at + n) - begin,
              MADV_WILLNEED);
      uint8_t acc = 0;
      for (uint64_t i = 0; i < n; i += page)
        acc ^= p[at + i];
      sink = sink ^ acc;
      done += n;
      bar.update(done);
    }
  }
  bar.finish();
  return total;
}

} // namespace

Expected<std::unique_ptr<Session>> Session::open(const SessionOptions &options) {
  std::ifstream in(options.artifactPath, std::ios::binary);
  if (!in)
    return Error(options.artifactPath, "", "cannot open the artifact");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  Expected<artifact::Artifact> artifact =
      artifact::parseArtifact(bytes, options.artifactPath);
  if (!artifact)
    return artifact.error();
  const artifact::Step *step = artifact->rankPlans[0].step(kDecodeStep);
  if (!step)
    return Error(options.artifactPath, "steps",
                 "has no decode_step: not a decoder artifact");
  std::optional<int32_t> logits =
      step->slot(artifact::BufferKind::Output, "logits");
  for (auto [kind, name] :
       {std::pair{artifact::BufferKind::Input, "token"},
        std::pair{artifact::BufferKind::Input, "position"},
        std::pair{artifact::BufferKind::Output, "next_token"}}) {
    std::optional<int32_t> slot = step->slot(kind, name);
    if (!slot || step->buffers[*slot].bytes() != 4)
      return Error(options.artifactPath,
                   fmt::format("decode_step slot '{}'", name),
                   "is missing or has the wrong size");
  }
  // The sampling words are optional: an artifact without them runs every
  // draw on the host.
  std::optional<int32_t> drawSlot =
      step->slot(artifact::BufferKind::Input, "sampling");
  // Its forms (DrawKey.h): eight words, four in artifacts whose step draws
  // plain temperatures only, or the adjusting form's.
  if (drawSlot) {
    const uint64_t bytes = step->buffers[*drawSlot].bytes();
    if (bytes != 4 * draw::kDrawWords && bytes != 4 * draw::kTemperatureWords &&
        (bytes % 4 != 0 || bytes / 4 > INT32_MAX ||
         draw::adjustCapacity(int(bytes / 4)) == 0))
      return Error(options.artifactPath, "decode_step slot 'sampling'",
                   fmt::format("has the wrong size ({} bytes: {} or {} i32 "
                               "words, or {} + {} n)",
                               bytes, draw::kDrawWords, draw::kTemperatureWords,
                               draw::kEntriesStart, draw::kEntryWords));
  }
  const artifact::ConfigEntry *vocab = artifact->configEntry("vocab");
  if (!logits && (!vocab || vocab->isFloat || vocab->intValue <= 0))
    return Error(options.artifactPath, "config",
                 "without a logits slot the config must give the vocab");
  // Random weights (a benchmark) need no file; otherwise every binding is
  // checked against the GGUF set before the backend sees a byte.
  bool random = options.flags & KILN_RUN_RANDOM_WEIGHTS;
  gguf::GGUFModel model;
  std::vector<kiln_weight_bytes> weights;
  if (!random) {
    if (options.weightPaths.empty())
      return Error(options.artifactPath, "weights",
                   "no GGUF file given (--weights FILE.gguf...)");
    Expected<gguf::GGUFModel> opened =
        gguf::GGUFModel::open(options.weightPaths);
    if (!opened)
      return opened.error();
    model = std::move(*opened);
    if (Status st = checkBindings(*artifact, model, weights); !st)
      return st.error();
  }
  auto readStart = std::chrono::steady_clock::now();
  uint64_t weightBytes = readWeights(weights, options.progress);
  double weightSeconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - readStart)
                             .count();
  if (options.flags & KILN_RUN_SIMULATE_RANK &&
      options.simulateRank >= artifact->ranks)
    return Error(options.artifactPath, "ranks",
                 fmt::format("cannot simulate rank {}: the artifact has {} "
                             "ranks",
                             options.simulateRank, artifact->ranks));

  Expected<BackendPlugin> plugin =
      BackendPlugin::open(artifact->target, options.backendDirs);
  if (!plugin)
    return plugin.error();
  std::unique_ptr<Session> s(new Session(std::move(*plugin)));
  s->artifact_ = std::move(*artifact);
  s->artifactBytes_ = std::move(bytes);
  s->model_ = std::move(model);
  s->where_ = options.artifactPath;
  s->hasLogits_ = logits.has_value();
  s->draws_ = drawSlot.has_value();
  s->drawWordCount_ = drawSlot ? int(step->buffers[*drawSlot].bytes() / 4) : 0;
  s->drawWords_.assign(size_t(s->drawWordCount_), 0);
  // The adjusting form's repeat penalty: 1 (none).
  if (s->adjustCapacity() > 0)
    draw::doubleWords(1.0, s->drawWords_.data() + 8);
  s->weightBytes_ = weightBytes;
  s->weightSeconds_ = weightSeconds;
  s->vocab_ =
      logits ? int64_t(s->artifact_.rankPlans[0]
                           .step(kDecodeStep)
                           ->buffers[*logits]
                           .elements())
             : s->artifact_.configEntry("vocab")->intValue;
  kiln_rank_options rankOptions{};
  rankOptions.struct_bytes = sizeof(kiln_rank_options);
  rankOptions.threads = options.threads;
  rankOptions.device = options.device;
  rankOptions.flags = options.flags;
  rankOptions.simulate_rank = options.simulateRank;
  rankOptions.seed = options.seed;
  rankOptions.fill_positions = options.fillPositions;
  if (Status st = s->call(s->plugin_.api().open_group(
                              s->artifactBytes_.data(),
                              s->artifactBytes_.size(),
                              random ? nullptr : weights.data(),
                              uint32_t(random ? 0 : weights.size()),
                              &rankOptions,
                              &s->group_, s->error_, sizeof(s->error_)),
                          "open_group");
      !st)
    return st.error();
  return s;
}

Session::~Session() {
  if (group_)
    plugin_.api().close_group(group_);
}

Status Session::call(int rc, const char *what) {
  if (rc == 0)
    return Status::ok();
  return Error(plugin_.path(), what, error_);
}

Status Session::decode(int32_t token, int32_t position,
                       std::span<float> logits, int32_t *next) {
  if (position < 0 || uint64_t(position) >= artifact_.contextLength)
    return Error(where_, "context",
                 fmt::format("position {} is past the {} positions the "
                             "artifact's caches hold (compile with "
                             "kiln-compile --context N)",
                             position, artifact_.contextLength));
  if (token < 0 || token >= vocab_)
    return Error(where_, "token",
                 fmt::format("{} is not in the vocabulary [0, {})", token,
                             vocab_));
  if (!logits.empty() &&
      (!hasLogits_ || int64_t(logits.size()) != vocab_))
    return Error(where_, "logits",
                 hasLogits_ ? "buffer size is not the vocabulary"
                            : "the artifact was compiled with --no-logits");
  const kiln_backend_v1 &api = plugin_.api();
  if (Status st = call(api.write_slot(group_, kDecodeStep, "token", &token, 4,
                                      error_, sizeof(error_)),
                       "write_slot");
      !st)
    return st;
  if (Status st = call(api.write_slot(group_, kDecodeStep, "position",
                                      &position, 4, error_, sizeof(error_)),
                       "write_slot");
      !st)
    return st;
  if (draws_ && !drawWritten_) {
    if (Status st =
            call(api.write_slot(group_, kDecodeStep, "sampling",
                                drawWords_.data(), uint64_t(drawWordCount_) * 4,
                                error_, sizeof(error_)),
                 "write_slot");
        !st)
      return st;
    drawWritten_ = true;
  }
  if (Status st = call(api.run_step(group_, kDecodeStep, error_, sizeof(error_)),
                       "run_step");
      !st)
    return st;
  if (!logits.empty())
    if (Status st = call(api.read_slot(group_, kDecodeStep, "logits",
                                       logits.data(), logits.size_bytes(),
                                       error_, sizeof(error_)),
                         "read_slot");
        !st)
      return st;
  return call(api.read_slot(group_, kDecodeStep, "next_token", next, 4, error_,
                            sizeof(error_)),
              "read_slot");
}

Status Session::setDraw(const draw::DrawParams &params) {
  const auto [temperature, seed, topP, minP, topK] = params;
  int32_t words[draw::kDrawWords] = {int32_t(draw::floatBits(temperature)),
                                     int32_t(uint32_t(seed)),
                                     int32_t(uint32_t(seed >> 32)),
                                     int32_t(draw::floatBits(topP)),
                                     topK,
                                     int32_t(draw::floatBits(minP)),
                                     0,
                                     0};
  const bool cuts = params.cuts();
  if ((temperature != 0 || cuts) && !draws_)
    return Error(where_, "sampling",
                 "the artifact's step does not draw (compiled before its "
                 "argmax took the sampling words)");
  if (cuts && !cutsNucleus())
    return Error(where_, "sampling",
                 "the artifact's step draws plain temperatures only "
                 "(compiled before it cut a nucleus, top-k or min-p)");
  int bad = 0;
  if (!draw::validWords(words, draw::kDrawWords, bad))
    return Error(where_,
                 bad == 0   ? "temperature"
                 : bad == 3 ? "top_p"
                 : bad == 4 ? "top_k"
                            : "min_p",
                 fmt::format("{} is not a draw the step makes: {}",
                             bad == 0   ? fmt::format("{}", temperature)
                             : bad == 3 ? fmt::format("{}", topP)
                             : bad == 4 ? fmt::format("{}", topK)
                                        : fmt::format("{}", minP),
                             draw::kWordsRule));
  // The first form's four, or the eight (word 6, the adjusting form's
  // count, is setAdjustments').
  const int count = std::min(drawWordCount_, draw::kDrawWords);
  words[6] = count > 6 ? drawWords_[6] : 0;
  if (std::equal(words, words + count, drawWords_.begin()))
    return Status::ok();
  std::copy(words, words + count, drawWords_.begin());
  drawWritten_ = false;
  return Status::ok();
}

Status Session::setAdjustments(const draw::Penalties &penalties,
                               std::span<const draw::Adjustment> entries) {
  const int capacity = adjustCapacity();
  if (capacity == 0) {
    if (entries.empty() && penalties == draw::Penalties{})
      return Status::ok();
    return Error(where_, "sampling",
                 "the artifact's step does not adjust the logits (compiled "
                 "with --adjustments=0 or before the step adjusted them): "
                 "biases and penalties need the logits on the host");
  }
  if (entries.size() > size_t(capacity))
    return Error(where_, "sampling",
                 fmt::format("{} adjusted tokens are more than the {} the "
                             "artifact's step has room for (kiln-compile "
                             "--adjustments)",
                             entries.size(), capacity));
  std::vector<int32_t> words = drawWords_;
  draw::writeAdjustments(words.data(), drawWordCount_, penalties,
                         entries.data(), entries.size());
  // The step's own checks, here first, so that bad adjustments are an
  // error before any compute (the eight are setDraw's, valid).
  draw::Penalties read;
  int bad = 0;
  if (!draw::readAdjustments(words.data(), drawWordCount_, vocab_, read, bad))
    return Error(
        where_, bad < draw::kEntriesStart ? "penalties" : "adjustments",
        fmt::format("word {} is {:#010x}: {}", bad,
                    uint32_t(words[size_t(bad)]), draw::wordRule(bad)));
  if (std::equal(words.begin(), words.end(), drawWords_.begin()))
    return Status::ok();
  drawWords_ = std::move(words);
  drawWritten_ = false;
  return Status::ok();
}

Status Session::reset() {
  return call(plugin_.api().reset(group_, error_, sizeof(error_)), "reset");
}

} // namespace kiln::runtime
