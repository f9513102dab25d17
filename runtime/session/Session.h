//===- Session.h - A loaded model: artifact, weights, backend rank -*- C++ -*-===//
#ifndef KILN_RUNTIME_SESSION_SESSION_H
#define KILN_RUNTIME_SESSION_SESSION_H

#include "artifact/Artifact.h"
#include "gguf/GGUFFile.h"
#include "session/BackendPlugin.h"
#include "support/DrawKey.h"

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kiln::runtime {

struct SessionOptions {
  std::string artifactPath;
  std::vector<std::string> weightPaths;
  std::vector<std::string> backendDirs; ///< searched first for plugins
  uint32_t threads = 0;                 ///< CPU threads; 0 = all cores
  uint32_t device = 0;                  ///< first GPU (GPU backends)
  uint32_t flags = 0;                   ///< KILN_RUN_* (KilnBackend.h)
  uint32_t simulateRank = 0;            ///< with KILN_RUN_SIMULATE_RANK
  uint64_t seed = 0;                    ///< random weights and caches
  uint64_t fillPositions = 0; ///< caches' first positions made random
  /// Draw a progress bar (with GB/s) on stderr while the weights are read
  /// in, when stderr is a terminal.
  bool progress = true;
};

/// One model ready to run: the artifact read and verified, the GGUF set
/// opened and every bound tensor checked (name, type, dims) before any
/// compute, the backend plugin loaded and every rank opened on it.
class Session {
public:
  static Expected<std::unique_ptr<Session>> open(const SessionOptions &options);
  ~Session();
  Session(const Session &) = delete;
  Session &operator=(const Session &) = delete;

  const artifact::Artifact &artifact() const { return artifact_; }
  /// The GGUF set (empty with random weights: KILN_RUN_RANDOM_WEIGHTS).
  const gguf::GGUFModel &model() const { return model_; }
  const std::string &backendPath() const { return plugin_.path(); }
  /// Positions the caches hold.
  uint64_t contextLength() const { return artifact_.contextLength; }
  /// Logits per position.
  int64_t vocab() const { return vocab_; }
  /// Whether the steps return logits (not compiled with --no-logits).
  bool hasLogits() const { return hasLogits_; }
  /// Bytes of the bound tensors read from the GGUF set at open (0 with
  /// random weights), and the seconds that reading took.
  uint64_t weightBytes() const { return weightBytes_; }
  double weightSeconds() const { return weightSeconds_; }

  /// Runs @decode_step for `token` at `position`: the logits of the next
  /// token into `logits` (vocab values; pass an empty span to skip them,
  /// as an artifact without logits requires) and its argmax into `next`.
  /// A position at or past the context is an error, before any compute.
  Status decode(int32_t token, int32_t position, std::span<float> logits,
                int32_t *next);

  /// Empties the caches: the next decode must be at position 0.
  Status reset();

  /// Whether the step draws its next token itself (its argmax reads the
  /// `sampling` slot: support/DrawKey.h); artifacts compiled before it did
  /// not.
  bool draws() const { return draws_; }
  /// Whether the step also cuts a nucleus (top-p), top-k and min-p before
  /// it draws: its sampling slot has DrawKey.h's eight words (or the
  /// adjusting form, which begins with them).
  bool cutsNucleus() const { return drawWordCount_ >= draw::kDrawWords; }
  /// The draw the following decodes make their `next` by: temperature 0 is
  /// the argmax (the default); otherwise within [2^-16, 2^16], topP 0
  /// (none) or within (0, 1), minP 0 (none) or within (0, 1] and topK 0
  /// (none) or positive where the step cuts them (DrawKey.h). Written to
  /// the device with the next decode, only when it changed.
  Status setDraw(const draw::DrawParams &params);
  /// The tokens the step's adjusting form (DrawKey.h) has room for a step:
  /// 0 where its sampling slot has none (compiled with --adjustments=0, or
  /// before the form).
  int adjustCapacity() const { return draw::adjustCapacity(drawWordCount_); }
  /// The adjustments the following decodes make to the logits before their
  /// draw or argmax (logit_bias and the penalties over the recent tokens:
  /// runtime makeAdjustments): at most adjustCapacity() entries, ids
  /// ascending within the vocabulary, biases finite, counts at least 0,
  /// the repeat penalty finite and above 0, the others finite. Written to
  /// the device with the next decode, only when they changed.
  Status setAdjustments(const draw::Penalties &penalties,
                        std::span<const draw::Adjustment> entries);

private:
  Session(BackendPlugin plugin) : plugin_(std::move(plugin)) {}
  Status call(int rc, const char *what);

  artifact::Artifact artifact_;
  std::vector<uint8_t> artifactBytes_;
  gguf::GGUFModel model_;
  BackendPlugin plugin_;
  kiln_group *group_ = nullptr;
  int64_t vocab_ = 0;
  bool hasLogits_ = false;
  bool draws_ = false;
  /// The sampling words (DrawKey.h), the slot's count of them, and whether
  /// the device holds them; the first decode writes them (a plain argmax,
  /// no adjustments) whatever a slot held.
  std::vector<int32_t> drawWords_;
  int drawWordCount_ = 0; ///< the slot's (0: none)
  bool drawWritten_ = false;
  uint64_t weightBytes_ = 0;
  double weightSeconds_ = 0;
  std::string where_;
  char error_[1024] = {0};
};

} // namespace kiln::runtime

#endif // KILN_RUNTIME_SESSION_SESSION_H
