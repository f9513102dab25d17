//===- RandomTest.cpp - FNV-1a, the digest of seeds and results -----------===//
//
// fnv1a seeds the synthesiser's tensors, checksums artifacts and digests
// kiln-run --bench's logits, so it must be the published 64-bit FNV-1a:
// the specification's test vectors, continuation, and the bench's use on
// float32 bytes (the value Python computes from the same little-endian
// bytes, as from a --logits-out file).
//
//===----------------------------------------------------------------------===//
#include "support/Random.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

using namespace kiln;

TEST(Fnv1a, PublishedVectors) {
  EXPECT_EQ(fnv1a(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a("foobar"), 0x85944171f73967e8ull);
}

TEST(Fnv1a, ContinuesFromAHash) {
  EXPECT_EQ(fnv1a("bar", fnv1a("foo")), fnv1a("foobar"));
}

TEST(Fnv1a, OfFloatBytes) {
  // {1.0f, -2.5f} little-endian: 00 00 80 3f 00 00 20 c0.
  const float values[2] = {1.0f, -2.5f};
  std::string bytes(sizeof values, '\0');
  std::memcpy(bytes.data(), values, sizeof values);
  ASSERT_EQ(bytes, std::string("\x00\x00\x80\x3f\x00\x00\x20\xc0", 8));
  EXPECT_EQ(fnv1a(bytes), 0x09e629ee2dfdb3f8ull);
}
