#include "worker/model_file.h"

#include <cerrno>   // errno, ENOENT
#include <cstdint>  // int32_t
#include <cstdio>   // FILE, fopen, fread, fwrite, rename
#include <cstring>  // strerror
#include <memory>   // unique_ptr as a FILE closer

namespace dslaunch::worker {

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

StatusOr<FilePtr> OpenForRead(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    std::string m = path + ": " + std::strerror(err);
    return err == ENOENT ? NotFound(m) : DataError(m);
  }
  return FilePtr(f);
}

std::string Describe(const ModelConfig& c) {
  return "maxT " + std::to_string(c.max_seq_len) + ", V " +
         std::to_string(c.vocab_size) + ", Vp " +
         std::to_string(c.padded_vocab_size) + ", L " +
         std::to_string(c.num_layers) + ", NH " + std::to_string(c.num_heads) +
         ", C " + std::to_string(c.channels);
}

StatusOr<ModelConfig> ReadHeader(std::FILE* f, const std::string& path) {
  int32_t h[256];
  if (std::fread(h, sizeof(int32_t), 256, f) != 256) {
    return DataError(path + ": truncated model file (header shorter than " +
                     "1024 bytes)");
  }
  if (h[0] != kModelFileMagic) {
    return DataError(path + ": not an llm.c model file (magic " +
                     std::to_string(h[0]) + ", expected 20240326)");
  }
  if (h[1] != kModelFileVersionFp32) {
    return DataError(path + ": model file version " + std::to_string(h[1]) +
                     " is not supported (only 3, fp32" +
                     (h[1] == 5 ? "; 5 is bf16)" : ")"));
  }
  ModelConfig c;
  c.max_seq_len = h[2];
  c.vocab_size = h[3];
  c.num_layers = h[4];
  c.num_heads = h[5];
  c.channels = h[6];
  c.padded_vocab_size = h[7];
  const Status valid = c.Validate();
  if (!valid.ok()) return DataError(path + ": bad header: " + valid.message());
  return c;
}

}  // namespace

Status WriteModelFile(const std::string& path, const ParamLayout& layout,
                      std::span<const float> params) {
  DSL_CHECK(params.size() == layout.num_params());
  const ModelConfig& c = layout.config();
  int32_t h[256] = {};
  h[0] = kModelFileMagic;
  h[1] = kModelFileVersionFp32;
  h[2] = c.max_seq_len;
  h[3] = c.vocab_size;
  h[4] = c.num_layers;
  h[5] = c.num_heads;
  h[6] = c.channels;
  h[7] = c.padded_vocab_size;
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return ErrnoStatus("cannot create " + tmp, errno);
  bool ok = std::fwrite(h, sizeof(int32_t), 256, f) == 256;
  for (const TensorInfo& t : layout.Tensors()) {
    const size_t n = t.range.size();
    ok = ok &&
         std::fwrite(params.data() + t.range.begin, sizeof(float), n, f) == n;
  }
  int err = errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    return ErrnoStatus("cannot write " + tmp, err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus("cannot rename " + tmp + " to " + path, errno);
  }
  return Status::Ok();
}

StatusOr<ModelConfig> ReadModelFileConfig(const std::string& path) {
  ASSIGN_OR_RETURN(FilePtr f, OpenForRead(path));
  return ReadHeader(f.get(), path);
}

Status ReadModelFileParams(const std::string& path, const ParamLayout& layout,
                           std::span<float> params) {
  DSL_CHECK(params.size() == layout.num_params());
  ASSIGN_OR_RETURN(FilePtr f, OpenForRead(path));
  ASSIGN_OR_RETURN(ModelConfig c, ReadHeader(f.get(), path));
  if (!(c == layout.config())) {
    return DataError(path + ": model is " + Describe(c) + ", expected " +
                     Describe(layout.config()));
  }
  const std::string total = std::to_string(layout.num_params());
  size_t got = 0;
  for (const TensorInfo& t : layout.Tensors()) {
    const size_t n = std::fread(params.data() + t.range.begin, sizeof(float),
                                t.range.size(), f.get());
    got += n;
    if (n != t.range.size()) {
      return DataError(path + ": truncated model file (" + std::to_string(got) +
                       " of " + total + " parameters)");
    }
  }
  if (std::fgetc(f.get()) != EOF) {
    return DataError(path + ": trailing bytes after the " + total +
                     " parameters");
  }
  return Status::Ok();
}

}  // namespace dslaunch::worker
