//===- GLM5Builder.cpp - Emitting the GLM-5 decode step --------------------===//
#include "glm5/GLM5Builder.h"

#include "kiln/KilnDialect.h"
#include "kiln/KilnOps.h"
#include "kiln/KilnTypes.h"
#include "quant/QuantFormats.h"
#include "support/DrawKey.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"

#include <fmt/core.h>

#include <cctype>
#include <cmath>
#include <optional>
#include <set>

using namespace mlir;
namespace kd = mlir::kiln;

namespace kiln::glm5 {
namespace {

/// How tensor parallelism splits a GLM-5 weight (kiln.weight's tp_split
/// and tp_groups): the Megatron layout of docs/parallel.md. Heads through
/// attention (attn_q_b's rows, attn_k_b's and attn_v_b's stacks) and the
/// intermediate dim through the FFNs (gate and up rows) stay split, so
/// only attn_output and the down projections, split on ne[0], end in
/// partial sums; the output head is split by vocabulary.
struct TensorSplit {
  int64_t dim;
  int64_t groups = 1;
};

/// The split of a tensor by its role (its name without "blk.N." and
/// ".weight"); none when every rank holds all of it.
std::optional<TensorSplit> tensorSplitOf(StringRef tensor) {
  StringRef role = tensor;
  role.consume_back(".weight");
  if (role.starts_with("blk.")) {
    role = role.drop_front(4);
    role = role.drop_while([](char c) { return c >= '0' && c <= '9'; });
    role.consume_front(".");
  }
  if (role == "attn_q_b" || role == "ffn_gate" || role == "ffn_up" ||
      role == "ffn_gate_shexp" || role == "ffn_up_shexp" ||
      role == "ffn_gate_exps" || role == "ffn_up_exps" || role == "output")
    return TensorSplit{1};
  // Each expert's gate rows, then its up rows: each rank takes its part of
  // both halves.
  if (role == "ffn_gate_up_exps")
    return TensorSplit{1, 2};
  if (role == "attn_k_b" || role == "attn_v_b")
    return TensorSplit{2};
  if (role == "attn_output" || role == "ffn_down" || role == "ffn_down_shexp" ||
      role == "ffn_down_exps")
    return TensorSplit{0};
  return std::nullopt;
}

std::string lowerName(GGMLType type) {
  std::string s(nameOf(type));
  for (char &c : s)
    c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string dimsText(const std::vector<uint64_t> &dims) {
  std::string s = "{";
  for (size_t i = 0; i < dims.size(); ++i)
    s += fmt::format("{}{}", i ? ", " : "", dims[i]);
  return s + "}";
}

/// Every tensor `dims` implies (norms and router F32, matrices `matrixType`;
/// the mix's alignment check is skipped by using a one-value-block type when
/// `matrixType` is unknown).
Expected<std::vector<synth::SynthTensor>>
impliedTensors(const GLM5Dims &dims, GGMLType matrixType, bool fusedGateUp) {
  synth::Mix mix;
  mix.name = "catalogue";
  mix.defaultMatrix = matrixType;
  return synth::glm5Tensors(dims, mix, synth::LayoutOptions{fusedGateUp});
}

/// Checks the catalogue holds exactly the tensors the model implies, with
/// their dims and a dequantisable type.
Status checkCatalog(const GLM5Dims &dims, const TensorCatalog &catalog,
                    bool fusedGateUp) {
  Expected<std::vector<synth::SynthTensor>> implied =
      impliedTensors(dims, GGMLType::F32, fusedGateUp);
  if (!implied)
    return implied.error().withWhere(catalog.source);
  std::set<std::string, std::less<>> expectedNames;
  for (const synth::SynthTensor &t : *implied) {
    expectedNames.insert(t.name);
    auto it = catalog.tensors.find(t.name);
    if (it == catalog.tensors.end())
      return Error(catalog.source, t.name,
                   fmt::format("missing: the model's metadata implies a "
                               "tensor of dims {}",
                               dimsText(t.dims)));
    if (it->second.dims != t.dims)
      return Error(catalog.source, t.name,
                   fmt::format("dims {} but the model's metadata implies {}",
                               dimsText(it->second.dims), dimsText(t.dims)));
    if (!canDequantize(it->second.type))
      return Error(catalog.source, t.name,
                   fmt::format("unsupported type {} for tensor {}",
                               nameOf(it->second.type), t.name));
  }
  for (const auto &[name, tensor] : catalog.tensors)
    if (!expectedNames.count(name))
      return Error(catalog.source, name,
                   "unexpected tensor: the model's metadata implies no tensor "
                   "of this name (wrong block_count, layer kind or "
                   "architecture?)");
  return Status::ok();
}

/// Emits the program; every weight it asks for has been checked.
class StepBuilder {
public:
  StepBuilder(MLIRContext &ctx, const GLM5Dims &d, const TensorCatalog &c,
              uint64_t context, Type cacheElement)
      : b_(&ctx), loc_(UnknownLoc::get(&ctx)), d_(d), catalog_(c),
        context_(int64_t(context)), f32_(b_.getF32Type()),
        cacheElement_(cacheElement) {}

  OwningOpRef<ModuleOp> build(bool includeMtp, bool fusedGateUp,
                              bool returnLogits, int64_t words);

private:
  RankedTensorType vec(int64_t n) { return RankedTensorType::get({n}, f32_); }
  RankedTensorType mat(int64_t r, int64_t c) {
    return RankedTensorType::get({r, c}, f32_);
  }
  FloatAttr f32Attr(double v) { return b_.getF32FloatAttr(float(v)); }

  Value weight(const std::string &name) {
    const CatalogTensor &t = catalog_.tensors.find(name)->second;
    SmallVector<int64_t> dims(t.dims.begin(), t.dims.end());
    auto type = kd::QWeightType::get(b_.getContext(), name,
                                       lowerName(t.type), dims);
    IntegerAttr split, groups;
    if (std::optional<TensorSplit> s = tensorSplitOf(name)) {
      split = b_.getI64IntegerAttr(s->dim);
      if (s->groups != 1)
        groups = b_.getI64IntegerAttr(s->groups);
    }
    return kd::WeightOp::create(b_, loc_, type, split, groups);
  }
  /// A small tensor (norm weight, bias) dequantised whole.
  Value vector(const std::string &name) {
    Value w = weight(name);
    auto type = cast<kd::QWeightType>(w.getType());
    return kd::DequantOp::create(b_, loc_, type.getDequantizedType(f32_), w);
  }
  /// x (last dim K) times weight [K, N] -> last dim N; [B, K] times a
  /// stacked [K, N, B] -> [B, N].
  Value linear(Value x, const std::string &name) {
    Value w = weight(name);
    ArrayRef<int64_t> dims = cast<kd::QWeightType>(w.getType()).getDims();
    auto in = cast<RankedTensorType>(x.getType());
    SmallVector<int64_t> shape(in.getShape());
    shape.back() = dims[1];
    return kd::LinearOp::create(b_, loc_, RankedTensorType::get(shape, f32_),
                                  x, w);
  }
  Value rmsNorm(Value x, const std::string &weightName) {
    return kd::RMSNormOp::create(b_, loc_, x.getType(), x,
                                   vector(weightName), f32Attr(d_.rmsEps));
  }
  Value rope(Value x, Value position, int64_t offset) {
    return kd::RopeOp::create(
        b_, loc_, x.getType(), x, position, b_.getStringAttr("interleaved"),
        f32Attr(d_.ropeTheta), b_.getI64IntegerAttr(offset),
        b_.getI64IntegerAttr(int64_t(d_.qkRopeDim)));
  }
  Value slice(Value x, ArrayRef<int64_t> offsets, ArrayRef<int64_t> sizes) {
    SmallVector<OpFoldResult> o, s, st;
    for (size_t i = 0; i < offsets.size(); ++i) {
      o.push_back(b_.getIndexAttr(offsets[i]));
      s.push_back(b_.getIndexAttr(sizes[i]));
      st.push_back(b_.getIndexAttr(1));
    }
    return tensor::ExtractSliceOp::create(b_, loc_, x, o, s, st);
  }
  /// [r * c] -> [r, c]
  Value split(Value x, int64_t rows, int64_t cols) {
    return tensor::ExpandShapeOp::create(b_, loc_, mat(rows, cols), x,
                                         ArrayRef<ReassociationIndices>{{0, 1}});
  }
  /// [r, c] -> [r * c]
  Value flatten(Value x) {
    return tensor::CollapseShapeOp::create(
        b_, loc_, x, ArrayRef<ReassociationIndices>{{0, 1}});
  }
  Value add(Value a, Value c) {
    return kd::AddOp::create(b_, loc_, a, c);
  }
  Value swigluFFN(Value f, const std::string &prefix,
                  const std::string &suffix) {
    Value g = linear(f, prefix + "ffn_gate" + suffix + ".weight");
    Value u = linear(f, prefix + "ffn_up" + suffix + ".weight");
    Value h = kd::SwiGLUOp::create(b_, loc_, g, u);
    return linear(h, prefix + "ffn_down" + suffix + ".weight");
  }

  Value attention(Value a, Value position, const std::string &p);
  Value feedForward(Value f, const std::string &p, uint64_t layer,
                    bool fusedGateUp);
  Value layer(Value x, Value position, uint64_t index, StringRef kind,
              bool fusedGateUp);
  kd::GLM5ConfigAttr config();

  OpBuilder b_;
  Location loc_;
  const GLM5Dims &d_;
  const TensorCatalog &catalog_;
  int64_t context_;
  Type f32_;
  Type cacheElement_;
};

Value StepBuilder::attention(Value a, Value pos, const std::string &p) {
  const int64_t H = d_.heads, nope = d_.qkNopeDim, ropeDims = d_.qkRopeDim,
                kvLora = d_.kvLoraRank,
                iHeads = d_.indexerHeads, iDim = d_.indexerDim;
  // Queries through the q_a latent.
  Value cq = rmsNorm(linear(a, p + "attn_q_a.weight"), p + "attn_q_a_norm.weight");
  Value q = split(linear(cq, p + "attn_q_b.weight"), H, nope + ropeDims);
  Value qNope = slice(q, {0, 0}, {H, nope});
  Value qPe = rope(slice(q, {0, nope}, {H, ropeDims}), pos, 0);
  // This token's cache entry: normalised latent, then the roped key.
  Value kv = linear(a, p + "attn_kv_a_mqa.weight");
  Value cKv = rmsNorm(slice(kv, {0}, {kvLora}), p + "attn_kv_a_norm.weight");
  Value kPe = rope(slice(kv, {kvLora}, {ropeDims}), pos, 0);
  Value entry = tensor::ConcatOp::create(b_, loc_, 0, ValueRange{cKv, kPe});
  auto kvType = kd::LatentCacheType::get(b_.getContext(), context_, kvLora,
                                         ropeDims, cacheElement_);
  Value kvCache = kd::StateOp::create(b_, loc_, kvType,
                                        b_.getStringAttr(p + "kv_cache"));
  kd::CacheAppendOp::create(b_, loc_, kvCache, pos, entry);

  // DSA indexer: its queries from the q latent, its key from the input;
  // rope on the first rope dims of each indexer head.
  Value qI = rope(split(linear(cq, p + "indexer.attn_q_b.weight"), iHeads, iDim),
                  pos, 0);
  Value kI = linear(a, p + "indexer.attn_k.weight");
  // (Operands into locals first: C++ leaves argument order unspecified, and
  // the printed program should read in a fixed order.)
  Value kNormW = vector(p + "indexer.k_norm.weight");
  Value kNormB = vector(p + "indexer.k_norm.bias");
  kI = kd::LayerNormOp::create(b_, loc_, kI.getType(), kI, kNormW, kNormB,
                               f32Attr(1e-6));
  kI = rope(kI, pos, 0);
  auto idxType = kd::IndexCacheType::get(b_.getContext(), context_, iDim,
                                           cacheElement_);
  Value idxCache = kd::StateOp::create(b_, loc_, idxType,
                                         b_.getStringAttr(p + "index_cache"));
  kd::CacheAppendOp::create(b_, loc_, idxCache, pos, kI);
  Value headWeights = linear(a, p + "indexer.proj.weight");
  auto selType = RankedTensorType::get({int64_t(d_.indexerTopK)},
                                       b_.getI32Type());
  auto count = RankedTensorType::get({}, b_.getI32Type());
  auto indexer = kd::DSAIndexerOp::create(
      b_, loc_, selType, count, qI, headWeights, idxCache, pos,
      b_.getI64IntegerAttr(int64_t(d_.indexerTopK)),
      f32Attr(1.0 / std::sqrt(double(iDim * iHeads))));

  // Absorbed attention over the latent cache, then expand and project.
  Value qLatent = linear(qNope, p + "attn_k_b.weight");
  Value oLatent = kd::MLAAttentionOp::create(
      b_, loc_, qLatent.getType(), qLatent, qPe, kvCache, pos,
      indexer.getSelected(), indexer.getCount(),
      f32Attr(1.0 / std::sqrt(double(nope + ropeDims))));
  Value o = flatten(linear(oLatent, p + "attn_v_b.weight"));
  return linear(o, p + "attn_output.weight");
}

Value StepBuilder::feedForward(Value f, const std::string &p, uint64_t layer,
                               bool fusedGateUp) {
  if (layer < d_.leadingDense)
    return swigluFFN(f, p, "");
  auto ids = RankedTensorType::get({int64_t(d_.expertsUsed)}, b_.getI32Type());
  auto weights = vec(int64_t(d_.expertsUsed));
  Value gate = weight(p + "ffn_gate_inp.weight");
  Value bias = vector(p + "exp_probs_b.bias");
  auto router = kd::MoERouterOp::create(
      b_, loc_, ids, weights, f, gate, bias,
      b_.getI64IntegerAttr(int64_t(d_.expertsUsed)),
      b_.getStringAttr("sigmoid"), b_.getBoolAttr(d_.weightsNorm),
      f32Attr(d_.routedScale));
  SmallVector<Value> experts;
  if (fusedGateUp) {
    experts.push_back(weight(p + "ffn_gate_up_exps.weight"));
  } else {
    experts.push_back(weight(p + "ffn_gate_exps.weight"));
    experts.push_back(weight(p + "ffn_up_exps.weight"));
  }
  experts.push_back(weight(p + "ffn_down_exps.weight"));
  Value routed = kd::MoEExpertsOp::create(b_, loc_, f.getType(), f,
                                            router.getIds(),
                                            router.getWeights(), experts);
  return add(routed, swigluFFN(f, p, "_shexp"));
}

Value StepBuilder::layer(Value x, Value pos, uint64_t index, StringRef kind,
                         bool fusedGateUp) {
  std::string p = fmt::format("blk.{}.", index);
  auto op = kd::LayerOp::create(b_, loc_, x.getType(),
                                  b_.getI64IntegerAttr(int64_t(index)),
                                  b_.getStringAttr(kind), x);
  // Back after the layer op once the body is built.
  OpBuilder::InsertionGuard guard(b_);
  Block *body = b_.createBlock(&op.getBody(), {}, {x.getType()}, {loc_});
  Value h = body->getArgument(0);
  Value a = rmsNorm(h, p + "attn_norm.weight");
  Value h1 = add(h, attention(a, pos, p));
  Value f = rmsNorm(h1, p + "ffn_norm.weight");
  Value h2 = add(h1, feedForward(f, p, index, fusedGateUp));
  kd::YieldOp::create(b_, loc_, h2);
  return op.getResult();
}

kd::GLM5ConfigAttr StepBuilder::config() {
  auto i = [](uint64_t v) { return int64_t(v); };
  return kd::GLM5ConfigAttr::get(
      b_.getContext(), i(d_.hidden), i(d_.layers), i(d_.mtpLayers),
      i(d_.leadingDense), i(d_.vocab), i(d_.denseFF), i(d_.expertFF),
      i(d_.experts), i(d_.expertsUsed), i(d_.sharedExperts), i(d_.heads),
      i(d_.qLoraRank), i(d_.kvLoraRank), i(d_.qkNopeDim), i(d_.qkRopeDim),
      i(d_.vHeadDim), i(d_.indexerHeads), i(d_.indexerDim),
      i(d_.indexerTopK), context_, b_.getF64FloatAttr(d_.ropeTheta),
      b_.getF64FloatAttr(d_.rmsEps), b_.getF64FloatAttr(d_.routedScale));
}

/// Names the step's inputs and outputs (`kiln.slot`), which become the
/// runtime's slot names when the step is lowered to buffers.
static void nameSlots(func::FuncOp f, ArrayRef<StringRef> args,
                      ArrayRef<StringRef> results) {
  MLIRContext *ctx = f.getContext();
  for (unsigned i = 0; i < f.getNumArguments(); ++i)
    f.setArgAttr(i, "kiln.slot", StringAttr::get(ctx, args[i]));
  for (unsigned i = 0; i < f.getNumResults(); ++i)
    f.setResultAttr(i, "kiln.slot", StringAttr::get(ctx, results[i]));
}

OwningOpRef<ModuleOp> StepBuilder::build(bool includeMtp, bool fusedGateUp,
                                         bool returnLogits, int64_t words) {
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc_);
  b_.setInsertionPointToEnd(module->getBody());
  auto scalar = RankedTensorType::get({}, b_.getI32Type());
  const int64_t hidden = d_.hidden, vocab = d_.vocab;

  // @decode_step(%token, %position, %sampling) -> (next token[, logits][,
  // hidden])
  SmallVector<Type> results{scalar};
  SmallVector<StringRef> names{"next_token"};
  if (returnLogits) {
    results.push_back(vec(vocab));
    names.push_back("logits");
  }
  if (includeMtp) {
    results.push_back(vec(hidden));
    names.push_back("hidden");
  }
  // The sampling words (DrawKey.h) make the step's argmax a draw where the
  // runtime asks for one (a temperature, its cuts, and in the adjusting
  // form the logits' biases and penalties first): a sampled token costs
  // what a greedy one does.
  auto drawWords = RankedTensorType::get({words}, b_.getI32Type());
  auto step = func::FuncOp::create(
      b_, loc_, "decode_step",
      b_.getFunctionType({scalar, scalar, drawWords}, results));
  step->setAttr("kiln.config", config());
  nameSlots(step, {"token", "position", "sampling"}, names);
  Block *entry = step.addEntryBlock();
  b_.setInsertionPointToStart(entry);
  Value token = entry->getArgument(0), pos = entry->getArgument(1);
  Value sampling = entry->getArgument(2);
  Value x = kd::EmbedOp::create(b_, loc_, vec(hidden),
                                  weight("token_embd.weight"), token);
  for (uint64_t l = 0; l < d_.layers; ++l)
    x = layer(x, pos, l, l < d_.leadingDense ? "dense" : "moe", fusedGateUp);
  Value logits = linear(rmsNorm(x, "output_norm.weight"), "output.weight");
  Value next = kd::ArgmaxOp::create(b_, loc_, logits, sampling, pos);
  SmallVector<Value> returned{next};
  if (returnLogits)
    returned.push_back(logits);
  if (includeMtp)
    returned.push_back(x);
  func::ReturnOp::create(b_, loc_, returned);

  if (includeMtp) {
    // @mtp_step(%next_token, %position, %hidden) -> (token after next,
    // logits): enorm(embed(next)) and hnorm(hidden), concatenated, through
    // eh_proj, then the MTP decoder block, shared_head_norm and the head.
    b_.setInsertionPointToEnd(module->getBody());
    SmallVector<Type> mtpResults{scalar};
    if (returnLogits)
      mtpResults.push_back(vec(vocab));
    auto mtp = func::FuncOp::create(
        b_, loc_, "mtp_step",
        b_.getFunctionType({scalar, scalar, vec(hidden)}, mtpResults));
    nameSlots(mtp, {"token", "position", "hidden"}, {"next_token", "logits"});
    Block *e = mtp.addEntryBlock();
    b_.setInsertionPointToStart(e);
    uint64_t l = d_.layers; // The first MTP block follows the trunk.
    std::string p = fmt::format("blk.{}.", l);
    Value emb = kd::EmbedOp::create(b_, loc_, vec(hidden),
                                      weight("token_embd.weight"),
                                      e->getArgument(0));
    Value en = rmsNorm(emb, p + "nextn.enorm.weight");
    Value hn = rmsNorm(e->getArgument(2), p + "nextn.hnorm.weight");
    Value cat = tensor::ConcatOp::create(b_, loc_, 0, ValueRange{en, hn});
    Value h = linear(cat, p + "nextn.eh_proj.weight");
    h = layer(h, e->getArgument(1), l, "mtp", fusedGateUp);
    Value mlogits =
        linear(rmsNorm(h, p + "nextn.shared_head_norm.weight"), "output.weight");
    Value mnext = kd::ArgmaxOp::create(b_, loc_, mlogits, Value(), Value());
    SmallVector<Value> mtpReturned{mnext};
    if (returnLogits)
      mtpReturned.push_back(mlogits);
    func::ReturnOp::create(b_, loc_, mtpReturned);
  }
  return module;
}

} // namespace

TensorCatalog TensorCatalog::fromGGUF(const gguf::GGUFModel &model) {
  TensorCatalog c;
  c.source = model.parts().front().path();
  for (gguf::TensorRef ref : model.tensors()) {
    const gguf::TensorInfo &info = model.info(ref);
    c.tensors[info.name] = CatalogTensor{info.type, info.dims};
  }
  return c;
}

Expected<TensorCatalog> TensorCatalog::expected(const GLM5Dims &dims,
                                                GGMLType matrixType,
                                                std::string source) {
  Expected<std::vector<synth::SynthTensor>> implied =
      impliedTensors(dims, matrixType, /*fusedGateUp=*/false);
  if (!implied)
    return implied.error().withWhere(source);
  TensorCatalog c;
  c.source = std::move(source);
  for (const synth::SynthTensor &t : *implied)
    c.tensors[t.name] = CatalogTensor{t.type, t.dims};
  return c;
}

Expected<OwningOpRef<ModuleOp>> buildDecodeStep(MLIRContext &context,
                                                const GLM5Dims &dims,
                                                const TensorCatalog &catalog,
                                                const BuildOptions &options) {
  context.loadDialect<kd::KilnDialect, func::FuncDialect,
                      tensor::TensorDialect>();
  if (options.includeMtp && dims.mtpLayers == 0)
    return Error(catalog.source, "nextn_predict_layers",
                 "the model has no MTP layer to build");
  // Some files fuse each MoE layer's gate and up experts into one tensor.
  bool fused = dims.leadingDense < dims.layers &&
               catalog.tensors.count(fmt::format(
                   "blk.{}.ffn_gate_up_exps.weight", dims.leadingDense));
  if (Status s = checkCatalog(dims, catalog, fused); !s)
    return s.error();
  uint64_t ctx = options.contextLength ? options.contextLength
                                       : dims.contextLength;
  Type cacheElement;
  if (options.cacheType == "f16")
    cacheElement = Float16Type::get(&context);
  else if (options.cacheType == "bf16")
    cacheElement = BFloat16Type::get(&context);
  else if (options.cacheType == "f32")
    cacheElement = Float32Type::get(&context);
  else
    return Error(catalog.source, "cache type",
                 fmt::format("'{}' is not f16, bf16 or f32", options.cacheType));
  // The sampling slot's words: the adjusting form's, or the eight.
  constexpr uint64_t kMostAdjustments =
      (uint64_t(1) << 20); // a 12 MiB slot; far more than a request needs
  if (options.adjustments > kMostAdjustments)
    return Error(catalog.source, "adjustments",
                 fmt::format("{} is more than the {} a sampling slot holds",
                             options.adjustments, kMostAdjustments));
  const int64_t words = options.adjustments > 0
                            ? draw::adjustingWords(int(options.adjustments))
                            : draw::kDrawWords;
  StepBuilder builder(context, dims, catalog, ctx, cacheElement);
  OwningOpRef<ModuleOp> module =
      builder.build(options.includeMtp, fused, options.returnLogits, words);
  if (failed(verify(*module)))
    return Error(catalog.source, "",
                 "internal error: the built program does not verify (see "
                 "the diagnostics above)");
  return module;
}

} // namespace kiln::glm5
