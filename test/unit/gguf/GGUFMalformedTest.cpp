//===- GGUFMalformedTest.cpp - The reader on malformed images
//--------------===//
//
// Each case builds a small image in memory that breaks one rule and pins the
// field and problem of the error. A case also passes if the reader rejects
// the image for the intended reason only: the message must name the field.
//
//===----------------------------------------------------------------------===//
#include "GGUFBytes.h"
#include "gguf/GGUFFile.h"

#include <gtest/gtest.h>

using namespace kiln;
using namespace kiln::gguf;
using kiln::gguf::test::Bytes;

namespace {

constexpr uint32_t kF32 = 0, kQ4K = 12;

std::string openError(const Bytes &b) {
  Expected<GGUFFile> file = GGUFFile::fromBytes("bad.gguf", b.data);
  return file ? std::string("opened without error") : file.error().message();
}

/// One F32 tensor {4} at offset 0 with data present: a valid image.
Bytes validImage() {
  Bytes b;
  b.header(1, 1).kvU32("k", 1).tensor("t", {4}, kF32, 0).padTo(32, 16);
  return b;
}

} // namespace

TEST(GGUFMalformed, ValidImageOpens) {
  Expected<GGUFFile> file = GGUFFile::fromBytes("ok.gguf", validImage().data);
  ASSERT_TRUE(file) << file.error().message();
  EXPECT_EQ(file->tensors()[0].fileOffset, file->dataOffset());
}

TEST(GGUFMalformed, Header) {
  EXPECT_EQ(openError(Bytes()),
            "bad.gguf: magic: file ends inside the magic (at byte 0 of 0)");
  Bytes wrongMagic;
  wrongMagic.u32(0x46554746).u32(3).u64(0).u64(0);
  EXPECT_EQ(openError(wrongMagic),
            "bad.gguf: magic: not a GGUF file (starts with \"FGUF\")");
  EXPECT_EQ(openError(Bytes().header(0, 0, 1)),
            "bad.gguf: version: GGUF version 1 is not supported (only "
            "versions 2 and 3)");
  EXPECT_NE(openError(Bytes().header(0, 0, 0x03000000)).find("big-endian"),
            std::string::npos);
  EXPECT_NE(openError(Bytes().header(0, 0, 4))
                .find("unsupported GGUF "
                      "version 4"),
            std::string::npos);
  Bytes truncated = Bytes().header(0, 0);
  truncated.data.resize(12);
  EXPECT_NE(openError(truncated).find("tensor_count: file ends inside"),
            std::string::npos);
  EXPECT_NE(openError(Bytes().header(0, 1ull << 60))
                .find("kv_count: metadata count 1152921504606846976 cannot "
                      "fit"),
            std::string::npos);
  EXPECT_NE(openError(Bytes().header(~0ull, 0)).find("tensor_count"),
            std::string::npos);
  // Version 2 has the same layout and is accepted.
  EXPECT_EQ(openError(Bytes().header(0, 0, 2)), "opened without error");
}

TEST(GGUFMalformed, Metadata) {
  EXPECT_NE(openError(Bytes().header(0, 1).str("a-long-key"))
                .find("a-long-key: file ends inside the value type"),
            std::string::npos);
  EXPECT_NE(openError(Bytes().header(0, 1).str("key").u32(13).u32(0))
                .find("key: unknown value type 13"),
            std::string::npos);
  EXPECT_NE(openError(Bytes().header(0, 1).u64(1000).u64(0))
                .find("metadata key #0: key of 1000 bytes is longer"),
            std::string::npos);
  EXPECT_NE(openError(Bytes().header(0, 1).str("s").u32(8).u64(1ull << 62))
                .find("s: string of 4611686018427387904 bytes is longer"),
            std::string::npos);
  EXPECT_NE(openError(Bytes().header(0, 1).str("a").u32(9).u32(6).u64(~0ull))
                .find("a: array of 18446744073709551615 float32 elements is "
                      "longer"),
            std::string::npos);
  EXPECT_NE(openError(Bytes().header(0, 1).str("a").u32(9).u32(99).u64(0))
                .find("a: unknown array element type 99"),
            std::string::npos);
  EXPECT_NE(
      openError(Bytes().header(0, 1).str("b").u32(7).put<uint8_t>(2).u64(0))
          .find("b: bool value 2"),
      std::string::npos);
  EXPECT_NE(openError(Bytes().header(0, 2).kvU32("k", 1).kvU32("k", 2))
                .find("k: duplicate metadata key"),
            std::string::npos);
  // Arrays of arrays deeper than the limit: an error, not a stack overflow.
  Bytes deep = Bytes().header(0, 1).str("d").u32(9);
  for (int i = 0; i < 100; ++i)
    deep.u32(9).u64(1);
  EXPECT_NE(openError(deep).find("d: arrays nested deeper than 8"),
            std::string::npos);
}

TEST(GGUFMalformed, MetadataElementBudget) {
  // Two u8 arrays that fit the file but together exceed the element budget.
  uint64_t half = kMaxMetadataElements / 2 + 1;
  Bytes b = Bytes().header(0, 2);
  for (const char *key : {"a", "b"}) {
    b.str(key).u32(9).u32(0).u64(half);
    b.data.resize(b.data.size() + half, 0);
  }
  EXPECT_EQ(openError(b), "bad.gguf: b: metadata holds more than 16777216 "
                          "array elements in all");
}

TEST(GGUFMalformed, Alignment) {
  auto image = [](Bytes kv) {
    Bytes b = Bytes().header(0, 1);
    b.data.insert(b.data.end(), kv.data.begin(), kv.data.end());
    return b;
  };
  EXPECT_EQ(openError(image(Bytes().kvU32("general.alignment", 48))),
            "bad.gguf: general.alignment: alignment 48 is not a power of two");
  EXPECT_NE(openError(image(Bytes().kvU32("general.alignment", 0)))
                .find("alignment 0 is not a power of two"),
            std::string::npos);
  EXPECT_EQ(openError(image(Bytes().str("general.alignment").u32(10).u64(64))),
            "bad.gguf: general.alignment: must be uint32, not uint64");
  EXPECT_EQ(openError(image(Bytes().kvU32("general.alignment", 1))),
            "opened without error");
}

TEST(GGUFMalformed, TensorInfos) {
  auto one = [](std::vector<uint64_t> dims, uint32_t type, uint64_t offset,
                uint64_t data) {
    Bytes b;
    b.header(1, 0).tensor("w", std::move(dims), type, offset).padTo(32, data);
    return openError(b);
  };
  EXPECT_EQ(one({4}, 77, 0, 16), "bad.gguf: w: unknown ggml type id 77");
  EXPECT_EQ(one({4, 0}, kF32, 0, 16), "bad.gguf: w: dimension 1 is 0");
  EXPECT_EQ(one({1, 1, 1, 1, 1}, kF32, 0, 16),
            "bad.gguf: w: 5 dimensions (at most 4)");
  EXPECT_EQ(one({192, 2}, kQ4K, 0, 1024),
            "bad.gguf: w: ne[0] = 192 is not a multiple of the Q4_K block "
            "size 256");
  EXPECT_EQ(one({1ull << 32, 1ull << 32, 2}, kF32, 0, 16),
            "bad.gguf: w: product of dimensions overflows 64 bits");
  EXPECT_EQ(one({1ull << 62, 2}, kF32, 0, 16),
            "bad.gguf: w: data size overflows 64 bits");
  EXPECT_NE(one({4}, kF32, 0, 15).find("w: data (offset 0, 16 bytes"),
            std::string::npos);
  EXPECT_NE(one({4}, kF32, ~0ull - 31, 16).find("lies past the end"),
            std::string::npos);
  EXPECT_EQ(one({4}, kF32, 8, 64),
            "bad.gguf: w: data offset 8 is not a multiple of the alignment "
            "32");
  // ggml allows dims of 1 and zero dims (a scalar).
  EXPECT_EQ(one({1, 1, 1, 1}, kF32, 0, 4), "opened without error");
  EXPECT_EQ(one({}, kF32, 0, 4), "opened without error");

  Bytes dup;
  dup.header(2, 0)
      .tensor("w", {4}, kF32, 0)
      .tensor("w", {4}, kF32, 32)
      .padTo(32, 64);
  EXPECT_EQ(openError(dup), "bad.gguf: w: duplicate tensor name");
  Bytes overlap;
  overlap.header(2, 0)
      .tensor("a", {16}, kF32, 0)
      .tensor("b", {4}, kF32, 32)
      .padTo(32, 64);
  EXPECT_EQ(openError(overlap), "bad.gguf: b: data overlaps that of tensor a");
  Bytes truncatedName;
  truncatedName.header(1, 0).u64(50).u64(0).u64(0);
  EXPECT_NE(openError(truncatedName).find("tensor #0: tensor name of 50"),
            std::string::npos);
}

TEST(GGUFMalformed, FieldsArePrintable) {
  Bytes b;
  b.header(1, 0).tensor("evil\nname", {4}, 77, 0).padTo(32, 16);
  std::string message = openError(b);
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_NE(message.find("evil\\x0aname"), std::string::npos) << message;
}

TEST(GGUFMalformed, EveryTruncationFailsCleanly) {
  // Every prefix of a valid image with metadata of each kind must fail
  // with an error (or open, for the full image) and never crash.
  Bytes b;
  b.header(2, 3)
      .kvU32("general.alignment", 64)
      .str("s")
      .u32(8)
      .str("text")
      .str("a")
      .u32(9)
      .u32(8)
      .u64(2)
      .str("x")
      .str("yz")
      .tensor("t0", {32, 2}, 8, 0)
      .tensor("t1", {3}, kF32, 128)
      .padTo(64, 140);
  ASSERT_EQ(openError(b), "opened without error");
  for (size_t n = 0; n < b.data.size(); ++n) {
    Bytes prefix;
    prefix.data.assign(b.data.begin(), b.data.begin() + n);
    std::string message = openError(prefix);
    EXPECT_NE(message, "opened without error") << "prefix of " << n;
    EXPECT_EQ(message.rfind("bad.gguf: ", 0), 0u) << message;
  }
}
