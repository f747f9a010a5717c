// Our GPT-2 against PyTorch: writes a model file and a batch, runs
// tests/worker/torch_compare.py (float64 PyTorch under /usr/bin/python3) and
// compares the loss and every gradient. Skips without PyTorch there.
#include <gtest/gtest.h>
#include <unistd.h>  // access, getpid

#include <cmath>
#include <cstdio>  // popen
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "worker/model.h"

namespace dslaunch::worker {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

// The absolute source directory (tests/CMakeLists.txt): __FILE__ may be
// relative, e.g. when built through ccache with a base directory.
std::string ScriptPath() {
  return std::string(DSL_TESTS_DIR) + "/worker/torch_compare.py";
}

// Runs `cmd`, returns its exit status and stdout+stderr.
int RunCommand(const std::string& cmd, std::string* out) {
  std::FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  return pclose(p);
}

void WriteBatch(const std::string& path, int B, int T,
                const std::vector<int>& tokens,
                const std::vector<int>& targets) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const int32_t bt[2] = {B, T};
  f.write(reinterpret_cast<const char*>(bt), sizeof(bt));
  f.write(reinterpret_cast<const char*>(tokens.data()), 4 * tokens.size());
  f.write(reinterpret_cast<const char*>(targets.data()), 4 * targets.size());
}

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  std::vector<float> v(static_cast<size_t>(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), 4 * v.size());
  return v;
}

TEST(ModelVsTorch, LossAndEveryGradientMatchPyTorch) {
  if (access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " not found";
  const ModelConfig c = ModelConfig::Make(16, 300, 2, 4, 32);  // Vp 320
  const int B = 2, T = 12;
  StatusOr<std::unique_ptr<Model>> made = Model::Create(c);
  ASSERT_TRUE(made.ok());
  Model& m = **made;
  m.InitParams(11);
  std::mt19937 rng(12);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  for (float& p : m.params()) p += noise(rng);  // off init: every path used
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  std::vector<int> tokens(B * T), targets(B * T);
  for (int& x : tokens) x = tok(rng);
  for (int& x : targets) x = tok(rng);

  const std::string dir =
      ::testing::TempDir() + "/dsl_torch_" + std::to_string(getpid()) + "_";
  const std::string model_path = dir + "model.bin",
                    batch_path = dir + "batch.bin",
                    grads_path = dir + "grads.bin";
  ASSERT_TRUE(WriteModelFile(model_path, m).ok());
  WriteBatch(batch_path, B, T, tokens, targets);
  std::string out;
  const int rc =
      RunCommand(std::string(kPython) + " -I " + ScriptPath() + " " +
                     model_path + " " + batch_path + " " + grads_path,
                 &out);
  if (rc != 0 && out.find("No module named") != std::string::npos) {
    GTEST_SKIP() << "PyTorch not importable by " << kPython << ": " << out;
  }
  ASSERT_EQ(rc, 0) << out;
  double torch_loss = 0, torch_norm = 0;
  ASSERT_EQ(std::sscanf(out.c_str(), "loss=%lf grad_norm=%lf", &torch_loss,
                        &torch_norm),
            2)
      << out;

  m.ZeroGrad();
  const float loss = m.Forward(tokens.data(), targets.data(), B, T);
  m.Backward();
  EXPECT_NEAR(loss, torch_loss, 1e-5 * torch_loss);
  double norm = 0;
  for (float g : m.grads()) norm += static_cast<double>(g) * g;
  EXPECT_NEAR(std::sqrt(norm), torch_norm, 1e-5 * torch_norm);

  const std::vector<float> ref = ReadFloats(grads_path);  // llm.c order
  ASSERT_EQ(ref.size(), m.layout().num_params());
  for (const TensorInfo& t : m.layout().Tensors()) {
    double max_ref = 0, max_err = 0;
    for (size_t i = t.range.begin; i < t.range.end; i++) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
      max_err = std::max(max_err,
                         std::fabs(static_cast<double>(ref[i]) - m.grads()[i]));
    }
    EXPECT_LE(max_err, 1e-4 * max_ref + 1e-9)
        << ParamKindName(t.kind) << "[" << t.layer << "] max |grad| "
        << max_ref;
  }
  for (const std::string& p : {model_path, batch_path, grads_path}) {
    std::remove(p.c_str());
  }
}

}  // namespace
}  // namespace dslaunch::worker
