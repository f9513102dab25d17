//===- Generator.cpp - Prompt evaluation and text generation on a session --===//
#include "session/Generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <numeric>
#include <optional>
#include <string>
#include <unordered_map>

namespace kiln::runtime {

namespace {

/// `token`'s log-softmax over `logits` (in double) and the `top` most likely
/// tokens' (ties to the lower id).
TokenLogprob logprobOf(std::span<const float> logits, int32_t token,
                       int32_t top, std::vector<int32_t> &order) {
  double most = -INFINITY;
  for (float l : logits)
    most = std::max(most, double(l));
  double sum = 0;
  for (float l : logits)
    sum += std::exp(double(l) - most);
  const double norm = most + std::log(sum);
  TokenLogprob out;
  out.token = token;
  out.logprob = double(logits[size_t(token)]) - norm;
  if (top > 0) {
    const size_t n = std::min(size_t(top), logits.size());
    order.resize(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + ptrdiff_t(n), order.end(),
                      [&](int32_t a, int32_t b) {
                        return logits[size_t(a)] > logits[size_t(b)] ||
                               (logits[size_t(a)] == logits[size_t(b)] &&
                                a < b);
                      });
    for (size_t i = 0; i < n; ++i)
      out.top.emplace_back(order[i], double(logits[size_t(order[i])]) - norm);
  }
  return out;
}

} // namespace

TokenLogprob tokenLogprob(std::span<const float> logits, int32_t token,
                          int32_t top) {
  std::vector<int32_t> order;
  return logprobOf(logits, token, top, order);
}

Generator::Generator(Session &session, const tokenizer::Tokenizer *tokenizer)
    : session_(session), tokenizer_(tokenizer),
      logits_(session.hasLogits() ? size_t(session.vocab()) : 0) {}

std::vector<int32_t> Generator::history() const {
  std::vector<int32_t> all(cached_);
  if (pending_)
    all.push_back(*pending_);
  return all;
}

bool stepAdjusts(const Session &session, const SamplingOptions &sampling) {
  return session.adjustCapacity() > 0 &&
         mostAdjustments(sampling, session.vocab()) <= session.adjustCapacity();
}

std::optional<KeyDraw> stepDraw(const Session &session,
                                const SamplingOptions &sampling) {
  if (!session.draws())
    return std::nullopt;
  const bool adjusts = sampling.penalises();
  if (adjusts && !stepAdjusts(session, sampling))
    return std::nullopt;
  // Greedy decoding with adjustments is the step's argmax of the adjusted
  // logits (a temperature of 0).
  std::optional<KeyDraw> d =
      sampling.greedy() ? (adjusts ? std::optional(KeyDraw{}) : std::nullopt)
                        : keyDraw(sampling, session.vocab());
  if (d && d->cuts() && !session.cutsNucleus())
    return std::nullopt;
  return d;
}

std::string stepChoices(const Session &session,
                        const SamplingOptions &sampling) {
  if (!session.draws())
    return "greedy decoding";
  const int room = session.adjustCapacity();
  return fmt::format(
      "greedy decoding, {}{}",
      session.cutsNucleus() ? "temperatures, top-p, top-k and min-p"
                            : "plain temperatures",
      room > 0 ? fmt::format(", and penalties and logit biases over up to {} "
                             "tokens (these: up to {})",
                             room, mostAdjustments(sampling, session.vocab()))
               : "");
}

bool needsHostLogits(const Session &session, const SamplingOptions &sampling) {
  return sampling.needsLogits() && !stepDraw(session, sampling);
}

const char *chooserName(GenerateResult::Chooser chooser) {
  switch (chooser) {
  case GenerateResult::Chooser::StepArgmax:
    return "step_argmax";
  case GenerateResult::Chooser::StepDraw:
    return "step_draw";
  case GenerateResult::Chooser::Host:
    return "host";
  }
  return "?";
}

std::optional<Generator::Draw>
Generator::deviceDraw(const GenerateOptions &options) const {
  if (options.constraint)
    return std::nullopt;
  const SamplingOptions &o = options.sampling;
  std::optional<KeyDraw> d = stepDraw(session_, o);
  if (!d)
    return std::nullopt;
  Draw draw;
  draw.params = d->params(o.seed);
  if (o.penalises()) {
    draw.adjusts = true;
    draw.penalties = penaltiesOf(o);
    draw.logitBias = o.logitBias;
    draw.repeatWindow = o.repeatWindow;
  }
  return draw;
}

void Generator::plan(const GenerateOptions &options) {
  planned_ = deviceDraw(options).value_or(Draw{});
}

Status Generator::step(int32_t token, std::vector<float> *allLogits,
                       bool wantLogits, Draw draw) {
  // The logits cross from the device only where something reads them (a
  // prompt's last position, a sampled or constrained choice, logprobs).
  const bool copy = (wantLogits || allLogits) && !logits_.empty();
  fresh_ = false;
  if (session_.draws())
    if (Status st = session_.setDraw(draw.params); !st)
      return st;
  if (session_.adjustCapacity() > 0) {
    // The adjustments over the tokens so far, this one included (the
    // window's last ones are enough).
    std::vector<draw::Adjustment> entries;
    if (draw.adjusts) {
      const size_t window = size_t(std::max<int64_t>(draw.repeatWindow, 0));
      const size_t older = std::min(cached_.size(), window);
      std::vector<int32_t> recent(cached_.end() - ptrdiff_t(older),
                                  cached_.end());
      recent.push_back(token);
      entries = makeAdjustments(draw.logitBias, draw.penalties,
                                draw.repeatWindow, recent, session_.vocab());
    }
    if (Status st = session_.setAdjustments(
            draw.adjusts ? draw.penalties : draw::Penalties{}, entries);
        !st)
      return st;
  }
  nextDraw_ = session_.draws() ? draw : Draw{};
  if (Status st = session_.decode(
          token, int32_t(cached_.size()),
          copy ? std::span<float>(logits_) : std::span<float>(), &next_);
      !st)
    return st;
  cached_.push_back(token);
  fresh_ = true;
  logitsHeld_ = copy;
  if (allLogits)
    allLogits->insert(allLogits->end(), logits_.begin(), logits_.end());
  return Status::ok();
}

Status Generator::feed(std::span<const int32_t> tokens, size_t keep,
                       std::vector<float> *allLogits) {
  // Positions past `keep` are overwritten as the new tokens are evaluated;
  // attention never reads past the current position, so nothing stale is
  // seen.
  cached_.resize(std::min(keep, cached_.size()));
  pending_.reset();
  fresh_ = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool last = i + 1 == tokens.size();
    if (Status st = step(tokens[i], allLogits, last, last ? planned_ : Draw{});
        !st)
      return st;
  }
  return Status::ok();
}

Expected<size_t> Generator::feedConversation(std::span<const int32_t> tokens) {
  size_t common = 0;
  while (common < cached_.size() && common < tokens.size() &&
         cached_[common] == tokens[common])
    ++common;
  // The last token must be evaluated again to have its logits.
  if (common == tokens.size() && common > 0)
    --common;
  if (Status st = feed(tokens.subspan(common), common); !st)
    return st.error();
  return common;
}

Expected<GenerateResult>
Generator::generate(const GenerateOptions &options,
                    const std::function<bool(std::string_view)> &onText,
                    std::vector<float> *allLogits) {
  if (cached_.empty())
    return Error("generate", "", "nothing was fed to generate after");
  if (!fresh_)
    return Error("generate", "",
                 "the end of the cache was not evaluated (a reply's last "
                 "token, or a cut without new tokens): feed before "
                 "generating");
  if (!options.stopStrings.empty() && !tokenizer_)
    return Error("generate", "stop",
                 "stop strings need the file's tokenizer, and it has none");
  if (options.logprobs >= 0 && logits_.empty())
    return Error("generate", "logprobs",
                 "log-probabilities need the logits: the artifact was "
                 "compiled with --no-logits");
  if (options.constraint && (!tokenizer_ || logits_.empty()))
    return Error("generate", "constraint",
                 !tokenizer_ ? "a constrained reply needs the file's "
                               "tokenizer, and it has none"
                             : "a constrained reply needs the logits: the "
                               "artifact was compiled with --no-logits");
  std::vector<int32_t> order;
  using Clock = std::chrono::steady_clock;
  Clock::time_point start = Clock::now();
  GenerateResult result;
  Sampler sampler(options.sampling);
  std::vector<int32_t> history = cached_;
  std::optional<tokenizer::StreamDecoder> stream;
  if (tokenizer_)
    stream.emplace(*tokenizer_);
  // Text decoded but not yet shown: it could be the start of a stop string.
  std::string held;
  size_t longestStop = 0;
  for (const std::string &stop : options.stopStrings)
    longestStop = std::max(longestStop, stop.size());
  auto show = [&](const std::string &piece) {
    result.text += piece;
    if (onText && !piece.empty() && !onText(piece))
      result.stoppedByCaller = true;
  };
  // A constrained reply: the stop ids in the vocabulary and the allowed
  // sets by state.
  std::unique_ptr<chat::ReplyConstraint> constraint;
  std::vector<int32_t> enders;
  constexpr size_t kMaxMasks = 32;
  std::unordered_map<std::string, std::vector<uint8_t>> masks;
  if (options.constraint) {
    constraint = options.constraint();
    // The vocabulary's spelling tokens, read once for the generator's life.
    if (!spellersRead_) {
      for (int32_t id = 0;
           id < tokenizer_->vocabSize() && size_t(id) < logits_.size(); ++id) {
        const tokenizer::TokenType type = tokenizer_->tokenType(id);
        std::optional<std::string_view> bytes = tokenizer_->tokenBytes(id);
        if (!bytes || bytes->empty())
          continue;
        if (type == tokenizer::TokenType::Normal ||
            type == tokenizer::TokenType::Byte ||
            type == tokenizer::TokenType::UserDefined)
          spellers_.emplace_back(id, *bytes);
        else if (type == tokenizer::TokenType::Control)
          controls_.emplace_back(id, *bytes);
      }
      spellersRead_ = true;
    }
    for (int32_t id : options.stopIds)
      if (id >= 0 && id < tokenizer_->vocabSize() &&
          size_t(id) < logits_.size())
        enders.push_back(id);
  }
  // The allowed set of the constraint's state now: its text tokens, its
  // control tokens where it takes them, the stop ids where it may end (a
  // stop id spells nothing, whatever its bytes).
  auto maskOf = [&] {
    std::vector<uint8_t> mask(logits_.size(), 0);
    for (const auto &[id, bytes] : spellers_)
      mask[size_t(id)] = constraint->accepts(bytes);
    if (constraint->takesControlTokens())
      for (const auto &[id, bytes] : controls_)
        mask[size_t(id)] = constraint->acceptsControl(bytes);
    const uint8_t end = constraint->complete();
    for (int32_t id : enders)
      mask[size_t(id)] = end;
    return mask;
  };
  // A new state's allowed set is computed on a second thread while the
  // model's step runs (the state does not change until the next token is
  // chosen, which waits for it): on a GPU, the step's time hides it.
  std::future<std::vector<uint8_t>> pending;
  std::string pendingKey;
  // A draw is the step's own where it can make it (the argmax of DrawKey.h's
  // keys, after the adjustments: no logits cross), else the same keys'
  // argmax on the host, after the same adjustments; anything else is the
  // Sampler's.
  const std::optional<Draw> onDevice = deviceDraw(options);
  std::optional<KeyDraw> drawn =
      constraint ? std::nullopt : keyDraw(options.sampling, session_.vocab());
  const bool sample =
      needsHostLogits(session_, options.sampling) || bool(constraint);
  std::vector<float> adjusted; // the host's keys' draw with adjustments
  if (sample && logits_.empty()) {
    const SamplingOptions &o = options.sampling;
    return Error(
        "generate", "sampling",
        !o.penalises() || stepAdjusts(session_, o)
            ? std::string("sampling (a cut of the vocabulary) needs the "
                          "logits: the artifact was compiled with "
                          "--no-logits")
        : session_.adjustCapacity() == 0
            ? std::string("a penalty or a bias needs the logits: the "
                          "artifact was compiled with --no-logits, and its "
                          "step does not adjust them (--adjustments=0)")
            : fmt::format("a penalty or a bias over up to {} tokens needs "
                          "the logits: the artifact was compiled with "
                          "--no-logits, and its step adjusts at most {}",
                          mostAdjustments(o, session_.vocab()),
                          session_.adjustCapacity()));
  }
  const bool wantLogits = sample || options.logprobs >= 0;
  result.chooser = onDevice               ? GenerateResult::Chooser::StepDraw
                   : sample || constraint ? GenerateResult::Chooser::Host
                                          : GenerateResult::Chooser::StepArgmax;
  // The first token is the last fed step's: where that step did not draw
  // as asked, it is evaluated again (the same cache row) with the draw.
  if (onDevice && nextDraw_ != *onDevice && options.maxTokens > 0) {
    const int32_t last = cached_.back();
    cached_.pop_back();
    if (Status st = step(last, nullptr, wantLogits, *onDevice); !st)
      return st.error();
  }
  if (wantLogits && !logitsHeld_ && !logits_.empty())
    return Error("generate", "",
                 "the last step's logits were not kept: feed before "
                 "generating");
  for (int64_t g = 0; g < options.maxTokens; ++g) {
    int32_t token;
    if (constraint) {
      // A state seen before (inside a long string or value, most steps)
      // has its allowed set kept; a few dozen states at most are kept.
      std::string key = constraint->key();
      auto keep = [&](std::string k, std::vector<uint8_t> mask) {
        if (masks.size() >= kMaxMasks)
          masks.clear();
        return masks.emplace(std::move(k), std::move(mask)).first;
      };
      if (pending.valid()) // computed while the step ran
        keep(pendingKey, pending.get());
      auto it = masks.find(key);
      if (it == masks.end())
        it = keep(std::move(key), maskOf());
      const std::vector<uint8_t> &allowed = it->second;
      token = sampler.sample(logits_, history, allowed);
      if (token < 0)
        return Error("generate", "constraint",
                     "no token of the vocabulary continues the constrained "
                     "reply after " +
                         std::to_string(result.tokens.size()) +
                         " generated tokens");
      if (std::find(enders.begin(), enders.end(), token) == enders.end())
        constraint->push(*tokenizer_->tokenBytes(token));
    } else if (drawn && !onDevice) {
      std::span<const float> logits = logits_;
      if (options.sampling.penalises()) {
        adjusted.assign(logits_.begin(), logits_.end());
        adjustLogits(adjusted, options.sampling, history);
        logits = adjusted;
      }
      token = drawToken(logits, *drawn, options.sampling.seed,
                        int32_t(cached_.size()) - 1);
    } else {
      token = sample ? sampler.sample(logits_, history) : next_;
    }
    if (std::find(options.stopIds.begin(), options.stopIds.end(), token) !=
        options.stopIds.end()) {
      result.stoppedAtId = true; // end of sequence: not part of the output
      break;
    }
    result.tokens.push_back(token);
    if (options.logprobs >= 0)
      result.logprobs.push_back(
          logprobOf(logits_, token, options.logprobs, order));
    history.push_back(token);
    if (stream) {
      Expected<std::string> piece = stream->push(token);
      if (piece) {
        held += *piece;
        // A stop string ends generation; text before it is output.
        size_t cut = std::string::npos;
        for (const std::string &stop : options.stopStrings)
          cut = std::min(cut, held.find(stop));
        if (cut != std::string::npos) {
          show(held.substr(0, cut));
          held.clear();
          result.stoppedAtString = true;
          break;
        }
        // Keep back only what could still begin a stop string.
        size_t keep = longestStop ? std::min(held.size(), longestStop - 1) : 0;
        show(held.substr(0, held.size() - keep));
        held.erase(0, held.size() - keep);
      }
    }
    if (constraint && constraint->final()) {
      result.stoppedWhole = true; // nothing may follow but the end
      break;
    }
    if (g + 1 == options.maxTokens || result.stoppedByCaller)
      break;
    if (constraint) {
      pendingKey = constraint->key();
      if (!masks.count(pendingKey))
        pending = std::async(std::launch::async, maskOf);
    }
    if (Status st =
            step(token, allLogits, wantLogits, onDevice.value_or(Draw{}));
        !st)
      return st.error();
    ++result.steps;
  }
  fresh_ = false; // the last token is not evaluated (pending_ below), or
                  // ended the reply
  // The last generated token has no successor yet: it is evaluated by the
  // next feed (a chat's next turn re-encodes it with the reply).
  if (result.steps < int64_t(result.tokens.size()))
    pending_ = result.tokens.back();
  if (stream && !result.stoppedAtString && !result.stoppedByCaller)
    show(held + stream->flush());
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

} // namespace kiln::runtime
