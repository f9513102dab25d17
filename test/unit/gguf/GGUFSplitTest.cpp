//===- GGUFSplitTest.cpp - Split sets opened as one model
//------------------===//
#include "gguf/GGUFFile.h"
#include "gguf/GGUFWriter.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

using namespace kiln;
using namespace kiln::gguf;
namespace fs = std::filesystem;

namespace {

class SplitSet : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("kiln-gguf-split-" +
         std::string(
             ::testing::UnitTest::GetInstance()->current_test_info()->name()) +
         "-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string part(uint32_t k, uint32_t n, const std::string &stem = "m") {
    return splitPartName((dir_ / stem).string(), k, n);
  }

  /// Writes part k (1-based) of n holding `tensors`; the first part also
  /// holds the model metadata. `no`/`count`/`total` override the split keys.
  void writePart(const std::string &path, uint32_t no, uint32_t count,
                 int32_t total, const std::vector<std::string> &tensors) {
    GGUFWriter w;
    if (no == 0)
      w.addMetadata("general.architecture", Value::string("glm-dsa"));
    w.addMetadata("split.no", Value::unsignedInt(ValueType::UInt16, no));
    w.addMetadata("split.count", Value::unsignedInt(ValueType::UInt16, count));
    w.addMetadata("split.tensors.count", Value::i32(total));
    for (const std::string &name : tensors)
      w.addTensor({name, GGMLType::F32, {8}});
    Status s = w.write(path, [&](size_t i, uint64_t, std::span<uint8_t> out) {
      std::fill(out.begin(), out.end(), static_cast<uint8_t>(no * 16 + i));
      return Status::ok();
    });
    ASSERT_TRUE(s) << s.error().message();
  }

  void writeSet() {
    writePart(part(1, 3), 0, 3, 4, {});
    writePart(part(2, 3), 1, 3, 4, {"a", "b"});
    writePart(part(3, 3), 2, 3, 4, {"c", "d"});
  }

  std::string openError(const std::vector<std::string> &paths) {
    Expected<GGUFModel> m = GGUFModel::open(paths);
    return m ? std::string("opened without error") : m.error().message();
  }

  fs::path dir_;
};

} // namespace

TEST(SplitName, ParsesAndFormats) {
  std::optional<SplitName> n = parseSplitName("d/GLM-5-UD-00002-of-00010.gguf");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->prefix, "d/GLM-5-UD");
  EXPECT_EQ(n->number, 2u);
  EXPECT_EQ(n->count, 10u);
  EXPECT_EQ(splitPartName(n->prefix, 3, 10), "d/GLM-5-UD-00003-of-00010.gguf");
  EXPECT_FALSE(parseSplitName("model.gguf"));
  EXPECT_FALSE(parseSplitName("-00001-of-00002.gguf")) << "empty name";
  EXPECT_FALSE(parseSplitName("m-0001-of-00002.gguf"));
  EXPECT_FALSE(parseSplitName("m-00001-of-0000x.gguf"));
}

TEST_F(SplitSet, AnyPartOpensTheWholeSet) {
  writeSet();
  for (uint32_t k = 1; k <= 3; ++k) {
    Expected<GGUFModel> m = GGUFModel::open({part(k, 3)});
    ASSERT_TRUE(m) << m.error().message();
    ASSERT_EQ(m->parts().size(), 3u);
    EXPECT_EQ(m->parts()[0].path(), part(1, 3)) << "ordered by split.no";
    EXPECT_EQ(m->tensors().size(), 4u);
    EXPECT_EQ(*m->find("general.architecture")->asString(), "glm-dsa");
    std::optional<TensorRef> c = m->findTensor("c");
    ASSERT_TRUE(c);
    EXPECT_EQ(c->part, 2u);
    EXPECT_EQ(m->tensorData(*c)[0], 2 * 16 + 0);
    EXPECT_EQ(m->tensorData(*m->findTensor("b"))[0], 1 * 16 + 1);
  }
}

TEST_F(SplitSet, AllPartsInAnyOrder) {
  writeSet();
  Expected<GGUFModel> m = GGUFModel::open({part(3, 3), part(1, 3), part(2, 3)});
  ASSERT_TRUE(m) << m.error().message();
  EXPECT_EQ(m->info(m->tensors()[0]).name, "a");
}

TEST_F(SplitSet, MissingPart) {
  writeSet();
  fs::remove(part(2, 3));
  std::string e = openError({part(3, 3)});
  EXPECT_NE(e.find("split.count: split part 2 of 3 is missing"),
            std::string::npos)
      << e;
  e = openError({part(1, 3), part(3, 3)});
  EXPECT_NE(e.find("split part 2 of 3 (split.no 1) is missing"),
            std::string::npos)
      << e;
}

TEST_F(SplitSet, InconsistentCounts) {
  writePart(part(1, 2), 0, 2, 2, {"a"});
  writePart(part(2, 2), 1, 2, 3, {"b"});
  std::string e = openError({part(1, 2)});
  EXPECT_NE(e.find("split.tensors.count: split.tensors.count 3 differs"),
            std::string::npos)
      << e;
  writePart(part(2, 2), 1, 2, 3, {"b", "c"});
  writePart(part(1, 2), 0, 2, 3, {});
  EXPECT_EQ(openError({part(1, 2)}),
            part(1, 2) + ": split.tensors.count: split.tensors.count is 3 "
                         "but the parts hold 2 tensors");
}

TEST_F(SplitSet, CountDisagreesAcrossParts) {
  writePart(part(1, 2), 0, 2, 2, {"a"});
  writePart(part(2, 2, "other"), 1, 3, 2, {"b"});
  std::string e = openError({part(1, 2), part(2, 2, "other")});
  EXPECT_NE(e.find("split.count 3 differs from 2"), std::string::npos) << e;
}

TEST_F(SplitSet, DuplicateTensorAcrossParts) {
  writePart(part(1, 2), 0, 2, 2, {"a"});
  writePart(part(2, 2), 1, 2, 2, {"a"});
  EXPECT_EQ(openError({part(1, 2)}),
            part(2, 2) + ": a: tensor also in " + part(1, 2));
}

TEST_F(SplitSet, NameDisagreesWithSplitNo) {
  writePart(part(1, 2), 0, 2, 2, {"a"});
  writePart(part(2, 2), 0, 2, 2, {"b"});
  std::string e = openError({part(1, 2), part(2, 2)});
  EXPECT_NE(e.find("file name says part 2 of 2 but the file is split.no 0"),
            std::string::npos)
      << e;
}

TEST_F(SplitSet, SplitNoOutOfRangeAndStrayFile) {
  std::string odd = (dir_ / "odd.gguf").string();
  writePart(odd, 5, 2, 1, {"a"});
  EXPECT_EQ(openError({odd}),
            odd + ": split.no: split.no 5 is not below split.count 2");
  std::string lone = (dir_ / "lone.gguf").string();
  GGUFWriter w;
  ASSERT_TRUE(w.write(lone, nullptr));
  writePart(part(1, 2), 0, 2, 1, {"a"});
  std::string e = openError({part(1, 2), lone});
  EXPECT_NE(e.find("lone.gguf: split.count: given with other files"),
            std::string::npos)
      << e;
  // A part whose name hides its siblings cannot be completed.
  std::string renamed = (dir_ / "renamed.gguf").string();
  fs::copy_file(part(1, 2), renamed);
  e = openError({renamed});
  EXPECT_NE(e.find("cannot be found"), std::string::npos) << e;
}
