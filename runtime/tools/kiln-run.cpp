//===- kiln-run.cpp - Run a compiled model --------------------------------===//
//
// kiln-run M.kiln --weights FILE.gguf... (--prompt TEXT | --prompt-tokens
// 1,2,3) -n N
//         [--temperature T --top-k K --top-p P --seed S] [--json]
//         [--logits-out FILE.npy] [--threads N] [--backend-dir DIR]
//         [--eager] [--device N]
// kiln-run M.kiln --bench [--simulate-rank R/N] [--context N] [--steps N]
// kiln-run --bench-sampler VOCAB [--temperature T ...] [--steps N]
//
// Loads the artifact, checks the GGUF set against it, opens the backend
// plugin the artifact names, evaluates the prompt tokens one position at a
// time, then generates N tokens (greedy unless --temperature is given).
// --logits-out writes the logits of every evaluated position: with the
// whole sequence as the prompt and -n 0 that is teacher forcing.
// --bench needs no weights file: the backend fills the weights with random
// valid blocks on the device, and the caches up to --context, and the
// decode step is timed.
// No LLVM/MLIR in this program.
//
//===----------------------------------------------------------------------===//
#include "artifact/StepTraffic.h"
#include "chat/JsonPrefix.h"
#include "chat/SchemaPrefix.h"
#include "chat/ThinkFirst.h"
#include "chat/ToolCallPrefix.h"
#include "chat/WhitespaceCap.h"
#ifdef KILN_RUN_JSON_SCHEMA
#include "chat/JsonValue.h"
#endif
#include "session/Generator.h"
#include "session/ModelText.h"
#include "session/Npy.h"
#include "session/Sampler.h"
#include "session/Session.h"
#include "session/SessionFlags.h"
#include "support/Progress.h"
#include "support/Random.h"
#include "tokenizer/Tokenizer.h"
#include "tokenizer/Unicode.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

using namespace kiln;
using namespace kiln::runtime;

namespace {

constexpr const char *kUsage =
    R"(usage: kiln-run M.kiln --weights FILE.gguf... (--prompt TEXT | --prompt-tokens IDS) [options]

Runs a model compiled by kiln-compile: evaluates the prompt, then generates.

options:
  --weights FILE.gguf...   the model's GGUF file(s) (every part of a split set,
                           or one part to find the others)
  --prompt TEXT            the prompt as text, encoded with the tokenizer in the
                           GGUF file (special tokens such as <|user|> written in
                           the text become their ids); the output is then text
                           too, streamed as it is generated
  --prompt-tokens IDS      the prompt as comma-separated token ids, e.g. 1,2,3
  --ignore-eos             keep generating after an end-of-reply token (by
                           default generation stops at the file's eos/eot ids
                           and GLM's <|endoftext|>, <|user|>, <|observation|>)
  -n N                     tokens to generate (default 16; 0: only evaluate
                           the prompt, i.e. teacher forcing)
  --temperature T          sample with temperature T (default 0: greedy);
                           with --top-p, --top-k, --min-p, the penalties and
                           --logit-bias too, the step draws the token
                           itself: no logits cross to the host (penalties
                           and biases where the artifact's step adjusts the
                           logits: kiln-compile --adjustments)
  --top-k K                sample among the K most likely (default: all);
                           the step keeps them itself
  --top-p P                sample within probability mass P (default 1); the
                           step cuts this nucleus itself (docs/runtime.md)
  --min-p P                sample among tokens at least P times as likely as
                           the most likely one (default 0: off); the step
                           cuts this floor itself
  --repeat-penalty R       divide (multiply, if negative) the logits of the
                           last 64 tokens by R before choosing (default 1:
                           off; also applies to greedy decoding)
  --frequency-penalty F    subtract F times a token's count in the last 64
                           tokens from its logit (OpenAI's; -2 to 2, default
                           0; also applies to greedy decoding)
  --presence-penalty P     subtract P from the logit of each token in the
                           last 64 (OpenAI's; -2 to 2, default 0)
  --logit-bias ID=B        add B (-100 to 100) to token ID's logit before
                           anything else (OpenAI's logit_bias); repeatable,
                           a token's biases added up
  --stop TEXT              stop when the generated text contains TEXT (not
                           printed); repeatable; needs the file's tokenizer
  --json-object            constrain the generated text to one JSON object:
                           each token is chosen among those whose bytes keep
                           it a prefix of one, and generation stops once it
                           is whole (with --chat: each reply); needs the
                           file's tokenizer and the logits
  --json-schema FILE       constrain the generated text to one JSON value
                           the JSON Schema in FILE accepts (as kiln-serve's
                           response_format json_schema; docs/serving.md
                           lists the keywords, others are refused)
  --think-first            with --json-object, --json-schema or --tool-call:
                           the reply may think first (<think>...</think>,
                           free text) and the constraint holds the answer
                           after it, as kiln-serve does for chat replies
  --tool-call NAME[=KEYS]  constrain the generated text to GLM tool calls
                           (<tool_call>NAME ... </tool_call>, one or more) of
                           the functions given (repeatable), each with the
                           comma-separated parameters KEYS (none: any key),
                           each KEY, KEY! (required) or KEY:TYPE (TYPE a
                           JSON type other than string: the value is JSON of
                           it); or NAME=@FILE, the function's parameters
                           JSON Schema in FILE (values held to it as
                           kiln-serve holds a tool's); as kiln-serve's
                           tool_choice "required"
  --chat                   an interactive conversation on stdin: each line is
                           a user turn, rendered with the file's chat
                           template (GLM's format when it has none); replies
                           stream as they are generated (-n caps each); an
                           empty line or end of input ends it
  --system TEXT            with --chat: a system message first
  --chat-template FILE     with --chat: this Jinja template instead of the
                           file's ("glm": Kiln's GLM template)
  --seed S                 sampling seed (default 0)
  --logits-out FILE.npy    write the logits of every evaluated position
                           ([positions, vocab] float32)
  --json                   print one JSON object instead of text
  --threads N              CPU threads, 0 to 4096 (default 0: all cores)
  --device N               first GPU to use, 0 to 1024 (GPU backends; default
                           0): rank r runs on GPU N + r
  --eager                  launch each step op by op instead of replaying the
                           step's captured CUDA graph (debugging; the same
                           bits either way)
  --one-gpu                every rank of a tp=N artifact on GPU --device,
                           each on its own stream, the collectives through
                           that GPU's memory: tp=N's results on one GPU
                           (checking; not its speed: no launch overlaps
                           its predecessor)
  --profile                time every op (GPU backends; eager, an event pair
                           per op) and print each step's time by op kind to
                           stderr at exit
  --backend-dir DIR        look for backend plugins in DIR first

benchmark (kiln-run M.kiln --bench [options]; no weights or prompt):
  --bench                  time the decode step on random weights (random
                           valid blocks of each binding's type, made on the
                           device), printing the step time and tok/s, and
                           its result (token and a digest of the logits),
                           the same for runs that compute the same bits
  --simulate-rank R/N      run only rank R of the artifact's N ranks, alone on
                           one GPU, each collective replaced by a local copy
                           of its memory traffic: the per-GPU work of an
                           N-GPU deployment, measured on one GPU
  --context N              fill the caches' first N positions with random
                           values and time steps at position N (default 0)
  --steps N                timed steps (default 50, after 5 untimed)
  --temperature T          every step draws its token at T (the step's own
                           draw: the argmax of DrawKey.h's keys) instead of
                           taking the argmax; with --top-p, --top-k and
                           --min-p from what the step keeps; the penalties
                           and --logit-bias (greedy too) adjust the logits
                           first, each step's over the tokens the steps
                           before it chose (an artifact whose step adjusts
                           them)
  --bench-sampler VOCAB    time the host's sampler alone (no artifact): a
                           draw from VOCAB seeded logits N(0, 3^2) with the
                           sampling options given (--temperature, --top-k,
                           --top-p, --min-p, --seed), --steps draws after
                           5 untimed, the mean time a draw printed; for a
                           temperature without penalties (which the step
                           draws itself) also the step's draw made on the
                           host
  --bench-head N           with --bench-sampler: N seeded tokens' logits
                           raised by 20, the head a trained model's logits
                           have above the rest (default 0)
  --describe               print what the artifact holds (config, payloads,
                           each rank's steps, the bytes its decode step reads,
                           the weight slices it binds and their device
                           layouts) and exit; needs no weights
  --help                   this text

environment (CUDA backend, for measuring; the same bits either way):
  KILN_CUDA_BRANCHES=N     at most N parallel branches in a step's graph
                           (default 8; 1: the ops in list order)
  KILN_CUDA_PDL=0          no programmatic dependent launch
  KILN_CUDA_OMIT=K1,K2     leave every op of kinds K1, K2 (rms_norm, rope,
                           ...) out of the step: what they cost on the
                           step's critical path (results are NOT valid)
  KILN_CUDA_LOCAL_COLLECTIVES=1
                           every collective stays on its rank's GPU, as a
                           simulated rank's does: the step's cost without
                           the exchange between GPUs (results are NOT valid)
  KILN_CUDA_GRAPH_STATS=1  print each captured step's nodes and edges (how
                           many are programmatic) to stderr
  KILN_CUDA_TIMELINE=FILE  write the kernels of rank 0's fifth graph replay
                           (start, end, stream; from CUPTI, opened at run
                           time: KILN_CUPTI_LIBRARY names it) to FILE as
                           CSV; utils/timeline.py reads it
  KILN_CUDA_ALLREDUCE=nccl all-reduces through NCCL instead of the one-shot
                           kernel over NVLink peers (the default where every
                           pair of the group's GPUs can read each other's
                           memory; a simulated rank then reads its own part
                           once per rank)
  KILN_CUDA_SCHEDULE=FILE  write rank 0's replayed step as launch units in
                           order (op, branch, the units it waits for) to
                           FILE as TSV
  KILN_CUDA_QUIET_START=0  the mat-vecs after a collective prefetch their
                           weights early too (by default they do not)
  KILN_CUDA_QUIET_PREFETCH=N
                           of those, the q8_0-split mat-vecs prefetch their
                           warps' first N passes of 512 values early all
                           the same (0-64, default 1; 0: none)
  KILN_CUDA_MLA_PROJECTION=1
                           attn_v_b by MLA's launch: its combine and the
                           projection in one kernel (off by default)
  KILN_CUDA_CLUSTER_SELECT=1
                           the indexer's top-k as before: by its cluster of
                           blocks at every count, four radix passes always
                           (by default one block selects up to 6,144
                           attended positions, and the passes stop once the
                           threshold is known); the same result
  KILN_CUDA_SELECT_BLOCKS=8|16|auto
                           the blocks of the indexer selection's cluster:
                           auto (the default) takes 8, and 16 by a second
                           graph from KILN_CUDA_SELECT_WIDE_FROM attended
                           positions, where the GPU runs such clusters (16
                           is faster past ~100k and slower below); 8 or 16
                           at every position; the same result
  KILN_CUDA_SELECT_WIDE_FROM=N
                           where auto takes 16 blocks (default 98304; 0:
                           never)
  KILN_CUDA_SHORT_GRAPH=0  a step with DSA indexers replays one graph, the
                           indexers in it, at every position (by default a
                           second graph without them runs while each
                           selects every attended position, so that MLA
                           does not wait for them); the same result
  KILN_CUDA_SPECIALISED=LIST
                           the kernels compiled for GLM-5's shapes, by
                           family: a comma list of q8 (the q8_0 mat-vecs),
                           experts (routed gate/up and down), mla, indexer;
                           1 for all, 0 for none (default: experts,mla,
                           the two that measured faster)
  KILN_CUDA_DIRECT_SLOTS=0 each all-reduce copies its input into the
                           exchange the peers read (default: its producer
                           writes it there; docs/cuda.md, "Direct slots")
  KILN_CUDA_STEP_EPOCHS=0  each all-reduce's blocks load their call's epoch
                           from the exchange after their wait (default: the
                           step's word and the call's place, before it)
  KILN_CUDA_PEER_CLUSTER=1 the all-reduces as one cluster of 8 blocks, the
                           fused norm's parts through its shared memory
                           (default: blocks that are not a cluster, the
                           parts through the exchange; measured faster)
  KILN_CUDA_PEER_CLUSTER_POLICY=spread|balance
                           how the GPU places the all-reduces' clusters of
                           8 blocks (with KILN_CUDA_PEER_CLUSTER=1; unset:
                           the driver's default; a probe)
  KILN_CUDA_PEER_PUSH=1    a real group's all-reduces push each part into
                           every rank's exchange instead of pulling the
                           parts over NVLink (off until measured)
  KILN_CUDA_EXPERTS_INT8_X=1
                           a timing probe: the routed experts' gate/up
                           kernel (GLM-5 at tp=8) rounds its input to an
                           int8 grid and dots by dp4a; the results are not
                           the CPU reference's (for measuring only)
  NCCL_NVLS_ENABLE         left as set; 0 when unset
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
  for (const artifact::Payload &p : a.payloads) {
    bool text = !p.data.empty() && p.data.size() <= 256 &&
                std::all_of(p.data.begin(), p.data.end(),
                            [](uint8_t c) { return c >= 0x20 && c < 0x7f; });
    std::printf("payload %s/%s: %zu bytes%s%s\n", p.backend.c_str(),
                p.name.c_str(), p.data.size(), text ? ": " : "",
                text ? std::string(p.data.begin(), p.data.end()).c_str() : "");
  }
  for (const artifact::RankPlan &plan : a.rankPlans) {
    std::printf("rank %u:\n", plan.rank);
    std::vector<bool> bound(a.weights.size(), false);
    for (const artifact::Step &step : plan.steps) {
      std::printf("  step %s: %zu ops, %zu buffers, arena %llu bytes (peak "
                  "live %llu)\n",
                  step.name.c_str(), step.ops.size(), step.buffers.size(),
                  (unsigned long long)step.arenaBytes,
                  (unsigned long long)step.peakLiveBytes);
      // The slots the runtime writes and reads, with their sizes (the
      // `sampling` words make the step draw: docs/runtime.md).
      std::string inputs, outputs;
      for (const artifact::Buffer &b : step.buffers) {
        if (b.kind == artifact::BufferKind::Weight)
          bound[b.binding] = true;
        std::string *list = b.kind == artifact::BufferKind::Input    ? &inputs
                            : b.kind == artifact::BufferKind::Output ? &outputs
                                                                     : nullptr;
        if (list)
          *list += fmt::format("{}{} ({} bytes)", list->empty() ? "" : ", ",
                               b.name, b.bytes());
      }
      std::printf("    inputs: %s; outputs: %s\n", inputs.c_str(),
                  outputs.c_str());
    }
    const artifact::StepTraffic t =
        artifact::stepTraffic(a, plan.rank, a.contextLength);
    if (t.boundBytes)
      std::printf("  decode_step reads %llu bytes of weights a token (%llu "
                  "bound; routed experts: top-k rows, embedding: one row) "
                  "and %llu bytes of caches a position attended\n",
                  (unsigned long long)t.weightBytes,
                  (unsigned long long)t.boundBytes,
                  (unsigned long long)t.cacheBytesPerPosition);
    if (t.boundBytes && t.selectedPositions)
      std::printf("  attention reads at most the indexer's %llu selected "
                  "positions: past them a position adds %llu bytes of "
                  "caches; %llu bytes at context %llu\n",
                  (unsigned long long)t.selectedPositions,
                  (unsigned long long)t.cacheBytesPerPositionPast,
                  (unsigned long long)t.cacheBytes,
                  (unsigned long long)a.contextLength);
    for (size_t i = 0; i < a.weights.size(); ++i) {
      if (!bound[i])
        continue;
      const artifact::WeightBinding &w = a.weights[i];
      std::string dims;
      for (size_t d = 0; d < w.dims.size(); ++d)
        dims += (d ? ", " : "") + std::to_string(w.dims[d]);
      std::string slice = w.sliceDim < 0
                              ? "whole"
                              : fmt::format("dim {} [{}, {})", w.sliceDim,
                                            w.sliceBegin, w.sliceEnd);
      if (w.sliceGroups > 1)
        slice += fmt::format(" of each of {} groups", w.sliceGroups);
      if (w.rowPeriod > 0)
        slice += fmt::format(", rows [{}, {}) of every {} of dim 1",
                             w.rowBegin, w.rowEnd, w.rowPeriod);
      if (w.layout != "gguf")
        slice += ", device layout " + w.layout;
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

/// --logit-bias's ids against the vocabulary of `s`.
Status checkBiases(const std::string &where, const Session &s,
                   const SamplingOptions &sampling) {
  for (auto [id, bias] : sampling.logitBias)
    if (id >= s.vocab())
      return Error(where, "--logit-bias",
                   fmt::format("token {} is outside the vocabulary ({} "
                               "tokens)",
                               id, s.vocab()));
  return Status::ok();
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
    if (item.empty() || !parseNumber(item.c_str(), v) || v < 0 || v > INT32_MAX)
      return false;
    out.push_back(int32_t(v));
    start = end + 1;
  }
  return !out.empty();
}

/// A JSON string. Generated text may hold bytes that are not UTF-8 (a
/// random model, or a sequence cut at the end): each maximal subpart of an
/// ill-formed sequence becomes one U+FFFD (tokenizer::illFormedLength, as
/// kiln-serve's JSON and Python's decoder make them), so the object stays
/// valid JSON.
std::string jsonString(const std::string &s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    tokenizer::Utf8Unit unit = tokenizer::decodeUtf8(s, i);
    size_t n = unit.length;
    if (!unit.valid) {
      out += "\\ufffd";
      i += tokenizer::illFormedLength(s, i);
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

using Constraint = decltype(GenerateOptions::constraint);

/// The JSON document in `path`, read for `flag` (--json-schema, --tool-call
/// NAME=@FILE).
Expected<chat::Value> readJsonFile(const std::string &path, const char *flag) {
#ifdef KILN_RUN_JSON_SCHEMA
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in)
    text << in.rdbuf();
  if (!in || in.bad())
    return Error(path, flag, "cannot read the file");
  return chat::parseJsonValue(text.str(), path);
#else
  return Error(path, flag,
               "this kiln-run was built without nlohmann-json, which reads "
               "the file");
#endif
}

/// The parameters of --tool-call NAME=@FILE: FILE's JSON Schema of them.
Status readToolParameters(const std::string &path, chat::ToolSignature &sig) {
  Expected<chat::Value> doc = readJsonFile(path, "--tool-call");
  if (!doc)
    return doc.error();
  const chat::Value *props =
      doc->isMap() ? doc->asMap().find("properties") : nullptr;
  if (!props || !props->isMap())
    return Error(path, "properties",
                 "expected a parameters schema with \"properties\"");
  Expected<chat::ToolSignature> found = chat::toolSignature(sig.name, *doc);
  if (!found)
    return Error(path, "properties",
                 "parameter '" + found.error().field() +
                     "' cannot be written in GLM's call markup");
  sig = std::move(*found);
  return Status::ok();
}

/// The JSON Schema in `path` (--json-schema), compiled.
Expected<std::shared_ptr<const chat::JsonSchema>>
readJsonSchema(const std::string &path) {
  Expected<chat::Value> value = readJsonFile(path, "--json-schema");
  if (!value)
    return value.error();
  return chat::JsonSchema::compile(*value, path);
}

/// --chat: user turns from stdin, each rendered with the whole conversation
/// by the chat template; only what differs from the cached tokens is
/// evaluated; replies stream to stdout.
int runChat(const SessionOptions &options, const SamplingOptions &sampling,
            int64_t maxTokens, const Constraint &constraint,
            const std::vector<std::string> &stopStrings,
            const std::optional<std::string> &systemPrompt,
            const std::string &chatTemplateFile) {
  Expected<TextModel> model = openTextModel(options, chatTemplateFile);
  if (!model)
    return fail(model.error());
  Session &s = *model->session;
  const tokenizer::Tokenizer *tok = &model->tokenizer;
  const chat::ChatTemplate &chatTemplate = model->chat.chatTemplate;
  const std::string &where = model->chat.where;
  if (Status st = checkBiases(options.artifactPath, s, sampling); !st)
    return fail(st.error());
  if (!s.hasLogits() && (needsHostLogits(s, sampling) || constraint))
    return fail(Error(options.artifactPath, "logits",
                      fmt::format("the artifact was compiled with "
                                  "--no-logits: its step makes {} only",
                                  stepChoices(s, sampling))));

  GenerateOptions generate;
  generate.maxTokens = maxTokens;
  generate.sampling = sampling;
  generate.constraint = constraint;
  generate.stopStrings = stopStrings;
  generate.stopIds = tok->endOfReplyIds();
  Generator generator(s, tok);
  bool interactive = isatty(0);
  std::fprintf(stderr,
               "kiln chat: backend %s, %llu positions, template from %s; an "
               "empty line or end of input ends it\n",
               s.artifact().target.c_str(),
               (unsigned long long)s.contextLength(), where.c_str());
  chat::ValueList messages;
  auto message = [](const char *role, std::string content) {
    chat::ValueMap m;
    m.set("role", chat::Value(role));
    m.set("content", chat::Value(std::move(content)));
    return chat::Value::map(std::move(m));
  };
  if (systemPrompt)
    messages.push_back(message("system", *systemPrompt));
  std::string line;
  for (;;) {
    if (interactive) {
      std::fputs("> ", stderr);
      std::fflush(stderr);
    }
    if (!std::getline(std::cin, line) || line.empty())
      break;
    messages.push_back(message("user", line));
    Expected<std::string> prompt = chatTemplate.render(
        chat::chatContext(chat::Value::list(messages), true));
    if (!prompt)
      return fail(prompt.error());
    std::vector<int32_t> tokens = tok->encode(*prompt, /*parseSpecial=*/true);
    if (tokens.size() + uint64_t(maxTokens) > s.contextLength())
      return fail(
          Error(options.artifactPath, "context",
                fmt::format("the conversation needs {} positions "
                            "({} so far + -n {}); the caches hold {} "
                            "(compile with kiln-compile --context N)",
                            tokens.size() + uint64_t(maxTokens), tokens.size(),
                            maxTokens, s.contextLength())));
    auto start = std::chrono::steady_clock::now();
    generator.plan(generate);
    Expected<size_t> reused = generator.feedConversation(tokens);
    if (!reused)
      return fail(reused.error());
    double promptSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    Expected<GenerateResult> reply =
        generator.generate(generate, [](std::string_view piece) {
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
          return true;
        });
    if (!reply)
      return fail(reply.error());
    std::fputs("\n", stdout);
    std::fflush(stdout);
    std::fprintf(stderr,
                 "[%zu prompt tokens (%zu reused) in %.3f s; %zu generated, "
                 "%.1f tok/s]\n",
                 tokens.size(), *reused, promptSeconds, reply->tokens.size(),
                 reply->steps / std::max(reply->seconds, 1e-9));
    messages.push_back(message("assistant", reply->text));
  }
  return 0;
}

/// --bench: the decode step on random weights, timed.
/// --bench-sampler: the sampler's time a draw over `vocab` seeded logits,
/// as many as GLM-5's vocabulary in a served token.
int runSamplerBench(int64_t vocab, int64_t head,
                    const SamplingOptions &sampling, int64_t steps, bool json) {
  if (sampling.greedy())
    return usageError("--bench-sampler times a sampled draw: give "
                      "--temperature T > 0");
  Rng rng(sampling.seed);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float &l : logits)
    l = float(rng.normal() * 3);
  for (int64_t i = 0; i < head; ++i)
    logits[size_t(rng.below(uint64_t(vocab)))] += 20.0f;
  Sampler sampler(sampling);
  int64_t digest = 0;
  for (int i = 0; i < 5; ++i)
    digest += sampler.sample(logits);
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0 = Clock::now();
  for (int64_t i = 0; i < steps; ++i)
    digest += sampler.sample(logits);
  const double ms =
      1e3 * std::chrono::duration<double>(Clock::now() - t0).count() /
      double(steps);
  // A temperature with at most a top-p, a top-k and a min-p is the keys'
  // draw (DrawKey.h), which the host makes only where the artifact's step
  // does not: its time too (not with penalties or biases, whose
  // adjustments need a history this bench does not have).
  double keysMs = -1;
  std::optional<KeyDraw> d =
      sampling.penalises() ? std::nullopt : keyDraw(sampling, vocab);
  if (d) {
    Clock::time_point k0 = Clock::now();
    for (int64_t i = 0; i < steps; ++i)
      digest += drawToken(logits, *d, sampling.seed, int32_t(i));
    keysMs = 1e3 * std::chrono::duration<double>(Clock::now() - k0).count() /
             double(steps);
  }
  if (json)
    std::printf("{\"vocab\": %lld, \"draws\": %lld, \"ms_per_draw\": "
                "%.4f, \"keys_ms_per_draw\": %s, \"token_sum\": %lld}\n",
                static_cast<long long>(vocab), static_cast<long long>(steps),
                ms,
                keysMs < 0 ? "null" : fmt::format("{:.4f}", keysMs).c_str(),
                static_cast<long long>(digest));
  else {
    std::printf("sampler: %lld tokens, %lld draws: %.4f ms a draw (token "
                "sum %lld)\n",
                static_cast<long long>(vocab), static_cast<long long>(steps),
                ms, static_cast<long long>(digest));
    if (keysMs >= 0)
      std::printf("the step's draw made on the host (an artifact whose "
                  "step does not draw it): %.4f ms a draw\n",
                  keysMs);
  }
  return 0;
}

int runBench(SessionOptions options, const std::string &simulate,
             uint64_t context, int64_t steps, const SamplingOptions &sampling,
             bool json) {
  if (!options.weightPaths.empty())
    return usageError("--bench uses random weights: give no --weights");
  // With --temperature (and its cuts) every step draws its token
  // (DrawKey.h) instead of taking the argmax: the draw's cost on the
  // device.
  const std::optional<KeyDraw> drawn = keyDraw(sampling, INT64_MAX);
  if (!sampling.greedy() && !drawn)
    return usageError("--bench draws with a --temperature within [2^-16, "
                      "2^16] and at most a --top-p, a --top-k and a --min-p");
  options.flags |= KILN_RUN_RANDOM_WEIGHTS;
  options.fillPositions = context;
  options.seed = 1;
  uint32_t of = 0;
  if (!simulate.empty() && (options.flags & KILN_RUN_ONE_GPU))
    return usageError("--simulate-rank runs one rank alone; --one-gpu runs "
                      "them all: give one of them");
  if (!simulate.empty()) {
    size_t slash = simulate.find('/');
    if (slash == std::string::npos ||
        !parseNumber(simulate.substr(0, slash).c_str(), options.simulateRank) ||
        !parseNumber(simulate.substr(slash + 1).c_str(), of) ||
        options.simulateRank >= of)
      return usageError("--simulate-rank: expected R/N with R < N, e.g. 0/8");
    options.flags |= KILN_RUN_SIMULATE_RANK;
  }
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0 = Clock::now();
  Expected<std::unique_ptr<Session>> session = Session::open(options);
  if (!session)
    return fail(session.error());
  Session &s = **session;
  double load = std::chrono::duration<double>(Clock::now() - t0).count();
  if (of && of != s.artifact().ranks)
    return fail(Error(options.artifactPath, "ranks",
                      fmt::format("--simulate-rank names {} ranks, the "
                                  "artifact has {}",
                                  of, s.artifact().ranks)));
  if (context >= s.contextLength())
    return fail(Error(options.artifactPath, "context",
                      fmt::format("--context {} leaves no position to decode "
                                  "at: the caches hold {}",
                                  context, s.contextLength())));
  if (drawn)
    if (Status st = s.setDraw(drawn->params(sampling.seed)); !st)
      return fail(st.error());
  // Penalties and biases: the step's adjustments, made each step over the
  // tokens the bench's steps chose, as a generator makes them (their time
  // on the host, the slot's write included, is in the step's).
  if (Status st = checkBiases(options.artifactPath, s, sampling); !st)
    return fail(st.error());
  if (sampling.penalises() && !stepAdjusts(s, sampling))
    return fail(Error(options.artifactPath, "sampling",
                      fmt::format("--bench times penalties and biases the "
                                  "step adjusts the logits for; its step "
                                  "makes {}",
                                  stepChoices(s, sampling))));
  std::vector<int32_t> history;
  // Every step decodes at position `context`, over the random cache before
  // it; the token is fixed (the work does not depend on it).
  std::vector<double> times;
  int32_t next = 0;
  const int warmup = 5;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    Clock::time_point a = Clock::now();
    if (sampling.penalises())
      if (Status st =
              s.setAdjustments(penaltiesOf(sampling),
                               makeAdjustments(sampling, history, s.vocab()));
          !st)
        return fail(st.error());
    if (Status st = s.decode(1, int32_t(context), {}, &next); !st)
      return fail(st.error());
    history.push_back(next);
    if (i >= warmup)
      times.push_back(std::chrono::duration<double>(Clock::now() - a).count() *
                      1e6);
  }
  // The step's result once more, untimed, for comparing runs: the weights
  // and caches are seeded, so two runs that compute the same bits (graph
  // or eager, a switch that keeps the bits) print the same digest.
  std::vector<float> logits(s.hasLogits() ? size_t(s.vocab()) : 0);
  if (Status st = s.decode(1, int32_t(context), logits, &next); !st)
    return fail(st.error());
  // FNV-1a over the logits' float32 bytes as memory holds them
  // (little-endian), the bytes --logits-out writes: numpy can compute the
  // same digest from such a file.
  const std::string digest =
      logits.empty()
          ? std::string()
          : fmt::format("{:016x}",
                        fnv1a(std::string_view(
                            reinterpret_cast<const char *>(logits.data()),
                            logits.size() * 4)));
  const std::string result =
      digest.empty() ? fmt::format("token {} (no logits: --no-logits)", next)
                     : fmt::format("token {}, logits FNV-1a {}", next, digest);
  std::vector<double> sorted(times);
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double t : times)
    mean += t / double(times.size());
  double median = sorted[sorted.size() / 2], best = sorted.front();
  std::string mode = options.flags & KILN_RUN_EAGER ? "eager" : "graph";
  if (drawn)
    mode += fmt::format(
        ", drawn at T = {:g}{}{}{}", drawn->temperature,
        drawn->topP != 0.0f ? fmt::format(", top-p {:g}", drawn->topP) : "",
        drawn->topK != 0 ? fmt::format(", top-k {}", drawn->topK) : "",
        drawn->minP != 0.0f ? fmt::format(", min-p {:g}", drawn->minP) : "");
  if (sampling.penalises())
    mode += fmt::format(", adjusted (up to {} tokens)",
                        mostAdjustments(sampling, s.vocab()));
  artifact::StepTraffic traffic = artifact::stepTraffic(
      s.artifact(),
      options.flags & KILN_RUN_SIMULATE_RANK ? options.simulateRank : 0,
      context);
  uint64_t bytes = traffic.weightBytes + traffic.cacheBytes;
  std::string ranks =
      options.flags & KILN_RUN_SIMULATE_RANK
          ? fmt::format("rank {} of {} (simulated alone)", options.simulateRank,
                        of)
          : fmt::format("{} rank(s){}", s.artifact().ranks,
                        options.flags & KILN_RUN_ONE_GPU ? " on one GPU" : "");
  if (json) {
    std::printf(
        "{\"bench\": true, \"backend\": %s, \"mode\": \"%s\", "
        "\"ranks\": %u, \"simulated_rank\": %d, \"context\": %llu, "
        "\"steps\": %lld, \"step_us_mean\": %.3f, "
        "\"step_us_median\": %.3f, \"step_us_min\": %.3f, "
        "\"tokens_per_second\": %.3f, \"load_seconds\": %.3f, "
        "\"weight_bytes_read\": %llu, \"weight_bytes_bound\": %llu, "
        "\"cache_bytes_read\": %llu, \"weight_bytes_not_live\": %llu, "
        "\"achieved_gb_per_s\": %.1f, \"next_token\": %d, "
        "\"logits_fnv1a\": %s}\n",
        jsonString(s.artifact().target).c_str(), mode.c_str(),
        s.artifact().ranks,
        options.flags & KILN_RUN_SIMULATE_RANK ? int(options.simulateRank) : -1,
        (unsigned long long)context, (long long)steps, mean, median, best,
        1e6 / median, load, (unsigned long long)traffic.weightBytes,
        (unsigned long long)traffic.boundBytes,
        (unsigned long long)traffic.cacheBytes,
        (unsigned long long)traffic.notLiveBytes,
        double(bytes) / (median * 1e3), next,
        digest.empty() ? "null" : jsonString(digest).c_str());
    return 0;
  }
  std::printf("bench: %s, %s, %s, context %llu, %lld steps\n",
              s.artifact().target.c_str(), mode.c_str(), ranks.c_str(),
              (unsigned long long)context, (long long)steps);
  std::printf("step: median %.1f us, mean %.1f us, min %.1f us (%.1f tok/s)\n",
              median, mean, best, 1e6 / median);
  std::printf("bytes per step: %.3f GB read (weights %.3f GB of %.3f GB bound: "
              "routed experts top-k only; caches %.3f GB at context %llu); "
              "%.1f GB/s achieved\n",
              bytes / 1e9, traffic.weightBytes / 1e9, traffic.boundBytes / 1e9,
              traffic.cacheBytes / 1e9, (unsigned long long)context,
              double(bytes) / (median * 1e3));
  if (traffic.notLiveBytes)
    std::printf("not read at this context: %.3f GB of weights, rows read only "
                "from a later position (live_from: the indexer's query and "
                "head weights below its top-k)\n",
                traffic.notLiveBytes / 1e9);
  std::printf("result: %s\n", result.c_str());
  std::printf("load: %.3f s (backend %s)\n", load, s.backendPath().c_str());
  return 0;
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
  bool jsonObject = false;
  std::string jsonSchemaFile;
  bool thinkFirst = false;
  std::vector<chat::ToolSignature> toolCalls;
  bool describeOnly = false;
  bool bench = false;
  bool chatMode = false;
  std::optional<std::string> systemPrompt;
  std::string chatTemplateFile;
  int64_t benchSteps = 50;
  int64_t benchSamplerVocab = 0, benchHead = 0;
  uint64_t benchContext = 0;
  std::string simulate;

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
      // Applied as a float (DrawKey.h adjustLogit): above 0 and finite as
      // one.
      if (!parseNumber(value("--repeat-penalty"), sampling.repeatPenalty) ||
          !(float(sampling.repeatPenalty) > 0) ||
          !std::isfinite(float(sampling.repeatPenalty)))
        return usageError("--repeat-penalty: expected a number > 0, finite "
                          "as a float");
    } else if (arg == "--logit-bias") {
      const std::string v = value("--logit-bias");
      const size_t eq = v.find('=');
      int32_t id = -1;
      double bias = 0;
      if (eq == std::string::npos ||
          !parseNumber(v.substr(0, eq).c_str(), id) || id < 0 ||
          !parseNumber(v.substr(eq + 1).c_str(), bias) ||
          !(bias >= -100 && bias <= 100))
        return usageError("--logit-bias: expected ID=BIAS, a token id and a "
                          "number from -100 to 100");
      sampling.logitBias.emplace_back(id, float(bias));
    } else if (arg == "--frequency-penalty" || arg == "--presence-penalty") {
      double &p = arg == "--frequency-penalty" ? sampling.frequencyPenalty
                                               : sampling.presencePenalty;
      if (!parseNumber(value(arg.c_str()), p) || !(p >= -2 && p <= 2))
        return usageError(arg + ": expected a number from -2 to 2");
    } else if (arg == "--stop") {
      stopStrings.push_back(value("--stop"));
      if (stopStrings.back().empty())
        return usageError("--stop: expected non-empty text");
    } else if (arg == "--seed") {
      if (!parseNumber(value("--seed"), sampling.seed))
        return usageError("--seed: expected an unsigned integer");
    } else if (arg == "--logits-out") {
      logitsOut = value("--logits-out");
    } else if (arg == "--json-object") {
      jsonObject = true;
    } else if (arg == "--json-schema") {
      jsonSchemaFile = value("--json-schema");
    } else if (arg == "--think-first") {
      thinkFirst = true;
    } else if (arg == "--tool-call") {
      std::string spec = value("--tool-call");
      chat::ToolSignature sig;
      const size_t eq = spec.find('=');
      sig.name = spec.substr(0, eq);
      bool bad = false;
      if (eq != std::string::npos && spec.compare(eq + 1, 1, "@") == 0) {
        // NAME=@FILE: the function's parameters schema, as a server's tool.
        Status st = readToolParameters(spec.substr(eq + 2), sig);
        if (!st)
          return fail(st.error());
      } else if (eq != std::string::npos) {
        std::string keys = spec.substr(eq + 1);
        for (size_t at = 0; at <= keys.size();) {
          size_t comma = std::min(keys.find(',', at), keys.size());
          std::string key = keys.substr(at, comma - at);
          // KEY:TYPE, TYPE a JSON type other than string (the value is
          // JSON of it); none: any text. A '!' after KEY: required.
          const size_t colon = key.find(':');
          const std::string type =
              colon == std::string::npos ? "" : key.substr(colon + 1);
          std::string name = key.substr(0, colon);
          const bool required = !name.empty() && name.back() == '!';
          if (required)
            name.pop_back();
          sig.parameters.push_back(name);
          sig.values.push_back(chat::typeSchema(type));
          sig.required.push_back(required);
          bad = bad || (colon != std::string::npos && !sig.values.back());
          at = comma + 1;
        }
      }
      bad = bad || !chat::writableInMarkup(sig.name);
      for (const std::string &k : sig.parameters)
        bad = bad || !chat::writableInMarkup(k);
      if (bad)
        return usageError("--tool-call: expected NAME[=KEY[!][:TYPE],...] "
                          "or NAME=@FILE with non-empty names without '<', "
                          "newlines or whitespace at either end and TYPE a "
                          "JSON type other than string, "
                          "not '" +
                          spec + "'");
      toolCalls.push_back(std::move(sig));
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--describe") {
      describeOnly = true;
    } else if (arg == "--chat") {
      chatMode = true;
    } else if (arg == "--system") {
      systemPrompt = value("--system");
    } else if (arg == "--chat-template") {
      chatTemplateFile = value("--chat-template");
    } else if (arg == "--profile") {
      options.flags |= KILN_RUN_PROFILE;
    } else if (arg == "--bench") {
      bench = true;
    } else if (arg == "--bench-sampler") {
      if (!parseNumber(value("--bench-sampler"), benchSamplerVocab) ||
          benchSamplerVocab <= 0 || benchSamplerVocab > (int64_t(1) << 31) - 1)
        return usageError("--bench-sampler: expected a vocabulary size from "
                          "1 to 2^31 - 1");
    } else if (arg == "--bench-head") {
      if (!parseNumber(value("--bench-head"), benchHead) || benchHead < 0)
        return usageError("--bench-head: expected a count >= 0");
    } else if (arg == "--steps") {
      if (!parseNumber(value("--steps"), benchSteps) || benchSteps <= 0)
        return usageError("--steps: expected a count > 0");
    } else if (arg == "--context") {
      if (!parseNumber(value("--context"), benchContext))
        return usageError("--context: expected a position count");
    } else if (arg == "--simulate-rank") {
      simulate = value("--simulate-rank");
    } else if (std::string error;
               !parseSessionFlag(argc, argv, i, options, error)) {
      return usageError(error);
    }
  }
  if (benchSamplerVocab) {
    if (!options.artifactPath.empty())
      return usageError("--bench-sampler needs no artifact");
    return runSamplerBench(benchSamplerVocab, benchHead, sampling, benchSteps,
                           json);
  }
  if (options.artifactPath.empty())
    return usageError("no artifact given");
  if (describeOnly) {
    Expected<artifact::Artifact> a =
        artifact::readArtifact(options.artifactPath);
    if (!a)
      return fail(a.error());
    describe(options.artifactPath, *a);
    return 0;
  }
  if (bench)
    return runBench(options, simulate, benchContext, benchSteps, sampling,
                    json);
  if (!simulate.empty() || benchContext)
    return usageError("--simulate-rank and --context are --bench options");
  const int constraints =
      int(jsonObject) + int(!jsonSchemaFile.empty()) + int(!toolCalls.empty());
  if (constraints > 1)
    return usageError("--json-object, --json-schema and --tool-call exclude "
                      "each other");
  const char *constraintFlag = jsonObject                ? "--json-object"
                               : !jsonSchemaFile.empty() ? "--json-schema"
                                                         : "--tool-call";
  // The reply's constraint (GenerateOptions::constraint), if any.
  Constraint constraint;
  if (jsonObject) {
    constraint = [] {
      return std::make_unique<chat::WhitespaceCap>(
          std::make_unique<chat::JsonPrefix>());
    };
  } else if (!jsonSchemaFile.empty()) {
    Expected<std::shared_ptr<const chat::JsonSchema>> schema =
        readJsonSchema(jsonSchemaFile);
    if (!schema)
      return fail(schema.error());
    constraint = [schema = *schema] {
      return std::make_unique<chat::WhitespaceCap>(
          std::make_unique<chat::SchemaPrefix>(schema));
    };
  } else if (!toolCalls.empty()) {
    constraint = [toolCalls] {
      return std::make_unique<chat::ToolCallPrefix>(toolCalls, true);
    };
  }
  if (thinkFirst) {
    if (!constraint)
      return usageError("--think-first goes with --json-object, --json-schema "
                        "or --tool-call");
    constraint = [inner = constraint] {
      return std::make_unique<chat::ThinkFirst>(inner());
    };
  }
  if (chatMode) {
    if (hasPromptText || !prompt.empty() || json || !logitsOut.empty())
      return usageError("--chat reads its turns from stdin: no --prompt, "
                        "--prompt-tokens, --json or --logits-out");
    return runChat(options, sampling, generate, constraint, stopStrings,
                   systemPrompt, chatTemplateFile);
  }
  if (systemPrompt)
    return usageError("--system goes with --chat");
  if (!chatTemplateFile.empty())
    return usageError("--chat-template goes with --chat");
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
    stops = tok->endOfReplyIds();
  if ((!stopStrings.empty() || constraint) && !tok)
    return fail(tok.error());
  if (constraint && !s.hasLogits())
    return fail(Error(options.artifactPath, "logits",
                      std::string(constraintFlag) +
                          " needs the logits: the artifact was compiled with "
                          "--no-logits"));
  Clock::time_point t1 = Clock::now();

  uint64_t evaluated = prompt.size() + (generate > 0 ? generate - 1 : 0);
  if (evaluated > s.contextLength())
    return fail(Error(options.artifactPath, "context",
                      fmt::format("{} prompt tokens and {} to generate need "
                                  "{} positions; the artifact's caches hold "
                                  "{} (compile with kiln-compile --context N)",
                                  prompt.size(), generate, evaluated,
                                  s.contextLength())));
  if (Status st = checkBiases(options.artifactPath, s, sampling); !st)
    return fail(st.error());
  if (!s.hasLogits() && (!logitsOut.empty() || needsHostLogits(s, sampling)))
    return fail(Error(options.artifactPath, "logits",
                      fmt::format("the artifact was compiled with "
                                  "--no-logits: its step makes {} only, no "
                                  "--logits-out",
                                  stepChoices(s, sampling))));
  std::vector<float> allLogits;
  std::vector<float> *keep = logitsOut.empty() ? nullptr : &allLogits;
  if (keep)
    allLogits.reserve(evaluated * s.vocab());
  GenerateOptions generateOptions;
  generateOptions.maxTokens = generate;
  generateOptions.sampling = sampling;
  generateOptions.stopIds = stops;
  generateOptions.stopStrings = stopStrings;
  generateOptions.constraint = constraint;
  Generator generator(s, tok ? &*tok : nullptr);
  generator.plan(generateOptions);
  if (Status st = generator.feed(prompt, 0, keep); !st)
    return fail(st.error());
  Clock::time_point t2 = Clock::now();
  bool streaming = tok && !json;
  if (streaming) {
    std::fputs("text: ", stdout);
    std::fflush(stdout);
  }
  Expected<GenerateResult> result = generator.generate(
      generateOptions,
      [&](std::string_view piece) {
        if (streaming) {
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
        }
        return true;
      },
      keep);
  if (!result)
    return fail(result.error());
  if (streaming)
    std::fputs("\n", stdout);
  Clock::time_point t3 = Clock::now();
  const std::vector<int32_t> &generated = result->tokens;
  const std::string &text = result->text;

  if (!logitsOut.empty())
    if (Status st = writeNpy(logitsOut, allLogits, allLogits.size() / s.vocab(),
                             s.vocab());
        !st)
      return fail(st.error());

  double load = seconds(t0, t1), promptTime = seconds(t1, t2),
         decodeTime = seconds(t2, t3);
  double promptRate = prompt.size() / std::max(promptTime, 1e-9);
  int64_t decodeSteps = generated.empty() ? 0 : int64_t(generated.size()) - 1;
  double decodeRate = decodeSteps / std::max(decodeTime, 1e-9);
  if (json) {
    std::string tokens;
    for (size_t i = 0; i < generated.size(); ++i)
      tokens += (i ? "," : "") + std::to_string(generated[i]);
    std::printf(
        "{\"tokens\": [%s], \"prompt_tokens\": %zu, "
        "\"load_seconds\": %.6f, \"prompt_seconds\": %.6f, "
        "\"prompt_tokens_per_second\": %.3f, \"decode_steps\": %lld, "
        "\"decode_seconds\": %.6f, \"decode_tokens_per_second\": %.3f, "
        "\"weight_bytes\": %llu, \"weight_seconds\": %.6f, "
        "\"backend\": %s, \"context\": %llu, \"chooser\": \"%s\", "
        "\"finish_reason\": \"%s\"%s}\n",
        tokens.c_str(), prompt.size(), load, promptTime, promptRate,
        (long long)decodeSteps, decodeTime, decodeRate,
        (unsigned long long)s.weightBytes(), s.weightSeconds(),
        jsonString(s.artifact().target).c_str(),
        (unsigned long long)s.contextLength(), chooserName(result->chooser),
        result->stoppedAtId || result->stoppedAtString || result->stoppedWhole
            ? "stop"
            : "length",
        tok ? (", \"text\": " + jsonString(text)).c_str() : "");
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
  std::printf("load: %.3f s (weights %s read in %.3f s, %.2f GB/s; backend %s: "
              "%s)\n",
              load, formatBytes(s.weightBytes()).c_str(), s.weightSeconds(),
              s.weightBytes() / std::max(s.weightSeconds(), 1e-9) / 1e9,
              s.artifact().target.c_str(), s.backendPath().c_str());
  return 0;
}
