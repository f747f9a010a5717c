#include "worker/train_config.h"

#include <yaml-cpp/yaml.h>  // YAML::Load, Node, convert, Exception

#include <cerrno>   // errno
#include <cstring>  // strerror
#include <fstream>  // ifstream
#include <limits>   // numeric_limits
#include <set>      // set
#include <sstream>  // ostringstream
#include <utility>  // move

#include "worker/config_values.h"
#include "worker/lr_schedule.h"

namespace dslaunch::worker {
namespace {

using config_values::Choice;
using config_values::Describe;
using config_values::Entry;
using config_values::ReadBatchSize;
using config_values::ReadBool;
using config_values::ReadChoice;
using config_values::ReadDouble;
using config_values::ReadInt;
using config_values::ReadInt64;
using config_values::ReadOptionalDouble;
using config_values::ReadString;
using config_values::TypeError;
using config_values::ValueError;

constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

constexpr Choice<OptimizerType> kOptimizers[] = {
    {"Adam", OptimizerType::kAdam}, {"AdamW", OptimizerType::kAdamW}};
constexpr Choice<SchedulerType> kSchedulers[] = {
    {"WarmupLR", SchedulerType::kWarmupLR},
    {"WarmupDecayLR", SchedulerType::kWarmupDecayLR},
    {"WarmupCosineLR", SchedulerType::kWarmupCosineLR}};
constexpr Choice<WarmupType> kWarmupTypes[] = {{"log", WarmupType::kLog},
                                               {"linear", WarmupType::kLinear}};
constexpr Choice<OffloadDevice> kDevices[] = {{"none", OffloadDevice::kNone},
                                              {"cpu", OffloadDevice::kCpu}};

Status ReadBetas(const Entry& e, TrainConfig* c) {
  if (!e.node.IsSequence() || e.node.size() != 2) {
    return TypeError(e, "a list of two numbers");
  }
  const YAML::Node first = e.node[0];
  const YAML::Node second = e.node[1];
  RETURN_IF_ERROR(
      ReadDouble(Entry{first, e.key, e.where}, &c->optimizer.beta1));
  return ReadDouble(Entry{second, e.key, e.where}, &c->optimizer.beta2);
}

struct Preset {
  const char* name;
  int n_layer, n_head, n_embd;
};
// llm.c's GPT-2 depths (d4 extends its 64-channels-per-layer pattern).
constexpr Preset kPresets[] = {{"d4", 4, 4, 256},     {"d6", 6, 6, 384},
                               {"d12", 12, 12, 768},  {"d24", 24, 16, 1024},
                               {"d36", 36, 20, 1280}, {"d48", 48, 25, 1600}};

const Preset* FindPreset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

Status ReadPreset(const Entry& e, TrainConfig* c) {
  std::string name;
  RETURN_IF_ERROR(ReadString(e, &name));
  if (!FindPreset(name)) {
    return ValueError(
        e, "unknown preset '" + name + "' (d4, d6, d12, d24, d36, d48)");
  }
  c->model.preset = name;
  return Status::Ok();
}

Status ReadResume(const Entry& e, TrainConfig* c) {
  bool flag = false;
  if (e.node.IsScalar() && e.node.Tag() != "!" &&
      YAML::convert<bool>::decode(e.node, flag)) {
    c->checkpoint.resume = flag ? "latest" : "";
    return Status::Ok();
  }
  return ReadString(e, &c->checkpoint.resume);
}

using E = const Entry&;
using C = TrainConfig*;
using Setter = Status (*)(E, C);
struct KeySpec {
  std::string_view key;
  Setter set;
};

// Every leaf key dsworker reads. Mappings that hold them are in kSections.
// KEY(name, reader, args...) reads `name` with reader(entry, args...), where
// the args may use `c`, the config being filled.
#define KEY(name, reader, ...)                            \
  {                                                       \
    name, [](E e, C c) { return reader(e, __VA_ARGS__); } \
  }
const KeySpec kKeys[] = {
    KEY("train_batch_size", ReadBatchSize, &c->batch.given_train_batch_size),
    KEY("train_micro_batch_size_per_gpu", ReadBatchSize,
        &c->batch.given_micro_batch_per_gpu),
    KEY("gradient_accumulation_steps", ReadBatchSize,
        &c->batch.given_gradient_accumulation_steps),
    KEY("gradient_clipping", ReadDouble, &c->gradient_clipping),
    KEY("steps_per_print", ReadInt, 1, kMaxInt, &c->steps_per_print),
    KEY("optimizer.type", ReadChoice, kOptimizers, &c->optimizer.type, true),
    KEY("optimizer.params.lr", ReadDouble, &c->optimizer.lr),
    KEY("optimizer.params.betas", ReadBetas, c),
    KEY("optimizer.params.eps", ReadDouble, &c->optimizer.eps),
    KEY("optimizer.params.weight_decay", ReadDouble,
        &c->optimizer.weight_decay),
    KEY("optimizer.params.adam_w_mode", ReadBool, &c->optimizer.adam_w_mode),
    KEY("scheduler.type", ReadChoice, kSchedulers, &c->scheduler.type),
    KEY("scheduler.params.warmup_min_lr", ReadDouble,
        &c->scheduler.warmup_min_lr),
    KEY("scheduler.params.warmup_max_lr", ReadOptionalDouble,
        &c->scheduler.warmup_max_lr),
    KEY("scheduler.params.warmup_num_steps", ReadInt, 0, kMaxInt,
        &c->scheduler.warmup_num_steps),
    KEY("scheduler.params.warmup_type", ReadChoice, kWarmupTypes,
        &c->scheduler.warmup_type),
    KEY("scheduler.params.total_num_steps", ReadInt, 1, kMaxInt,
        &c->scheduler.total_num_steps),
    KEY("scheduler.params.warmup_min_ratio", ReadDouble,
        &c->scheduler.warmup_min_ratio),
    KEY("scheduler.params.cos_min_ratio", ReadDouble,
        &c->scheduler.cos_min_ratio),
    KEY("fp16.enabled", ReadBool, &c->fp16.enabled),
    KEY("fp16.loss_scale", ReadDouble, &c->fp16.loss_scale),
    KEY("fp16.initial_scale_power", ReadInt, 0, 64,
        &c->fp16.initial_scale_power),
    KEY("fp16.loss_scale_window", ReadInt, 1, kMaxInt,
        &c->fp16.loss_scale_window),
    KEY("fp16.hysteresis", ReadInt, 1, kMaxInt, &c->fp16.hysteresis),
    KEY("fp16.min_loss_scale", ReadDouble, &c->fp16.min_loss_scale),
    KEY("bf16.enabled", ReadBool, &c->bf16),
    KEY("zero_optimization.stage", ReadInt, 0, 3, &c->zero.stage),
    KEY("zero_optimization.reduce_bucket_size", ReadInt, 1, kMaxInt64,
        &c->zero.reduce_bucket_size),
    KEY("zero_optimization.allgather_bucket_size", ReadInt, 1, kMaxInt64,
        &c->zero.allgather_bucket_size),
    KEY("zero_optimization.overlap_comm", ReadBool, &c->zero.overlap_comm),
    KEY("zero_optimization.contiguous_gradients", ReadBool,
        &c->zero.contiguous_gradients),
    KEY("zero_optimization.offload_optimizer.device", ReadChoice, kDevices,
        &c->zero.offload_optimizer),
    KEY("zero_optimization.offload_param.device", ReadChoice, kDevices,
        &c->zero.offload_param),
    KEY("model.preset", ReadPreset, c),
    KEY("model.n_layer", ReadInt, 1, kMaxInt, &c->model.n_layer),
    KEY("model.n_head", ReadInt, 1, kMaxInt, &c->model.n_head),
    KEY("model.n_embd", ReadInt, 1, kMaxInt, &c->model.n_embd),
    KEY("model.seq_len", ReadInt, 1, kMaxInt, &c->model.seq_len),
    // Token shards hold uint16 ids.
    KEY("model.vocab_size", ReadInt, 1, 65536, &c->model.vocab_size),
    KEY("data.train", ReadString, &c->data.train),
    KEY("data.val", ReadString, &c->data.val),
    KEY("data.shuffle", ReadBool, &c->data.shuffle),
    KEY("train.steps", ReadInt, 0, kMaxInt64, &c->train.steps),
    KEY("train.seed", ReadInt, 0, kMaxInt64, &c->train.seed),
    KEY("train.eval_every", ReadInt, 0, kMaxInt64, &c->train.eval_every),
    KEY("checkpoint.dir", ReadString, &c->checkpoint.dir),
    KEY("checkpoint.every", ReadInt, 0, kMaxInt64, &c->checkpoint.every),
    KEY("checkpoint.keep", ReadInt, 0, kMaxInt, &c->checkpoint.keep),
    KEY("checkpoint.resume", ReadResume, c),
    KEY("tensorboard.enabled", ReadBool, &c->tensorboard.enabled),
    KEY("tensorboard.output_path", ReadString, &c->tensorboard.output_path),
    KEY("tensorboard.job_name", ReadString, &c->tensorboard.job_name),
};
#undef KEY

constexpr std::string_view kSections[] = {"optimizer",
                                          "optimizer.params",
                                          "scheduler",
                                          "scheduler.params",
                                          "fp16",
                                          "bf16",
                                          "zero_optimization",
                                          "zero_optimization.offload_optimizer",
                                          "zero_optimization.offload_param",
                                          "model",
                                          "data",
                                          "train",
                                          "checkpoint",
                                          "tensorboard"};

const KeySpec* FindKey(std::string_view key) {
  for (const KeySpec& spec : kKeys) {
    if (spec.key == key) return &spec;
  }
  return nullptr;
}

bool IsSection(std::string_view key) {
  return std::find(std::begin(kSections), std::end(kSections), key) !=
         std::end(kSections);
}

Status WalkMap(const YAML::Node& map, const std::string& prefix,
               const std::string& override_where, TrainConfig* c);

// Reads one key: a leaf through its setter, a section by walking it, and
// anything else becomes an "unknown key" warning.
Status Visit(const YAML::Node& node, const std::string& key,
             const std::string& where, const std::string& override_where,
             TrainConfig* c) {
  if (const KeySpec* spec = FindKey(key)) {
    c->sources[key] = where;
    return spec->set(Entry{node, key, where}, c);
  }
  if (!IsSection(key)) {
    c->warnings.push_back(where + ": unknown key '" + key + "'");
    return Status::Ok();
  }
  if (node.IsNull()) return Status::Ok();  // `"scheduler": null`
  if (!node.IsMap()) return TypeError(Entry{node, key, where}, "a mapping");
  c->sources[key] = where;
  return WalkMap(node, key, override_where, c);
}

// `override_where` replaces file:line for the keys of an override's value.
Status WalkMap(const YAML::Node& map, const std::string& prefix,
               const std::string& override_where, TrainConfig* c) {
  std::set<std::string> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string name = it->first.Scalar();
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    const std::string where =
        !override_where.empty()
            ? override_where
            : c->path + ":" + std::to_string(it->first.Mark().line + 1);
    if (!seen.insert(name).second) {
      return DataError(where + ": duplicate key '" + key + "'");
    }
    RETURN_IF_ERROR(Visit(it->second, key, where, override_where, c));
  }
  return Status::Ok();
}

std::string Where(const TrainConfig& c, const std::string& key) {
  auto it = c.sources.find(key);
  return it != c.sources.end() ? it->second : c.path;
}

// DeepSpeed's _set_batch_related_parameters and _batch_assertion, with the
// divisibility failures named instead of surfacing as a product mismatch.
Status ResolveBatch(TrainConfig* c) {
  BatchConfig& b = c->batch;
  const int64_t w = b.world_size;
  const std::string ws = " * world_size " + std::to_string(w);
  const std::string at = Where(*c, "train_batch_size") + ": ";
  int64_t t = b.given_train_batch_size.value_or(0);
  int64_t m = b.given_micro_batch_per_gpu.value_or(0);
  int64_t g = b.given_gradient_accumulation_steps.value_or(0);
  auto divides = [&](int64_t divisor, const std::string& what) {
    if (t % divisor == 0) return Status::Ok();
    return DataError(at + "train_batch_size " + std::to_string(t) +
                     " is not divisible by " + what);
  };
  if (t == 0 && m == 0) {
    return DataError(c->path +
                     ": train_batch_size or "
                     "train_micro_batch_size_per_gpu is required");
  }
  if (t != 0 && m != 0 && g == 0) {
    RETURN_IF_ERROR(divides(
        m * w, "train_micro_batch_size_per_gpu " + std::to_string(m) + ws));
    g = t / (m * w);
  } else if (t != 0 && m == 0 && g != 0) {
    RETURN_IF_ERROR(divides(
        g * w, "gradient_accumulation_steps " + std::to_string(g) + ws));
    m = t / (g * w);
  } else if (t != 0 && m == 0) {
    RETURN_IF_ERROR(divides(w, "world_size " + std::to_string(w)));
    g = 1;
    m = t / w;
  } else if (t == 0) {
    if (g == 0) g = 1;
    t = m * g * w;
  }
  if (t != m * g * w) {
    return DataError(at + "train_batch_size " + std::to_string(t) +
                     " != train_micro_batch_size_per_gpu " + std::to_string(m) +
                     " * gradient_accumulation_steps " + std::to_string(g) +
                     ws + " (= " + std::to_string(m * g * w) + ")");
  }
  if (t > kMaxInt) return DataError(at + "train_batch_size is too large");
  b.train_batch_size = static_cast<int>(t);
  b.micro_batch_per_gpu = static_cast<int>(m);
  b.gradient_accumulation_steps = static_cast<int>(g);
  return Status::Ok();
}

Status CheckScheduler(const TrainConfig& c) {
  const SchedulerConfig& s = c.scheduler;
  if (s.type == SchedulerType::kNone) {
    if (!c.sources.count("scheduler")) return Status::Ok();
    return DataError(Where(c, "scheduler") +
                     ": scheduler.type is required in a scheduler section");
  }
  if (s.type == SchedulerType::kWarmupLR) return Status::Ok();
  if (!c.sources.count("scheduler.params.total_num_steps")) {
    return DataError(Where(c, "scheduler.type") +
                     ": scheduler.params.total_num_steps is required by " +
                     SchedulerName(s.type));
  }
  if (s.type == SchedulerType::kWarmupCosineLR &&
      s.total_num_steps <= WarmupSteps(s)) {
    return DataError(Where(c, "scheduler.params.total_num_steps") +
                     ": scheduler.params.total_num_steps " +
                     std::to_string(s.total_num_steps) +
                     " must exceed warmup_num_steps " +
                     std::to_string(WarmupSteps(s)) + " for WarmupCosineLR");
  }
  return Status::Ok();
}

// Fills the shape from the preset where no explicit key was given.
Status ResolveModel(TrainConfig* c) {
  const Preset* preset = FindPreset(c->model.preset);
  DSL_CHECK(preset != nullptr);  // ReadPreset accepts only known names
  if (!c->sources.count("model.n_layer")) c->model.n_layer = preset->n_layer;
  if (!c->sources.count("model.n_head")) c->model.n_head = preset->n_head;
  if (!c->sources.count("model.n_embd")) c->model.n_embd = preset->n_embd;
  if (c->model.n_embd % c->model.n_head != 0) {
    return DataError(Where(*c, "model.n_embd") + ": model.n_embd " +
                     std::to_string(c->model.n_embd) +
                     " is not divisible by model.n_head " +
                     std::to_string(c->model.n_head));
  }
  return Status::Ok();
}

// Cross-key checks, run after the file and again after each override.
Status Finalize(TrainConfig* c) {
  RETURN_IF_ERROR(ResolveBatch(c));
  if (c->fp16.enabled && c->bf16) {
    return DataError(Where(*c, "bf16.enabled") +
                     ": fp16.enabled and bf16.enabled are both true; "
                     "enable at most one");
  }
  RETURN_IF_ERROR(CheckScheduler(*c));
  return ResolveModel(c);
}

// Settings that are legal but have no effect, as DeepSpeed warns of them.
void AddWarnings(TrainConfig* c) {
  const std::string_view prefix = "scheduler.params.";
  for (const auto& [key, where] : c->sources) {
    if (key.rfind(prefix, 0) != 0 || key == "scheduler.params") continue;
    if (!SchedulerUses(c->scheduler.type, key.substr(prefix.size()))) {
      c->warnings.push_back(where + ": " + key + " is not used by " +
                            SchedulerName(c->scheduler.type));
    }
  }
  const SchedulerConfig& s = c->scheduler;
  if (s.type == SchedulerType::kWarmupDecayLR &&
      s.total_num_steps < WarmupSteps(s)) {
    c->warnings.push_back(Where(*c, "scheduler.params.total_num_steps") +
                          ": total_num_steps is less than warmup_num_steps");
  }
  if (c->zero.offload_param != OffloadDevice::kNone && c->zero.stage != 3) {
    c->warnings.push_back(Where(*c, "zero_optimization.offload_param") +
                          ": offload_param only applies to stage 3");
  }
}

// An override's value as YAML ("[0.9,0.95]", "true"), else as a string.
YAML::Node OverrideValue(const std::string& key, const std::string& text) {
  try {
    YAML::Node node = YAML::Load(text);
    if (!node.IsMap() || IsSection(key)) return node;
  } catch (const YAML::Exception&) {
  }
  return YAML::Node(text);
}

}  // namespace

std::string TensorBoardDir(const TensorBoardConfig& tb) {
  const std::string& base = tb.output_path;
  if (base.empty() || tb.job_name.rfind('/', 0) == 0) return tb.job_name;
  return base.back() == '/' ? base + tb.job_name : base + "/" + tb.job_name;
}

StatusOr<TrainConfig> ParseTrainConfig(std::string_view text,
                                       const std::string& path,
                                       int world_size) {
  if (world_size < 1) return InvalidArgument("world_size must be >= 1");
  TrainConfig c;
  c.path = path;
  c.batch.world_size = world_size;
  try {
    const YAML::Node root = YAML::Load(std::string(text));
    if (!root.IsMap()) {
      return DataError(path + ": expected a mapping of settings, got " +
                       Describe(root));
    }
    RETURN_IF_ERROR(WalkMap(root, "", "", &c));
  } catch (const YAML::Exception& e) {
    return DataError(path + ":" + std::to_string(e.mark.line + 1) + ":" +
                     std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  RETURN_IF_ERROR(Finalize(&c));
  AddWarnings(&c);
  return c;
}

StatusOr<TrainConfig> LoadTrainConfig(const std::string& path, int world_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return DataError(path + ": cannot read: " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return ParseTrainConfig(text.str(), path, world_size);
}

Status ApplyOverride(TrainConfig* config, std::string_view assignment) {
  const std::string text(assignment);
  const std::string where = "override '" + text + "'";
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgument(where + ": expected key.path=value");
  }
  const std::string key = text.substr(0, eq);
  if (!FindKey(key) && !IsSection(key)) {
    return InvalidArgument(where + ": unknown key '" + key + "'");
  }
  TrainConfig copy = *config;
  Status status =
      Visit(OverrideValue(key, text.substr(eq + 1)), key, where, where, &copy);
  if (!status.ok()) return InvalidArgument(status.message());
  RETURN_IF_ERROR(Finalize(&copy));
  *config = std::move(copy);
  return Status::Ok();
}

}  // namespace dslaunch::worker
