//===- GeneratorDrawTest.cpp - The step's draw through the generator -----===//
//
// A temperature (with a top-p or a min-p) drawn by the step (support/DrawKey.h)
// through Generator on the CPU backend, with a tiny synthetic model made by
// this build's kiln-gguf and kiln-compile: the tokens are the same whether the
// prompt's last step drew the first one (Generator::plan) or the generator
// evaluated the last token again to draw it (no plan, or another plan),
// each token is the host's drawToken over the logits of the position that
// drew it (the path of an artifact without the sampling slot), and the
// draw is not the argmax. Seeds are printed.
//
//===----------------------------------------------------------------------===//
#include "session/Generator.h"
#include "session/Sampler.h"
#include "session/Session.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

using namespace kiln::runtime;
namespace fs = std::filesystem;

namespace {

/// The tiny model's GGUF and artifact, made once in a fresh directory.
struct TinyModel {
  fs::path dir, gguf, artifact;
  /// `flags`: kiln-compile's, after the defaults below.
  explicit TinyModel(const std::string &flags = "") {
    std::string pattern =
        (fs::temp_directory_path() / "kiln-draw-XXXXXX").string();
    if (!mkdtemp(pattern.data()))
      return;
    dir = pattern;
    gguf = dir / "tiny.gguf";
    artifact = dir / "tiny.kiln";
    const std::string tools = KILN_TOOL_DIR;
    const std::string synth = tools + "/kiln-gguf synth " + gguf.string() +
                              " --preset tiny --seed 29 --quiet";
    const std::string compile = tools + "/kiln-compile " + gguf.string() +
                                " --target=cpu --context 64 " + flags + " -o " +
                                artifact.string() + " 2>/dev/null";
    if (std::system(synth.c_str()) != 0 || std::system(compile.c_str()) != 0)
      artifact.clear();
  }
  ~TinyModel() {
    if (!dir.empty())
      fs::remove_all(dir);
  }
  /// A session of the artifact on the CPU backend, two threads.
  kiln::Expected<std::unique_ptr<Session>> open() const {
    SessionOptions options;
    options.artifactPath = artifact.string();
    options.weightPaths = {gguf.string()};
    options.backendDirs = {KILN_PLUGIN_DIR};
    options.threads = 2;
    options.progress = false;
    return Session::open(options);
  }
};

TEST(GeneratorDraw, PlannedLateAndHostDrawsAgree) {
  TinyModel model;
  ASSERT_FALSE(model.artifact.empty()) << "could not make the tiny model";
  auto session = model.open();
  ASSERT_TRUE(bool(session)) << session.error().message();
  Session &s = **session;
  ASSERT_TRUE(s.draws());

  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  ASSERT_TRUE(s.cutsNucleus());
  // A temperature alone, with a top-p (the step's nucleus), with a min-p,
  // with a top-k alone and under a top-p.
  for (auto [temperature, seed, topP, minP, topK] :
       {std::tuple{0.9, uint64_t(77), 1.0, 0.0, 0},
        std::tuple{1.6, uint64_t(1) << 40, 1.0, 0.0, 0},
        std::tuple{1.3, uint64_t(5), 0.7, 0.0, 0},
        std::tuple{1.2, uint64_t(6), 1.0, 0.4, 0},
        std::tuple{1.5, uint64_t(8), 1.0, 0.0, 3},
        std::tuple{1.4, uint64_t(9), 0.9, 0.0, 10}}) {
    SCOPED_TRACE("T " + std::to_string(temperature) + ", seed " +
                 std::to_string(seed) + ", top-p " + std::to_string(topP) +
                 ", min-p " + std::to_string(minP) + ", top-k " +
                 std::to_string(topK));
    GenerateOptions g;
    g.maxTokens = 12;
    g.sampling.temperature = temperature;
    g.sampling.seed = seed;
    g.sampling.topP = topP;
    g.sampling.minP = minP;
    g.sampling.topK = topK;
    const KeyDraw asked{float(temperature), topP < 1 ? float(topP) : 0.0f,
                        float(minP), topK};
    // Planned: the prompt's last step draws the first token.
    ASSERT_TRUE(s.reset());
    Generator planned(s, nullptr);
    planned.plan(g);
    std::vector<float> logits;
    ASSERT_TRUE(planned.feed(prompt, SIZE_MAX, &logits));
    auto a = planned.generate(g, {}, &logits);
    ASSERT_TRUE(bool(a)) << a.error().message();
    ASSERT_EQ(a->tokens.size(), 12u);
    EXPECT_EQ(a->chooser, GenerateResult::Chooser::StepDraw);
    // Not planned: the last token is evaluated again to draw.
    ASSERT_TRUE(s.reset());
    Generator late(s, nullptr);
    ASSERT_TRUE(late.feed(prompt));
    auto b = late.generate(g);
    ASSERT_TRUE(bool(b)) << b.error().message();
    EXPECT_EQ(a->tokens, b->tokens);
    // Each token is the host's draw over the logits that drew it: the
    // prompt's 5 positions, then one a generated token but the last.
    const size_t vocab = size_t(s.vocab());
    ASSERT_EQ(logits.size(), (prompt.size() + 11) * vocab);
    size_t argmaxes = 0;
    for (size_t i = 0; i < a->tokens.size(); ++i) {
      const size_t position = prompt.size() - 1 + i;
      std::span<const float> row(logits.data() + position * vocab, vocab);
      EXPECT_EQ(a->tokens[i], drawToken(row, asked, seed, int32_t(position)))
          << "token " << i;
      argmaxes += a->tokens[i] == argmax(row);
    }
    EXPECT_LT(argmaxes, a->tokens.size()); // a draw, not the argmax
    // Greedy after a drawn reply: the step's words are the argmax again.
    ASSERT_TRUE(s.reset());
    Generator greedy(s, nullptr);
    GenerateOptions plain;
    plain.maxTokens = 4;
    std::vector<float> greedyLogits;
    ASSERT_TRUE(greedy.feed(prompt, SIZE_MAX, &greedyLogits));
    auto c = greedy.generate(plain);
    ASSERT_TRUE(bool(c));
    EXPECT_EQ(c->tokens[0],
              argmax(std::span<const float>(greedyLogits).subspan(
                  (prompt.size() - 1) * vocab, vocab)));
  }
}

/// The logits `row` adjusted as the rules state them (DrawKey.h), written
/// out here: each biased id's biases summed in order and added, then for a
/// token among the last `window` of `history` its repeat penalty (as a
/// float: a positive logit divided, others multiplied) and OpenAI's
/// penalties (in double), by its count there.
std::vector<float> adjustedRow(std::span<const float> row,
                               const SamplingOptions &o,
                               const std::vector<int32_t> &history) {
  std::vector<float> out(row.begin(), row.end());
  std::vector<float> bias(out.size(), 0.0f);
  std::vector<bool> biased(out.size(), false);
  for (auto [id, b] : o.logitBias) {
    bias[size_t(id)] = biased[size_t(id)] ? bias[size_t(id)] + b : b;
    biased[size_t(id)] = true;
  }
  std::vector<int32_t> count(out.size(), 0);
  const bool penalised =
      o.repeatPenalty != 1 || o.frequencyPenalty != 0 || o.presencePenalty != 0;
  for (size_t i = history.size() > size_t(o.repeatWindow)
                      ? history.size() - size_t(o.repeatWindow)
                      : 0;
       penalised && i < history.size(); ++i)
    ++count[size_t(history[i])];
  for (size_t v = 0; v < out.size(); ++v) {
    float l = out[v];
    if (biased[v] && bias[v] != 0.0f)
      l = l + bias[v];
    if (count[v] > 0) {
      if (o.repeatPenalty != 1)
        l = l > 0 ? l / float(o.repeatPenalty) : l * float(o.repeatPenalty);
      l = float(double(l) - o.frequencyPenalty * double(count[v]) -
                o.presencePenalty);
    }
    out[v] = l;
  }
  return out;
}

TEST(GeneratorDraw, PenalisedChoicesAreTheStepsAndTheHostsAlike) {
  // The same tiny model compiled three ways: the default's step adjusts
  // the logits (room for 320 tokens), one with room for 3 (fewer than a
  // penalty's window: the host adjusts), one without (--adjustments=0).
  TinyModel adjusting, narrow("--adjustments 3"), plain("--adjustments=0");
  for (const TinyModel *m : {&adjusting, &narrow, &plain})
    ASSERT_FALSE(m->artifact.empty()) << "could not make the tiny model";
  auto a = adjusting.open(), n = narrow.open(), p = plain.open();
  ASSERT_TRUE(bool(a) && bool(n) && bool(p));
  EXPECT_EQ((*a)->adjustCapacity(), 320);
  EXPECT_EQ((*n)->adjustCapacity(), 3);
  EXPECT_EQ((*p)->adjustCapacity(), 0);
  // Session::setAdjustments refuses before any compute, naming what: more
  // entries than the room, a bad penalty or entry, any on a step without
  // the form (none is fine there).
  using kiln::draw::Adjustment;
  using kiln::draw::Penalties;
  const std::vector<Adjustment> four = {
      {1, 1, 0}, {2, 1, 0}, {3, 1, 0}, {4, 1, 0}};
  for (auto [session, penalties, entries, says] :
       {std::tuple{n->get(), Penalties{}, four, "more than the 3"},
        std::tuple{a->get(), Penalties{0, 0, 0}, four, "word 8"},
        std::tuple{a->get(), Penalties{1, NAN, 0}, four, "word 10"},
        std::tuple{a->get(), Penalties{},
                   std::vector<Adjustment>{{2, 1, 0}, {2, 1, 0}}, "word 19"},
        std::tuple{a->get(), Penalties{},
                   std::vector<Adjustment>{{int32_t((*a)->vocab()), 1, 0}},
                   "word 16"},
        std::tuple{a->get(), Penalties{},
                   std::vector<Adjustment>{{3, INFINITY, 0}}, "word 17"},
        std::tuple{p->get(), Penalties{}, four, "does not adjust"}}) {
    kiln::Status st = session->setAdjustments(penalties, entries);
    ASSERT_FALSE(st) << says;
    EXPECT_NE(st.error().message().find(says), std::string::npos)
        << st.error().message();
  }
  EXPECT_TRUE((*p)->setAdjustments({}, {}));

  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  struct Case {
    double temperature, topP, repeat, frequency, presence;
    std::vector<std::pair<int32_t, float>> bias;
    uint64_t seed;
  };
  // Greedy and drawn, each penalty alone and together, biases alone (two
  // for one id among them), a penalty with a nucleus. Strong enough to move
  // the choice: the test fails unless some token differs from the
  // unadjusted choice.
  const std::vector<Case> cases = {
      {0.0, 1.0, 1.8, 0.0, 0.0, {}, 0},
      {0.0, 1.0, 1.0, 1.5, 0.7, {}, 0},
      {0.0, 1.0, 1.0, 0.0, 0.0, {{7, 4.0f}, {2, -3.0f}, {7, 1.5f}}, 0},
      {1.1, 1.0, 1.0, 1.2, 0.4, {}, 41},
      {0.9, 0.85, 1.4, 0.0, 0.3, {{11, 2.5f}}, 42},
  };
  const size_t vocab = size_t((*a)->vocab());
  int moved = 0;
  for (const Case &c : cases) {
    SCOPED_TRACE("T " + std::to_string(c.temperature) + ", seed " +
                 std::to_string(c.seed) + ", repeat " +
                 std::to_string(c.repeat) + ", frequency " +
                 std::to_string(c.frequency) + ", presence " +
                 std::to_string(c.presence) + ", biases " +
                 std::to_string(c.bias.size()));
    GenerateOptions g;
    g.maxTokens = 10;
    g.sampling.temperature = c.temperature;
    g.sampling.topP = c.topP;
    g.sampling.repeatPenalty = c.repeat;
    g.sampling.frequencyPenalty = c.frequency;
    g.sampling.presencePenalty = c.presence;
    g.sampling.logitBias = c.bias;
    g.sampling.seed = c.seed;
    std::vector<std::vector<int32_t>> replies;
    for (Session *s : {a->get(), n->get(), p->get()}) {
      ASSERT_TRUE(s->reset());
      Generator gen(*s, nullptr);
      gen.plan(g);
      std::vector<float> logits;
      ASSERT_TRUE(gen.feed(prompt, SIZE_MAX, &logits));
      auto r = gen.generate(g, {}, &logits);
      ASSERT_TRUE(bool(r)) << r.error().message();
      ASSERT_EQ(r->tokens.size(), 10u);
      // Room for 3 holds two biased ids, not a penalty's window of 64.
      const bool window = c.repeat != 1 || c.frequency != 0 || c.presence != 0;
      const bool onStep = s == a->get() || (s == n->get() && !window);
      EXPECT_EQ(r->chooser, onStep ? GenerateResult::Chooser::StepDraw
                                   : GenerateResult::Chooser::Host);
      replies.push_back(r->tokens);
      if (s != a->get())
        continue;
      // Each token from its position's logits adjusted over the tokens
      // so far: their argmax, or the host's keys' draw.
      std::vector<int32_t> history = prompt;
      for (size_t i = 0; i < r->tokens.size(); ++i) {
        const size_t position = prompt.size() - 1 + i;
        std::span<const float> row(logits.data() + position * vocab, vocab);
        const std::vector<float> adjusted =
            adjustedRow(row, g.sampling, history);
        std::optional<KeyDraw> d = keyDraw(g.sampling, int64_t(vocab));
        const int32_t want =
            d ? drawToken(adjusted, *d, c.seed, int32_t(position))
              : argmax(adjusted);
        EXPECT_EQ(r->tokens[i], want) << "token " << i;
        moved += want != (d ? drawToken(row, *d, c.seed, int32_t(position))
                            : argmax(row));
        history.push_back(r->tokens[i]);
      }
    }
    EXPECT_EQ(replies[0], replies[1]) << "room for 3";
    EXPECT_EQ(replies[0], replies[2]) << "no adjusting step";
  }
  EXPECT_GT(moved, 0) << "no adjustment changed a choice";
  std::printf("penalised choices: %d of %zu tokens moved by the adjustments\n",
              moved, cases.size() * 10);
}

} // namespace
