//===- kiln-run.cpp - Run a compiled model ---------------------------------===//
//
// kiln-run M.kiln --weights FILE.gguf... (--prompt TEXT | --prompt-tokens 1,2,3) -n N
//         [--temperature T --top-k K --top-p P --seed S] [--json]
//         [--logits-out FILE.npy] [--threads N] [--backend-dir DIR]
//
// Loads the artifact, checks the GGUF set against it, opens the backend
// plugin the artifact names, evaluates the prompt tokens one position at a
// time, then generates N tokens (greedy unless --temperature is given).
// --logits-out writes the logits of every evaluated position: with the
// whole sequence as the prompt and -n 0 that is teacher forcing.
// No LLVM/MLIR in this program.
//
//===----------------------------------------------------------------------===//
#include "session/Npy.h"
#include "tokenizer/Tokenizer.h"
#include "tokenizer/Unicode.h"
#include "session/Sampler.h"
#include "session/Session.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace kiln;
using namespace kiln::runtime;

namespace {

constexpr const char *kUsage = R"(usage: kiln-run M.kiln --weights FILE.gguf... (--prompt TEXT | --prompt-tokens IDS) [options]

Runs a model compiled by kiln-compile: evaluates the prompt, then generates.

options:
  --weights FILE.gguf...   the model's GGUF file(s) (every part of a split set,
                           or one part to find the others)
  --prompt TEXT            the prompt as text, encoded with the tokenizer in the
                           GGUF file (special tokens such as <|user|> written in
                           the text become their ids); the output is then text
                           too, streamed as it is generated
  --prompt-tokens IDS      the prompt as comma-separated token ids, e.g. 1,2,3
  --ignore-eos             keep generating after an end-of-sequence token (by
                           default generation stops at the file's eos/eot ids)
  -n N                     tokens to generate (default 16; 0: only evaluate
                           the prompt, i.e. teacher forcing)
  --temperature T          sample with temperature T (default 0: greedy)
  --top-k K                sample among the K most likely (default: all)
  --top-p P                sample within probability mass P (default 1)
  --min-p P                sample among tokens at least P times as likely as
                           the most likely one (default 0: off)
  --repeat-penalty R       divide (multiply, if negative) the logits of the
                           last 64 tokens by R before choosing (default 1:
                           off; also applies to greedy decoding)
  --stop TEXT              stop when the generated text contains TEXT (not
                           printed); repeatable; needs the file's tokenizer
  --seed S                 sampling seed (default 0)
  --logits-out FILE.npy    write the logits of every evaluated position
                           ([positions, vocab] float32)
  --json                   print one JSON object instead of text
  --threads N              CPU threads (default: all cores)
  --backend-dir DIR        look for backend plugins in DIR first
  --describe               print what the artifact holds (config, each rank's
                           steps and the weight slices it binds) and exit;
                           needs no weights
  --help                   this text
)";

int usageError(const std::string &message) {
  std::fprintf(stderr, "kiln-run: error: %s\n%s", message.c_str(), kUsage);
  return 2;
}

/// The artifact in words: what an expert checks before deploying it.
void describe(const std::string &path, const artifact::Artifact &a) {
  std::printf("artifact %s: format %u, %s, target %s, model %s, context %llu, "
              "%u rank%s\n",
              path.c_str(), artifact::kFormatVersion, a.producer.c_str(),
              a.target.c_str(), a.modelArch.c_str(),
              (unsigned long long)a.contextLength, a.ranks,
              a.ranks == 1 ? "" : "s");
  std::string config;
  for (const artifact::ConfigEntry &e : a.config)
    config += fmt::format(" {}={}", e.key,
                          e.isFloat ? fmt::format("{}", e.floatValue)
                                    : std::to_string(e.intValue));
  std::printf("config:%s\n", config.c_str());
  for (const artifact::RankPlan &plan : a.rankPlans) {
    std::printf("rank %u:\n", plan.rank);
    std::vector<bool> bound(a.weights.size(), false);
    for (const artifact::Step &step : plan.steps) {
      std::printf("  step %s: %zu ops, %zu buffers, arena %llu bytes (peak "
                  "live %llu)\n",
                  step.name.c_str(), step.ops.size(), step.buffers.size(),
                  (unsigned long long)step.arenaBytes,
                  (unsigned long long)step.peakLiveBytes);
      for (const artifact::Buffer &b : step.buffers)
        if (b.kind == artifact::BufferKind::Weight)
          bound[b.binding] = true;
    }
    for (size_t i = 0; i < a.weights.size(); ++i) {
      if (!bound[i])
        continue;
      const artifact::WeightBinding &w = a.weights[i];
      std::string dims;
      for (size_t d = 0; d < w.dims.size(); ++d)
        dims += (d ? ", " : "") + std::to_string(w.dims[d]);
      std::string slice =
          w.sliceDim < 0 ? "whole"
                         : fmt::format("dim {} [{}, {})", w.sliceDim,
                                       w.sliceBegin, w.sliceEnd);
      if (w.sliceGroups > 1)
        slice += fmt::format(" of each of {} groups", w.sliceGroups);
      std::printf("  binds %s %s [%s] %s\n", w.tensor.c_str(),
                  std::string(nameOf(w.type)).c_str(), dims.c_str(),
                  slice.c_str());
    }
  }
}

int fail(const Error &error) {
  std::fprintf(stderr, "kiln-run: error: %s\n", error.message().c_str());
  return 1;
}

template <typename T> bool parseNumber(const char *text, T &out) {
  char *end = nullptr;
  errno = 0;
  if constexpr (std::is_floating_point_v<T>)
    out = T(std::strtod(text, &end));
  else if constexpr (std::is_signed_v<T>)
    out = T(std::strtoll(text, &end, 10));
  else
    out = T(std::strtoull(text, &end, 10));
  return errno == 0 && end && end != text && *end == '\0';
}

bool parseTokens(const std::string &text, std::vector<int32_t> &out) {
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos)
      end = text.size();
    std::string item = text.substr(start, end - start);
    int64_t v;
    if (item.empty() || !parseNumber(item.c_str(), v) || v < 0 ||
        v > INT32_MAX)
      return false;
    out.push_back(int32_t(v));
    start = end + 1;
  }
  return !out.empty();
}

/// A JSON string. Generated text may hold bytes that are not UTF-8 (a
/// random model, or a sequence cut at the end): each such byte becomes
/// U+FFFD, so the object stays valid JSON.
std::string jsonString(const std::string &s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    tokenizer::Utf8Unit unit = tokenizer::decodeUtf8(s, i);
    size_t n = unit.length;
    if (!unit.valid) {
      out += "\\ufffd";
      i += n;
      continue;
    }
    unsigned char c = s[i];
    if (c == '"' || c == '\\')
      out += '\\', out += char(c);
    else if (c < 0x20)
      out += fmt::format("\\u{:04x}", c);
    else
      out.append(s, i, n);
    i += n;
  }
  return out + "\"";
}

} // namespace

int main(int argc, char **argv) {
  SessionOptions options;
  SamplingOptions sampling;
  std::vector<int32_t> prompt;
  std::string promptText;
  std::vector<std::string> stopStrings;
  bool hasPromptText = false, ignoreEos = false;
  int64_t generate = 16;
  std::string logitsOut;
  bool json = false;
  bool describeOnly = false;

  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char *flag) -> const char * {
      if (i + 1 >= argc) {
        usageError(std::string(flag) + " needs a value");
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--weights") {
      while (i + 1 < argc && argv[i + 1][0] != '-')
        options.weightPaths.push_back(argv[++i]);
      if (options.weightPaths.empty())
        return usageError("--weights needs at least one file");
    } else if (arg == "--prompt-tokens") {
      if (!parseTokens(value("--prompt-tokens"), prompt))
        return usageError("--prompt-tokens: expected ids like 1,2,3");
    } else if (arg == "--prompt") {
      promptText = value("--prompt");
      hasPromptText = true;
    } else if (arg == "--ignore-eos") {
      ignoreEos = true;
    } else if (arg == "-n") {
      if (!parseNumber(value("-n"), generate) || generate < 0)
        return usageError("-n: expected a count >= 0");
    } else if (arg == "--temperature") {
      if (!parseNumber(value("--temperature"), sampling.temperature) ||
          sampling.temperature < 0)
        return usageError("--temperature: expected a number >= 0");
    } else if (arg == "--top-k") {
      if (!parseNumber(value("--top-k"), sampling.topK) || sampling.topK < 0)
        return usageError("--top-k: expected a count >= 0");
    } else if (arg == "--top-p") {
      if (!parseNumber(value("--top-p"), sampling.topP) ||
          !(sampling.topP > 0 && sampling.topP <= 1))
        return usageError("--top-p: expected a number in (0, 1]");
    } else if (arg == "--min-p") {
      if (!parseNumber(value("--min-p"), sampling.minP) ||
          !(sampling.minP >= 0 && sampling.minP < 1))
        return usageError("--min-p: expected a number in [0, 1)");
    } else if (arg == "--repeat-penalty") {
      if (!parseNumber(value("--repeat-penalty"), sampling.repeatPenalty) ||
          !(sampling.repeatPenalty > 0))
        return usageError("--repeat-penalty: expected a number > 0");
    } else if (arg == "--stop") {
      stopStrings.push_back(value("--stop"));
      if (stopStrings.back().empty())
        return usageError("--stop: expected non-empty text");
    } else if (arg == "--seed") {
      if (!parseNumber(value("--seed"), sampling.seed))
        return usageError("--seed: expected an unsigned integer");
    } else if (arg == "--logits-out") {
      logitsOut = value("--logits-out");
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--describe") {
      describeOnly = true;
    } else if (arg == "--threads") {
      if (!parseNumber(value("--threads"), options.threads))
        return usageError("--threads: expected a count");
    } else if (arg == "--backend-dir") {
      options.backendDirs.push_back(value("--backend-dir"));
    } else if (!arg.empty() && arg[0] == '-') {
      return usageError("unknown option " + arg);
    } else if (options.artifactPath.empty()) {
      options.artifactPath = arg;
    } else {
      return usageError("more than one artifact given: " + arg);
    }
  }
  if (options.artifactPath.empty())
    return usageError("no artifact given");
  if (describeOnly) {
    Expected<artifact::Artifact> a = artifact::readArtifact(options.artifactPath);
    if (!a)
      return fail(a.error());
    describe(options.artifactPath, *a);
    return 0;
  }
  if (hasPromptText && !prompt.empty())
    return usageError("give --prompt or --prompt-tokens, not both");
  if (prompt.empty() && !hasPromptText)
    return usageError("no prompt given (--prompt or --prompt-tokens)");

  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  Clock::time_point t0 = Clock::now();
  Expected<std::unique_ptr<Session>> session = Session::open(options);
  if (!session)
    return fail(session.error());
  Session &s = **session;
  // The file's tokenizer, when it has one: text in for --prompt, text out
  // whenever it loads.
  Expected<tokenizer::Tokenizer> tok =
      tokenizer::Tokenizer::fromGGUF(s.model());
  if (hasPromptText) {
    if (!tok)
      return fail(tok.error());
    prompt = tok->encode(promptText, /*parseSpecial=*/true);
    if (prompt.empty())
      return usageError("--prompt: the text encodes to no tokens");
  }
  std::vector<int32_t> stops;
  if (tok && !ignoreEos)
    for (std::optional<int32_t> id : {tok->eosId(), tok->eotId()})
      if (id)
        stops.push_back(*id);
  if (!stopStrings.empty() && !tok)
    return fail(tok.error());
  std::optional<tokenizer::StreamDecoder> stream;
  if (tok)
    stream.emplace(*tok);
  std::string text;
  Clock::time_point t1 = Clock::now();

  uint64_t evaluated = prompt.size() + (generate > 0 ? generate - 1 : 0);
  if (evaluated > s.contextLength())
    return fail(Error(options.artifactPath, "context",
                      fmt::format("{} prompt tokens and {} to generate need "
                                  "{} positions; the artifact's caches hold "
                                  "{} (compile with kiln-compile --context N)",
                                  prompt.size(), generate, evaluated,
                                  s.contextLength())));
  if (!s.hasLogits() && (!logitsOut.empty() || sampling.needsLogits()))
    return fail(Error(options.artifactPath, "logits",
                      "the artifact was compiled with --no-logits: greedy "
                      "decoding only, no --logits-out, sampling or "
                      "repetition penalty"));
  std::vector<float> logits(s.hasLogits() ? s.vocab() : 0);
  std::vector<float> allLogits;
  if (!logitsOut.empty())
    allLogits.reserve(evaluated * s.vocab());
  Sampler sampler(sampling);
  std::vector<int32_t> generated;
  int32_t next = 0;
  int32_t position = 0;

  for (int32_t token : prompt) {
    if (Status st = s.decode(token, position++, logits, &next); !st)
      return fail(st.error());
    if (!logitsOut.empty())
      allLogits.insert(allLogits.end(), logits.begin(), logits.end());
  }
  Clock::time_point t2 = Clock::now();
  bool streaming = stream && !json;
  if (streaming) {
    std::fputs("text: ", stdout);
    std::fflush(stdout);
  }
  std::vector<int32_t> history(prompt);
  // Text decoded but not yet shown: it could be the start of a stop string.
  std::string held;
  size_t longestStop = 0;
  for (const std::string &stop : stopStrings)
    longestStop = std::max(longestStop, stop.size());
  bool stopped = false;
  auto show = [&](const std::string &piece) {
    text += piece;
    if (streaming) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
  };
  for (int64_t g = 0; g < generate && !stopped; ++g) {
    int32_t token = sampling.needsLogits() ? sampler.sample(logits, history)
                                           : next;
    if (std::find(stops.begin(), stops.end(), token) != stops.end())
      break; // end of sequence: not part of the output
    generated.push_back(token);
    history.push_back(token);
    if (stream) {
      Expected<std::string> piece = stream->push(token);
      if (piece) {
        held += *piece;
        // A stop string ends generation; text before it is output.
        size_t cut = std::string::npos;
        for (const std::string &stop : stopStrings)
          cut = std::min(cut, held.find(stop));
        if (cut != std::string::npos) {
          show(held.substr(0, cut));
          held.clear();
          stopped = true;
          break;
        }
        // Keep back only what could still begin a stop string.
        size_t keep = longestStop ? std::min(held.size(), longestStop - 1) : 0;
        show(held.substr(0, held.size() - keep));
        held.erase(0, held.size() - keep);
      }
    }
    if (g + 1 == generate)
      break;
    if (Status st = s.decode(token, position++, logits, &next); !st)
      return fail(st.error());
    if (!logitsOut.empty())
      allLogits.insert(allLogits.end(), logits.begin(), logits.end());
  }
  Clock::time_point t3 = Clock::now();
  if (stream) {
    if (!stopped)
      show(held + stream->flush());
    if (streaming)
      std::fputs("\n", stdout);
  }

  if (!logitsOut.empty())
    if (Status st = writeNpy(logitsOut, allLogits, allLogits.size() / s.vocab(),
                             s.vocab());
        !st)
      return fail(st.error());

  double load = seconds(t0, t1), promptTime = seconds(t1, t2),
         decodeTime = seconds(t2, t3);
  double promptRate = prompt.size() / std::max(promptTime, 1e-9);
  int64_t decodeSteps =
      generated.empty() ? 0 : int64_t(generated.size()) - 1;
  double decodeRate = decodeSteps / std::max(decodeTime, 1e-9);
  if (json) {
    std::string tokens;
    for (size_t i = 0; i < generated.size(); ++i)
      tokens += (i ? "," : "") + std::to_string(generated[i]);
    std::printf("{\"tokens\": [%s], \"prompt_tokens\": %zu, "
                "\"load_seconds\": %.6f, \"prompt_seconds\": %.6f, "
                "\"prompt_tokens_per_second\": %.3f, \"decode_steps\": %lld, "
                "\"decode_seconds\": %.6f, \"decode_tokens_per_second\": %.3f, "
                "\"backend\": %s, \"context\": %llu%s}\n",
                tokens.c_str(), prompt.size(), load, promptTime, promptRate,
                (long long)decodeSteps, decodeTime, decodeRate,
                jsonString(s.artifact().target).c_str(),
                (unsigned long long)s.contextLength(),
                stream ? (", \"text\": " + jsonString(text)).c_str() : "");
    return 0;
  }
  std::string tokens;
  for (int32_t t : generated)
    tokens += (tokens.empty() ? "" : " ") + std::to_string(t);
  std::printf("tokens: %s\n", tokens.c_str());
  std::printf("prompt: %zu tokens in %.3f s (%.1f tok/s)\n", prompt.size(),
              promptTime, promptRate);
  std::printf("decode: %lld steps in %.3f s (%.1f tok/s)\n",
              (long long)decodeSteps, decodeTime, decodeRate);
  std::printf("load: %.3f s (backend %s: %s)\n", load,
              s.artifact().target.c_str(), s.backendPath().c_str());
  return 0;
}
