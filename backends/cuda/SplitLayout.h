//===- SplitLayout.h - The planes of the split layouts ----------*- C++ -*-===//
//
// A split layout keeps every byte of a weight's GGUF blocks but moves each
// field of a block into its own plane: plane p holds bytes [offset, offset +
// bytes) of every block, blocks in file order (rows back to back, a row's
// blocks in column order), so a row of plane p is (cols / blockValues) *
// bytes bytes long and its blocks' pieces sit side by side. A warp reading
// consecutive 16-byte pieces of a quant plane then reads contiguous,
// aligned memory, which the 144-, 176-, 210-, 136-, 18-, 22- and 24-byte
// blocks do not allow. Every other piece is a power of two of at most 8
// bytes or whole 16-byte loads, so each is read with one aligned load.
// The repack is a permutation of the bytes: unpacking gives the file's
// blocks back.
//
// Plain C++ (no CUDA): the plane tables, the plane sizes, and the host
// reference repack / unpack the tests compare the device repack with.
// StepKernels.h documents the layouts as DeviceWeight fields; docs/cuda.md
// as the artifact names them.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_BACKENDS_CUDA_SPLITLAYOUT_H
#define KILN_BACKENDS_CUDA_SPLITLAYOUT_H

#include "quant/QuantTypes.h"

#include <cstdint>
#include <cstring>
#include <string_view>

namespace kiln::cuda {

/// The most planes a split layout has.
constexpr int kMaxSplitPlanes = 4;
/// Each plane starts at this alignment within a weight's allocation (the
/// kernels need 16; 256 keeps every plane on its own cache lines).
constexpr uint64_t kSplitPlaneAlign = 256;

/// Bytes [offset, offset + bytes) of every block.
struct SplitPlane {
  uint32_t offset = 0;
  uint32_t bytes = 0;
};

/// A split layout: its artifact name, the type it is for, and its planes in
/// DeviceWeight field order (data, scales, high, d: StepKernels.h).
struct SplitFormat {
  const char *name = nullptr;
  GGMLType type = GGMLType::F32;
  uint32_t blockValues = 0, blockBytes = 0;
  int planes = 0;
  SplitPlane plane[kMaxSplitPlanes] = {};
};

/// Every split layout.
inline constexpr SplitFormat kSplitFormats[] = {
    // Q8_0 (34 bytes: d, qs[32]): quants, scales.
    {"q8_0-split", GGMLType::Q8_0, 32, 34, 2, {{2, 32}, {0, 2}}},
    // Q4_K (144: d, dmin, scales[12], qs[128]): qs, heads (d, dmin,
    // scales).
    {"q4_k-split", GGMLType::Q4_K, 256, 144, 2, {{16, 128}, {0, 16}}},
    // Q5_K (176: d, dmin, scales[12], qh[32], qs[128]): qs, heads, qh.
    {"q5_k-split", GGMLType::Q5_K, 256, 176, 3, {{48, 128}, {0, 16}, {16, 32}}},
    // Q6_K (210: ql[128], qh[64], scales[16], d): ql, scales, qh, d.
    {"q6_k-split",
     GGMLType::Q6_K,
     256,
     210,
     4,
     {{0, 128}, {192, 16}, {128, 64}, {208, 2}}},
    // IQ4_XS (136: d, scales_h, scales_l[4], qs[128]): qs, heads (the
    // first 8 bytes, one 8-byte load).
    {"iq4_xs-split", GGMLType::IQ4_XS, 256, 136, 2, {{8, 128}, {0, 8}}},
    // The 32-value blocks: a block's 16 quant bytes are one 16-byte load.
    // IQ4_NL (18: d, qs[16]): qs, d.
    {"iq4_nl-split", GGMLType::IQ4_NL, 32, 18, 2, {{2, 16}, {0, 2}}},
    // Q5_0 (22: d, qh[4], qs[16]): qs, d, qh (d and qh apart: 6 bytes
    // would not keep either aligned).
    {"q5_0-split", GGMLType::Q5_0, 32, 22, 3, {{6, 16}, {0, 2}, {2, 4}}},
    // Q5_1 (24: d, m, qh[4], qs[16]): qs, heads (d, m and qh together: one
    // aligned 8-byte load).
    {"q5_1-split", GGMLType::Q5_1, 32, 24, 2, {{8, 16}, {0, 8}}},
};

/// The split layout of `type`, or nullptr when it has none.
inline const SplitFormat *splitFormatOf(GGMLType type) {
  for (const SplitFormat &f : kSplitFormats)
    if (f.type == type)
      return &f;
  return nullptr;
}

/// The split layout named `name` in an artifact, or nullptr.
inline const SplitFormat *splitFormatNamed(std::string_view name) {
  for (const SplitFormat &f : kSplitFormats)
    if (name == f.name)
      return &f;
  return nullptr;
}

/// Bytes of plane p for `blocks` blocks.
inline uint64_t splitPlaneBytes(const SplitFormat &f, int p, uint64_t blocks) {
  return blocks * f.plane[p].bytes;
}

/// Where plane p starts in an allocation holding `blocks` blocks' planes
/// one after another, each at kSplitPlaneAlign; p = f.planes gives the
/// allocation's size.
inline uint64_t splitPlaneStart(const SplitFormat &f, int p, uint64_t blocks) {
  uint64_t at = 0;
  for (int i = 0; i < p; ++i)
    at += (splitPlaneBytes(f, i, blocks) + kSplitPlaneAlign - 1) /
          kSplitPlaneAlign * kSplitPlaneAlign;
  return at;
}

/// The host reference repack: `count` blocks at `blocks` into planes[p]
/// (each splitPlaneBytes(f, p, count) bytes).
inline void repackSplitHost(const SplitFormat &f, const uint8_t *blocks,
                            uint64_t count, uint8_t *const *planes) {
  for (uint64_t b = 0; b < count; ++b)
    for (int p = 0; p < f.planes; ++p)
      std::memcpy(planes[p] + b * f.plane[p].bytes,
                  blocks + b * f.blockBytes + f.plane[p].offset,
                  f.plane[p].bytes);
}

/// The inverse: the planes back into `count` blocks.
inline void unpackSplitHost(const SplitFormat &f, const uint8_t *const *planes,
                            uint64_t count, uint8_t *blocks) {
  for (uint64_t b = 0; b < count; ++b)
    for (int p = 0; p < f.planes; ++p)
      std::memcpy(blocks + b * f.blockBytes + f.plane[p].offset,
                  planes[p] + b * f.plane[p].bytes, f.plane[p].bytes);
}

/// Whether operand `i` of a step op of kind `kind` (the artifact's op
/// name), when it is a weight, is read by a mat-vec kernel: the only
/// kernels that read a split layout. The compiler gives a weight a split
/// layout only when every use of it is one of these, and the CUDA backend
/// refuses an artifact that has a split weight anywhere else, so both
/// decide by this one rule. A linear's and a fused_linear's weights follow
/// their input; an rms_norm_linear's follow its input and its norm's
/// weight; a swiglu_linear's follow gate and up; an mla_attention's only
/// weight is its output projection; a moe_experts' shared expert
/// (kiln-fuse-shared-expert) is its 2-D weights (`dims`, the weight's
/// rank; the routed experts' are 3-D and keep the file's blocks); a
/// linear_router's is its linear's weight (operand 1; its gate and norm are
/// F32, read when it is bound).
inline bool readsWeightAsMatVec(std::string_view kind, size_t i, size_t dims) {
  if (kind == "linear" || kind == "fused_linear")
    return i >= 1;
  if (kind == "linear_router")
    return i == 1;
  if (kind == "rms_norm_linear" || kind == "swiglu_linear")
    return i >= 2;
  if (kind == "moe_experts")
    return dims == 2;
  return kind == "mla_attention";
}

} // namespace kiln::cuda

#endif // KILN_BACKENDS_CUDA_SPLITLAYOUT_H
