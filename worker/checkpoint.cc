#include "worker/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

namespace dslaunch::worker {

namespace fs = std::filesystem;

namespace {

constexpr int32_t kCheckpointMagic = 0x64736c63;  // "dslc"
constexpr int32_t kCheckpointVersion = 1;
constexpr const char* kComplete = "COMPLETE";

struct ShardHeader {
  int32_t magic, version, rank, world;
  uint64_t begin, count;
};

Status WriteFileDurably(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  // One a crash left behind may be another UID's: made anew, not truncated.
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot write " + tmp, errno);
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status st = ErrnoStatus("cannot write " + tmp, errno);
      ::close(fd);
      return st;
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    return ErrnoStatus("cannot sync " + tmp, errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return ErrnoStatus("cannot rename " + tmp, errno);
  return Status::Ok();
}

void SyncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string StepDir(const std::string& root, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld",
                static_cast<long long>(step));
  return root + "/" + name;
}

std::string RankFile(const std::string& dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank_%05d.bin", rank);
  return dir + "/" + name;
}

nlohmann::json ToJson(const CheckpointState& s, int world, size_t num_params) {
  const LoaderState& l = s.loader;
  const ModelConfig& m = s.model;
  return {{"format", "dslaunch-checkpoint"},
          {"version", 1},
          {"step", s.step},
          {"world_size", world},
          {"train_batch_size", s.train_batch_size},
          {"num_params", num_params},
          {"param_order", "llmc"},
          {"model",
           {{"max_seq_len", m.max_seq_len},
            {"vocab_size", m.vocab_size},
            {"num_layers", m.num_layers},
            {"num_heads", m.num_heads},
            {"channels", m.channels}}},
          {"loader",
           {{"epoch", l.epoch},
            {"shard", l.shard},
            {"position", l.position},
            {"seed", l.seed},
            {"seq_len", l.seq_len},
            {"num_shards", l.num_shards},
            {"shuffle", l.shuffle}}}};
}

// Complete checkpoint directories under root, oldest first.
std::vector<std::string> CompleteCheckpoints(const std::string& root) {
  std::vector<std::string> dirs;
  std::error_code ec;
  for (auto it = fs::directory_iterator(root, ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename();
    if (name.rfind("step_", 0) == 0 && fs::exists(it->path() / kComplete)) {
      dirs.push_back(it->path());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// Creates `dir` (and its parents). Ranks of one job may run as different
// users of one group (OpenShift's arbitrary UIDs with GID 0, one per pod):
// a directory made here is made group-writable too, whatever the umask, so
// that every rank can write its file in it and rank 0 can prune it later.
// A directory that was there already keeps its mode.
Status MakeSharedDirectory(const std::string& dir) {
  std::error_code ec;
  const bool existed = fs::exists(dir, ec);
  fs::create_directories(dir, ec);
  if (ec)
    return DataError("cannot create checkpoint directory " + dir + ": " +
                     ec.message());
  if (!existed)
    fs::permissions(dir, fs::perms::group_all, fs::perm_options::add, ec);
  return Status::Ok();
}

void Prune(const std::string& root, const std::string& newest, int keep) {
  auto complete = CompleteCheckpoints(root);
  if (keep > 0 && static_cast<int>(complete.size()) > keep) {
    for (size_t i = 0; i + keep < complete.size(); ++i)
      fs::remove_all(complete[i]);
  }
  std::error_code ec;
  for (auto it = fs::directory_iterator(root, ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string path = it->path();
    // A crashed save left this behind: older than what just completed.
    if (it->path().filename().string().rfind("step_", 0) == 0 &&
        path < newest && !fs::exists(it->path() / kComplete)) {
      fs::remove_all(path, ec);
    }
  }
}

}  // namespace

StatusOr<std::string> SaveCheckpoint(const std::string& root,
                                     const CheckpointState& state,
                                     const RankShard& shard, int keep,
                                     Comm& comm) {
  const std::string dir = StepDir(root, state.step);
  Status made = Status::Ok();
  if (comm.rank() == 0) {
    made = MakeSharedDirectory(root);
    if (made.ok()) made = MakeSharedDirectory(dir);
  }
  RETURN_IF_ERROR(comm.Barrier());  // it is there, writable by every rank
  RETURN_IF_ERROR(made);
  const size_t count = shard.params.size();
  ShardHeader h{kCheckpointMagic, kCheckpointVersion, comm.rank(),
                comm.size(),      shard.begin,        count};
  std::string bytes(reinterpret_cast<const char*>(&h), sizeof(h));
  for (auto part : {shard.params, shard.m, shard.v}) {
    bytes.append(reinterpret_cast<const char*>(part.data()),
                 count * sizeof(float));
  }
  RETURN_IF_ERROR(WriteFileDurably(RankFile(dir, comm.rank()), bytes));
  RETURN_IF_ERROR(comm.Barrier());  // every rank's file is in place
  if (comm.rank() == 0) {
    nlohmann::json manifest = ToJson(state, comm.size(), state.num_params);
    RETURN_IF_ERROR(
        WriteFileDurably(dir + "/manifest.json", manifest.dump(2) + "\n"));
    RETURN_IF_ERROR(WriteFileDurably(dir + "/" + kComplete, "complete\n"));
    SyncDirectory(dir);
    SyncDirectory(root);
    Prune(root, dir, keep);
  }
  RETURN_IF_ERROR(comm.Barrier());
  return dir;
}

std::optional<std::string> LatestCheckpoint(const std::string& root) {
  auto complete = CompleteCheckpoints(root);
  if (complete.empty()) return std::nullopt;
  return complete.back();
}

StatusOr<CheckpointState> ReadCheckpointState(const std::string& dir) {
  if (!fs::exists(dir + "/" + kComplete)) {
    return DataError("checkpoint " + dir + " is incomplete (no " + kComplete +
                     " marker)");
  }
  std::ifstream f(dir + "/manifest.json");
  auto j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || j.value("format", "") != "dslaunch-checkpoint") {
    return DataError(dir +
                     "/manifest.json: not a dslaunch checkpoint manifest");
  }
  CheckpointState s;
  try {
    s.step = j.at("step");
    s.num_params = j.at("num_params");
    s.train_batch_size = j.value("train_batch_size", int64_t{0});
    s.world_size = j.value("world_size", 0);
    const auto& m = j.at("model");
    s.model = ModelConfig::Make(m.at("max_seq_len"), m.at("vocab_size"),
                                m.at("num_layers"), m.at("num_heads"),
                                m.at("channels"));
    const auto& l = j.at("loader");
    s.loader.epoch = l.at("epoch");
    s.loader.shard = l.at("shard");
    s.loader.position = l.at("position");
    s.loader.seed = l.at("seed");
    s.loader.seq_len = l.at("seq_len");
    s.loader.num_shards = l.at("num_shards");
    s.loader.shuffle = l.at("shuffle");
  } catch (const nlohmann::json::exception& e) {
    return DataError(dir + "/manifest.json: " + e.what());
  }
  return s;
}

Status ReadCheckpointRange(const std::string& dir, const char* which,
                           size_t begin, std::span<float> out) {
  const int part = !std::strcmp(which, "params") ? 0
                   : !std::strcmp(which, "m")    ? 1
                                                 : 2;
  const size_t end = begin + out.size();
  size_t covered = 0;
  for (int rank = 0;; ++rank) {
    const std::string path = RankFile(dir, rank);
    std::ifstream f(path, std::ios::binary);
    if (!f) break;
    ShardHeader h{};
    if (!f.read(reinterpret_cast<char*>(&h), sizeof(h)) ||
        h.magic != kCheckpointMagic || h.version != kCheckpointVersion ||
        h.rank != rank) {
      return DataError(path + ": not a dslaunch checkpoint shard");
    }
    const size_t b = std::max<size_t>(begin, h.begin),
                 e = std::min<size_t>(end, h.begin + h.count);
    if (b >= e) continue;
    f.seekg(static_cast<std::streamoff>(
        sizeof(h) + (part * h.count + (b - h.begin)) * sizeof(float)));
    if (!f.read(reinterpret_cast<char*>(out.data() + (b - begin)),
                static_cast<std::streamsize>((e - b) * sizeof(float)))) {
      return DataError(path + ": truncated");
    }
    covered += e - b;
  }
  if (covered != out.size()) {
    return DataError(dir + ": the rank files cover " + std::to_string(covered) +
                     " of " + std::to_string(out.size()) +
                     " requested elements");
  }
  return Status::Ok();
}

}  // namespace dslaunch::worker
