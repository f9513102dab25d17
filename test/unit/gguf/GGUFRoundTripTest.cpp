//===- GGUFRoundTripTest.cpp - Writer to reader round trips
//----------------===//
#include "gguf/GGUFFile.h"
#include "gguf/GGUFWriter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <sys/stat.h>
#include <unistd.h>

using namespace kiln;
using namespace kiln::gguf;
namespace fs = std::filesystem;

namespace {

/// A fresh folder per test, removed afterwards.
class TempDir {
public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            fmt_name(::testing::UnitTest::GetInstance()->current_test_info());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string &name) const {
    return (path_ / name).string();
  }
  size_t entries() const {
    return std::distance(fs::directory_iterator(path_),
                         fs::directory_iterator());
  }

private:
  static std::string fmt_name(const ::testing::TestInfo *info) {
    return std::string("kiln-gguf-test-") + info->test_suite_name() + "-" +
           info->name() + "-" + std::to_string(getpid());
  }
  fs::path path_;
};

Metadata everyValueType() {
  Metadata m;
  m.emplace_back("u8", Value::u8(250));
  m.emplace_back("i8", Value::signedInt(ValueType::Int8, -100));
  m.emplace_back("u16", Value::unsignedInt(ValueType::UInt16, 65000));
  m.emplace_back("i16", Value::signedInt(ValueType::Int16, -32000));
  m.emplace_back("u32", Value::u32(4000000000u));
  m.emplace_back("i32", Value::i32(-2000000000));
  m.emplace_back("u64", Value::u64(std::numeric_limits<uint64_t>::max()));
  m.emplace_back("i64", Value::i64(std::numeric_limits<int64_t>::min()));
  m.emplace_back("f32", Value::f32(0.1f));
  m.emplace_back("f32.nan",
                 Value::f32(std::numeric_limits<float>::quiet_NaN()));
  m.emplace_back("f64", Value::f64(-1e300));
  m.emplace_back("bool.t", Value::boolean(true));
  m.emplace_back("bool.f", Value::boolean(false));
  m.emplace_back("str", Value::string("gl\xc3\xa9m \n\"5\""));
  m.emplace_back("str.empty", Value::string(""));
  m.emplace_back("arr.str", Value::stringArray({"a", "", "ccc"}));
  m.emplace_back(
      "arr.f32",
      Value::array(ValueType::Float32, {Value::f32(1.5f), Value::f32(-0.0f)}));
  m.emplace_back("arr.i64", Value::array(ValueType::Int64,
                                         {Value::i64(-1), Value::i64(2)}));
  m.emplace_back("arr.bool",
                 Value::array(ValueType::Bool, {Value::boolean(true)}));
  m.emplace_back("arr.empty", Value::array(ValueType::UInt32, {}));
  m.emplace_back("arr.nested",
                 Value::array(ValueType::Array,
                              {Value::array(ValueType::UInt8, {Value::u8(1)}),
                               Value::array(ValueType::UInt8, {})}));
  return m;
}

} // namespace

TEST(GGUFValue, NormalisesToTheStoredWidth) {
  EXPECT_EQ(Value::unsignedInt(ValueType::UInt8, 0x1ff), Value::u8(0xff));
  EXPECT_EQ(*Value::signedInt(ValueType::Int8, 200).asInt(), -56);
  EXPECT_FALSE(Value::i32(-1).asUInt());
  EXPECT_EQ(*Value::i32(7).asUInt(), 7u);
  EXPECT_FALSE(Value::u64(~uint64_t(0)).asInt());
  EXPECT_FALSE(Value::u32(1) == Value::i32(1)) << "types differ";
  EXPECT_EQ(*Value::string("x").asString(), "x");
  EXPECT_EQ(Value::u32(1).asString(), nullptr);
}

TEST(GGUFRoundTrip, EveryValueTypeAndTensor) {
  TempDir dir;
  GGUFWriter writer;
  Metadata expected = everyValueType();
  for (auto &[k, v] : expected)
    writer.addMetadata(k, v);
  writer.addTensor({"q4k", GGMLType::Q4_K, {512, 3, 2}});
  writer.addTensor({"f16", GGMLType::F16, {5}});
  writer.addTensor({"one", GGMLType::F32, {1, 1, 1, 1}});
  unsigned seed = 20240611;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<std::vector<uint8_t>> written;
  std::string path = dir.file("all.gguf");
  uint64_t lastDone = 0, lastTotal = 0;
  int progressCalls = 0;
  Status s = writer.write(
      path,
      [&](size_t, uint64_t, std::span<uint8_t> out) {
        for (uint8_t &b : out)
          b = static_cast<uint8_t>(rng());
        written.emplace_back(out.begin(), out.end());
        return Status::ok();
      },
      [&](uint64_t done, uint64_t total) {
        EXPECT_GE(done, lastDone);
        lastDone = done;
        lastTotal = total;
        ++progressCalls;
      });
  ASSERT_TRUE(s) << s.error().message();
  EXPECT_EQ(progressCalls, 3);
  EXPECT_EQ(lastDone, lastTotal);
  EXPECT_EQ(lastTotal, 144u * 2 * 3 * 2 + 10 + 4);

  Expected<GGUFFile> file = GGUFFile::open(path);
  ASSERT_TRUE(file) << file.error().message();
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(file->alignment(), 32u);
  EXPECT_EQ(file->fileSize(), *writer.fileSize());
  EXPECT_EQ(file->fileSize(), fs::file_size(path));
  ASSERT_EQ(file->metadata().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(file->metadata()[i].first, expected[i].first);
    EXPECT_TRUE(file->metadata()[i].second == expected[i].second)
        << expected[i].first;
  }
  ASSERT_EQ(file->tensors().size(), 3u);
  const TensorInfo *q = file->findTensor("q4k");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GGMLType::Q4_K);
  EXPECT_EQ(q->dims, (std::vector<uint64_t>{512, 3, 2}));
  EXPECT_EQ(q->bytes, 144u * 2 * 6);
  EXPECT_EQ(q->elements, 512u * 6);
  for (size_t i = 0; i < 3; ++i) {
    const TensorInfo &t = file->tensors()[i];
    EXPECT_EQ(t.fileOffset % 32, 0u);
    std::span<const uint8_t> data = file->tensorData(t);
    EXPECT_TRUE(std::equal(data.begin(), data.end(), written[i].begin(),
                           written[i].end()))
        << t.name;
  }
  EXPECT_EQ(dir.entries(), 1u) << "temporary file left behind";
}

class GGUFAlignment : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GGUFAlignment, OffsetsFollowTheAlignment) {
  TempDir dir;
  uint32_t align = GetParam();
  GGUFWriter writer(align);
  writer.addMetadata("general.name", Value::string("x"));
  writer.addTensor({"a", GGMLType::F16, {3}});
  writer.addTensor({"b", GGMLType::Q8_0, {32, 3}});
  writer.addTensor({"c", GGMLType::I8, {7}});
  std::string path = dir.file("a.gguf");
  Status s = writer.write(path, [](size_t i, uint64_t, std::span<uint8_t> out) {
    std::fill(out.begin(), out.end(), static_cast<uint8_t>(i + 1));
    return Status::ok();
  });
  ASSERT_TRUE(s) << s.error().message();
  Expected<GGUFFile> file = GGUFFile::open(path);
  ASSERT_TRUE(file) << file.error().message();
  EXPECT_EQ(file->alignment(), align);
  const Value *key = file->find("general.alignment");
  if (align == 32) {
    EXPECT_EQ(key, nullptr) << "the default is not written";
  } else {
    ASSERT_NE(key, nullptr);
    EXPECT_EQ(key->type(), ValueType::UInt32);
    EXPECT_EQ(*key->asUInt(), align);
  }
  EXPECT_EQ(file->dataOffset() % align, 0u);
  for (const TensorInfo &t : file->tensors()) {
    EXPECT_EQ(t.offset % align, 0u) << t.name;
    for (uint8_t b : file->tensorData(t))
      ASSERT_EQ(b, &t - file->tensors().data() + 1) << t.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Powers, GGUFAlignment,
                         ::testing::Values(1u, 2u, 8u, 32u, 64u, 4096u));

TEST(GGUFWriter, RejectsBadSpecs) {
  auto sizeError = [](GGUFWriter &w) {
    Expected<uint64_t> size = w.fileSize();
    return size ? std::string("no error") : size.error().message();
  };
  {
    GGUFWriter w(48);
    EXPECT_NE(sizeError(w).find("not a power of two"), std::string::npos);
  }
  {
    GGUFWriter w;
    w.addTensor({"t", GGMLType::Q4_K, {192, 2}});
    EXPECT_NE(sizeError(w).find("t: ne[0] = 192 is not a multiple"),
              std::string::npos);
  }
  {
    GGUFWriter w;
    w.addTensor({"t", GGMLType::F32, {2, 0}});
    EXPECT_NE(sizeError(w).find("dimension 1 is 0"), std::string::npos);
  }
  {
    GGUFWriter w;
    w.addTensor({"t", GGMLType::F32, {1, 1, 1, 1, 1}});
    EXPECT_NE(sizeError(w).find("5 dimensions"), std::string::npos);
  }
  {
    GGUFWriter w;
    w.addTensor({"t", GGMLType::F32, {1ull << 40, 1ull << 40}});
    EXPECT_NE(sizeError(w).find("overflows"), std::string::npos);
  }
  {
    GGUFWriter w;
    w.addTensor({"t", GGMLType::F32, {1}});
    w.addTensor({"t", GGMLType::F32, {1}});
    EXPECT_NE(sizeError(w).find("duplicate tensor name"), std::string::npos);
  }
  {
    GGUFWriter w;
    w.addMetadata("k", Value::u8(1));
    w.addMetadata("k", Value::u8(2));
    EXPECT_NE(sizeError(w).find("k: duplicate metadata key"),
              std::string::npos);
  }
  {
    GGUFWriter w;
    w.addMetadata("k", Value::array(ValueType::UInt8, {Value::i32(1)}));
    EXPECT_NE(sizeError(w).find("array of uint8 holds a int32"),
              std::string::npos);
  }
  {
    GGUFWriter w(64);
    w.addMetadata("general.alignment", Value::u32(32));
    EXPECT_NE(sizeError(w).find("aligns to 64"), std::string::npos);
  }
}

TEST(GGUFWriter, FailureLeavesNoFile) {
  TempDir dir;
  GGUFWriter writer;
  writer.addTensor({"a", GGMLType::F32, {4}});
  writer.addTensor({"b", GGMLType::F32, {4}});
  std::string path = dir.file("out.gguf");
  Status s = writer.write(path, [](size_t i, uint64_t, std::span<uint8_t>) {
    return i == 1 ? Status(Error("", "", "source unreadable")) : Status::ok();
  });
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().message(), path + ": b: source unreadable");
  EXPECT_EQ(dir.entries(), 0u) << "the temporary file must be removed";
  EXPECT_FALSE(fs::exists(path));
}

TEST(GGUFWriter, FailureKeepsThePreviousFile) {
  TempDir dir;
  std::string path = dir.file("out.gguf");
  GGUFWriter good;
  good.addMetadata("v", Value::u32(1));
  ASSERT_TRUE(good.write(path, nullptr));
  GGUFWriter bad;
  bad.addTensor({"a", GGMLType::F32, {4}});
  ASSERT_FALSE(bad.write(path, [](size_t, uint64_t, std::span<uint8_t>) {
    return Status(Error("", "", "no"));
  }));
  Expected<GGUFFile> file = GGUFFile::open(path);
  ASSERT_TRUE(file);
  EXPECT_EQ(*file->find("v")->asUInt(), 1u);
  EXPECT_EQ(dir.entries(), 1u);
}

TEST(GGUFWriter, MetadataOnlyFileIsSparse) {
  TempDir dir;
  GGUFWriter writer;
  // 64 MiB of F32 data that is never written.
  writer.addTensor({"big", GGMLType::F32, {4096, 4096}});
  std::string path = dir.file("sparse.gguf");
  ASSERT_TRUE(writer.write(path, nullptr));
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), *writer.fileSize());
  // Allocated blocks (512 bytes each) cover the header page, not the data;
  // tolerance: a few file-system blocks.
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, 1u << 20);
  Expected<GGUFFile> file = GGUFFile::open(path);
  ASSERT_TRUE(file) << file.error().message();
  EXPECT_EQ(file->tensors()[0].bytes, 64u << 20);
}
