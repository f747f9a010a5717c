// `dsworker prepare`: trains the byte-level BPE tokenizer on a text corpus
// and writes llm.c token shards (train and val) plus the tokenizer file.
// Runs on the calling thread.
#pragma once

#include <string>

#include "base/status.h"

namespace dslaunch::worker {

struct PrepareOptions {
  std::string input;    // UTF-8 text
  std::string out_dir;  // gets tokenizer.bpe, train_000.bin, val_000.bin
  int vocab_size = 2048;
  double val_fraction = 0.05;  // the last part of the corpus
};

struct PrepareResult {
  int vocab_size = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
};

StatusOr<PrepareResult> Prepare(const PrepareOptions& options);

}  // namespace dslaunch::worker
