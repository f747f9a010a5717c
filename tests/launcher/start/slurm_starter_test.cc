#include "launcher/start/slurm_starter.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <string>
#include <vector>

namespace dslaunch::launcher {
namespace {

using Words = std::vector<std::string>;

TEST(SrunArgv, OneAgentPerNodeAsOneStepEachPrintingItsSecret) {
  SrunSettings s;
  s.extra_args = {"--cpu-bind=none", "-A", "proj"};
  const Words argv = SrunArgv(s, {"n1", "n2"},
                              {"/opt/dsagent", "--connect", "10.0.0.9:4242",
                               "--node_rank", "0", "--job_id", "j"});
  EXPECT_EQ(argv, (Words{"srun",
                         "--nodes=2",
                         "--ntasks=2",
                         "--ntasks-per-node=1",
                         "--nodelist=n1,n2",
                         "--kill-on-bad-exit=1",
                         "--overlap",
                         "--input=none",
                         "--export=ALL",
                         "--job-name=dsagent",
                         "--cpu-bind=none",
                         "-A",
                         "proj",
                         "/opt/dsagent",
                         "--connect",
                         "10.0.0.9:4242",
                         "--job_id",
                         "j",
                         "--hosts",
                         "n1,n2",
                         "--node_host_env",
                         "SLURMD_NODENAME",
                         "--secret_stdout"}));
}

// A job that restarts keeps the step's other agents when one ends: the
// launcher stops every rank itself, and then starts the next generation.
TEST(SrunArgv, ARestartingJobsStepOutlivesOneAgent) {
  SrunSettings s;
  s.agents_outlive_a_peer = true;
  const Words argv = SrunArgv(s, {"n1"}, {"/opt/dsagent"});
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--kill-on-bad-exit=0"),
            argv.end());
  EXPECT_EQ(std::find(argv.begin(), argv.end(), "--kill-on-bad-exit=1"),
            argv.end());
}

// srun's environment lasts the whole job, where a rank of the same user
// reads it: nothing is added to ours.
TEST(SrunSpec, AddsNothingToTheEnvironment) {
  const proto::ProcessSpec spec =
      SrunSpec(SrunSettings(), {"n1"}, {"/opt/dsagent", "--job_id", "j"});
  EXPECT_TRUE(spec.inherit_env);
  EXPECT_TRUE(spec.env.empty());
  EXPECT_EQ(spec.argv.back(), "--secret_stdout");
  EXPECT_EQ(spec.destroy_signal, SIGTERM);
}

TEST(CheckSrunArgs, RefusesExportAndOutputWhichWouldWithholdTheAgentsNeeds) {
  SrunSettings s;
  s.extra_args = {"--cpu-bind=none", "--exclusive", "-O", "--overlap"};
  EXPECT_TRUE(CheckSrunArgs(s).ok());
  for (const char* word : {"--export=NONE", "--export", "--export=PATH",
                           "--output=x", "--output", "-o", "-ofile"}) {
    s.extra_args = {"-A", "proj", word};
    const Status st = CheckSrunArgs(s);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << word;
    EXPECT_NE(st.message().find(word), std::string::npos) << st.message();
  }
}

TEST(ParseSrunLine, NamesTheNodeWhoseTaskEnded) {
  const Words hosts = {"n1", "n2"};
  SrunEvent e =
      ParseSrunLine("srun: error: n2: task 1: Exited with exit code 3", hosts);
  EXPECT_EQ(e.node, 1);
  EXPECT_EQ(e.how, "Exited with exit code 3");
  EXPECT_TRUE(e.cancelled.empty());
  e = ParseSrunLine("srun: error: n1: tasks 0-1: Killed", hosts);
  EXPECT_EQ(e.node, 0);
  EXPECT_EQ(e.how, "Killed");
  // Other hosts, other messages, and rank output are nothing of srun's.
  EXPECT_EQ(ParseSrunLine("srun: error: n9: task 1: Killed", hosts).node, -1);
  EXPECT_EQ(ParseSrunLine("srun: error: Unable to create step", hosts).node,
            -1);
  EXPECT_EQ(ParseSrunLine("srun: error: n1: task", hosts).node, -1);
  EXPECT_EQ(ParseSrunLine("[n1:0] srun: error: n1: task 0: x", hosts).node, -1);
}

TEST(ParseSrunLine, SaysWhenSlurmCancelledTheStepOrTheJob) {
  const Words hosts = {"n1"};
  EXPECT_EQ(ParseSrunLine("slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED "
                          "AT 2026-11-24T10:00:00 ***",
                          hosts)
                .cancelled,
            "SLURM cancelled step 12.0 (scancel)");
  EXPECT_EQ(ParseSrunLine("slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT "
                          "2026-11-24T10:00:00 DUE TO TIME LIMIT ***",
                          hosts)
                .cancelled,
            "SLURM cancelled job 12 (time limit)");
  EXPECT_TRUE(ParseSrunLine("*** nothing", hosts).cancelled.empty());
}

}  // namespace
}  // namespace dslaunch::launcher
