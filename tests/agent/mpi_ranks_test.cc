#include "agent/mpi_ranks.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/unix_socket.h"
#include "proto/auth.h"

namespace dslaunch::agent {
namespace {

using Env = std::map<std::string, std::string>;

GetEnv Lookup(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

Env Ompi(int rank, int size, int local, int local_size) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", std::to_string(size)},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(local)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(local_size)}};
}

TEST(ParseNodeSlots, TakesCountsAndNamesTheBadEntry) {
  auto slots = ParseNodeSlots("2,1,4");
  ASSERT_TRUE(slots.ok());
  EXPECT_EQ(*slots, (std::vector<int>{2, 1, 4}));
  for (const char* bad : {"", "2,,3", "0", "a", "5000", "2,-1", "1 ,2", "3,"}) {
    auto st = ParseNodeSlots(bad);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.status().message().find("--node_slots"), std::string::npos);
  }
}

TEST(MpiPlacementFrom, FindsTheNodeFromMpirunsRanks) {
  const Env env = Ompi(3, 6, 1, 2);
  auto p = MpiPlacementFrom(Lookup(env), {2, 2, 2});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->node_rank, 1);
  EXPECT_EQ(p->first_rank, 2);
  EXPECT_EQ(p->local_rank, 1);
  EXPECT_EQ(p->local_size, 2);
  EXPECT_EQ(p->world_rank, 3);
  const Env uneven = Ompi(5, 7, 0, 4);
  p = MpiPlacementFrom(Lookup(uneven), {1, 4, 4, 2});
  ASSERT_FALSE(p.ok());  // 7 != 11
  p = MpiPlacementFrom(Lookup(uneven), {1, 4, 2});
  ASSERT_FALSE(p.ok());  // rank 5 starts node 2, which has 2 slots, not 4
  const Env last = Ompi(5, 7, 0, 2);
  p = MpiPlacementFrom(Lookup(last), {1, 4, 2});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->node_rank, 2);
}

TEST(MpiPlacementFrom, SaysWhatMpirunDidDifferently) {
  // --map-by node: MPI rank 1 is local rank 0 of the second node.
  const Env by_node = Ompi(1, 4, 0, 2);
  auto p = MpiPlacementFrom(Lookup(by_node), {2, 2});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("mpirun placed MPI rank 1"),
            std::string::npos)
      << p.status().message();
  EXPECT_NE(p.status().message().find("--launcher_args"), std::string::npos);
  const Env more = Ompi(0, 5, 0, 2);
  p = MpiPlacementFrom(Lookup(more), {2, 2});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("mpirun started 5 processes; the plan "
                                      "has 4 ranks"),
            std::string::npos)
      << p.status().message();
  Env missing = Ompi(0, 2, 0, 2);
  missing.erase("OMPI_COMM_WORLD_LOCAL_SIZE");
  p = MpiPlacementFrom(Lookup(missing), {2});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("OMPI_COMM_WORLD_LOCAL_SIZE is not set"),
            std::string::npos);
  Env garbage = Ompi(0, 2, 0, 2);
  garbage["OMPI_COMM_WORLD_RANK"] = "0x1";
  EXPECT_FALSE(MpiPlacementFrom(Lookup(garbage), {2}).ok());
  EXPECT_FALSE(MpiPlacementFrom(Lookup(Ompi(1, 2, 2, 2)), {2}).ok());
}

TEST(MpiSocketName, TakesTheSecretSoNoOneElseCanTakeTheNameFirst) {
  const std::string a = MpiSocketName("secret", "job", 2);
  EXPECT_EQ(a.rfind("dslaunch-mpi-", 0), 0u);
  EXPECT_EQ(a.size(), 13u + 32u);
  EXPECT_EQ(a.find("job"), std::string::npos);
  EXPECT_EQ(a, MpiSocketName("secret", "job", 2));
  EXPECT_NE(a, MpiSocketName("other", "job", 2));
  EXPECT_NE(a, MpiSocketName("secret", "job", 4));
  EXPECT_NE(a, MpiSocketName("secret", "job2", 2));
}

TEST(IsMpiVariable, TheRuntimesOwnPrefixesOnly) {
  for (const char* yes : {"OMPI_COMM_WORLD_RANK=1", "PMIX_RANK=3",
                          "OPAL_PREFIX=/usr", "ORTE_X=", "PRTE_MCA_y=1"}) {
    EXPECT_TRUE(IsMpiVariable(yes)) << yes;
  }
  for (const char* no : {"RANK=1", "MPI_X=1", "XOMPI_A=1", "OMP_NUM_THREADS=1",
                         "PMI_RANK=1", ""}) {
    EXPECT_FALSE(IsMpiVariable(no)) << no;
  }
  const char* env[] = {"PATH=/bin", "OMPI_A=1", "PMIX_B=2", "OMPI_NOEQUALS",
                       nullptr};
  EXPECT_EQ(MpiVariables(env),
            (std::vector<std::string>{"OMPI_A=1", "PMIX_B=2"}));
}

// The agent side and the holders run as children of this test, so they are
// siblings, as mpirun's daemon makes them. The agent child writes what it
// learnt to a pipe; holders' exit statuses are theirs.
class MpiHoldersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_ = "t" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  void TearDown() override {
    for (pid_t pid : children_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }

  MpiPlacement Place(int local, int local_size = 3, int first = 3) {
    return {.node_rank = 1,
            .local_rank = local,
            .local_size = local_size,
            .world_rank = first + local,
            .first_rank = first};
  }

  // Forks the node's agent: it waits up to `timeout_s` for the holders, then
  // reports "ok" or the error, and for each holder its world rank and
  // variables, one per line, then whether its socket (the key) still lets a
  // process connect ("open") or not ("closed"), and releases them.
  pid_t StartAgent(double timeout_s, int* report_fd) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      boost::asio::io_context io;
      MpiHolders holders(io, job_, "secret", Place(0));
      if (!holders.Listen().ok()) ::_exit(3);
      holders.WhenReady(timeout_s, [&](Status st) {
        std::string out = st.ok() ? "ok\n" : st.message() + "\n";
        for (int l = 1; st.ok() && l < 3; ++l) {
          out += std::to_string(holders.WorldRankOf(l));
          for (const auto& v : holders.VariablesOf(l)) out += " " + v;
          out += "\n";
        }
        if (st.ok()) {
          const bool open = ConnectOnce(MpiSocketName("secret", job_, 3));
          out += open ? "open\n" : "closed\n";
        }
        (void)base::WriteAll(fds[1], out);
        holders.Release();
        io.stop();
      });
      io.run();
      ::_exit(0);
    }
    ::close(fds[1]);
    children_.push_back(pid);
    *report_fd = fds[0];
    return pid;
  }

  // Forks a holder of local rank `local` with mpirun's variables plus
  // `extra`; with `grandchild`, the holder is a child of the forked process
  // (not a sibling of the agent).
  pid_t StartHolder(int local, const std::string& secret,
                    const std::string& extra = "", bool grandchild = false,
                    double timeout_s = 3) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (grandchild) {
        const pid_t inner = ::fork();
        if (inner != 0) {
          int status = 0;
          ::waitpid(inner, &status, 0);
          ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 99);
        }
      }
      ::clearenv();
      ::setenv("OMPI_COMM_WORLD_RANK", std::to_string(3 + local).c_str(), 1);
      ::setenv("PMIX_RANK", std::to_string(3 + local).c_str(), 1);
      ::setenv("NOT_MPI", "1", 1);
      if (!extra.empty()) ::putenv(const_cast<char*>(extra.c_str()));
      ::_exit(RunMpiHolder(job_, secret, Place(local), timeout_s));
    }
    children_.push_back(pid);
    return pid;
  }

  // Forks a sibling of the agent that connects to its socket (retrying
  // until it listens) and sends `payload` as a registration; it exits 64
  // when refused ('X'), 0 when registered, 69 otherwise.
  pid_t StartForger(const std::string& payload) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const std::string name =
          std::string(1, '\0') + MpiSocketName("secret", job_, 3);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::memcpy(addr.sun_path, name.data(), name.size());
      for (int i = 0; i < 300; ++i) {
        const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&addr),
                      offsetof(sockaddr_un, sun_path) + name.size()) == 0) {
          const uint32_t n = static_cast<uint32_t>(payload.size());
          const char header[4] = {char(n >> 24), char(n >> 16), char(n >> 8),
                                  char(n)};
          (void)base::WriteAll(fd, std::string(header, 4) + payload);
          char reply = 0;
          const ssize_t got = ::read(fd, &reply, 1);
          ::_exit(got == 1 && reply == 'X' ? 64 : got == 1 ? 0 : 69);
        }
        ::close(fd);
        ::usleep(10000);
      }
      ::_exit(69);
    }
    children_.push_back(pid);
    return pid;
  }

  // Whether a connection to the abstract socket `name` is taken (a listening
  // socket takes it into its backlog without an accept).
  static bool ConnectOnce(const std::string& name) {
    const std::string abstract = std::string(1, '\0') + name;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, abstract.data(), abstract.size());
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    const bool ok =
        ::connect(fd, reinterpret_cast<sockaddr*>(&addr),
                  offsetof(sockaddr_un, sun_path) + abstract.size()) == 0;
    ::close(fd);
    return ok;
  }

  static int ExitOf(pid_t pid) {
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  static std::string ReadAll(int fd) {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
    ::close(fd);
    return out;
  }

  std::string job_;
  std::vector<pid_t> children_;
};

TEST_F(MpiHoldersTest, HoldersHandTheirMpiIdentityAndExitZeroWhenReleased) {
  const pid_t h2 = StartHolder(2, "secret");  // before the agent listens
  int report = -1;
  const pid_t agent = StartAgent(10, &report);
  const pid_t h1 = StartHolder(1, "secret", "OMPI_MCA_x=a=b");
  // Once every holder registered, the key opens nothing: the agent's socket
  // is closed before it starts a rank (ready), not when the job ends.
  EXPECT_EQ(ReadAll(report),
            "ok\n"
            "4 OMPI_COMM_WORLD_RANK=4 PMIX_RANK=4 OMPI_MCA_x=a=b\n"
            "5 OMPI_COMM_WORLD_RANK=5 PMIX_RANK=5\n"
            "closed\n");
  EXPECT_EQ(ExitOf(h1), 0);
  EXPECT_EQ(ExitOf(h2), 0);
  EXPECT_EQ(ExitOf(agent), 0);
}

TEST_F(MpiHoldersTest, AWrongSecretIsRefusedAndTheAgentSaysWhoIsMissing) {
  int report = -1;
  const pid_t agent = StartAgent(0.8, &report);
  const pid_t h1 = StartHolder(1, "secret");
  // Without the secret a holder does not even find the agent's socket...
  const pid_t lost = StartHolder(2, "not the secret", "", false, 0.3);
  // ...and a sibling that knows the name still has to prove the secret.
  const pid_t forger = StartForger(
      std::string("dslaunch-mpi-holder-1") + '\0' + "5" + '\0' + "2" + '\0' +
      std::string(64, 'a') + '\0' + "OMPI_COMM_WORLD_RANK=5");
  EXPECT_EQ(ExitOf(lost), 69);
  EXPECT_EQ(ExitOf(forger), 64);
  EXPECT_EQ(ReadAll(report),
            "the MPI processes of ranks 5 did not register with node 1's "
            "agent within 0.8 s\n");
  EXPECT_EQ(ExitOf(agent), 0);
  EXPECT_EQ(ExitOf(h1), 0);  // released all the same
}

TEST_F(MpiHoldersTest, NeitherSideTalksToAProcessThatIsNotItsSibling) {
  int report = -1;
  const pid_t agent = StartAgent(0.6, &report);
  // A holder one level further down will not hand its identity over.
  const pid_t stray = StartHolder(1, "secret", "", /*grandchild=*/true);
  EXPECT_EQ(ExitOf(stray), 69);
  // This test process (the agent's parent, not its sibling) is refused.
  const std::string name =
      std::string(1, '\0') + MpiSocketName("secret", job_, Place(0).first_rank);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, name.data(), name.size());
  int fd = -1;
  for (int i = 0; i < 200; ++i) {
    fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr),
                  offsetof(sockaddr_un, sun_path) + name.size()) == 0)
      break;
    ::close(fd);
    fd = -1;
    ::usleep(10000);
  }
  ASSERT_GE(fd, 0);
  const std::string reply = ReadAll(fd);
  EXPECT_EQ(reply.rfind("X", 0), 0u) << reply;
  EXPECT_NE(reply.find("was not started by the same mpirun daemon"),
            std::string::npos)
      << reply;
  EXPECT_NE(ReadAll(report).find("ranks 4, 5 did not register"),
            std::string::npos);
  EXPECT_EQ(ExitOf(agent), 0);
}

TEST_F(MpiHoldersTest, ANodeOfOneRankListensForNoHolder) {
  boost::asio::io_context io;
  MpiHolders holders(io, job_, "secret", Place(0, 1));
  ASSERT_TRUE(holders.Listen().ok());
  EXPECT_FALSE(holders.listening());
  EXPECT_FALSE(ConnectOnce(MpiSocketName("secret", job_, 3)));
  bool ready = false;
  holders.WhenReady(1, [&](Status st) { ready = st.ok(); });
  io.run();
  EXPECT_TRUE(ready);
}

TEST_F(MpiHoldersTest, AHolderWithoutAnAgentGivesUpAfterItsTimeout) {
  const pid_t h1 = StartHolder(1, "secret", "", false, 0.3);
  EXPECT_EQ(ExitOf(h1), 69);
}

}  // namespace
}  // namespace dslaunch::agent
