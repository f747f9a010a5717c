#include "launcher/report/line_folder.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace dslaunch::launcher {
namespace {

using Group = LineFolder::Group;

// "o[0,1] text" / "e[2] text": a group as one comparable string.
std::string Show(const Group& g) {
  std::string out(1, g.is_stderr ? 'e' : 'o');
  out += "[";
  for (size_t i = 0; i < g.ranks.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(g.ranks[i]);
  }
  return out + "] " + g.text;
}

std::vector<std::string> Show(const std::vector<Group>& groups) {
  std::vector<std::string> out;
  for (const Group& g : groups) out.push_back(Show(g));
  return out;
}

using Lines = std::vector<std::string>;

TEST(LineFolder, FoldsIdenticalLinesOfSeveralRanks) {
  LineFolder folder(0.1);
  for (int rank = 0; rank < 8; ++rank)
    EXPECT_FALSE(folder.Add(rank, false, "loading shards", 10.0 + rank * 0.01));
  EXPECT_FALSE(folder.empty());
  const auto groups = folder.Take(10.2, false);
  EXPECT_EQ(Show(groups), Lines{"o[0,1,2,3,4,5,6,7] loading shards"});
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_DOUBLE_EQ(groups[0].first, 10.0);
  EXPECT_TRUE(folder.empty());
}

TEST(LineFolder, KeepsRanksInTheOrderTheirLinesCame) {
  LineFolder folder(0.1);
  folder.Add(5, false, "x", 1.0);
  folder.Add(2, false, "x", 1.0);
  folder.Add(7, false, "x", 1.0);
  EXPECT_EQ(Show(folder.Take(0, true)), Lines{"o[5,2,7] x"});
}

TEST(LineFolder, HoldsAGroupUntilItsWindowHasPassed) {
  LineFolder folder(0.5);
  folder.Add(0, false, "a", 100.0);
  folder.Add(1, false, "a", 100.3);
  EXPECT_TRUE(folder.Take(100.0, false).empty());
  EXPECT_TRUE(folder.Take(100.49, false).empty());
  // The window counts from the group's first line, not its last.
  EXPECT_EQ(Show(folder.Take(100.5, false)), Lines{"o[0,1] a"});
  EXPECT_TRUE(folder.empty());
}

TEST(LineFolder, TakesOnlyTheGroupsWhoseWindowPassedOldestFirst) {
  LineFolder folder(1.0);
  folder.Add(0, false, "first", 10.0);
  folder.Add(0, false, "second", 10.5);
  folder.Add(0, false, "third", 11.2);
  EXPECT_EQ(Show(folder.Take(11.0, false)), Lines{"o[0] first"});
  EXPECT_EQ(Show(folder.Take(11.6, false)), Lines{"o[0] second"});
  EXPECT_FALSE(folder.empty());
  EXPECT_EQ(Show(folder.Take(12.2, false)), Lines{"o[0] third"});
  EXPECT_TRUE(folder.empty());
}

TEST(LineFolder, TakesEveryGroupAtOnceWhenAskedForAll) {
  LineFolder folder(10.0);
  folder.Add(0, false, "a", 5.0);
  folder.Add(1, false, "a", 5.0);
  folder.Add(1, true, "b", 5.0);
  EXPECT_TRUE(folder.Take(5.0, false).empty());
  EXPECT_EQ(Show(folder.Take(5.0, true)), (Lines{"o[0,1] a", "e[1] b"}));
  EXPECT_TRUE(folder.empty());
  EXPECT_TRUE(folder.Take(100.0, true).empty());
}

TEST(LineFolder, ShowsARanksOwnRepeatedLineAgain) {
  LineFolder folder(0.1);
  folder.Add(0, false, "tick", 1.0);
  folder.Add(1, false, "tick", 1.01);
  folder.Add(0, false, "tick", 1.02);
  folder.Add(1, false, "tick", 1.03);
  EXPECT_EQ(Show(folder.Take(0, true)), (Lines{"o[0,1] tick", "o[0,1] tick"}));
}

// Agents forward each rank's output in batches, so the lines of one rank
// usually come together: rank 0's two lines, then rank 1's two, ...
TEST(LineFolder, FoldsARepeatedLineOfSeveralRanksThatCameRankByRank) {
  LineFolder folder(0.1);
  for (int rank = 0; rank < 4; ++rank) {
    folder.Add(rank, false, "x", 1.0);
    folder.Add(rank, false, "x", 1.0);
  }
  EXPECT_EQ(Show(folder.Take(0, true)),
            (Lines{"o[0,1,2,3] x", "o[0,1,2,3] x"}));
}

TEST(LineFolder, NeverMergesARanksRepeatIntoAGroupItIsAlreadyIn) {
  LineFolder folder(0.1);
  folder.Add(3, false, "same", 1.0);
  folder.Add(3, false, "same", 1.0);
  folder.Add(3, false, "same", 1.0);
  EXPECT_EQ(Show(folder.Take(0, true)),
            (Lines{"o[3] same", "o[3] same", "o[3] same"}));
}

TEST(LineFolder, KeepsEachRanksLinesInOrderRatherThanJoiningAnOlderGroup) {
  LineFolder folder(0.1);
  folder.Add(0, false, "A", 1.0);
  folder.Add(0, false, "B", 1.0);
  folder.Add(1, false, "B", 1.0);  // joins rank 0's B
  folder.Add(1, false, "A", 1.0);  // must not join A: it came before B
  const Lines got = Show(folder.Take(0, true));
  EXPECT_EQ(got, (Lines{"o[0] A", "o[0,1] B", "o[1] A"}));
}

TEST(LineFolder, KeepsARanksOrderAcrossItsTwoStreams) {
  LineFolder folder(0.1);
  folder.Add(0, false, "a", 1.0);
  folder.Add(1, true, "b", 1.0);
  folder.Add(1, false, "a", 1.0);  // after its stderr "b": not into rank 0's
  EXPECT_EQ(Show(folder.Take(0, true)), (Lines{"o[0] a", "e[1] b", "o[1] a"}));
}

TEST(LineFolder, NeverMergesStdoutWithStderr) {
  LineFolder folder(0.1);
  folder.Add(0, false, "warning: x", 1.0);
  folder.Add(1, true, "warning: x", 1.0);
  folder.Add(2, true, "warning: x", 1.0);
  folder.Add(3, false, "warning: x", 1.0);
  EXPECT_EQ(Show(folder.Take(0, true)),
            (Lines{"o[0,3] warning: x", "e[1,2] warning: x"}));
}

TEST(LineFolder, StartsANewGroupForALineWhoseGroupWasTaken) {
  LineFolder folder(0.1);
  folder.Add(0, false, "x", 1.0);
  EXPECT_EQ(Show(folder.Take(1.1, false)), Lines{"o[0] x"});
  folder.Add(1, false, "x", 1.2);
  folder.Add(0, false, "x", 1.2);
  EXPECT_EQ(Show(folder.Take(0, true)), Lines{"o[1,0] x"});
}

TEST(LineFolder, KeepsAnEmptyLineAsAGroup) {
  LineFolder folder(0.1);
  folder.Add(0, false, "", 1.0);
  folder.Add(1, false, "", 1.0);
  EXPECT_EQ(Show(folder.Take(0, true)), Lines{"o[0,1] "});
}

TEST(LineFolder, SaysWhenTheHeldLinesReachTheBound) {
  LineFolder folder(0.1);
  const size_t third = LineFolder::kMaxPendingBytes / 3 + 1;  // held once each
  EXPECT_FALSE(folder.Add(0, false, std::string(third, 'a'), 1.0));
  EXPECT_FALSE(folder.Add(0, false, std::string(third, 'b'), 1.0));
  EXPECT_TRUE(folder.Add(0, false, std::string(third, 'c'), 1.0));
  // Still over the bound when a line joins a group.
  EXPECT_TRUE(folder.Add(1, false, std::string(third, 'a'), 1.0));
  EXPECT_EQ(folder.Take(1.0, true).size(), 3u);
  // Taking everything gives the room back.
  EXPECT_FALSE(folder.Add(0, false, std::string(third, 'd'), 2.0));
  EXPECT_FALSE(folder.Add(0, false, "short", 2.0));
}

TEST(LineFolder, DoesNotReachTheBoundWithManySmallLinesTakenInTime) {
  LineFolder folder(0.1);
  for (int i = 0; i < 200000; ++i) {
    const double now = i * 0.001;
    ASSERT_FALSE(folder.Add(i % 8, false, "line " + std::to_string(i), now))
        << i;
    folder.Take(now, false);
  }
}

TEST(LineFolder, ReachesTheBoundWithALineLongerThanIt) {
  LineFolder folder(0.1);
  EXPECT_TRUE(
      folder.Add(0, true, std::string(LineFolder::kMaxPendingBytes, 'z'), 0));
  const auto groups = folder.Take(0, true);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].text.size(), LineFolder::kMaxPendingBytes);
  EXPECT_TRUE(groups[0].is_stderr);
}

// ---- FoldedPrefix ----

std::map<int, std::string> Hosts(
    const std::vector<std::pair<std::string, int>>& nodes) {
  std::map<int, std::string> host_of;
  int rank = 0;
  for (const auto& [host, n] : nodes)
    for (int i = 0; i < n; ++i) host_of[rank++] = host;
  return host_of;
}

std::vector<int> Range(int from, int to) {  // [from, to)
  std::vector<int> out;
  for (int r = from; r < to; ++r) out.push_back(r);
  return out;
}

TEST(FoldedPrefix, NamesOneHostWithItsRankRange) {
  EXPECT_EQ(FoldedPrefix(Range(0, 8), Hosts({{"h", 8}})), "[h:0-7] ");
}

TEST(FoldedPrefix, NamesASingleRank) {
  EXPECT_EQ(FoldedPrefix({3}, Hosts({{"node1", 8}})), "[node1:3] ");
}

TEST(FoldedPrefix, NamesUpToThreeHostsEach) {
  const auto hosts = Hosts({{"a", 4}, {"b", 4}, {"c", 4}, {"d", 4}});
  EXPECT_EQ(FoldedPrefix(Range(0, 8), hosts), "[a:0-3,b:4-7] ");
  EXPECT_EQ(FoldedPrefix(Range(0, 12), hosts), "[a:0-3,b:4-7,c:8-11] ");
  EXPECT_EQ(FoldedPrefix({1, 9}, hosts), "[a:1,c:9] ");
}

TEST(FoldedPrefix, CountsNodesBeyondThree) {
  const auto hosts = Hosts({{"a", 8}, {"b", 8}, {"c", 8}, {"d", 8}, {"e", 8}});
  EXPECT_EQ(FoldedPrefix(Range(0, 40), hosts), "[5 nodes:0-39] ");
  EXPECT_EQ(FoldedPrefix({0, 8, 16, 24}, hosts), "[4 nodes:0,8,16,24] ");
}

TEST(FoldedPrefix, SortsRanksGivenInArrivalOrder) {
  const auto hosts = Hosts({{"a", 4}, {"b", 4}});
  EXPECT_EQ(FoldedPrefix({3, 1, 2, 0}, hosts), "[a:0-3] ");
  EXPECT_EQ(FoldedPrefix({7, 0, 5, 2, 6, 1, 4, 3}, hosts), "[a:0-3,b:4-7] ");
}

TEST(FoldedPrefix, ShowsGapsInTheRanks) {
  EXPECT_EQ(FoldedPrefix({0, 1, 2, 5}, Hosts({{"h", 8}})), "[h:0-2,5] ");
  EXPECT_EQ(FoldedPrefix({5, 0, 7, 2, 1}, Hosts({{"h", 8}})), "[h:0-2,5,7] ");
}

TEST(FoldedPrefix, MarksARankOfUnknownHost) {
  EXPECT_EQ(FoldedPrefix({0, 1}, {}), "[?:0-1] ");
}

}  // namespace
}  // namespace dslaunch::launcher
