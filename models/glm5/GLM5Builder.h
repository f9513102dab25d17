//===- GLM5Builder.h - GLM-5 decode step as a kiln program -------*- C++ -*-===//
//
// Builds the decode-step function of a GLM-5-shaped model in the kiln
// dialect from its hyper-parameters and the catalogue of its weights. Every
// tensor the program references is checked against the catalogue first:
// missing, unexpected, wrongly shaped or undequantisable tensors are errors
// naming the tensor.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_MODELS_GLM5_GLM5BUILDER_H
#define KILN_MODELS_GLM5_GLM5BUILDER_H

#include "glm5/GLM5Config.h"
#include "gguf/GGUFFile.h"
#include "quant/QuantTypes.h"
#include "support/Error.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

#include <map>
#include <string>
#include <vector>

namespace kiln::glm5 {

/// One weight as the model's files hold it.
struct CatalogTensor {
  GGMLType type = GGMLType::F32;
  std::vector<uint64_t> dims; ///< GGUF order, ne[0] first.
};

/// The weights a program may bind, by name.
struct TensorCatalog {
  std::string source; ///< File (or config) the tensors come from, for errors.
  std::map<std::string, CatalogTensor, std::less<>> tensors;

  /// The tensors of a GGUF model (all parts).
  static TensorCatalog fromGGUF(const gguf::GGUFModel &model);
  /// The tensors a checkpoint with `dims` has, matrices stored as
  /// `matrixType`, norms, biases and the router as F32 (for config.json,
  /// which names no file).
  static Expected<TensorCatalog> expected(const GLM5Dims &dims,
                                          GGMLType matrixType,
                                          std::string source);
};

struct BuildOptions {
  /// Positions the caches hold; 0 means the model's context length.
  uint64_t contextLength = 0;
  /// Also build `@mtp_step`, the next-token-prediction layer (kept out of
  /// the decode step).
  bool includeMtp = false;
  /// Element type of the latent and indexer caches: "f16" (llama.cpp's
  /// default), "bf16" or "f32".
  std::string cacheType = "f16";
  /// Return the logits (for sampling, --logits-out, comparisons). Without
  /// them a step returns only the greedy next token, and a partitioned step
  /// never gathers the vocabulary-split logits.
  bool returnLogits = true;
  /// Room for this many adjusted tokens a step in the sampling slot
  /// (DrawKey.h's adjusting form: logit_bias and the recent tokens the
  /// penalties count), made by the step before its draw; 0: the eight-word
  /// form, whose penalties and biases need the logits on the host.
  uint64_t adjustments = kDefaultAdjustments;
  /// 64 recent tokens (the penalties' default window) and 256 biases.
  static constexpr uint64_t kDefaultAdjustments = 320;
};

/// Checks `catalog` against every tensor `dims` implies, then builds a module
/// holding `@decode_step(%token, %position) -> (next token, logits)`.
Expected<mlir::OwningOpRef<mlir::ModuleOp>>
buildDecodeStep(mlir::MLIRContext &context, const GLM5Dims &dims,
                const TensorCatalog &catalog, const BuildOptions &options);

} // namespace kiln::glm5

#endif // KILN_MODELS_GLM5_GLM5BUILDER_H
