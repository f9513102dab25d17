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

#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

using namespace kiln::runtime;
namespace fs = std::filesystem;

namespace {

/// The tiny model's GGUF and artifact, made once in a fresh directory.
struct TinyModel {
  fs::path dir, gguf, artifact;
  TinyModel() {
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
                                " --target=cpu --context 64 -o " +
                                artifact.string() + " 2>/dev/null";
    if (std::system(synth.c_str()) != 0 || std::system(compile.c_str()) != 0)
      artifact.clear();
  }
  ~TinyModel() {
    if (!dir.empty())
      fs::remove_all(dir);
  }
};

TEST(GeneratorDraw, PlannedLateAndHostDrawsAgree) {
  TinyModel model;
  ASSERT_FALSE(model.artifact.empty()) << "could not make the tiny model";
  SessionOptions options;
  options.artifactPath = model.artifact.string();
  options.weightPaths = {model.gguf.string()};
  options.backendDirs = {KILN_PLUGIN_DIR};
  options.threads = 2;
  options.progress = false;
  auto session = Session::open(options);
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

} // namespace
