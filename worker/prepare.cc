#include "worker/prepare.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "worker/bpe.h"
#include "worker/data_loader.h"

namespace dslaunch::worker {

static StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return DataError("cannot read corpus " + path);
  std::stringstream buf;
  buf << f.rdbuf();
  if (buf.str().empty()) return DataError("corpus " + path + " is empty");
  return buf.str();
}

static std::vector<uint16_t> ToShard(const std::vector<int>& ids) {
  std::vector<uint16_t> tokens;
  tokens.reserve(ids.size() + 1);
  tokens.push_back(
      BpeTokenizer::kEndOfText);  // documents start with EOT, as in llm.c
  for (int id : ids) tokens.push_back(static_cast<uint16_t>(id));
  return tokens;
}

StatusOr<PrepareResult> Prepare(const PrepareOptions& o) {
  if (o.vocab_size > 65536)
    return InvalidArgument("--vocab must fit uint16 shards (<= 65536)");
  if (o.val_fraction <= 0 || o.val_fraction >= 0.5) {
    return InvalidArgument("--val_fraction must be in (0, 0.5)");
  }
  ASSIGN_OR_RETURN(std::string text, ReadText(o.input));
  // Split at a line boundary so no word is cut.
  size_t cut = static_cast<size_t>(text.size() * (1 - o.val_fraction));
  cut = text.rfind('\n', cut) == std::string::npos ? cut
                                                   : text.rfind('\n', cut) + 1;
  const std::string_view train(text.data(), cut),
      val(text.data() + cut, text.size() - cut);
  ASSIGN_OR_RETURN(BpeTokenizer tok, BpeTokenizer::Train(train, o.vocab_size));
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return DataError("cannot create " + o.out_dir + ": " + ec.message());
  RETURN_IF_ERROR(tok.Save(o.out_dir + "/tokenizer.bpe"));
  const auto train_tokens = ToShard(tok.Encode(train));
  const auto val_tokens = ToShard(tok.Encode(val));
  RETURN_IF_ERROR(WriteShard(o.out_dir + "/train_000.bin", train_tokens));
  RETURN_IF_ERROR(WriteShard(o.out_dir + "/val_000.bin", val_tokens));
  return PrepareResult{tok.vocab_size(),
                       static_cast<int64_t>(train_tokens.size()),
                       static_cast<int64_t>(val_tokens.size())};
}

}  // namespace dslaunch::worker
