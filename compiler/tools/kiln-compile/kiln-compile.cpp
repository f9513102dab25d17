//===- kiln-compile.cpp - The Kiln compiler driver ------------------------===//
//
// kiln-compile MODEL.gguf... --target=cpu -o M.kiln   (the artifact)
// kiln-compile MODEL.gguf... [--emit=mlir|step] [--report] [-o OUT]
// kiln-compile config.json --weight-type=bf16 [--emit=...] [-o OUT]
//
// Reads only the model's metadata (GGUF header and tensor infos, or a
// HuggingFace config.json), checks every tensor the program will bind, and
// builds the GLM-5 decode step in the kiln dialect (--emit=mlir). With
// --emit=step it lowers that to the step dialect, plans its memory and
// verifies it is safe to capture; --report prints the plan's figures to
// stderr. --emit=artifact (the default when -o ends in .kiln) writes the
// deployable artifact for --target. Later stages (fusion, partitioning)
// extend this driver.
//
//===----------------------------------------------------------------------===//
#include "artifact/EmitArtifact.h"
#include "artifact/StepTraffic.h"
#include "glm5/GLM5Builder.h"
#include "glm5/GLM5Config.h"
#include "passes/Passes.h"
#include "passes/StepReport.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <string>
#include <vector>

namespace cl = llvm::cl;

/// Only Kiln's own options in --help (not LLVM's hundreds).
static cl::OptionCategory kilnOptions("kiln-compile options");

static cl::list<std::string> inputs(cl::cat(kilnOptions), cl::Positional,
                                    cl::OneOrMore,
                                    cl::desc("<model.gguf... | config.json>"));
static cl::opt<std::string>
    emit(cl::cat(kilnOptions), "emit", cl::init(""),
         cl::desc("What to produce: mlir (the kiln program), step (the "
                  "planned, verified step program) or artifact (the .kiln "
                  "file; the default when -o ends in .kiln, else mlir)"),
         cl::value_desc("kind"));
static cl::opt<std::string>
    target(cl::cat(kilnOptions), "target", cl::init("cpu"),
           cl::desc("Backend the artifact is for: cpu, or cuda with the GPU "
                    "architectures it may run on and carries kernel images "
                    "for (cuda:sm_90,sm_120; default: every architecture "
                    "the --cuda-images folder has)"),
           cl::value_desc("name"));
static cl::opt<std::string> output(cl::cat(kilnOptions), "o", cl::init("-"),
                                   cl::desc("Output file ('-' for stdout)"),
                                   cl::value_desc("file"));
static cl::opt<std::string> cudaImages(
    cl::cat(kilnOptions), "cuda-images", cl::init(""),
    cl::desc("Folder of the CUDA kernel images (sm_XX/*.fatbin) that "
             "--target=cuda copies into the artifact (default: lib/kiln-cuda "
             "beside this program's bin/)"),
    cl::value_desc("dir"));
static cl::opt<uint64_t>
    contextLength(cl::cat(kilnOptions), "context", cl::init(0),
                  cl::desc("Positions the caches hold (default: the model's "
                           "context length)"));
static cl::opt<std::string>
    cacheType(cl::cat(kilnOptions), "cache-type", cl::init("f16"),
              cl::desc("Element type of the latent and indexer caches: f16 "
                       "(default), bf16 or f32"),
              cl::value_desc("type"));
static cl::opt<int64_t>
    tp(cl::cat(kilnOptions), "tp", cl::init(1),
       cl::desc("Tensor-parallel ranks to partition the step for (1, 2, 4, "
                "8, ...; default 1)"),
       cl::value_desc("N"));
static cl::opt<bool>
    noFuse(cl::cat(kilnOptions), "no-fuse", cl::init(false),
           cl::desc("Do not fuse projections that share an input (for "
                    "comparisons; the default fuses)"));
static cl::opt<bool> fuseSharedExpert(
    cl::cat(kilnOptions), "fuse-shared-expert", cl::init(true),
    cl::desc("Move each MoE layer's shared expert inside its routed experts' "
             "op (moe_experts shared(...)): the CUDA backend runs it as a "
             "ninth expert of weight 1 (default on, measured faster: "
             "docs/perf.md; =false keeps the shared expert's own ops)"));
static cl::opt<std::string> projectionNorms(
    cl::cat(kilnOptions), "projection-norms", cl::ValueOptional,
    cl::init(""),
    cl::desc(
        "Leave the norm after a collective's residual add to the op that "
        "reads it, so that the collective no longer sums squares across its "
        "blocks. =projections: to the Q8_0 or F32 projection that reads it "
        "(step.all_reduce_add, then rms_norm_linear); =router: without "
        "--fold-router, to the F32 router that reads it (rms_norm_router, "
        "which writes the normalised vector for the experts); bare or =all: "
        "both. Off by default (measured slower: docs/perf.md); by default "
        "that norm is inside the collective, all_reduce_add_rms_norm"),
    cl::value_desc("all|projections|router"));
static cl::opt<std::string> foldRouter(
    cl::cat(kilnOptions), "fold-router", cl::ValueOptional, cl::init(""),
    cl::desc("Fold each MoE layer's router into the attention's all-reduce "
             "(the logits divided by its rms; with --fuse-router-choice the "
             "choice made there too): the "
             "router's dots leave the path after the all-reduce. Bare or "
             "=partial: router_partial after attn_output; =composed: "
             "attn_output and the router's share in one linear_router, its "
             "matrix composed at load (off by default until it measures "
             "faster, docs/perf.md)"),
    cl::value_desc("partial|composed"));
static cl::opt<bool> fuseRouterChoice(
    cl::cat(kilnOptions), "fuse-router-choice", cl::init(false),
    cl::desc("With --fold-router: make each MoE layer's router choice (top-k "
             "and weights) inside the all-reduce that reduces its logits "
             "(all_reduce_add_rms_norm choose), the same bits as a "
             "moe_choose after it (off by default: measured slower on "
             "the GPU, in the step and alone, docs/perf.md twentieth and "
             "twenty-second passes)"));
static cl::opt<bool> elideIndexers(
    cl::cat(kilnOptions), "elide-indexers", cl::init(true),
    cl::desc("Leave out each DSA indexer whose cache holds no more positions "
             "than its top-k (--context at most 2,048 for GLM-5): it would "
             "select every position, so MLA attends them all without it, "
             "the same bits (default on; =false keeps them, for "
             "comparisons)"));
static cl::opt<bool> splitProjections(
    cl::cat(kilnOptions), "split-projections", cl::init(true),
    cl::desc("Cut each projection read only in slices of its heads (GLM-5's "
             "attn_q_b: 192 rows a head without position, 64 with) into one "
             "projection per slice, its weight's rows gathered at load: the "
             "slices become views of one mat-vec, the same bits (default "
             "on; =false keeps the slice copies, for comparisons)"));
static cl::opt<bool>
    noLogits(cl::cat(kilnOptions), "no-logits", cl::init(false),
             cl::desc("Steps return only the greedy next token, not the "
                      "logits (no sampling or --logits-out at run time; at "
                      "tp > 1 the logits are never gathered)"));
static cl::opt<uint64_t> adjustments(
    cl::cat(kilnOptions), "adjustments",
    cl::init(kiln::glm5::BuildOptions::kDefaultAdjustments),
    cl::desc("Room for N adjusted tokens a step in the sampling slot: "
             "logit_bias and the recent tokens the repeat, frequency and "
             "presence penalties count, applied by the step before its draw "
             "(default 320: 64 recent tokens and 256 biases); 0: the "
             "eight-word slot, whose penalties and biases need the logits "
             "on the host"),
    cl::value_desc("N"));
static cl::opt<bool> mtp(cl::cat(kilnOptions), "mtp", cl::init(false),
                         cl::desc("Also build @mtp_step, the next-token-"
                                  "prediction layer"));
static cl::opt<bool>
    report(cl::cat(kilnOptions), "report", cl::init(false),
           cl::desc("Print the step's figures (ops, arena, peak live "
                    "bytes, cache bytes per token, weights) to stderr"));
static cl::opt<int64_t>
    alignment(cl::cat(kilnOptions), "alignment", cl::init(256),
              cl::desc("Byte alignment of every arena buffer (power of two)"));
static cl::opt<int64_t> reuseDistance(
    cl::cat(kilnOptions), "reuse-distance", cl::init(16),
    cl::desc("Ops after an arena buffer's last access before another buffer "
             "may take its bytes: reused bytes order their new writer after "
             "the old readers, so a distance keeps nearby independent ops "
             "free to overlap on a backend's parallel branches (default 16; "
             "0: reuse at once)"));
static cl::opt<std::string>
    weightType(cl::cat(kilnOptions), "weight-type", cl::init("bf16"),
               cl::desc("With config.json: the type the checkpoint's "
                        "matrices are stored in"),
               cl::value_desc("ggml type"));

static int fail(const kiln::Error &error) {
  llvm::errs() << "kiln-compile: error: " << error.message() << "\n";
  return 1;
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions(kilnOptions);
  cl::ParseCommandLineOptions(argc, argv, "Kiln compiler driver\n");
  if (emit.empty())
    emit = llvm::StringRef(output).ends_with(".kiln") ? "artifact" : "mlir";
  if (emit != "mlir" && emit != "step" && emit != "artifact") {
    llvm::errs() << "kiln-compile: error: --emit=" << emit
                 << ": expected 'mlir', 'step' or 'artifact'\n";
    return 2;
  }
  // --target=NAME or NAME:OPTIONS (cuda:sm_90,sm_120).
  auto [targetName, targetOptions] = llvm::StringRef(target).split(':');
  const kiln::compiler::Target *backend =
      kiln::compiler::lookupTarget(targetName);
  if (!backend) {
    llvm::errs() << "kiln-compile: error: --target=" << target
                 << ": unknown target; known:";
    for (const kiln::compiler::Target &t : kiln::compiler::targets())
      llvm::errs() << " " << t.name;
    llvm::errs() << "\n";
    return 2;
  }
  if (cudaImages.empty()) {
    std::string self = llvm::sys::fs::getMainExecutable(
        argv[0], reinterpret_cast<void *>(&main));
    llvm::SmallString<256> dir(
        llvm::sys::path::parent_path(llvm::sys::path::parent_path(self)));
    llvm::sys::path::append(dir, "lib", "kiln-cuda");
    kiln::compiler::setCudaImageDir(std::string(dir));
  } else {
    kiln::compiler::setCudaImageDir(cudaImages);
  }
  {
    // Refuse bad target options before any work.
    kiln::artifact::Artifact probe;
    if (kiln::Status st = backend->applyOptions(targetOptions, probe); !st) {
      llvm::errs() << "kiln-compile: error: " << st.error().message() << "\n";
      return 2;
    }
  }
  if (emit == "artifact" && output == "-") {
    llvm::errs() << "kiln-compile: error: an artifact needs -o FILE.kiln\n";
    return 2;
  }
  if (tp < 1 || tp > 1024) {
    llvm::errs() << "kiln-compile: error: --tp=" << tp
                 << ": expected a rank count from 1 to 1024\n";
    return 2;
  }
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
    llvm::errs() << "kiln-compile: error: --alignment=" << alignment
                 << ": must be a power of two\n";
    return 2;
  }
  mlir::kiln::RouterFold routerFold = mlir::kiln::RouterFold::Off;
  if (foldRouter.getNumOccurrences()) {
    if (foldRouter.empty() || foldRouter == "partial") {
      routerFold = mlir::kiln::RouterFold::Partial;
    } else if (foldRouter == "composed") {
      routerFold = mlir::kiln::RouterFold::Composed;
    } else {
      llvm::errs() << "kiln-compile: error: --fold-router=" << foldRouter
                   << ": expected 'partial' (the same as a bare "
                      "--fold-router) or 'composed'\n";
      return 2;
    }
  }
  bool normsToProjections = false, normsToRouter = false;
  if (projectionNorms.getNumOccurrences()) {
    if (projectionNorms.empty() || projectionNorms == "all") {
      normsToProjections = normsToRouter = true;
    } else if (projectionNorms == "projections") {
      normsToProjections = true;
    } else if (projectionNorms == "router") {
      normsToRouter = true;
    } else {
      llvm::errs() << "kiln-compile: error: --projection-norms="
                   << projectionNorms
                   << ": expected 'all' (the same as a bare "
                      "--projection-norms), 'projections' or 'router'\n";
      return 2;
    }
  }
  if (reuseDistance < 0 || reuseDistance > 1000000) {
    llvm::errs() << "kiln-compile: error: --reuse-distance=" << reuseDistance
                 << ": expected a count of ops from 0 to 1000000\n";
    return 2;
  }
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point since) {
    return std::chrono::duration<double>(Clock::now() - since).count();
  };
  Clock::time_point start = Clock::now();

  kiln::Expected<kiln::glm5::GLM5Dims> dims = kiln::Error("", "", "");
  kiln::Expected<kiln::glm5::TensorCatalog> catalog = kiln::Error("", "", "");
  std::string first = inputs.front();
  if (llvm::StringRef(first).ends_with(".json")) {
    if (inputs.size() != 1) {
      llvm::errs() << "kiln-compile: error: a config.json is the only input\n";
      return 2;
    }
    std::optional<kiln::GGMLType> type = kiln::parseGGMLType(weightType);
    if (!type) {
      llvm::errs() << "kiln-compile: error: --weight-type: unknown type '"
                   << weightType << "'\n";
      return 2;
    }
    dims = kiln::glm5::dimsFromConfigJson(first);
    if (!dims)
      return fail(dims.error());
    catalog = kiln::glm5::TensorCatalog::expected(*dims, *type, first);
  } else {
    std::vector<std::string> paths(inputs.begin(), inputs.end());
    kiln::Expected<kiln::gguf::GGUFModel> model =
        kiln::gguf::GGUFModel::open(paths);
    if (!model)
      return fail(model.error());
    dims = kiln::glm5::dimsFromGGUF(*model);
    if (!dims)
      return fail(dims.error());
    catalog = kiln::glm5::TensorCatalog::fromGGUF(*model);
  }
  if (!catalog)
    return fail(catalog.error());

  mlir::MLIRContext context;
  kiln::glm5::BuildOptions options;
  options.contextLength = contextLength;
  options.includeMtp = mtp;
  options.cacheType = cacheType;
  options.returnLogits = !noLogits;
  options.adjustments = adjustments;
  auto module = kiln::glm5::buildDecodeStep(context, *dims, *catalog, options);
  if (!module)
    return fail(module.error());
  double buildSeconds = seconds(start);

  // The step pipeline runs for --emit=step, and on a copy for a report of
  // the kiln program.
  mlir::OwningOpRef<mlir::ModuleOp> step;
  double stepSeconds = 0;
  if (emit != "mlir" || report) {
    Clock::time_point lowering = Clock::now();
    if (emit != "mlir")
      step = std::move(*module);
    else
      step = (*module)->clone();
    mlir::PassManager pm(&context);
    mlir::kiln::StepPipelineOptions pipeline;
    pipeline.alignment = alignment;
    pipeline.fuse = !noFuse;
    pipeline.tp = tp;
    pipeline.reuseDistance = reuseDistance;
    pipeline.fuseSharedExpert = fuseSharedExpert;
    pipeline.projectionNorms = normsToProjections;
    pipeline.routerNorms = normsToRouter;
    pipeline.foldRouter = routerFold;
    pipeline.fuseRouterChoice = fuseRouterChoice;
    pipeline.elideIndexers = elideIndexers;
    pipeline.splitProjections = splitProjections;
    mlir::kiln::buildStepPipeline(pm, pipeline);
    if (mlir::failed(pm.run(*step))) {
      llvm::errs() << "kiln-compile: error: the step pipeline failed (see "
                      "above)\n";
      return 1;
    }
    stepSeconds = seconds(lowering);
  }
  if (report) {
    mlir::step::printReport(llvm::errs(), mlir::step::reportSteps(*step));
    llvm::errs() << llvm::format("  build %.3f s, lower+plan+verify %.3f s\n",
                                 buildSeconds, stepSeconds);
  }

  if (emit == "artifact") {
    kiln::Expected<kiln::artifact::Artifact> artifact =
        kiln::compiler::emitArtifact(*step, *backend, "kiln-compile 0.1");
    if (!artifact)
      return fail(artifact.error());
    if (kiln::Status st = backend->applyOptions(targetOptions, *artifact); !st)
      return fail(st.error());
    if (report)
      for (const kiln::artifact::RankPlan &plan : artifact->rankPlans) {
        const kiln::artifact::StepTraffic t = kiln::artifact::stepTraffic(
            *artifact, plan.rank, artifact->contextLength);
        if (t.boundBytes)
          llvm::errs() << llvm::format(
              "  rank %u: a decode step reads %.3f GB of weights (%.3f GB "
              "bound; routed experts: top-k rows) and %llu bytes of caches "
              "a position attended (%.3f GB at context %llu)\n",
              plan.rank, t.weightBytes / 1e9, t.boundBytes / 1e9,
              (unsigned long long)t.cacheBytesPerPosition, t.cacheBytes / 1e9,
              (unsigned long long)artifact->contextLength);
        if (t.boundBytes && t.selectedPositions)
          llvm::errs() << llvm::format(
              "  rank %u: attention reads at most the indexer's %llu "
              "selected positions; past them a position adds %llu bytes of "
              "caches\n",
              plan.rank, (unsigned long long)t.selectedPositions,
              (unsigned long long)t.cacheBytesPerPositionPast);
      }
    if (kiln::Status st = kiln::artifact::writeArtifact(*artifact, output); !st)
      return fail(st.error());
    return 0;
  }

  std::string errorMessage;
  auto out = mlir::openOutputFile(output, &errorMessage);
  if (!out) {
    llvm::errs() << "kiln-compile: error: " << output << ": " << errorMessage
                 << "\n";
    return 1;
  }
  if (emit == "step")
    step->print(out->os());
  else
    (*module)->print(out->os());
  out->os() << "\n";
  out->keep();
  return 0;
}
