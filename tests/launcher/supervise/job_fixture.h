// The Job's test fixture: a FakeStarter and fake agent links, no processes,
// no sockets (job_test.cc, job_join_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "launcher/plan/hostfile.h"
#include "launcher/supervise/job.h"

namespace dslaunch::launcher::job_testing {

class FakeStarter : public Starter {
 public:
  void Start(const AgentBootstrap& boot, StartDone done) override {
    boot_ = boot;
    done_ = std::move(done);
  }
  void Kill(int node_rank) override { killed.push_back(node_rank); }
  void Stopping() override { stopping = true; }
  bool SeesAgentProcesses() const override { return sees_processes; }
  bool AgentsMakeSecrets() const override { return makes_secrets; }
  bool CanStartAgain() const override { return can_start_again; }
  void StartAgain(int node_rank) override {
    started_again.push_back(node_rank);
  }
  void Finish(StatusOr<Started> result) { done_(std::move(result)); }

  bool sees_processes = true;
  bool makes_secrets = false;
  bool stopping = false;
  bool can_start_again = false;
  std::vector<int> started_again;

  AgentBootstrap boot_;
  StartDone done_;
  std::vector<int> killed;
};

class FakeLinks : public AgentLinks {
 public:
  Status Send(int node_rank, const wire::Envelope& msg) override {
    sent[node_rank].push_back(msg);
    return Status::Ok();
  }
  void Shutdown() override { shut_down = true; }
  void NodeSecretKnown(int node_rank) override {
    secrets_known.push_back(node_rank);
  }
  const wire::Envelope& Last(int node) { return sent.at(node).back(); }

  std::map<int, std::vector<wire::Envelope>> sent;
  bool shut_down = false;
  std::vector<int> secrets_known;
};

inline Plan TwoByTwo() {
  auto hostfile =
      ParseHostfile("127.0.0.1 slots=2\n127.0.0.2 slots=2\n", "hosts");
  EXPECT_TRUE(hostfile.ok());
  auto plan = MakePlan(*hostfile, PlanOptions());
  EXPECT_TRUE(plan.ok());
  return *plan;
}

class JobTest : public ::testing::Test {
 protected:
  JobTest() : out_(std::tmpfile()), err_(std::tmpfile()) {
    options_.master_port_given = true;
    options_.kill_grace_s = 0.2;
  }
  ~JobTest() override {
    job_.reset();
    console_.reset();
    std::fclose(out_);
    std::fclose(err_);
  }
  void StartJob() {
    console_ = std::make_unique<Console>(out_, err_);
    ASSERT_TRUE(console_->Open(plan_, "").ok());
    job_ = std::make_unique<Job>(io_, options_, plan_, EnvList{},
                                 RankCommand{{"train"}, 1}, *console_, "job1",
                                 "secret");
    job_->Start(&starter_, &links_, 4242);
  }
  void Authenticate(int node, int free_port = 0) {
    wire::Hello hello;
    hello.set_node_rank(node);
    hello.mutable_facts()->set_free_port(free_port);
    job_->OnAgentAuthenticated(node, hello, "127.0.0.1");
  }
  void RankStarted(int node, int rank) {
    wire::Envelope env;
    env.mutable_worker_started()->set_rank(rank);
    env.mutable_worker_started()->set_pid(1000 + rank);
    job_->OnAgentMessage(node, std::move(env));
  }
  // `stopped`: its agent had signalled it (a stop of ours).
  void RankExited(int node, int rank, int code, int sig, double time = 0,
                  bool stopped = false) {
    wire::Envelope env;
    auto* e = env.mutable_worker_exited();
    e->set_rank(rank);
    e->set_exit_code(code);
    e->set_signal(sig);
    e->set_time(time);
    e->set_stopped(stopped);
    job_->OnAgentMessage(node, std::move(env));
  }
  void RunAll() {
    Authenticate(0);
    Authenticate(1);
    for (int r = 0; r < 4; ++r) RankStarted(r / 2, r);
  }
  void AgentGone(int node) {
    job_->OnAgentDisconnected(node, Status::Ok());
    job_->OnAgentProcessExited(node, "exited with code 0");
  }
  bool Got(int node, wire::Envelope::MsgCase what) {
    for (const auto& m : links_.sent[node]) {
      if (m.msg_case() == what) return true;
    }
    return false;
  }
  std::string Report() {
    console_->DrainTerminal();
    std::fflush(err_);
    std::rewind(err_);
    std::string text;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), err_)) > 0) text.append(buf, n);
    return text;
  }
  Phase phase() { return job_->state().phase(); }

  boost::asio::io_context io_;
  LaunchOptions options_;
  Plan plan_ = TwoByTwo();
  FILE* out_;
  FILE* err_;
  std::unique_ptr<Console> console_;
  FakeStarter starter_;
  FakeLinks links_;
  std::unique_ptr<Job> job_;
};

}  // namespace dslaunch::launcher::job_testing
