#include "worker/commands.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "base/exit_status.h"
#include "worker/bpe.h"
#include "worker/checkpoint.h"
#include "worker/comm.h"
#include "worker/data_loader.h"
#include "worker/device_loader.h"
#include "worker/model.h"
#include "worker/stop_signal.h"
#include "worker/train_config.h"
#include "worker/trainer.h"

namespace dslaunch::worker {

static int Fail(const Status& st) {
  std::fprintf(stderr, "dsworker: %s\n", st.message().c_str());
  return ExitStatusFor(st);
}

// The restart count dslaunch (DSLAUNCH_RESTART_COUNT) or torchrun's elastic
// agent (TORCHELASTIC_RESTART_COUNT) gives a restarted generation; 0 for
// the first run or a value that is not a count.
static int RestartCount() {
  for (const char* name :
       {"DSLAUNCH_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    return *end == '\0' && n > 0 && n < (1 << 30) ? static_cast<int>(n) : 0;
  }
  return 0;
}

int RunTrain(const TrainArgs& args) {
  const char* world_env = std::getenv("WORLD_SIZE");
  const int world = world_env ? std::atoi(world_env) : 1;
  auto config = LoadTrainConfig(args.config, world);
  if (!config.ok()) return Fail(config.status());
  for (const auto& o : args.overrides) {
    if (Status st = ApplyOverride(&*config, o); !st.ok()) return Fail(st);
  }
  // A restarted generation goes on from the newest complete checkpoint
  // (none yet: from the start), unless checkpoint.resume names one.
  const int restart = RestartCount();
  const bool auto_resume = restart > 0 && config->checkpoint.resume.empty() &&
                           !config->checkpoint.dir.empty();
  if (auto_resume) config->checkpoint.resume = "latest";
  CatchStopSignal();  // from here a SIGTERM ends the step, then the run
  auto comm = CommFromEnvironment();
  if (!comm.ok()) return Fail(comm.status());
  if ((*comm)->rank() == 0) {
    for (const auto& w : config->warnings)
      std::fprintf(stderr, "dsworker: warning: %s\n", w.c_str());
    if (auto_resume) {
      std::printf(
          "restart %d: checkpoint.resume is latest (the newest complete "
          "checkpoint in %s, if there is one)\n",
          restart, config->checkpoint.dir.c_str());
    }
  }
  TrainOptions options;
  options.init_model = args.init_model;
  auto asked = ParseDeviceKind(args.device);
  if (!asked.ok()) return Fail(asked.status());
  std::string note;
  auto device = ResolveDevice(*asked, &note);
  if (!device.ok()) return Fail(device.status());
  options.device = *device;
  const char* local_rank = std::getenv("LOCAL_RANK");
  options.local_rank = local_rank != nullptr ? std::atoi(local_rank)
                                             : std::max(0, args.local_rank);
  auto trainer = Trainer::Create(*config, std::move(comm).value(), options);
  if (!trainer.ok()) return Fail(trainer.status());
  auto result = (*trainer)->Run();
  if (!result.ok()) return Fail(result.status());
  if (result->stop_signal != 0) return 128 + result->stop_signal;
  if (!args.save_model.empty()) {
    auto params = (*trainer)->WholeParams();  // collective
    if (!params.ok()) return Fail(params.status());
    if ((*trainer)->rank() == 0) {
      const ParamLayout llmc((*trainer)->model_config(), ParamOrder::kLlmc);
      if (Status st = WriteModelFile(args.save_model, llmc, *params); !st.ok())
        return Fail(st);
      std::printf("saved the model to %s\n", args.save_model.c_str());
    }
  }
  return 0;
}

int RunPrepare(const PrepareArgs& args) {
  auto r = Prepare(args.options);
  if (!r.ok()) return Fail(r.status());
  std::printf(
      "tokenizer: %d tokens; train %lld tokens, val %lld tokens in %s\n",
      r->vocab_size, static_cast<long long>(r->train_tokens),
      static_cast<long long>(r->val_tokens), args.options.out_dir.c_str());
  return 0;
}

int RunExport(const std::string& dir, const std::string& out) {
  auto state = ReadCheckpointState(dir);
  if (!state.ok()) return Fail(state.status());
  ParamLayout layout(state->model);
  std::vector<float> params(layout.num_params());
  if (Status st = ReadCheckpointRange(dir, "params", 0, params); !st.ok())
    return Fail(st);
  if (Status st = WriteModelFile(out, layout, params); !st.ok())
    return Fail(st);
  std::printf("wrote %s (step %lld, %zu parameters)\n", out.c_str(),
              static_cast<long long>(state->step), params.size());
  return 0;
}

int RunEval(const EvalArgs& args) {
  auto model = ReadModelFile(args.model);
  if (!model.ok()) return Fail(model.status());
  auto shard = OpenShard(args.data);
  if (!shard.ok()) return Fail(shard.status());
  const int64_t need = static_cast<int64_t>(args.batch) * args.seq + 1;
  if (args.batch < 1 || args.seq < 1 ||
      args.seq > (*model)->config().max_seq_len) {
    return Fail(InvalidArgument(
        "--batch and --seq must be >= 1, --seq <= the model's maxT"));
  }
  if (shard->num_tokens() < need)
    return Fail(DataError(args.data + ": fewer tokens than B*T+1"));
  if (Status st = shard->ValidateTokens((*model)->config().vocab_size);
      !st.ok())
    return Fail(st);
  std::vector<int> in(need - 1), tgt(need - 1);
  for (int64_t i = 0; i + 1 < need; ++i) {
    in[i] = shard->tokens()[i];
    tgt[i] = shard->tokens()[i + 1];
  }
  const float loss =
      (*model)->Forward(in.data(), tgt.data(), args.batch, args.seq);
  std::printf("{\"loss\": %.9g}\n", loss);
  return 0;
}

int RunSample(const SampleArgs& args) {
  auto model = ReadModelFile(args.model);
  if (!model.ok()) return Fail(model.status());
  auto tok = BpeTokenizer::Load(args.tokenizer);
  if (!tok.ok()) return Fail(tok.status());
  const ModelConfig& c = (*model)->config();
  std::vector<int> ids = {BpeTokenizer::kEndOfText};
  for (int id : tok->Encode(args.prompt)) ids.push_back(id);
  std::mt19937_64 rng(args.seed);
  std::string out = args.prompt;
  for (int i = 0; i < args.tokens; ++i) {
    const int T = std::min<int>(static_cast<int>(ids.size()), c.max_seq_len);
    std::vector<int> window(ids.end() - T, ids.end());
    (*model)->Forward(window.data(), nullptr, 1, T);
    const float* p = (*model)->probs().data() +
                     static_cast<size_t>(T - 1) * c.padded_vocab_size;
    std::discrete_distribution<int> pick(p, p + c.vocab_size);
    const int next = pick(rng);
    if (next == BpeTokenizer::kEndOfText) break;
    ids.push_back(next);
    out += tok->TokenBytes(next);
  }
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace dslaunch::worker
