#include "worker/bpe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace dslaunch::worker {
namespace {

const char* kText =
    "In the beginning God created the heaven and the earth. And the earth was "
    "without form, and void; and darkness was upon the face of the deep. "
    "And God said, Let there be light: and there was light. 1234 times 56!!\n";

TEST(Bpe, PiecesKeepTheLeadingSpaceWithTheWord) {
  auto pieces = BpeTokenizer::Pieces("And God said,  Let 123!");
  std::vector<std::string> got(pieces.begin(), pieces.end());
  EXPECT_EQ(got, (std::vector<std::string>{"And", " God", " said", ",", " ",
                                           " Let", " 123", "!"}));
}

std::string Corpus() {
  std::string text;
  for (int i = 0; i < 20; ++i) text += kText;
  return text;
}

TEST(Bpe, RoundTripsAnyBytesAndCompresses) {
  auto tok = BpeTokenizer::Train(Corpus(), 300);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->vocab_size(), 300);
  auto ids = tok->Encode(kText);
  EXPECT_EQ(tok->Decode(ids), kText);
  EXPECT_LT(ids.size(), std::string(kText).size() / 2);
  const std::string binary("\x00\xff\x80 odd \xc3\xa9", 11);
  EXPECT_EQ(tok->Decode(tok->Encode(binary)), binary);
  for (int id : ids) EXPECT_LT(id, 300);
}

TEST(Bpe, TrainingIsDeterministicAndSavesAndLoads) {
  auto a = BpeTokenizer::Train(Corpus(), 290);
  auto b = BpeTokenizer::Train(Corpus(), 290);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->Encode(kText), b->Encode(kText));
  const std::string path =
      testing::TempDir() + "/tok-" + std::to_string(::getpid()) + ".bpe";
  ASSERT_TRUE(a->Save(path).ok());
  auto c = BpeTokenizer::Load(path);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->Encode(kText), a->Encode(kText));
  EXPECT_EQ(c->vocab_size(), 290);
  std::remove(path.c_str());
}

TEST(Bpe, LoadRejectsBadFilesNamingThem) {
  const std::string path =
      testing::TempDir() + "/bad-" + std::to_string(::getpid()) + ".bpe";
  std::ofstream(path) << "dsl-bpe 1 259\n65 66\n999 1\n";
  auto t = BpeTokenizer::Load(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(path + ":3: bad merge"),
            std::string::npos)
      << t.status().message();
  std::ofstream(path) << "hello\n";
  EXPECT_FALSE(BpeTokenizer::Load(path).ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace dslaunch::worker
