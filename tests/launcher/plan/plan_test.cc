#include "launcher/plan/plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dslaunch::launcher {
namespace {

// node1..node3 with 4, 4 and 2 slots; node2 has ssh overrides.
Hostfile ThreeHosts() {
  StatusOr<Hostfile> hostfile = ParseHostfile(
      "node1 slots=4\nnode2 slots=4 port=2222 user=bob\nnode3 slots=2\n",
      "hosts.txt");
  EXPECT_TRUE(hostfile.ok()) << hostfile.status().message();
  return *hostfile;
}

Plan MustPlan(const Hostfile& hostfile, const PlanOptions& options) {
  StatusOr<Plan> plan = MakePlan(hostfile, options);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? *plan : Plan{};
}

// Returns the InvalidArgument message of MakePlan, failing if it succeeds.
std::string PlanError(const PlanOptions& options) {
  StatusOr<Plan> plan = MakePlan(ThreeHosts(), options);
  EXPECT_FALSE(plan.ok());
  if (plan.ok()) return "";
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  return plan.status().message();
}

PlanOptions Include(const std::string& spec) {
  PlanOptions options;
  options.include = spec;
  return options;
}

PlanOptions Exclude(const std::string& spec) {
  PlanOptions options;
  options.exclude = spec;
  return options;
}

std::vector<std::string> Hosts(const Plan& plan) {
  std::vector<std::string> hosts;
  for (const NodePlan& node : plan.nodes) hosts.push_back(node.host);
  return hosts;
}

using Slots = std::vector<int>;

TEST(Plan, UsesEveryHostAndSlotByDefault) {
  Plan plan = MustPlan(ThreeHosts(), {});
  ASSERT_EQ(plan.nodes.size(), 3u);
  EXPECT_EQ(Hosts(plan), (std::vector<std::string>{"node1", "node2", "node3"}));
  EXPECT_EQ(plan.nodes[0].slots, (Slots{0, 1, 2, 3}));
  EXPECT_EQ(plan.nodes[2].slots, (Slots{0, 1}));
  EXPECT_EQ(plan.world_size, 10);
}

TEST(Plan, AssignsGlobalRanksInBlocksNodeByNode) {
  Plan plan = MustPlan(ThreeHosts(), {});
  EXPECT_EQ(plan.nodes[0].node_rank, 0);
  EXPECT_EQ(plan.nodes[0].first_rank, 0);
  EXPECT_EQ(plan.nodes[1].node_rank, 1);
  EXPECT_EQ(plan.nodes[1].first_rank, 4);
  EXPECT_EQ(plan.nodes[2].node_rank, 2);
  EXPECT_EQ(plan.nodes[2].first_rank, 8);
}

TEST(Plan, CarriesPerHostSshOverrides) {
  Plan plan = MustPlan(ThreeHosts(), {});
  EXPECT_FALSE(plan.nodes[0].ssh_port.has_value());
  EXPECT_FALSE(plan.nodes[0].ssh_user.has_value());
  EXPECT_EQ(plan.nodes[1].ssh_port, 2222);
  EXPECT_EQ(plan.nodes[1].ssh_user, "bob");
}

TEST(Plan, MasterDefaultsToNodeZerosHostAndPort29500) {
  Plan plan = MustPlan(ThreeHosts(), Exclude("node1"));
  EXPECT_EQ(plan.master_addr, "node2");
  EXPECT_EQ(plan.master_port, 29500);
}

TEST(Plan, UsesGivenMasterAddrAndPort) {
  PlanOptions options;
  options.master_addr = "10.0.0.9";
  options.master_port = 1234;
  Plan plan = MustPlan(ThreeHosts(), options);
  EXPECT_EQ(plan.master_addr, "10.0.0.9");
  EXPECT_EQ(plan.master_port, 1234);
}

TEST(Plan, RejectsMasterPortOutOfRange) {
  PlanOptions options;
  options.master_port = 0;
  EXPECT_EQ(PlanError(options), "--master_port must be in 1..65535, got 0");
  options.master_port = 65536;
  EXPECT_EQ(PlanError(options), "--master_port must be in 1..65535, got 65536");
}

TEST(Plan, IncludeKeepsHostfileOrderNotSpecOrder) {
  Plan plan = MustPlan(ThreeHosts(), Include("node3@node1"));
  EXPECT_EQ(Hosts(plan), (std::vector<std::string>{"node1", "node3"}));
  EXPECT_EQ(plan.nodes[0].slots, (Slots{0, 1, 2, 3}));
  EXPECT_EQ(plan.nodes[1].node_rank, 1);
  EXPECT_EQ(plan.nodes[1].first_rank, 4);
  EXPECT_EQ(plan.world_size, 6);
}

TEST(Plan, IncludeSelectedSlotsSortedAscending) {
  Plan plan = MustPlan(ThreeHosts(), Include("node2:3,1@node3:1"));
  EXPECT_EQ(Hosts(plan), (std::vector<std::string>{"node2", "node3"}));
  EXPECT_EQ(plan.nodes[0].slots, (Slots{1, 3}));
  EXPECT_EQ(plan.nodes[1].slots, (Slots{1}));
  EXPECT_EQ(plan.nodes[1].first_rank, 2);
  EXPECT_EQ(plan.world_size, 3);
  EXPECT_EQ(plan.master_addr, "node2");
}

TEST(Plan, IncludeMatchesHostsIgnoringCase) {
  Plan plan = MustPlan(ThreeHosts(), Include("NODE2"));
  EXPECT_EQ(Hosts(plan), (std::vector<std::string>{"node2"}));
}

TEST(Plan, ExcludeWholeHost) {
  Plan plan = MustPlan(ThreeHosts(), Exclude("node2"));
  EXPECT_EQ(Hosts(plan), (std::vector<std::string>{"node1", "node3"}));
  EXPECT_EQ(plan.nodes[1].node_rank, 1);
  EXPECT_EQ(plan.world_size, 6);
}

TEST(Plan, ExcludeSomeSlots) {
  Plan plan = MustPlan(ThreeHosts(), Exclude("node1:0,2@node3:1"));
  EXPECT_EQ(plan.nodes[0].slots, (Slots{1, 3}));
  EXPECT_EQ(plan.nodes[1].slots, (Slots{0, 1, 2, 3}));
  EXPECT_EQ(plan.nodes[2].slots, (Slots{0}));
  EXPECT_EQ(plan.nodes[1].first_rank, 2);
  EXPECT_EQ(plan.nodes[2].first_rank, 6);
  EXPECT_EQ(plan.world_size, 7);
}

TEST(Plan, ExcludingEverySlotOfAHostDropsIt) {
  Plan plan = MustPlan(ThreeHosts(), Exclude("node1:0,1,2,3"));
  EXPECT_EQ(Hosts(plan), (std::vector<std::string>{"node2", "node3"}));
  EXPECT_EQ(plan.nodes[0].node_rank, 0);
  EXPECT_EQ(plan.master_addr, "node2");
}

TEST(Plan, RejectsExcludingEverything) {
  EXPECT_EQ(PlanError(Exclude("node1@node2@node3:0,1")),
            "no slots left to run on after --exclude node1@node2@node3:0,1");
}

TEST(Plan, RejectsIncludeWithExclude) {
  PlanOptions options;
  options.include = "node1";
  options.exclude = "node2";
  EXPECT_EQ(PlanError(options),
            "--include and --exclude are mutually exclusive");
}

TEST(Plan, RejectsHostNotInHostfile) {
  EXPECT_EQ(PlanError(Include("node1@node9")),
            "--include: host node9 is not in the hostfile hosts.txt");
  EXPECT_EQ(PlanError(Exclude("node9:0")),
            "--exclude: host node9 is not in the hostfile hosts.txt");
}

TEST(Plan, RejectsSlotNotOnHost) {
  EXPECT_EQ(PlanError(Include("node2:5")),
            "--include: slot 5 is not on host node2 (it has slots 0-3)");
  EXPECT_EQ(PlanError(Exclude("node3:2")),
            "--exclude: slot 2 is not on host node3 (it has slots 0-1)");
}

TEST(Plan, SlotErrorSaysSingleSlot) {
  Hostfile hostfile = *ParseHostfile("solo\n", "h");
  StatusOr<Plan> plan = MakePlan(hostfile, Include("solo:1"));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message(),
            "--include: slot 1 is not on host solo (it has only slot 0)");
}

TEST(Plan, RejectsDuplicateSlot) {
  EXPECT_EQ(PlanError(Include("node1:1,2,1")),
            "--include: slot 1 is given twice in 'node1:1,2,1'");
}

TEST(Plan, RejectsHostNamedTwice) {
  EXPECT_EQ(PlanError(Exclude("node1:0@node1:1")),
            "--exclude: host node1 is named twice in 'node1:0@node1:1'");
}

TEST(Plan, RejectsMalformedSpecs) {
  EXPECT_EQ(PlanError(Include("node1@")),
            "--include: empty host name in 'node1@'");
  EXPECT_EQ(PlanError(Include("@node1")),
            "--include: empty host name in '@node1'");
  EXPECT_EQ(PlanError(Include(":0")), "--include: empty host name in ':0'");
  EXPECT_EQ(PlanError(Include("node1:")),
            "--include: no slot ids after ':' in 'node1:'");
  EXPECT_EQ(PlanError(Include("node1:a")),
            "--include: 'a' in 'node1:a' is not a slot id");
  EXPECT_EQ(PlanError(Include("node1:0,")),
            "--include: '' in 'node1:0,' is not a slot id");
  EXPECT_EQ(PlanError(Include("node1:-1")),
            "--include: '-1' in 'node1:-1' is not a slot id");
  EXPECT_EQ(PlanError(Exclude("node1:0:1")),
            "--exclude: '0:1' in 'node1:0:1' is not a slot id");
}

TEST(Plan, ParseFilterSpecRejectsEmptySpec) {
  StatusOr<std::vector<FilterTerm>> terms = ParseFilterSpec("", "--include");
  ASSERT_FALSE(terms.ok());
  EXPECT_EQ(terms.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(terms.status().message(), "--include: empty spec");
}

TEST(Plan, ParseFilterSpecKeepsSpecOrder) {
  StatusOr<std::vector<FilterTerm>> terms =
      ParseFilterSpec("b:2,0@a", "--exclude");
  ASSERT_TRUE(terms.ok()) << terms.status().message();
  ASSERT_EQ(terms->size(), 2u);
  EXPECT_EQ((*terms)[0].host, "b");
  EXPECT_EQ((*terms)[0].slots, (Slots{2, 0}));
  EXPECT_EQ((*terms)[1].host, "a");
  EXPECT_TRUE((*terms)[1].slots.empty());
}

TEST(Plan, NumNodesKeepsFirstHostsInHostfileOrder) {
  PlanOptions options;
  options.num_nodes = 2;
  Plan plan = MustPlan(ThreeHosts(), options);
  EXPECT_EQ(Hosts(plan), (std::vector<std::string>{"node1", "node2"}));
  EXPECT_EQ(plan.world_size, 8);
}

TEST(Plan, NumNodesAppliesAfterExclude) {
  PlanOptions options = Exclude("node1");
  options.num_nodes = 1;
  Plan plan = MustPlan(ThreeHosts(), options);
  EXPECT_EQ(Hosts(plan), (std::vector<std::string>{"node2"}));
  EXPECT_EQ(plan.nodes[0].node_rank, 0);
  EXPECT_EQ(plan.master_addr, "node2");
}

TEST(Plan, RejectsNumNodesAboveSelectedHosts) {
  PlanOptions options = Include("node1@node3");
  options.num_nodes = 3;
  EXPECT_EQ(PlanError(options), "--num_nodes 3: only 2 hosts are selected");
}

TEST(Plan, RejectsNumNodesBelowOne) {
  PlanOptions options;
  options.num_nodes = 0;
  EXPECT_EQ(PlanError(options), "--num_nodes must be at least 1, got 0");
  options.num_nodes = -2;
  EXPECT_EQ(PlanError(options), "--num_nodes must be at least 1, got -2");
}

TEST(Plan, NumNodesMinMaxMakesTheHostsBeyondMaxSpares) {
  PlanOptions options;
  ASSERT_TRUE(ParseNumNodes("1:2", 100, options).ok());
  options.num_gpus = 2;
  Plan plan = MustPlan(ThreeHosts(), options);
  ASSERT_EQ(plan.nodes.size(), 2u);
  EXPECT_EQ(plan.min_nodes, 1);
  EXPECT_EQ(plan.world_size, 4);
  EXPECT_EQ(plan.nodes[1].agent, 1);
  ASSERT_EQ(plan.spares.size(), 1u);
  EXPECT_EQ(plan.spares[0].host, "node3");
  EXPECT_EQ(plan.spares[0].agent, 2);
  EXPECT_EQ(plan.spares[0].node_rank, -1);
  EXPECT_EQ(plan.spares[0].slots, (std::vector<int>{0, 1}));  // --num_gpus too
  // The pool: every agent by index, what the starter starts.
  Plan pool = AgentPool(plan);
  ASSERT_EQ(pool.nodes.size(), 3u);
  EXPECT_EQ(pool.nodes[2].node_rank, 2);
  EXPECT_EQ(pool.nodes[2].host, "node3");
  EXPECT_TRUE(pool.spares.empty());
  // Fewer hosts than MAX are enough when MIN are there; fewer than MIN not.
  ASSERT_TRUE(ParseNumNodes("2:8", 100, options).ok());
  EXPECT_EQ(MustPlan(ThreeHosts(), options).nodes.size(), 3u);
  ASSERT_TRUE(ParseNumNodes("4:8", 100, options).ok());
  EXPECT_EQ(PlanError(options), "--num_nodes 4:8: only 3 hosts are selected");
}

TEST(Plan, AGenerationPlanRenumbersNodesAndRanksDensely) {
  Plan pool = AgentPool(MustPlan(ThreeHosts(), PlanOptions()));
  Plan plan = GenerationPlan(pool, {0, 2}, "node1", 1234);
  ASSERT_EQ(plan.nodes.size(), 2u);
  EXPECT_EQ(plan.world_size, 6);  // 4 + 2
  EXPECT_EQ(plan.nodes[1].host, "node3");
  EXPECT_EQ(plan.nodes[1].agent, 2);
  EXPECT_EQ(plan.nodes[1].node_rank, 1);
  EXPECT_EQ(plan.nodes[1].first_rank, 4);
  EXPECT_EQ(plan.master_port, 1234);
  plan = GenerationPlan(pool, {1, 2}, "node2", 1);
  EXPECT_EQ(plan.nodes[0].ssh_port, 2222);  // the host's own settings
  EXPECT_EQ(plan.nodes[0].first_rank, 0);
  EXPECT_EQ(plan.nodes[1].first_rank, 4);
}

TEST(Plan, ParseNumNodesTakesNOrMinMax) {
  PlanOptions o;
  ASSERT_TRUE(ParseNumNodes("3", 10, o).ok());
  EXPECT_EQ(o.num_nodes, 3);
  EXPECT_EQ(o.min_nodes, -1);
  ASSERT_TRUE(ParseNumNodes("2:2", 10, o).ok());
  EXPECT_EQ(o.min_nodes, 2);
  for (const char* bad :
       {"", ":", "1:", "a", "1:2:3", "1 :2", "+1:2", "99999999999:1"}) {
    EXPECT_FALSE(ParseNumNodes(bad, 10, o).ok()) << bad;
  }
  EXPECT_EQ(ParseNumNodes("11", 10, o).message(),
            "--num_nodes must be in 1..10, got 11");
  EXPECT_EQ(ParseNumNodes("1:11", 10, o).message(),
            "--num_nodes 1:11: need 1 <= MIN <= MAX <= 10");
  EXPECT_EQ(ParseNumNodes(std::string(1000, '7'), 10, o).message(),
            "--num_nodes must be N or MIN:MAX (whole numbers), got '" +
                std::string(40, '7') + "'");
}

TEST(Plan, FormatTableNamesSparesAndTheSizeRange) {
  PlanOptions options;
  ASSERT_TRUE(ParseNumNodes("1:2", 100, options).ok());
  const std::string table = FormatPlanTable(MustPlan(ThreeHosts(), options));
  EXPECT_NE(table.find("a later generation runs on 1 to 2 nodes (--num_nodes "
                       "1:2), ranks renumbered\n"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("spares, standing by to take a lost node's place: "
                       "node3\n"),
            std::string::npos)
      << table;
}

TEST(Plan, NumGpusKeepsFirstSelectedSlotsOfEachHost) {
  PlanOptions options;
  options.num_gpus = 2;
  Plan plan = MustPlan(ThreeHosts(), options);
  for (const NodePlan& node : plan.nodes) EXPECT_EQ(node.slots, (Slots{0, 1}));
  EXPECT_EQ(plan.nodes[2].first_rank, 4);
  EXPECT_EQ(plan.world_size, 6);
}

TEST(Plan, NumGpusAppliesToSlotsLeftByExclude) {
  PlanOptions options = Exclude("node1:0@node2:1");
  options.num_gpus = 2;
  options.num_nodes = 2;
  Plan plan = MustPlan(ThreeHosts(), options);
  EXPECT_EQ(plan.nodes[0].slots, (Slots{1, 2}));
  EXPECT_EQ(plan.nodes[1].slots, (Slots{0, 2}));
  EXPECT_EQ(plan.world_size, 4);
}

TEST(Plan, NumGpusIsCheckedOnlyAgainstHostsKeptByNumNodes) {
  PlanOptions options;
  options.num_nodes = 2;
  options.num_gpus = 4;
  Plan plan =
      MustPlan(ThreeHosts(), options);  // node3 has only 2 slots but is dropped
  EXPECT_EQ(plan.world_size, 8);
}

TEST(Plan, RejectsNumGpusAboveSelectedSlotsNamingHost) {
  PlanOptions options;
  options.num_gpus = 3;
  EXPECT_EQ(PlanError(options),
            "--num_gpus 3: host node3 has only 2 selected slots");
  options = Include("node1:0,1");
  options.num_gpus = 3;
  EXPECT_EQ(PlanError(options),
            "--num_gpus 3: host node1 has only 2 selected slots");
}

TEST(Plan, RejectsNumGpusBelowOneOrAboveTheSlotLimit) {
  PlanOptions options;
  options.num_gpus = 0;
  EXPECT_EQ(PlanError(options), "--num_gpus must be in 1..1024, got 0");
  options.num_gpus = 2147483647;
  EXPECT_EQ(PlanError(options),
            "--num_gpus must be in 1..1024, got 2147483647");
}

TEST(Plan, RejectsAHostfileBeyondTheLimitsBeforeAllocatingSlots) {
  Hostfile hostfile;
  hostfile.hosts.push_back({"big", 2147483647, {}, {}, {}, 1});
  StatusOr<Plan> plan = MakePlan(hostfile, {});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kDataError);
  EXPECT_EQ(plan.status().message(), "host big: slots must be in 1..1024");
  hostfile.hosts.assign(1025, {"h", 1024, {}, {}, {}, 1});
  plan = MakePlan(hostfile, {});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message(), "more than 1048576 slots");
}

TEST(Plan, RejectsEmptyHostfile) {
  StatusOr<Plan> plan = MakePlan(Hostfile{}, {});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(), "no hosts to run on");
}

TEST(Plan, FormatsTableWithOneRowPerRankAndSummary) {
  PlanOptions options = Include("node1:1,3@node3:1");
  Plan plan = MustPlan(ThreeHosts(), options);
  EXPECT_EQ(FormatPlanTable(plan),
            "host   node_rank  local_rank  global_rank  gpu\n"
            "node1  0          0           0            1\n"
            "node1  0          1           1            3\n"
            "node3  1          0           2            1\n"
            "2 nodes, 3 ranks, master node1:29500\n");
}

TEST(Plan, FormatTableWidensColumnsForLongHostNames) {
  Hostfile hostfile = *ParseHostfile("gpu-node-0001.cluster slots=1\n", "h");
  PlanOptions options;
  options.master_addr = "10.1.2.3";
  options.master_port = 6000;
  EXPECT_EQ(FormatPlanTable(MustPlan(hostfile, options)),
            "host                   node_rank  local_rank  global_rank  gpu\n"
            "gpu-node-0001.cluster  0          0           0            0\n"
            "1 node, 1 rank, master 10.1.2.3:6000\n");
}

TEST(Plan, FormatTableBracketsIpv6Master) {
  Plan plan;
  plan.master_addr = "fe80::1";
  plan.master_port = 29500;
  EXPECT_EQ(FormatPlanTable(plan),
            "host  node_rank  local_rank  global_rank  gpu\n"
            "0 nodes, 0 ranks, master [fe80::1]:29500\n");
}

}  // namespace
}  // namespace dslaunch::launcher
