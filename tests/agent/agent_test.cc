// Agent against a fake launcher on loopback: the test plays the launcher's
// side of Hello/Welcome/Auth with proto/channel.h and proto/auth.h on its own
// io_context (this thread), while a real Agent runs its own loop in Run() on
// a second thread; its workers are small /bin/sh programs. Every wait is for
// a message or an exit, bounded by a deadline that fails the test.
#include "agent/agent.h"

#include <gtest/gtest.h>
#include <signal.h>  // kill
#include <spdlog/spdlog.h>
#include <unistd.h>  // getpid

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cerrno>
#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "proto/auth.h"
#include "proto/channel.h"
#include "proto/version.h"

namespace dslaunch::agent {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr auto kDeadline = std::chrono::seconds(10);

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spdlog::set_level(spdlog::level::warn);
    acceptor_.open(tcp::v4());
    acceptor_.bind({asio::ip::make_address("127.0.0.1"), 0});
    acceptor_.listen();
    secret_ = proto::HexEncode(proto::RandomBytes(32));
  }

  void TearDown() override {
    if (!agent_result_.valid()) return;
    // A test that failed may leave the agent running: stop it as a signal
    // would, so the thread ends rather than hangs.
    if (agent_result_.wait_for(kDeadline) != std::future_status::ready) {
      ::kill(::getpid(), SIGTERM);
      agent_result_.wait();
    }
  }

  // Starts a real Agent toward this test's listener on another thread.
  void StartAgent() {
    AgentOptions o;
    o.launcher_host = "127.0.0.1";
    o.launcher_port = acceptor_.local_endpoint().port();
    o.node_rank = 0;
    o.job_id = "0123456789abcdef";
    o.secret = secret_;
    o.stdin_is_lifeline = false;
    o.connect_timeout_s = 10;
    o.stack_helper = {DSL_DSAGENT, kStackHelperFlag};
    agent_ = std::make_unique<Agent>(std::move(o));
    agent_result_ =
        std::async(std::launch::async, [this] { return agent_->Run(); });
    Accept();
  }

  // Takes the agent's next connection as the launcher's channel.
  void Accept() {
    closed_.reset();
    inbox_.clear();
    tcp::socket socket(io_);
    std::optional<boost::system::error_code> accepted;
    acceptor_.async_accept(
        socket, [&](const boost::system::error_code& ec) { accepted = ec; });
    if (!RunUntil([&] { return accepted.has_value(); }, "the agent to dial")) {
      acceptor_.cancel();
      io_.restart();
      io_.poll();
      return;
    }
    ASSERT_FALSE(*accepted) << accepted->message();
    channel_ = proto::Channel::Create(proto::Channel::Socket(std::move(socket)),
                                      "agent");
    channel_->Start({
        .on_message = [this](wire::Envelope&& m) { OnMessage(std::move(m)); },
        .on_close = [this](const Status& st) { closed_ = st; },
        .on_drain = [] {},
    });
  }

  // Runs this side's loop until `done` or the deadline (a test failure).
  bool RunUntil(const std::function<bool()>& done, const std::string& what) {
    const auto deadline = steady_clock::now() + kDeadline;
    while (!done()) {
      if (steady_clock::now() > deadline) {
        ADD_FAILURE() << "timed out waiting for " << what;
        return false;
      }
      io_.restart();
      io_.run_for(milliseconds(20));
    }
    return true;
  }

  // Removes and returns the first message of `kind` received (waiting for
  // it). Heartbeats are dropped and log lines collected as they arrive.
  wire::Envelope Next(wire::Envelope::MsgCase kind) {
    wire::Envelope out;
    RunUntil(
        [&] {
          for (auto it = inbox_.begin(); it != inbox_.end(); ++it) {
            if (it->msg_case() != kind) continue;
            out = std::move(*it);
            inbox_.erase(it);
            return true;
          }
          return false;
        },
        "message " + std::to_string(kind));
    return out;
  }

  void OnMessage(wire::Envelope&& m) {
    if (m.msg_case() == wire::Envelope::kHeartbeat) return;
    if (m.msg_case() == wire::Envelope::kLogBatch) {
      for (const auto& e : m.log_batch().entries()) logs_.push_back(e);
      return;
    }
    inbox_.push_back(std::move(m));
  }

  // Hello, then a Welcome proving `secret`; returns the agent's Hello.
  wire::Envelope Handshake(const std::string& secret) {
    wire::Envelope hello = Next(wire::Envelope::kHello);
    server_nonce_ = proto::RandomBytes(proto::kNonceBytes);
    wire::Envelope env;
    auto* w = env.mutable_welcome();
    w->set_protocol_version(kProtocolVersion);
    w->set_server_nonce(server_nonce_);
    w->set_launcher_proof(proto::LauncherProof(
        secret, hello.hello().client_nonce(), server_nonce_));
    EXPECT_TRUE(channel_->Send(env).ok());
    return hello;
  }

  // Authenticates and sends a job of `ranks` running `sh -c script`.
  void StartJob(const std::string& script, std::vector<int> ranks,
                double kill_grace_s = 5) {
    wire::Envelope hello = Handshake(secret_);
    wire::Envelope auth = Next(wire::Envelope::kAuth);
    EXPECT_EQ(auth.auth().agent_proof(),
              proto::AgentProof(secret_, hello.hello().client_nonce(),
                                server_nonce_));
    StartJobSpecOnly(script, ranks, kill_grace_s);
  }

  // Sends the JobSpec alone (the agent has authenticated).
  void StartJobSpecOnly(const std::string& script, std::vector<int> ranks,
                        double kill_grace_s = 5, int restart_count = 0,
                        int max_restarts = 0) {
    wire::Envelope env;
    auto* job = env.mutable_job_spec();
    job->set_job_id("0123456789abcdef");
    for (const char* a : {"/bin/sh", "-c"}) job->add_argv(a);
    job->add_argv(script);
    for (size_t i = 0; i < ranks.size(); ++i) {
      auto* r = job->add_ranks();
      r->set_rank(ranks[i]);
      r->set_local_rank(static_cast<int>(i));
      r->set_slot(static_cast<int>(i));
    }
    job->set_world_size(8);
    job->set_num_nodes(1);
    job->set_master_addr("127.0.0.1");
    job->set_master_port(29500);
    job->set_kill_grace_s(kill_grace_s);
    job->set_heartbeat_interval_s(0.2);
    job->set_heartbeat_timeout_s(30);
    job->set_restart_count(restart_count);
    job->set_max_restarts(max_restarts);
    ASSERT_TRUE(channel_->Send(env).ok());
  }

  // Waits for a log line `text` of `rank`.
  void WaitForLine(int rank, const std::string& text) {
    RunUntil(
        [&] {
          for (const auto& e : logs_)
            if (e.rank() == rank && e.line() == text) return true;
          return false;
        },
        "line '" + text + "'");
  }

  // Waits for the agent's Run() to return; its exit status.
  int AgentExit() {
    if (agent_result_.wait_for(kDeadline) != std::future_status::ready) {
      ADD_FAILURE() << "agent did not exit";
      return -1;
    }
    return agent_result_.get();
  }

  asio::io_context io_;
  tcp::acceptor acceptor_{io_};
  std::string secret_, server_nonce_;
  std::unique_ptr<Agent> agent_;
  std::future<int> agent_result_;
  std::shared_ptr<proto::Channel> channel_;
  std::deque<wire::Envelope> inbox_;  // all but heartbeats and logs
  std::vector<wire::LogBatch::Entry> logs_;
  std::optional<Status> closed_;
};

bool Alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

TEST_F(AgentTest, RunsTheJobRelaysOutputAndExitsZeroOnShutdown) {
  StartAgent();
  StartJob("echo hi $RANK; echo err $LOCAL_RANK >&2; exit 3", {4, 5});
  std::map<int, wire::WorkerExited> exits;
  std::map<int, int> pids;
  for (int i = 0; i < 2; ++i) {
    auto s = Next(wire::Envelope::kWorkerStarted).worker_started();
    pids[s.rank()] = s.pid();
    EXPECT_GT(s.pid(), 0);
  }
  for (int i = 0; i < 2; ++i) {
    auto e = Next(wire::Envelope::kWorkerExited).worker_exited();
    exits[e.rank()] = e;
  }
  for (int rank : {4, 5}) {
    EXPECT_EQ(exits[rank].exit_code(), 3) << rank;
    EXPECT_EQ(exits[rank].signal(), 0) << rank;
    EXPECT_EQ(exits[rank].pid(), pids[rank]) << rank;
  }
  // Each rank's lines came before its exit, tagged with rank and stream.
  std::vector<std::string> seen;
  for (const auto& e : logs_) {
    seen.push_back(std::to_string(e.rank()) +
                   (e.stream() == wire::LogBatch::STDERR ? " err: " : ": ") +
                   e.line());
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::string>{"4 err: err 0", "4: hi 4",
                                            "5 err: err 1", "5: hi 5"}));
  wire::Envelope env;
  env.mutable_shutdown();
  ASSERT_TRUE(channel_->Send(env).ok());
  Next(wire::Envelope::kAgentDone);
  RunUntil([&] { return closed_.has_value(); }, "the agent to close");
  EXPECT_EQ(AgentExit(), 0);
}

TEST_F(AgentTest, DialsAgainWhenTheLauncherDropsItBeforeTheJob) {
  // A launcher flooded by strangers may shed a connection before its Hello
  // is read; the agent comes back (with backoff) until the connect timeout.
  StartAgent();
  Next(wire::Envelope::kHello);
  channel_->Close(Status::Ok());
  Accept();
  StartJob("exit 0", {0});
  EXPECT_EQ(Next(wire::Envelope::kWorkerExited).worker_exited().exit_code(), 0);
  wire::Envelope env;
  env.mutable_shutdown();
  ASSERT_TRUE(channel_->Send(env).ok());
  Next(wire::Envelope::kAgentDone);
  EXPECT_EQ(AgentExit(), 0);
}

TEST_F(AgentTest, TakesHeartbeatsWhileItsJobWaitsForNodeZero) {
  StartAgent();
  Handshake(secret_);
  Next(wire::Envelope::kAuth);
  wire::Envelope beat;
  beat.mutable_heartbeat()->set_seq(1);
  ASSERT_TRUE(channel_->Send(beat).ok());
  StartJobSpecOnly("exit 0", {0});
  EXPECT_EQ(Next(wire::Envelope::kWorkerExited).worker_exited().exit_code(), 0);
  EXPECT_FALSE(closed_.has_value());
  wire::Envelope env;
  env.mutable_shutdown();
  ASSERT_TRUE(channel_->Send(env).ok());
  Next(wire::Envelope::kAgentDone);
  EXPECT_EQ(AgentExit(), 0);
}

TEST_F(AgentTest, RefusesALauncherThatCannotProveTheSecret) {
  StartAgent();
  Handshake("not the job secret");
  RunUntil([&] { return closed_.has_value(); }, "the agent to hang up");
  EXPECT_EQ(AgentExit(), 69);
  for (const auto& m : inbox_) {
    EXPECT_NE(m.msg_case(), wire::Envelope::kAuth) << "agent proved itself";
  }
}

TEST_F(AgentTest, ReportsTheSignalThatEndedAWorker) {
  StartAgent();
  StartJob("kill -KILL $$", {0});
  auto e = Next(wire::Envelope::kWorkerExited).worker_exited();
  EXPECT_EQ(e.signal(), SIGKILL);
  EXPECT_FALSE(e.oom_killed()) << e.oom_detail();  // not the OOM killer
  wire::Envelope env;
  env.mutable_shutdown();
  ASSERT_TRUE(channel_->Send(env).ok());
  Next(wire::Envelope::kAgentDone);
  EXPECT_EQ(AgentExit(), 0);
}

TEST_F(AgentTest, SendsRankStatsAndAnswersCollectStacks) {
  StartAgent();
  StartJob("echo ready; exec sleep 60", {4, 5});
  WaitForLine(4, "ready");
  WaitForLine(5, "ready");
  std::map<int, int64_t> rss;
  RunUntil(
      [&] {
        for (const auto& m : inbox_) {
          if (m.msg_case() != wire::Envelope::kRankStats) continue;
          for (const auto& e : m.rank_stats().entries())
            rss[e.rank()] = e.rss_bytes();
        }
        return rss.size() == 2;
      },
      "RankStats of ranks 4 and 5");
  EXPECT_GT(rss[4], 0);
  EXPECT_GT(rss[5], 0);
  wire::Envelope env;
  env.mutable_collect_stacks()->add_ranks(5);
  env.mutable_collect_stacks()->add_ranks(7);  // not this node's: no answer
  env.mutable_collect_stacks()->set_reason("test");
  ASSERT_TRUE(channel_->Send(env).ok());
  auto stacks = Next(wire::Envelope::kStacks).stacks();
  EXPECT_EQ(stacks.rank(), 5);
  // With elfutils or gdb installed, the frames of `sleep`; else why not.
  EXPECT_TRUE(!stacks.text().empty() || !stacks.error().empty());
  if (stacks.error().empty()) {
    EXPECT_NE(stacks.text().find("sleep"), std::string::npos) << stacks.text();
  }
  wire::Envelope abort;
  abort.mutable_abort()->set_reason("test");
  abort.mutable_abort()->set_kill_now(true);
  ASSERT_TRUE(channel_->Send(abort).ok());
  Next(wire::Envelope::kAgentDone);
  EXPECT_EQ(AgentExit(), 0);
  for (const auto& m : inbox_)
    EXPECT_NE(m.msg_case(), wire::Envelope::kStacks) << "rank 7 answered";
}

TEST_F(AgentTest, AbortSendsSigtermThenSigkillAfterTheGrace) {
  StartAgent();
  // Rank 0 ignores SIGTERM (says so and goes on); rank 1 dies of it.
  StartJob(
      "if [ $RANK = 0 ]; then trap 'echo term' TERM; fi; echo ready; "
      "while :; do sleep 0.05; done",
      {0, 1}, /*kill_grace_s=*/0.5);
  WaitForLine(0, "ready");
  WaitForLine(1, "ready");
  wire::Envelope env;
  env.mutable_abort()->set_reason("test");
  ASSERT_TRUE(channel_->Send(env).ok());
  const auto t0 = steady_clock::now();
  std::map<int, wire::WorkerExited> exits;
  std::map<int, double> after;
  for (int i = 0; i < 2; ++i) {
    auto e = Next(wire::Envelope::kWorkerExited).worker_exited();
    exits[e.rank()] = e;
    after[e.rank()] =
        std::chrono::duration<double>(steady_clock::now() - t0).count();
  }
  EXPECT_EQ(exits[1].signal(), SIGTERM);
  EXPECT_LT(after[1], 0.45);  // at once, not after the grace
  EXPECT_EQ(exits[0].signal(), SIGKILL);
  EXPECT_GE(after[0], 0.45);  // only when the grace ran out
  WaitForLine(0, "term");     // it did get SIGTERM first
  Next(wire::Envelope::kAgentDone);
  EXPECT_EQ(AgentExit(), 0);
}

TEST_F(AgentTest, AnAbortWithRestartKeepsTheAgentForTheNextGeneration) {
  StartAgent();
  // Each rank leaves a process behind that outlives it.
  StartJob(
      "echo gen $DSLAUNCH_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT "
      "$TORCHELASTIC_MAX_RESTARTS; setsid sleep 60 & echo stray $!; "
      "echo $DSLAUNCH_PROGRESS; exec sleep 60",
      {0, 1}, /*kill_grace_s=*/0.5);
  WaitForLine(0, "gen 0 0 0");
  WaitForLine(1, "gen 0 0 0");
  std::vector<pid_t> left;
  std::string socket0;
  RunUntil(
      [&] {
        left.clear();
        for (const auto& e : logs_) {
          if (e.line().rfind("stray ", 0) == 0)
            left.push_back(std::stoi(e.line().substr(6)));
          if (e.rank() == 0 && e.line().rfind("/", 0) == 0) socket0 = e.line();
        }
        return left.size() == 2 && !socket0.empty();
      },
      "both strays and rank 0's progress socket");
  wire::Envelope env;
  env.mutable_abort()->set_reason("rank 7 failed");
  env.mutable_abort()->set_restart(true);
  ASSERT_TRUE(channel_->Send(env).ok());
  for (int i = 0; i < 2; ++i) Next(wire::Envelope::kWorkerExited);
  const wire::GenerationEnded ended =
      Next(wire::Envelope::kGenerationEnded).generation_ended();
  EXPECT_EQ(ended.restart_count(), 0);
  EXPECT_GT(ended.free_port(), 0);  // node 0: the next MASTER_PORT
  // Nothing of the generation is left: no process, no socket.
  RunUntil(
      [&] {
        for (pid_t pid : left) {
          if (Alive(pid)) return false;  // killed, and reaped by the agent
        }
        return true;
      },
      "the strays' end");
  EXPECT_NE(::access(socket0.c_str(), F_OK), 0) << socket0;
  EXPECT_FALSE(agent_result_.wait_for(std::chrono::milliseconds(300)) ==
               std::future_status::ready);  // it waits, connected
  logs_.clear();
  StartJobSpecOnly(
      "echo gen $DSLAUNCH_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT "
      "$TORCHELASTIC_MAX_RESTARTS; test -S $DSLAUNCH_PROGRESS && echo sock",
      {0, 1}, 0.5, /*restart_count=*/1, /*max_restarts=*/3);
  WaitForLine(0, "gen 1 1 3");
  WaitForLine(1, "sock");
  for (int i = 0; i < 2; ++i) {
    const auto e = Next(wire::Envelope::kWorkerExited).worker_exited();
    EXPECT_EQ(e.exit_code(), 0);
    EXPECT_EQ(e.signal(), 0);  // a new cgroup: nothing kills them at birth
  }
  // Ended again with a restart due, then told there will be none.
  env.mutable_abort()->set_restart(true);
  ASSERT_TRUE(channel_->Send(env).ok());
  Next(wire::Envelope::kGenerationEnded);
  env.mutable_abort()->set_restart(false);
  ASSERT_TRUE(channel_->Send(env).ok());
  Next(wire::Envelope::kAgentDone);
  EXPECT_EQ(AgentExit(), 0);
}

TEST_F(AgentTest, LosingTheLauncherKillsTheWorkersAndExits69) {
  StartAgent();
  StartJob("echo ready; exec sleep 60", {0, 1});
  std::vector<pid_t> pids;
  for (int i = 0; i < 2; ++i)
    pids.push_back(Next(wire::Envelope::kWorkerStarted).worker_started().pid());
  WaitForLine(0, "ready");
  WaitForLine(1, "ready");
  for (pid_t pid : pids) EXPECT_TRUE(Alive(pid));
  channel_->Close(Status::Ok());  // the launcher goes away
  EXPECT_EQ(AgentExit(), 69);
  for (pid_t pid : pids) EXPECT_FALSE(Alive(pid)) << pid;
}

}  // namespace
}  // namespace dslaunch::agent
