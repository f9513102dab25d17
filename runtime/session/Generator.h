//===- Generator.h - Prompt evaluation and text generation on a session -*- C++ -*-===//
//
// What kiln-run (one prompt, or a chat) and a server need between the
// decode step and text: the tokens whose keys and values are in the caches,
// feeding new tokens after a common prefix (a chat turn re-renders the whole
// conversation; only what differs from the cached tokens is evaluated), and
// a generation loop with sampling, end-of-sequence ids, stop strings (text
// that could begin one is held back while streaming) and streamed UTF-8
// text.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_SESSION_GENERATOR_H
#define KILN_RUNTIME_SESSION_GENERATOR_H

#include "chat/ReplyConstraint.h"
#include "session/Sampler.h"
#include "session/Session.h"
#include "tokenizer/Tokenizer.h"

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::runtime {

struct GenerateOptions {
  int64_t maxTokens = 16;
  SamplingOptions sampling;
  /// Each generated token's log-probability under the model (the logits'
  /// log-softmax, before temperature and penalties) and this many of the
  /// most likely alternatives; -1: none. Needs the artifact's logits.
  int32_t logprobs = -1;
  std::vector<int32_t> stopIds;         ///< end generation, not output
  std::vector<std::string> stopStrings; ///< end generation, not output
  /// A constrained reply (OpenAI's response_format json_object:
  /// chat::JsonPrefix; tool_choice required or a named function:
  /// chat::ToolCallPrefix): a fresh recogniser for each generate call. Each
  /// token is chosen among those whose bytes it accepts (text tokens, and
  /// control tokens where it takes them; a stop id only where the reply may
  /// end), and generation ends where nothing else may follow. Needs the
  /// tokenizer and the logits; every step checks every token's bytes.
  std::function<std::unique_ptr<chat::ReplyConstraint>()> constraint;
};

/// The draw `session`'s step makes for `sampling`: its key draw (keyDraw)
/// on an artifact whose step draws (Session::draws), and cuts a nucleus
/// where it has one (Session::cutsNucleus); with penalties or biases only
/// where its step adjusts the logits with room for them (stepAdjusts), and
/// then the argmax (a temperature of 0) for greedy decoding; none
/// otherwise.
std::optional<KeyDraw> stepDraw(const Session &session,
                                const SamplingOptions &sampling);

/// Whether `session`'s step makes the adjustments `sampling` asks for
/// (its adjusting form, with room for mostAdjustments).
bool stepAdjusts(const Session &session, const SamplingOptions &sampling);

/// What `session`'s step chooses without the logits on the host, in words
/// for a refusal ("greedy decoding, temperatures, ..."), with
/// `sampling`'s count of adjustments where the step adjusts.
std::string stepChoices(const Session &session,
                        const SamplingOptions &sampling);

/// Whether choosing by `sampling` needs the logits on the host: anything
/// but greedy decoding and the step's own draw.
bool needsHostLogits(const Session &session, const SamplingOptions &sampling);

/// A generated token's log-probability and the most likely tokens' there
/// (most likely first; ties to the lower id).
struct TokenLogprob {
  int32_t token = 0;
  double logprob = 0;
  std::vector<std::pair<int32_t, double>> top;
};

/// `token`'s log-probability under `logits` (their log-softmax, in double)
/// and the `top` most likely tokens'.
TokenLogprob tokenLogprob(std::span<const float> logits, int32_t token,
                          int32_t top);

struct GenerateResult {
  std::vector<int32_t> tokens; ///< generated, stop id excluded
  std::string text;            ///< their text, cut before a stop string
  std::vector<TokenLogprob> logprobs; ///< one per token, when asked
  bool stoppedAtId = false;
  bool stoppedAtString = false;
  bool stoppedWhole = false;    ///< the constrained reply could only end
  bool stoppedByCaller = false; ///< onText returned false
  double seconds = 0; ///< the generation loop's wall time
  /// Decode steps the loop ran (the last token is not evaluated: it has
  /// no successor yet).
  int64_t steps = 0;
  /// Where the tokens were chosen: the step's argmax (greedy), the step's
  /// draw (a temperature and its cuts, or any choice with penalties or
  /// biases, which the step adjusts the logits for: DrawKey.h), or on the
  /// host (a constraint, or what the artifact's step cannot make; the
  /// logits copied each step).
  enum class Chooser { StepArgmax, StepDraw, Host };
  Chooser chooser = Chooser::StepArgmax;
};

/// A Chooser as kiln-run --json and kiln-serve's /metrics spell it:
/// "step_argmax", "step_draw", "host".
const char *chooserName(GenerateResult::Chooser chooser);

class Generator {
public:
  /// `tokenizer` may be null (no text out; stop strings refused).
  Generator(Session &session, const tokenizer::Tokenizer *tokenizer);

  /// Evaluates `tokens` after the first `keep` cached tokens (which must
  /// not exceed what is cached). Logits of each evaluated position are
  /// appended to `allLogits` when given.
  Status feed(std::span<const int32_t> tokens, size_t keep = SIZE_MAX,
              std::vector<float> *allLogits = nullptr);

  /// Evaluates `tokens` in place of the cached ones, re-using the longest
  /// common prefix: what a chat turn needs. Returns how many were reused.
  Expected<size_t> feedConversation(std::span<const int32_t> tokens);

  /// The generate call that will follow the next feed: where its sampling
  /// is the step's draw (stepDraw), the feed's last
  /// step draws its first token, so the reply costs no extra step. Without
  /// it (or with other options), generate evaluates the last token again to
  /// draw it.
  void plan(const GenerateOptions &options);

  /// Generates after what has been fed; `onText` receives text as it
  /// becomes final and returns false to stop (a client that went away).
  /// The generated tokens except the last are cached (the last is cached
  /// by the next feed).
  Expected<GenerateResult>
  generate(const GenerateOptions &options,
           const std::function<bool(std::string_view)> &onText = {},
           std::vector<float> *allLogits = nullptr);

  /// Tokens whose keys and values are in the caches, in position order.
  const std::vector<int32_t> &cached() const { return cached_; }
  /// The cached tokens plus the last generated one (not yet evaluated).
  std::vector<int32_t> history() const;

private:
  /// The draw a step's argmax makes (DrawKey.h): temperature 0 is the
  /// argmax; with `adjusts`, after the adjustments its bias, penalties and
  /// window make over the tokens so far (makeAdjustments).
  struct Draw {
    draw::DrawParams params;
    bool adjusts = false;
    draw::Penalties penalties;
    std::vector<std::pair<int32_t, float>> logitBias;
    int64_t repeatWindow = 0;
    bool operator==(const Draw &) const = default;
  };
  /// The device's draw for `options`, where the step can make it.
  std::optional<Draw> deviceDraw(const GenerateOptions &options) const;
  Status step(int32_t token, std::vector<float> *allLogits, bool wantLogits,
              Draw draw);

  Session &session_;
  const tokenizer::Tokenizer *tokenizer_;
  std::vector<float> logits_;
  int32_t next_ = 0;
  std::vector<int32_t> cached_;
  std::optional<int32_t> pending_; ///< generated, not yet evaluated
  /// next_ (and logits_, where logitsHeld_) are the step's after the last
  /// cached token: what a generate call chooses its first token from.
  bool fresh_ = false;
  bool logitsHeld_ = false;
  /// The draw next_ was made by, and the one plan() asked the next feed's
  /// last step for.
  Draw nextDraw_, planned_;
  /// A constrained reply's spelling tokens (text tokens; control tokens
  /// apart) with their bytes, read from the tokenizer at the first.
  std::vector<std::pair<int32_t, std::string_view>> spellers_, controls_;
  bool spellersRead_ = false;
};

} // namespace kiln::runtime

#endif // KILN_RUNTIME_SESSION_GENERATOR_H
