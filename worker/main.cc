// dsworker: the training engine of dslaunch (GPT-2 on the CPU, ZeRO over
// Gloo). Commands: train, prepare, eval, export, sample, version.
#include <cblas.h>   // openblas_set_num_threads
#include <omp.h>     // omp_set_num_threads
#include <unistd.h>  // execv

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "proto/version.h"
#include "worker/commands.h"
#include "worker/kernels_cpu.h"

int main(int argc, char** argv) {
  // OpenBLAS picks its kernels once, while loading, and on a CPU newer than
  // it knows it falls back to SSE3 ones (4.5x slower GEMMs; see
  // docs/performance.md). Start again with the right ones named; the pid,
  // open descriptors and parent-death signal stay. OPENBLAS_CORETYPE set by
  // the user (any value) is left alone, which also ends the loop.
  if (const char* core = dslaunch::worker::OpenBlasCoretypeOverride();
      core != nullptr && setenv("OPENBLAS_CORETYPE", core, 1) == 0) {
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE");  // exec failed: go on as installed
  }
  // Gloo writes to its peers' sockets without MSG_NOSIGNAL: a peer that died
  // must give an error to report, not a SIGPIPE that hides which rank failed.
  std::signal(SIGPIPE, SIG_IGN);
  // Line by line, also into a pipe: under dslaunch the header and the
  // val_loss lines reach the console as they happen, not at exit.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // Parallelism comes from OpenMP; OpenBLAS's own spinning threads would
  // fight the OpenMP team for the same cores (6x slower measured on 2 cores).
  openblas_set_num_threads(1);
  // Ranks sharing a node share its cores: without OMP_NUM_THREADS, each
  // takes its part (torchrun does the same with 1 thread per rank).
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  if (!std::getenv("OMP_NUM_THREADS") && local && std::atoi(local) > 1) {
    omp_set_num_threads(std::max(1, omp_get_num_procs() / std::atoi(local)));
  }
  CLI::App app("dsworker: GPT training engine (DeepSpeed configs, ZeRO stages)",
               "dsworker");
  app.require_subcommand(1);
  dslaunch::worker::TrainArgs train;
  auto* t = app.add_subcommand(
      "train", "train a GPT model (DeepSpeed JSON or YAML config)");
  t->add_option("--config", train.config, "DeepSpeed config")->required();
  t->add_option("--init", train.init_model,
                "start from an llm.c model_*.bin file");
  t->add_option("--set", train.overrides,
                "override a config key: train.steps=100");
  t->add_option("--save", train.save_model,
                "write the final model as an llm.c model file");
  t->add_option("--local_rank", train.local_rank,
                "accepted as DeepSpeed passes it");
  t->add_option("--device", train.device,
                "auto (the GPU when one is visible and the CUDA engine is "
                "built), cpu or cuda");
  dslaunch::worker::PrepareArgs prep;
  auto* p = app.add_subcommand("prepare",
                               "train a BPE tokenizer and write token shards");
  p->add_option("--input", prep.options.input, "text corpus")->required();
  p->add_option("--out", prep.options.out_dir, "output directory")->required();
  p->add_option("--vocab", prep.options.vocab_size,
                "vocabulary size (default 2048)");
  p->add_option("--val_fraction", prep.options.val_fraction,
                "held-out part (default 0.05)");
  dslaunch::worker::EvalArgs ev;
  auto* e = app.add_subcommand(
      "eval", "print {\"loss\": x} for the first batch of a shard");
  e->add_option("--model", ev.model, "llm.c model file")->required();
  e->add_option("--data", ev.data, "token shard")->required();
  e->add_option("--batch", ev.batch, "B")->required();
  e->add_option("--seq", ev.seq, "T")->required();
  dslaunch::worker::SampleArgs sa;
  auto* s = app.add_subcommand("sample", "generate text from a model file");
  s->add_option("--model", sa.model, "llm.c model file")->required();
  s->add_option("--tokenizer", sa.tokenizer, "tokenizer.bpe from prepare")
      ->required();
  s->add_option("--prompt", sa.prompt, "text to continue");
  s->add_option("--tokens", sa.tokens, "tokens to generate (default 64)");
  s->add_option("--seed", sa.seed, "sampling seed");
  std::string export_dir, export_out;
  auto* x = app.add_subcommand(
      "export", "write a checkpoint's model as an llm.c model file");
  x->add_option("--checkpoint", export_dir, "checkpoint directory (step_*)")
      ->required();
  x->add_option("--out", export_out, "model file to write")->required();
  auto* v = app.add_subcommand("version", "print the version");
  app.set_version_flag("--version",
                       std::string("dsworker ") + dslaunch::kVersion +
                           " (protocol " +
                           std::to_string(dslaunch::kProtocolVersion) + ")");
  CLI11_PARSE(app, argc, argv);
  if (v->parsed()) {
    std::printf("dsworker %s (protocol %u), OpenBLAS core %s, %d threads\n",
                dslaunch::kVersion, dslaunch::kProtocolVersion,
                openblas_get_corename(), omp_get_max_threads());
    return 0;
  }
  if (t->parsed()) return dslaunch::worker::RunTrain(train);
  if (p->parsed()) return dslaunch::worker::RunPrepare(prep);
  if (e->parsed()) return dslaunch::worker::RunEval(ev);
  if (x->parsed()) return dslaunch::worker::RunExport(export_dir, export_out);
  return dslaunch::worker::RunSample(sa);
}
