// worker/model_file.h: llm.c model file export and import, and its errors.
#include "worker/model_file.h"

#include <gtest/gtest.h>
#include <unistd.h>  // getpid

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "tests/worker/model_test_util.h"

namespace dslaunch::worker {
namespace {

// Unique per process: other runs of this binary may share the directory.
std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/dsl_model_test_" + std::to_string(getpid()) +
         "_" + name + ".bin";
}

std::vector<char> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

void WriteBytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), bytes.size());
}

TEST(ModelFile, ExportImportRoundTripIsBitExact) {
  auto m = NewModel(Tiny(), 5);
  Perturb(*m, 6);
  const std::string path = TempPath("roundtrip");
  ASSERT_TRUE(WriteModelFile(path, *m).ok());
  const std::vector<char> bytes = ReadBytes(path);
  EXPECT_EQ(bytes.size(), 1024 + 4 * m->layout().num_params());
  int32_t header[8];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(std::vector<int32_t>(header, header + 8),
            (std::vector<int32_t>{20240326, 3, 8, 67, 2, 2, 16, 128}));

  StatusOr<std::unique_ptr<Model>> back = ReadModelFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ((*back)->config(), m->config());
  EXPECT_EQ(std::memcmp((*back)->params().data(), m->params().data(),
                        m->params().size_bytes()),
            0);
  // Through the layer-major order and back: the same file.
  StatusOr<std::unique_ptr<Model>> lm =
      ReadModelFile(path, ParamOrder::kLayerMajor);
  ASSERT_TRUE(lm.ok());
  const std::string path2 = TempPath("roundtrip2");
  ASSERT_TRUE(WriteModelFile(path2, **lm).ok());
  EXPECT_EQ(ReadBytes(path2), bytes);
  std::remove(path.c_str());
  std::remove(path2.c_str());
}

// Writes a valid file, applies `edit` to its bytes, and returns the import
// error.
Status ImportEdited(const std::string& name,
                    const std::function<void(std::vector<char>&)>& edit) {
  auto m = NewModel(Tiny(), 5);
  const std::string path = TempPath(name);
  EXPECT_TRUE(WriteModelFile(path, *m).ok());
  std::vector<char> bytes = ReadBytes(path);
  edit(bytes);
  WriteBytes(path, bytes);
  StatusOr<std::unique_ptr<Model>> r = ReadModelFile(path);
  std::remove(path.c_str());
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path), std::string::npos)
      << r.status().ToString();
  return r.status();
}

TEST(ModelFile, ImportErrorsNameTheFile) {
  Status s = ImportEdited("magic", [](auto& b) { b[0] ^= 1; });
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find("magic"), std::string::npos) << s.ToString();

  s = ImportEdited("version", [](auto& b) { b[4] = 5; });
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find("version 5"), std::string::npos) << s.ToString();

  s = ImportEdited("truncated", [](auto& b) { b.resize(1024 + 4 * 1000 + 2); });
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.ToString();

  s = ImportEdited("short_header", [](auto& b) { b.resize(100); });
  EXPECT_EQ(s.code(), StatusCode::kDataError);

  s = ImportEdited("trailing", [](auto& b) { b.push_back(0); });
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find("trailing"), std::string::npos) << s.ToString();

  s = ImportEdited("bad_heads", [](auto& b) { b[20] = 3; });  // NH 3, C 16
  EXPECT_EQ(s.code(), StatusCode::kDataError);

  const std::string missing = TempPath("does_not_exist");
  StatusOr<std::unique_ptr<Model>> r = ReadModelFile(missing);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(missing), std::string::npos);
}

TEST(ModelFile, ParamsIntoAModelOfAnotherShapeAreRejected) {
  auto m = NewModel(Tiny(), 5);
  const std::string path = TempPath("shape");
  ASSERT_TRUE(WriteModelFile(path, *m).ok());
  auto other = NewModel(ModelConfig::Make(8, 67, 3, 2, 16), 5);
  const Status s = ReadModelFileParams(path, other->layout(), other->params());
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find("L 2"), std::string::npos) << s.ToString();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace dslaunch::worker
