#include "agent/env_contract.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "proto/dslaunch.pb.h"

namespace dslaunch::agent {
namespace {

// Node 1 of a job of 3 nodes with 2 ranks each: global ranks 2 and 3.
wire::JobSpec Node1Of3x2() {
  wire::JobSpec job;
  job.set_job_id("job-42");
  job.add_argv("/usr/bin/python3");
  job.add_argv("train.py");
  job.add_argv("--lr=0.1");
  job.set_node_rank(1);
  job.set_num_nodes(3);
  job.set_world_size(6);
  job.set_master_addr("10.0.0.1");
  job.set_master_port(29501);
  job.add_visible_slots(2);
  job.add_visible_slots(5);
  job.set_restart_count(0);
  job.set_append_local_rank(true);
  for (int local = 0; local < 2; ++local) {
    wire::RankSpec* rank = job.add_ranks();
    rank->set_rank(2 + local);
    rank->set_local_rank(local);
    rank->set_slot(local == 0 ? 2 : 5);
  }
  return job;
}

RankPaths Paths() {
  RankPaths paths;
  paths.progress_socket = "/tmp/dsl/progress-3.sock";
  paths.store_address = "unix:/tmp/dsl/store.sock";
  paths.error_file = "/tmp/dsl/error-3.json";
  return paths;
}

std::map<std::string, std::string> AsMap(const std::vector<std::string>& kvs) {
  std::map<std::string, std::string> out;
  for (const std::string& kv : kvs) {
    const size_t eq = kv.find('=');
    EXPECT_NE(eq, std::string::npos) << kv;
    EXPECT_TRUE(out.emplace(kv.substr(0, eq), kv.substr(eq + 1)).second)
        << "duplicate " << kv;
  }
  return out;
}

// Every variable of `expected` is in `env` with its value.
void ExpectVariables(const std::map<std::string, std::string>& env,
                     const std::map<std::string, std::string>& expected) {
  for (const auto& [key, value] : expected) {
    auto it = env.find(key);
    ASSERT_NE(it, env.end()) << key;
    EXPECT_EQ(it->second, value) << key;
  }
}

TEST(ContractEnv, SetsEveryContractVariableForRankOnNode1Of3x2) {
  const wire::JobSpec job = Node1Of3x2();
  auto env = ContractEnv(job, job.ranks(1), Paths());
  const std::map<std::string, std::string> expected = {
      {"RANK", "3"},
      {"LOCAL_RANK", "1"},
      {"WORLD_SIZE", "6"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"LOCAL_SIZE", "2"},
      {"NODE_RANK", "1"},
      {"GROUP_RANK", "1"},
      {"CROSS_RANK", "1"},
      {"CROSS_SIZE", "3"},
      {"MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "29501"},
      {"CUDA_VISIBLE_DEVICES", "2,5"},
      {"PYTHONUNBUFFERED", "1"},
      {"TORCHELASTIC_RESTART_COUNT", "0"},
      {"TORCHELASTIC_ERROR_FILE", "/tmp/dsl/error-3.json"},
      {"DSLAUNCH_JOB_ID", "job-42"},
      {"DSLAUNCH_PROGRESS", "/tmp/dsl/progress-3.sock"},
      {"DSLAUNCH_STORE", "unix:/tmp/dsl/store.sock"},
  };
  ExpectVariables(env, expected);
}

TEST(ContractEnv, SetsTorchrunGroupAndRoleVariables) {
  const wire::JobSpec job = Node1Of3x2();
  auto env = ContractEnv(job, job.ranks(0), Paths());
  EXPECT_EQ(env["RANK"], "2");
  EXPECT_EQ(env["LOCAL_RANK"], "0");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "3");
  EXPECT_EQ(env["ROLE_RANK"], "2");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "6");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job-42");
}

TEST(ContractEnv, ReportsRestartCount) {
  wire::JobSpec job = Node1Of3x2();
  job.set_restart_count(2);
  EXPECT_EQ(
      ContractEnv(job, job.ranks(0), Paths())["TORCHELASTIC_RESTART_COUNT"],
      "2");
}

TEST(ContractEnv, CudaVisibleDevicesListsOneSlot) {
  wire::JobSpec job = Node1Of3x2();
  job.clear_visible_slots();
  job.add_visible_slots(7);
  EXPECT_EQ(ContractEnv(job, job.ranks(0), Paths())["CUDA_VISIBLE_DEVICES"],
            "7");
}

// What horovodrun gives each rank, for node 1 of 3 (host "h2").
TEST(ContractEnv, SetsHorovodsPlacementAndRendezvous) {
  wire::JobSpec job = Node1Of3x2();
  job.set_host("h2");
  RankPaths paths = Paths();
  paths.horovod_port = 40123;
  auto env = ContractEnv(job, job.ranks(1), paths);
  const std::map<std::string, std::string> expected = {
      {"HOROVOD_RANK", "3"},
      {"HOROVOD_SIZE", "6"},
      {"HOROVOD_LOCAL_RANK", "1"},
      {"HOROVOD_LOCAL_SIZE", "2"},
      {"HOROVOD_CROSS_RANK", "1"},
      {"HOROVOD_CROSS_SIZE", "3"},
      {"HOROVOD_HOSTNAME", "h2"},
      {"HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1"},
      {"HOROVOD_GLOO_RENDEZVOUS_PORT", "40123"},
  };
  ExpectVariables(env, expected);
  // No rendezvous, no address for one.
  EXPECT_EQ(ContractEnv(job, job.ranks(1), Paths())
                .count("HOROVOD_GLOO_RENDEZVOUS_ADDR"),
            0u);
}

// Nodes with 3, 1 and 2 ranks: the ranks at local rank 1 live on nodes 0
// and 2 only, so node 2's is cross rank 1 of 2; local rank 2 is alone.
TEST(ContractEnv, CountsCrossRanksAmongTheNodesThatHaveThem) {
  wire::JobSpec job = Node1Of3x2();
  job.set_node_rank(2);
  job.set_world_size(6);
  for (int n : {3, 1, 2}) job.add_node_rank_counts(n);
  EXPECT_EQ(HorovodCross(job, 0).rank, 2);
  EXPECT_EQ(HorovodCross(job, 0).size, 3);
  EXPECT_EQ(HorovodCross(job, 1).rank, 1);
  EXPECT_EQ(HorovodCross(job, 1).size, 2);
  job.set_node_rank(0);
  EXPECT_EQ(HorovodCross(job, 2).rank, 0);
  EXPECT_EQ(HorovodCross(job, 2).size, 1);
  // Without the counts (an older launcher) every node counts as this one.
  job.clear_node_rank_counts();
  EXPECT_EQ(HorovodCross(job, 1).rank, 0);
  EXPECT_EQ(HorovodCross(job, 1).size, 3);
}

TEST(ContractEnv, NamesTheScopesHorovodMeetsIn) {
  wire::JobSpec job = Node1Of3x2();
  job.set_host("h2");
  for (int n : {2, 2, 1}) job.add_node_rank_counts(n);
  const std::map<std::string, int> expected = {
      {"global", 6}, {"local_h2", 2}, {"cross_0", 3}, {"cross_1", 2}};
  EXPECT_EQ(HorovodScopes(job), expected);
  job.clear_host();
  EXPECT_EQ(HorovodHostname(job), "node1");
}

TEST(BuildRankEnv, GivesHorovodGlooUnlessTheJobOrMpiSaysOtherwise) {
  wire::JobSpec job = Node1Of3x2();
  RankPaths paths = Paths();
  paths.horovod_port = 40123;
  paths.socket_ifname = "eth1";
  const char* base[] = {"PATH=/bin", nullptr};
  auto env = AsMap(BuildRankEnv(job, job.ranks(0), paths, base));
  EXPECT_EQ(env["HOROVOD_CONTROLLER"], "gloo");
  EXPECT_EQ(env["HOROVOD_CPU_OPERATIONS"], "gloo");
  EXPECT_EQ(env["HOROVOD_GLOO_IFACE"], "eth1");
  // The job's own choices stay.
  for (const char* kv : {"HOROVOD_GLOO_IFACE=ib0", "HOROVOD_CONTROLLER=mpi"}) {
    wire::EnvVar* var = job.add_env();
    const std::string s(kv);
    var->set_key(s.substr(0, s.find('=')));
    var->set_value(s.substr(s.find('=') + 1));
  }
  env = AsMap(BuildRankEnv(job, job.ranks(0), paths, base));
  EXPECT_EQ(env["HOROVOD_GLOO_IFACE"], "ib0");
  EXPECT_EQ(env["HOROVOD_CONTROLLER"], "mpi");
  // Ranks mpirun started: an MPI-built Horovod picks MPI by itself.
  job.clear_env();
  const std::vector<std::string> mpi = {"OMPI_COMM_WORLD_RANK=2"};
  env = AsMap(BuildRankEnv(job, job.ranks(0), paths, base, &mpi));
  EXPECT_EQ(env.count("HOROVOD_CONTROLLER"), 0u);
  EXPECT_EQ(env.count("HOROVOD_CPU_OPERATIONS"), 0u);
  EXPECT_EQ(env["HOROVOD_RANK"], "2");
}

TEST(BuildRankEnv, KeepsBaseEnvironmentAndAddsTheContract) {
  const wire::JobSpec job = Node1Of3x2();
  const char* base[] = {"PATH=/usr/bin:/bin", "HOME=/home/u", nullptr};
  auto env = AsMap(BuildRankEnv(job, job.ranks(1), Paths(), base));
  EXPECT_EQ(env["PATH"], "/usr/bin:/bin");
  EXPECT_EQ(env["HOME"], "/home/u");
  EXPECT_EQ(env["RANK"], "3");
  EXPECT_EQ(env["DSLAUNCH_JOB_ID"], "job-42");
}

TEST(BuildRankEnv, JobEnvOverridesBaseEnv) {
  wire::JobSpec job = Node1Of3x2();
  wire::EnvVar* var = job.add_env();
  var->set_key("NCCL_DEBUG");
  var->set_value("INFO");
  var = job.add_env();
  var->set_key("EMPTY");
  var->set_value("");
  const char* base[] = {"NCCL_DEBUG=WARN", "OTHER=kept", nullptr};
  auto env = AsMap(BuildRankEnv(job, job.ranks(0), Paths(), base));
  EXPECT_EQ(env["NCCL_DEBUG"], "INFO");
  EXPECT_EQ(env["OTHER"], "kept");
  ASSERT_EQ(env.count("EMPTY"), 1u);
  EXPECT_EQ(env["EMPTY"], "");
}

// dslaunch's Python files first on PYTHONPATH: the hook's directory (its
// sitecustomize), then the client's, then what the rank had (the job's
// value over the node's); without a directory PYTHONPATH is left alone.
TEST(BuildRankEnv, PutsDslaunchsPythonFilesFirstOnPythonpath) {
  wire::JobSpec job = Node1Of3x2();
  RankPaths paths = Paths();
  paths.python_dir = "/opt/dsl/share/dslaunch/python";
  const char* base[] = {"PYTHONPATH=/node/lib", nullptr};
  auto env = AsMap(BuildRankEnv(job, job.ranks(0), paths, base));
  EXPECT_EQ(env["PYTHONPATH"],
            "/opt/dsl/share/dslaunch/python/dslaunch_hook:"
            "/opt/dsl/share/dslaunch/python:/node/lib");
  wire::EnvVar* var = job.add_env();
  var->set_key("PYTHONPATH");
  var->set_value("/job/lib");
  env = AsMap(BuildRankEnv(job, job.ranks(0), paths, base));
  EXPECT_EQ(env["PYTHONPATH"],
            "/opt/dsl/share/dslaunch/python/dslaunch_hook:"
            "/opt/dsl/share/dslaunch/python:/job/lib");
  const char* none[] = {nullptr};
  env = AsMap(BuildRankEnv(Node1Of3x2(), job.ranks(0), paths, none));
  EXPECT_EQ(env["PYTHONPATH"],
            "/opt/dsl/share/dslaunch/python/dslaunch_hook:"
            "/opt/dsl/share/dslaunch/python");
  env = AsMap(BuildRankEnv(job, job.ranks(0), Paths(), base));
  EXPECT_EQ(env["PYTHONPATH"], "/job/lib");
}

TEST(BuildRankEnv, NamesTheInterfaceTowardTheMasterUnlessTheUserDid) {
  wire::JobSpec job = Node1Of3x2();
  RankPaths paths = Paths();
  paths.socket_ifname = "eth1";
  const char* base[] = {"PATH=/bin", nullptr};
  auto env = AsMap(BuildRankEnv(job, job.ranks(0), paths, base));
  EXPECT_EQ(env["GLOO_SOCKET_IFNAME"], "eth1");
  EXPECT_EQ(env["NCCL_SOCKET_IFNAME"], "eth1");
  // Set by the user (exported by the launcher, or on the node): kept.
  wire::EnvVar* var = job.add_env();
  var->set_key("NCCL_SOCKET_IFNAME");
  var->set_value("ib0");
  const char* node_base[] = {"GLOO_SOCKET_IFNAME=bond0", nullptr};
  env = AsMap(BuildRankEnv(job, job.ranks(0), paths, node_base));
  EXPECT_EQ(env["GLOO_SOCKET_IFNAME"], "bond0");
  EXPECT_EQ(env["NCCL_SOCKET_IFNAME"], "ib0");
  // Unknown (no route): neither is set.
  const wire::JobSpec plain = Node1Of3x2();
  env = AsMap(BuildRankEnv(plain, plain.ranks(0), Paths(), base));
  EXPECT_EQ(env.count("GLOO_SOCKET_IFNAME"), 0u);
  EXPECT_EQ(env.count("NCCL_SOCKET_IFNAME"), 0u);
}

TEST(BuildRankEnv, ContractOverridesJobEnvAndBaseEnv) {
  wire::JobSpec job = Node1Of3x2();
  wire::EnvVar* var = job.add_env();
  var->set_key("RANK");
  var->set_value("77");
  var = job.add_env();
  var->set_key("CUDA_VISIBLE_DEVICES");
  var->set_value("0,1,2,3");
  const char* base[] = {"RANK=99", "MASTER_PORT=1", "WORLD_SIZE=1", nullptr};
  auto env = AsMap(BuildRankEnv(job, job.ranks(1), Paths(), base));
  EXPECT_EQ(env["RANK"], "3");
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "2,5");
  EXPECT_EQ(env["MASTER_PORT"], "29501");
  EXPECT_EQ(env["WORLD_SIZE"], "6");
}

TEST(BuildRankEnv, TakesTheMpiIdentityOfTheRanksOwnProcess) {
  wire::JobSpec job = Node1Of3x2();
  wire::EnvVar* var = job.add_env();
  var->set_key("OMPI_COMM_WORLD_RANK");  // exported by mistake: not ours
  var->set_value("9");
  // The agent is local rank 0's process: its identity is not rank 3's.
  const char* base[] = {"OMPI_COMM_WORLD_RANK=2", "PMIX_RANK=2",
                        "OMPI_ONLY_IN_AGENT=x", "PATH=/bin", nullptr};
  const std::vector<std::string> own = {"OMPI_COMM_WORLD_RANK=3", "PMIX_RANK=3",
                                        "PMIX_ID=7.3"};
  auto env = AsMap(BuildRankEnv(job, job.ranks(1), Paths(), base, &own));
  EXPECT_EQ(env["OMPI_COMM_WORLD_RANK"], "3");
  EXPECT_EQ(env["PMIX_RANK"], "3");
  EXPECT_EQ(env["PMIX_ID"], "7.3");
  EXPECT_EQ(env.count("OMPI_ONLY_IN_AGENT"), 0u);
  EXPECT_EQ(env["PATH"], "/bin");
  EXPECT_EQ(env["RANK"], "3");
  // Without process variables the base's MPI variables pass as they are.
  env = AsMap(BuildRankEnv(job, job.ranks(1), Paths(), base));
  EXPECT_EQ(env["OMPI_ONLY_IN_AGENT"], "x");
}

TEST(BuildRankEnv, SkipsMalformedBaseEntriesAndKeepsEqualsInValues) {
  const wire::JobSpec job = Node1Of3x2();
  const char* base[] = {"NOEQUALS", "=novalue", "OPTS=a=b=c", nullptr};
  auto env = AsMap(BuildRankEnv(job, job.ranks(0), Paths(), base));
  EXPECT_EQ(env.count("NOEQUALS"), 0u);
  EXPECT_EQ(env.count(""), 0u);
  EXPECT_EQ(env["OPTS"], "a=b=c");
}

TEST(BuildRankEnv, AcceptsNullBase) {
  const wire::JobSpec job = Node1Of3x2();
  auto env = AsMap(BuildRankEnv(job, job.ranks(0), Paths(), nullptr));
  EXPECT_EQ(env["RANK"], "2");
}

TEST(BuildRankArgv, AppendsLocalRankWhenAsked) {
  const wire::JobSpec job = Node1Of3x2();
  EXPECT_EQ(BuildRankArgv(job, job.ranks(1)),
            (std::vector<std::string>{"/usr/bin/python3", "train.py",
                                      "--lr=0.1", "--local_rank=1"}));
  EXPECT_EQ(BuildRankArgv(job, job.ranks(0)).back(), "--local_rank=0");
}

TEST(BuildRankArgv, LeavesArgvAloneWithoutAppendLocalRank) {
  wire::JobSpec job = Node1Of3x2();
  job.set_append_local_rank(false);
  EXPECT_EQ(
      BuildRankArgv(job, job.ranks(1)),
      (std::vector<std::string>{"/usr/bin/python3", "train.py", "--lr=0.1"}));
}

TEST(BuildRankArgv, PassesArgumentsByteExact) {
  wire::JobSpec job = Node1Of3x2();
  job.clear_argv();
  job.add_argv("prog");
  job.add_argv("with space");
  job.add_argv("$HOME;'quoted'\"");
  job.add_argv("");
  job.set_append_local_rank(false);
  EXPECT_EQ(
      BuildRankArgv(job, job.ranks(0)),
      (std::vector<std::string>{"prog", "with space", "$HOME;'quoted'\"", ""}));
}

TEST(BuildRankArgv, PutsLocalRankWhereTheJobSays) {
  wire::JobSpec job = Node1Of3x2();
  job.set_local_rank_at(2);  // right after the script: DeepSpeed's order
  EXPECT_EQ(BuildRankArgv(job, job.ranks(1)),
            (std::vector<std::string>{"/usr/bin/python3", "train.py",
                                      "--local_rank=1", "--lr=0.1"}));
  job.set_local_rank_at(3);  // argv.size(): at the end
  EXPECT_EQ(BuildRankArgv(job, job.ranks(0)).back(), "--local_rank=0");
  job.set_local_rank_at(99);  // out of range (a newer launcher?): at the end
  EXPECT_EQ(BuildRankArgv(job, job.ranks(0)).back(), "--local_rank=0");
}

TEST(BuildRankEnv, LeavesOutWhatTheAgentsTransportSet) {
  const wire::JobSpec job = Node1Of3x2();
  const char* base[] = {"SSH_CLIENT=10.0.0.1 5 22",
                        "SSH_CONNECTION=10.0.0.1 5 10.0.0.2 22",
                        "SSH_TTY=/dev/pts/1",
                        "SSH_ORIGINAL_COMMAND=dsagent",
                        "SSH_AUTH_SOCK=/tmp/a",
                        "SHLVL=0",
                        "SSH_KEEP=1",
                        "HOME=/home/u",
                        nullptr};
  auto env = AsMap(BuildRankEnv(job, job.ranks(0), Paths(), base));
  for (const char* gone : {"SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY",
                           "SSH_ORIGINAL_COMMAND", "SSH_AUTH_SOCK", "SHLVL"})
    EXPECT_EQ(env.count(gone), 0u) << gone;
  EXPECT_EQ(env["SSH_KEEP"], "1");
  EXPECT_EQ(env["HOME"], "/home/u");
}

TEST(ShareCores, GivesEachRankAnEqualBlockInOrder) {
  auto shares = ShareCores({0, 1, 2, 3, 4, 5, 6}, 3);
  ASSERT_TRUE(shares.ok()) << shares.status().message();
  EXPECT_EQ(*shares, (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}}));
  shares = ShareCores({1, 3, 4, 5, 7}, 1);
  ASSERT_TRUE(shares.ok());
  EXPECT_EQ(*shares, (std::vector<std::vector<int>>{{1, 3, 4, 5, 7}}));
}

TEST(ShareCores, FewerCoresThanRanksIsAnErrorNamingThem) {
  auto shares = ShareCores({2, 3}, 4);
  ASSERT_FALSE(shares.ok());
  EXPECT_NE(shares.status().message().find("2 cores (2-3) for 4 ranks"),
            std::string::npos)
      << shares.status().message();
}

}  // namespace
}  // namespace dslaunch::agent
