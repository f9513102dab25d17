//===- EmitArtifact.cpp - Step programs to .kiln artifacts ----------------===//
#include "artifact/EmitArtifact.h"

#include "cuda/SplitLayout.h"

#include "kiln/KilnOps.h"
#include "passes/StepAccess.h"
#include "step/StepOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Interfaces/DestinationStyleOpInterface.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <fmt/format.h>

using namespace mlir;
namespace st = mlir::step;
namespace kd = mlir::kiln;

namespace kiln::compiler {

namespace {

/// Every op kind the step dialect has; the CPU and CUDA backends run all
/// of them.
const std::vector<std::string> kAllStepOps = {"embed",
                                              "dequant",
                                              "linear",
                                              "fused_linear",
                                              "rms_norm_linear",
                                              "swiglu_linear",
                                              "rms_norm",
                                              "add_rms_norm",
                                              "all_reduce_add_rms_norm",
                                              "all_reduce_add",
                                              "rms_norm_router",
                                              "layer_norm",
                                              "rope",
                                              "cache_append",
                                              "norm_rope_append",
                                              "mla_attention",
                                              "dsa_indexer",
                                              "moe_router",
                                              "moe_experts",
                                              "router_partial",
                                              "linear_router",
                                              "moe_choose",
                                              "swiglu",
                                              "add",
                                              "all_reduce",
                                              "all_gather",
                                              "distributed_argmax",
                                              "argmax",
                                              "copy",
                                              "slice",
                                              "concat"};

/// The GPU architectures the CUDA plugin's kernels are built for.
const std::vector<std::string> kCudaArchitectures = {"sm_90", "sm_100",
                                                     "sm_120"};

/// The kernel sources built into one image each per architecture
/// (backends/cuda/CMakeLists.txt).
const std::vector<std::string> kCudaImageSources = {"StepKernels",
                                                    "StepMatVec"};

std::string &cudaImageDir() {
  static std::string dir;
  return dir;
}

std::string imagePath(const std::string &arch, const std::string &source) {
  return cudaImageDir() + "/" + arch + "/" + source + ".fatbin";
}

/// --target=cuda[:sm_XX,...]: the architectures the artifact may run on,
/// recorded as the payload ("cuda", "archs") the plugin checks the GPU
/// against at load, and each one's kernel images, copied from the build's
/// image folder as payloads ("cuda", "sm_XX/NAME.fatbin"), which the
/// plugin runs. Default: every architecture the folder has images for.
Status applyCudaOptions(llvm::StringRef options, artifact::Artifact &out) {
  std::vector<std::string> archs;
  llvm::SmallVector<llvm::StringRef> parts;
  options.split(parts, ',', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef part : parts) {
    std::string arch = part.trim().str();
    if (std::find(kCudaArchitectures.begin(), kCudaArchitectures.end(), arch) ==
        kCudaArchitectures.end())
      return Error("--target=cuda:" + options.str(), arch,
                   "not an architecture the CUDA backend is built for "
                   "(sm_90, sm_100, sm_120)");
    if (std::find(archs.begin(), archs.end(), arch) == archs.end())
      archs.push_back(arch);
  }
  if (archs.empty())
    for (const std::string &arch : kCudaArchitectures)
      if (llvm::sys::fs::exists(imagePath(arch, kCudaImageSources.front())))
        archs.push_back(arch);
  if (archs.empty())
    return Error("--target=cuda", cudaImageDir(),
                 "holds no kernel images (sm_XX/" + kCudaImageSources.front() +
                     ".fatbin, built with Kiln's CUDA parts; "
                     "kiln-compile --cuda-images=DIR names another folder)");
  std::vector<artifact::Payload> images;
  for (const std::string &arch : archs)
    for (const std::string &source : kCudaImageSources) {
      std::string path = imagePath(arch, source);
      llvm::ErrorOr<std::unique_ptr<llvm::MemoryBuffer>> file =
          llvm::MemoryBuffer::getFile(path, /*IsText=*/false,
                                      /*RequiresNullTerminator=*/false);
      if (!file)
        return Error("--target=cuda:" + arch, path,
                     "cannot read the kernel image (" +
                         file.getError().message() +
                         "); build Kiln's CUDA parts for " + arch +
                         " (KILN_CUDA_ARCHITECTURES) or name another folder "
                         "with --cuda-images=DIR");
      llvm::StringRef bytes = (*file)->getBuffer();
      images.push_back({"cuda", arch + "/" + source + ".fatbin",
                        std::vector<uint8_t>(bytes.begin(), bytes.end())});
    }
  std::string list;
  for (const std::string &a : archs)
    list += (list.empty() ? "" : ",") + a;
  out.payloads.push_back(
      {"cuda", "archs", std::vector<uint8_t>(list.begin(), list.end())});
  for (artifact::Payload &p : images)
    out.payloads.push_back(std::move(p));
  return Status::ok();
}

/// The CUDA plugin's split device layouts (backends/cuda/SplitLayout.h's
/// table, the one the plugin reads them by), for weights read only as
/// mat-vec weights (readsWeightAsMatVec: linear, fused_linear,
/// rms_norm_linear, swiglu_linear, mla_attention's projection):
/// each field of the file's blocks in its own plane (quants, scales, high
/// bits), rows back to back in every plane, each plane 256-byte aligned.
/// The plugin repacks the file's blocks into it at load, every byte kept,
/// so each lane of a warp reads its quants in one aligned 16-byte load
/// (docs/cuda.md). Stacked
/// (3-D) weights, such as attn_k_b's per-head matrices, take it too: the
/// split kernels read a stacked weight's matrices as the block kernels do.
/// Any other use (embed, dequant, the routed experts) keeps the file's
/// blocks ("gguf"). nullptr: the type has no split layout.
const char *splitLayoutName(GGMLType type) {
  const ::kiln::cuda::SplitFormat *f = ::kiln::cuda::splitFormatOf(type);
  return f ? f->name : nullptr;
}

Status assignCudaLayouts(artifact::Artifact &out) {
  // Per binding: whether every use is the weight operand of a mat-vec.
  std::vector<int> matVecUses(out.weights.size(), 0),
      otherUses(out.weights.size(), 0);
  for (const artifact::RankPlan &plan : out.rankPlans)
    for (const artifact::Step &step : plan.steps)
      for (const artifact::Op &op : step.ops) {
        std::span<const int32_t> ins = op.ins();
        for (size_t i = 0; i < ins.size(); ++i) {
          const artifact::Buffer &b = step.buffers[size_t(ins[i])];
          if (b.kind != artifact::BufferKind::Weight)
            continue;
          const bool matVec = ::kiln::cuda::readsWeightAsMatVec(
              op.kind, i, out.weights[size_t(b.binding)].dims.size());
          ++(matVec ? matVecUses : otherUses)[size_t(b.binding)];
        }
      }
  for (size_t i = 0; i < out.weights.size(); ++i) {
    artifact::WeightBinding &w = out.weights[i];
    const char *split = splitLayoutName(w.type);
    if (split && w.dims.size() >= 2 && matVecUses[i] && !otherUses[i])
      w.layout = split;
  }
  return Status::ok();
}

} // namespace

void setCudaImageDir(std::string dir) { cudaImageDir() = std::move(dir); }

namespace {

std::vector<Target> makeTargets() {
  std::vector<Target> out;
  out.push_back({"cpu", "reference C++ kernels (plugin libkiln-backend-cpu.so)",
                 kAllStepOps,
                 [](ModuleOp, artifact::Artifact &) { return Status::ok(); },
                 [](llvm::StringRef options, artifact::Artifact &) -> Status {
                   if (!options.empty())
                     return Error("--target=cpu", options.str(),
                                  "the cpu target takes no options");
                   return Status::ok();
                 }});
  // The CUDA plugin carries its kernels (built for sm_90, sm_100, sm_120);
  // the artifact names each weight's device layout.
  out.push_back(
      {"cuda",
       "CUDA kernels, one captured graph per rank (plugin "
       "libkiln-backend-cuda.so); --target=cuda:sm_90,sm_120 "
       "names the GPU architectures it may run on",
       kAllStepOps,
       [](ModuleOp, artifact::Artifact &a) { return assignCudaLayouts(a); },
       applyCudaOptions});
  return out;
}

std::string describe(Operation *op) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "'" << op->getName() << "' at " << op->getLoc();
  return s;
}

Expected<artifact::DType> dtypeOf(Type element, Operation *where) {
  if (element.isF32())
    return artifact::DType::F32;
  if (element.isF16())
    return artifact::DType::F16;
  if (element.isBF16())
    return artifact::DType::BF16;
  if (element.isInteger(32))
    return artifact::DType::I32;
  return Error("", describe(where),
               "has an element type the artifact "
               "cannot express");
}

Expected<artifact::Attr> attrOf(NamedAttribute named, Operation *op) {
  artifact::Attr a;
  a.name = named.getName().str();
  Attribute v = named.getValue();
  if (auto b = dyn_cast<BoolAttr>(v)) {
    a.kind = artifact::AttrKind::Bool;
    a.intValue = b.getValue();
  } else if (auto i = dyn_cast<IntegerAttr>(v)) {
    a.kind = artifact::AttrKind::Int;
    a.intValue = i.getInt();
  } else if (auto f = dyn_cast<FloatAttr>(v)) {
    a.kind = artifact::AttrKind::Float;
    a.floatValue = f.getValueAsDouble();
  } else if (auto s = dyn_cast<StringAttr>(v)) {
    a.kind = artifact::AttrKind::String;
    a.stringValue = s.str();
  } else if (auto map = dyn_cast<ArrayAttr>(v);
             map && !map.empty() && llvm::all_of(map, [](Attribute a) {
               return isa<kd::SegmentAttr>(a);
             })) {
    // A segment map: names and formats are the weights' own bindings, so
    // the offsets are what the backend needs (and checks against them).
    a.kind = artifact::AttrKind::Ints;
    for (Attribute s : map)
      a.ints.push_back(cast<kd::SegmentAttr>(s).getOffset());
  } else if (auto arr = dyn_cast<DenseI64ArrayAttr>(v)) {
    a.kind = artifact::AttrKind::Ints;
    a.ints.assign(arr.asArrayRef().begin(), arr.asArrayRef().end());
  } else {
    return Error("", describe(op),
                 fmt::format("attribute '{}' has a kind the artifact cannot "
                             "express",
                             a.name));
  }
  return a;
}

void addConfig(artifact::Artifact &out, kd::GLM5ConfigAttr c) {
  auto i = [&](const char *key, int64_t v) {
    out.config.push_back({key, false, v, 0});
  };
  auto f = [&](const char *key, FloatAttr v) {
    out.config.push_back({key, true, 0, v.getValueAsDouble()});
  };
  i("hidden", c.getHidden());
  i("layers", c.getLayers());
  i("mtp_layers", c.getMtpLayers());
  i("dense_layers", c.getDenseLayers());
  i("vocab", c.getVocab());
  i("dense_ff", c.getDenseFf());
  i("expert_ff", c.getExpertFf());
  i("experts", c.getExperts());
  i("experts_used", c.getExpertsUsed());
  i("shared_experts", c.getSharedExperts());
  i("heads", c.getHeads());
  i("q_lora_rank", c.getQLoraRank());
  i("kv_lora_rank", c.getKvLoraRank());
  i("qk_nope_dim", c.getQkNopeDim());
  i("qk_rope_dim", c.getQkRopeDim());
  i("v_head_dim", c.getVHeadDim());
  i("indexer_heads", c.getIndexerHeads());
  i("indexer_dim", c.getIndexerDim());
  i("indexer_top_k", c.getIndexerTopK());
  i("context_length", c.getContextLength());
  f("rope_theta", c.getRopeTheta());
  f("rms_eps", c.getRmsEps());
  f("routed_scale", c.getRoutedScale());
}

} // namespace

llvm::ArrayRef<Target> targets() {
  static const std::vector<Target> all = makeTargets();
  return all;
}

const Target *lookupTarget(llvm::StringRef name) {
  for (const Target &t : targets())
    if (t.name == name)
      return &t;
  return nullptr;
}

Expected<artifact::Artifact> emitArtifact(ModuleOp module, const Target &target,
                                          const std::string &producer) {
  artifact::Artifact out;
  out.producer = producer;
  out.target = target.name;
  // Every step function is partitioned alike; each rank gets its own plan
  // (the same ops) whose split weights bind the rank's slice.
  int64_t ranks = 0;
  for (auto func : module.getOps<func::FuncOp>()) {
    if (!func->hasAttr(st::kPlanAttrName))
      continue;
    auto tp = func->getAttrOfType<IntegerAttr>("kiln.tp");
    int64_t n = tp ? tp.getInt() : 1;
    if (ranks && n != ranks)
      return Error("", "module",
                   "step functions partitioned for different "
                   "rank counts");
    ranks = n;
  }
  if (ranks < 1)
    return Error("", "module", "has no planned step function to emit");
  out.ranks = static_cast<uint32_t>(ranks);
  out.rankPlans.resize(out.ranks);
  llvm::StringMap<int32_t> bindings;
  bool contextSet = false;

  for (uint32_t rank = 0; rank < out.ranks; ++rank) {
    for (auto func : module.getOps<func::FuncOp>()) {
      if (!func->hasAttr(st::kPlanAttrName))
        continue;
      if (out.modelArch.empty())
        if (auto config =
                func->getAttrOfType<kd::GLM5ConfigAttr>("kiln.config")) {
          out.modelArch = "glm-dsa";
          addConfig(out, config);
        }
      auto plan = func->getAttrOfType<st::PlanAttr>(st::kPlanAttrName);
      artifact::Step step;
      step.name = func.getSymName().str();
      step.arenaBytes = plan.getArenaBytes();
      step.alignment = plan.getAlignment();
      step.peakLiveBytes = plan.getPeakLiveBytes();
      llvm::DenseMap<Value, int32_t> index;

      for (Operation &op : func.getBody().front()) {
        if (isa<func::ReturnOp>(op))
          continue;
        if (st::isDeclaration(&op) || isa<st::ViewOp>(op)) {
          artifact::Buffer b;
          Value result = op.getResult(0);
          if (auto w = dyn_cast<st::WeightOp>(op)) {
            kd::QWeightType type = w.getType();
            bool split = type.getShardDim() >= 0;
            std::string key = type.getName().str();
            if (split)
              key += fmt::format("#{}", rank);
            if (type.hasRowCut())
              key += fmt::format("@{}:{}/{}", type.getRowsBegin(),
                                 type.getRowsEnd(), type.getRowsPeriod());
            auto [it, inserted] = bindings.try_emplace(
                key, static_cast<int32_t>(out.weights.size()));
            if (inserted) {
              artifact::WeightBinding binding;
              binding.tensor = type.getName().str();
              std::optional<GGMLType> ggml =
                  parseGGMLType(type.getFormat().str());
              if (!ggml)
                return Error("", describe(&op), "has an unknown weight format");
              binding.type = *ggml;
              SmallVector<int64_t> full = type.getFullDims();
              binding.dims.assign(full.begin(), full.end());
              if (split) {
                // Per group (one unless a fused gate/up), this rank's cut
                // (of the dim before any row cut).
                int64_t part = full[size_t(type.getShardDim())] /
                               type.getShardParts() / type.getShardGroups();
                binding.sliceDim = static_cast<int32_t>(type.getShardDim());
                binding.sliceBegin = part * rank;
                binding.sliceEnd = part * (rank + 1);
                binding.sliceGroups =
                    static_cast<int32_t>(type.getShardGroups());
              }
              if (type.hasRowCut()) {
                binding.rowPeriod = type.getRowsPeriod();
                binding.rowBegin = type.getRowsBegin();
                binding.rowEnd = type.getRowsEnd();
              }
              out.weights.push_back(std::move(binding));
            }
            b.kind = artifact::BufferKind::Weight;
            b.binding = it->second;
            b.name = st::declarationName(&op);
          } else {
            auto type = cast<MemRefType>(result.getType());
            Expected<artifact::DType> dtype =
                dtypeOf(type.getElementType(), &op);
            if (!dtype)
              return dtype.error();
            b.dtype = *dtype;
            b.shape.assign(type.getShape().begin(), type.getShape().end());
            if (auto buffer = dyn_cast<st::BufferOp>(op)) {
              b.kind = artifact::BufferKind::Arena;
              b.offset = buffer.getOffset().value_or(-1);
              b.name = buffer.getBufferName().str();
            } else if (auto view = dyn_cast<st::ViewOp>(op)) {
              b.kind = artifact::BufferKind::View;
              b.offset = view.getOffset();
              b.base = index.lookup(view.getSource());
              b.name =
                  fmt::format("{}[{}]", st::describeBuffer(view.getSource()),
                              view.getOffset());
            } else if (auto state = dyn_cast<st::StateOp>(op)) {
              b.kind = artifact::BufferKind::State;
              b.name = state.getStateName().str();
              uint64_t positions = static_cast<uint64_t>(type.getDimSize(0));
              if (contextSet && positions != out.contextLength)
                return Error("", describe(&op),
                             "caches of different lengths in one artifact");
              out.contextLength = positions;
              contextSet = true;
            } else if (auto in = dyn_cast<st::InputOp>(op)) {
              b.kind = artifact::BufferKind::Input;
              b.name = in.getSlotName().str();
            } else {
              b.kind = artifact::BufferKind::Output;
              b.name = cast<st::OutputOp>(op).getSlotName().str();
            }
          }
          index[result] = static_cast<int32_t>(step.buffers.size());
          step.buffers.push_back(std::move(b));
          continue;
        }
        if (!isa_and_present<st::StepDialect>(op.getDialect()))
          return Error("", describe(&op), "is not a step op");
        artifact::Op a;
        a.kind = op.getName().stripDialect().str();
        if (std::find(target.supportedOps.begin(), target.supportedOps.end(),
                      a.kind) == target.supportedOps.end())
          return Error(
              "", describe(&op),
              fmt::format("target '{}' has no kernel for it", target.name));
        for (Value v : op.getOperands()) {
          auto it = index.find(v);
          if (it == index.end())
            return Error("", describe(&op), "uses a buffer declared after it");
          a.operands.push_back(it->second);
        }
        a.numOuts = static_cast<uint32_t>(
            cast<DestinationStyleOpInterface>(op).getNumDpsInits());
        for (NamedAttribute named : op.getAttrs()) {
          if (named.getName() == "operandSegmentSizes")
            continue;
          Expected<artifact::Attr> attr = attrOf(named, &op);
          if (!attr)
            return attr.error();
          a.attrs.push_back(std::move(*attr));
        }
        step.ops.push_back(std::move(a));
      }
      out.rankPlans[rank].rank = rank;
      out.rankPlans[rank].steps.push_back(std::move(step));
    }
  }
  if (Status st = target.emitPayloads(module, out); !st)
    return st.error();
  if (Status st = artifact::validate(out, "the emitted artifact"); !st)
    return st.error();
  return out;
}

} // namespace kiln::compiler
