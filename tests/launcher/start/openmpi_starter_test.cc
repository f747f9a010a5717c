#include "launcher/start/openmpi_starter.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dslaunch::launcher {
namespace {

using Words = std::vector<std::string>;

TEST(MpirunArgv, OneProcessPerRankNodeByNodeEachAgentPrintingItsSecret) {
  MpirunSettings s;
  s.extra_args = {"--mca", "btl", "tcp,self"};
  const Words argv = MpirunArgv(s, "/tmp/hosts", {2, 4},
                                {"/opt/dsagent", "--connect", "10.0.0.9:4242",
                                 "--node_rank", "0", "--job_id", "j"});
  EXPECT_EQ(argv, (Words{"mpirun",
                         "--np",
                         "6",
                         "--hostfile",
                         "/tmp/hosts",
                         "--map-by",
                         "slot",
                         "--bind-to",
                         "none",
                         "-x",
                         "DSLAUNCH_MPI_KEY",
                         "--mca",
                         "btl",
                         "tcp,self",
                         "/opt/dsagent",
                         "--connect",
                         "10.0.0.9:4242",
                         "--job_id",
                         "j",
                         "--from_mpirun",
                         "--node_slots",
                         "2,4",
                         "--mpi_key_env",
                         "DSLAUNCH_MPI_KEY",
                         "--secret_stdout"}));
}

// mpirun's environment lasts the whole job, where a rank of the same user
// reads it: it holds the MPI key only, never what the launcher accepts.
TEST(MpirunSpec, TheEnvironmentHoldsTheMpiKeyAndNoSecret) {
  const std::string key(64, 'k');
  base::ProcessSpec spec = MpirunSpec({"mpirun", "dsagent"}, key, false);
  EXPECT_EQ(spec.argv, (Words{"mpirun", "dsagent"}));
  EXPECT_TRUE(spec.inherit_env);
  EXPECT_EQ(spec.env, (Words{"DSLAUNCH_MPI_KEY=" + key}));
  spec = MpirunSpec({"mpirun"}, key, true);
  EXPECT_EQ(spec.env, (Words{"DSLAUNCH_MPI_KEY=" + key,
                             "OMPI_MCA_plm_slurm_args=--overlap"}));
}

TEST(CheckMpirunArgs, RefusesOutputFilesWhichWouldWithholdTheSecrets) {
  MpirunSettings s;
  s.extra_args = {"--mca", "btl", "tcp,self", "--tag-output",
                  "--output-proctable"};
  EXPECT_TRUE(CheckMpirunArgs(s).ok());
  for (const char* word : {"--output-filename", "-output-filename",
                           "--output-filename=/tmp/o", "--output"}) {
    s.extra_args = {"--mca", "btl", "self", word, "/tmp/o"};
    const Status st = CheckMpirunArgs(s);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << word;
    EXPECT_NE(st.message().find(word), std::string::npos) << st.message();
  }
}

TEST(MpirunArgv, AsRootSaysSo) {
  MpirunSettings s;
  s.as_root = true;
  const Words argv = MpirunArgv(s, "h", {1}, {"dsagent"});
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--allow-run-as-root"),
            argv.end());
  MpirunSettings user;
  const Words plain = MpirunArgv(user, "h", {1}, {"dsagent"});
  EXPECT_EQ(std::find(plain.begin(), plain.end(), "--allow-run-as-root"),
            plain.end());
}

TEST(MpirunHostfile, EachNodeWithItsSlotsInPlanOrder) {
  EXPECT_EQ(MpirunHostfile({"n2", "n1", "10.0.0.3"}, {2, 1, 4}),
            "# dslaunch's plan for mpirun: node by node\n"
            "n2 slots=2\nn1 slots=1\n10.0.0.3 slots=4\n");
}

TEST(ParseMpirunLine, NamesTheNodeOfTheRankThatEnded) {
  const std::vector<int> slots = {2, 2, 3};
  MpirunEvent e = ParseMpirunLine(
      "mpirun noticed that process rank 3 with PID 0 on node n2 exited on "
      "signal 9 (Killed).",
      slots);
  EXPECT_EQ(e.node, 1);
  EXPECT_EQ(e.how, "mpirun's process of rank 3 exited on signal 9 (Killed)");
  EXPECT_EQ(ParseMpirunLine("mpirun noticed that process rank 6 with PID 7 "
                            "on node n3 exited on signal 15 (Terminated).",
                            slots)
                .node,
            2);
  EXPECT_EQ(ParseMpirunLine("mpirun noticed that process rank 0 with PID 7 "
                            "on node n1 exited on signal 11.",
                            slots)
                .node,
            0);
  EXPECT_EQ(ParseMpirunLine("mpiexec noticed that process rank 2 with PID 7 "
                            "on node n2 exited on signal 9 (Killed).",
                            slots)
                .node,
            1);
}

TEST(ParseMpirunLine, IgnoresEverythingElse) {
  const std::vector<int> slots = {2, 2};
  for (const char* line :
       {"", "mpirun noticed that process rank",
        "mpirun noticed that process "
        "rank 4 with PID 0 on node n exited on signal 9 (Killed).",
        "mpirun noticed that process rank x with PID 0 exited",
        "mpirun noticed that process rank 1 with PID 0 on node n1",
        "[n1:0] mpirun noticed that process rank 99999999999999 exited",
        // ten digits are not read as the first nine
        "mpirun noticed that process rank 1000000001 with PID 0 on node n "
        "exited on signal 9 (Killed).",
        "--------------------------------------------------------------",
        "mpirun has exited due to process rank 1 with PID 0 on"}) {
    EXPECT_EQ(ParseMpirunLine(line, slots).node, -1) << line;
  }
}

}  // namespace
}  // namespace dslaunch::launcher
