// The Agent's states with fakes for what it reaches: a FakeLink stands for
// the launcher's connection (it records what the agent sends and delivers
// what the test's script answers) and FakeRanks for its ranks (spawns are
// recorded, exits and output come when the script says). No socket to the
// launcher and no rank process: each test is a script on the agent's own
// loop, and Run() returns when the agent ends. A watchdog ends a script that
// hangs and fails the test. agent_test.cc runs the same Agent against a
// real listener and real ranks.
#include <fcntl.h>  // AT_FDCWD
#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>    // mkdtemp
#include <sys/stat.h>  // utimensat

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "agent/probe_files.h"
#include "base/exit_status.h"
#include "proto/auth.h"
#include "proto/version.h"

namespace dslaunch::agent {
namespace {

namespace asio = boost::asio;
using Case = wire::Envelope::MsgCase;

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef";
constexpr char kJobId[] = "feedfacefeedface";

// The launcher's side of the link. Dial connects (or fails, `refusals`
// times); what the agent sends is kept in `sent` and handed to `on_send`.
class FakeLink : public LauncherLink {
 public:
  explicit FakeLink(asio::io_context& io) : io_(io), watchdog_(io) {
    watchdog_.expires_after(std::chrono::seconds(10));
    watchdog_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      timed_out = true;
      io_.stop();
    });
  }
  ~FakeLink() override { watchdog_.cancel(); }

  void SetHandlers(Handlers handlers) override { h_ = std::move(handlers); }
  void Dial(const std::string& host, int port) override {
    dialled.push_back(host + ":" + std::to_string(port));
    asio::post(io_, [this] {
      if (refusals > 0) {
        --refusals;
        return h_.dial_failed(false, "cannot connect: Connection refused");
      }
      open_ = true;
      h_.connected();
    });
  }
  bool open() const override { return open_; }
  Status Send(const wire::Envelope& msg) override {
    if (!open_) return Unavailable("closed");
    sent.push_back(msg);
    if (on_send) on_send(msg);
    return Status::Ok();
  }
  bool congested() const override { return congested_now; }
  void Close(const Status& why) override {
    if (!open_) return;
    open_ = false;
    closed_with = why;
    h_.closed(why);
  }
  void CloseAfterFlush() override {
    asio::post(io_, [this] { Close(Status::Ok()); });
  }

  // The launcher's side: a message to the agent, the connection ended by
  // the launcher, the queue drained.
  void Deliver(wire::Envelope msg) {
    asio::post(io_, [this, msg = std::move(msg)]() mutable {
      if (open_) h_.message(std::move(msg));
    });
  }
  void Drop() {
    asio::post(io_, [this] {
      if (!open_) return;
      open_ = false;
      closed_with = Unavailable("the launcher ended the connection");
      h_.closed(*closed_with);
    });
  }
  void Drained() {
    congested_now = false;
    asio::post(io_, [this] { h_.drained(); });
  }

  asio::io_context& io() { return io_; }

  std::vector<wire::Envelope> Sent(Case c) const {
    std::vector<wire::Envelope> out;
    for (const auto& m : sent)
      if (m.msg_case() == c) out.push_back(m);
    return out;
  }

  std::vector<wire::Envelope> sent;
  std::function<void(const wire::Envelope&)> on_send;
  std::vector<std::string> dialled;
  std::optional<Status> closed_with;
  int refusals = 0;
  bool congested_now = false;
  bool timed_out = false;

 private:
  asio::io_context& io_;
  asio::steady_timer watchdog_;
  Handlers h_;
  bool open_ = false;
};

// The agent's ranks: spawns recorded; a signal ends every live rank unless
// it is one they `ignore`; Exit and Output come when the script says.
class FakeRanks : public Ranks {
 public:
  FakeRanks(asio::io_context& io, Delegate* delegate)
      : io_(io), delegate_(delegate) {}

  void Contain(const std::string& job_id, int node_rank) override {
    contained = job_id + "/" + std::to_string(node_rank);
  }
  StatusOr<pid_t> Spawn(const WorkerSpec& spec) override {
    if (spec.rank == refuse_rank) return Internal("no such program");
    spawned.push_back(spec);
    live.insert(spec.rank);
    return 4000000 + spec.rank;  // no process: never signalled for real
  }
  void GuardContainment() override { ++guards; }
  std::string cgroup_dir() const override { return ""; }
  void SignalAll(int sig) override {
    signals.push_back(sig);
    if (ignore.count(sig)) return;
    for (int rank : live) Exit(rank, 0, sig);
  }
  void KillDescendants() override { ++descendants_killed; }
  void EndGeneration() override { ++generations_ended; }
  void PauseOutput() override { paused = true; }
  void ResumeOutput() override { paused = false; }
  size_t unfinished() const override { return live.size(); }

  // A rank ends (code, or by signal), later on the loop.
  void Exit(int rank, int code, int sig = 0) {
    asio::post(io_, [this, rank, code, sig] {
      if (!live.erase(rank)) return;
      ExitInfo info;
      info.exit_code = code;
      info.signal = sig;
      info.signalled = sig != 0;
      delegate_->OnWorkerExited(rank, 4000000 + rank, info);
    });
  }
  void Output(int rank, const std::string& line) {
    asio::post(io_, [this, rank, line] {
      delegate_->OnWorkerOutput(rank, false, line, false);
    });
  }

  std::vector<WorkerSpec> spawned;
  std::set<int> live;
  std::vector<int> signals;
  std::set<int> ignore;  // signals the ranks survive
  int refuse_rank = -1;
  std::string contained;
  int guards = 0;
  int descendants_killed = 0;
  int generations_ended = 0;
  bool paused = false;

 private:
  asio::io_context& io_;
  Delegate* delegate_;
};

class AgentStates : public ::testing::Test {
 protected:
  void SetUp() override { spdlog::set_level(spdlog::level::warn); }

  // A launcher that proves the secret (or not, `honest`) and answers the
  // Auth with `JobSpec(generation 0)` unless `hold_job_spec`.
  std::unique_ptr<Agent> MakeAgent(bool join = false,
                                   std::string alive_file = "") {
    AgentOptions o;
    o.launcher_host = "launcher.test";
    o.launcher_port = 29400;
    o.node_rank = 1;
    o.job_id = kJobId;
    o.secret = kSecret;
    o.stdin_is_lifeline = false;
    o.connect_timeout_s = 5;
    o.join = join;
    o.alive_file = std::move(alive_file);
    AgentParts parts;
    parts.link = [this](asio::io_context& io) {
      auto link = std::make_unique<FakeLink>(io);
      link_ = link.get();
      link_->on_send = [this](const wire::Envelope& m) { Launcher(m); };
      return link;
    };
    parts.ranks = [this](asio::io_context& io, Ranks::Delegate* d) {
      auto ranks = std::make_unique<FakeRanks>(io, d);
      ranks_ = ranks.get();
      return ranks;
    };
    return std::make_unique<Agent>(std::move(o), std::move(parts));
  }

  // The launcher's script: the handshake, then what the test adds.
  void Launcher(const wire::Envelope& m) {
    if (m.has_hello()) {
      client_nonce_ = m.hello().client_nonce();
      wire::Envelope w;
      auto* welcome = w.mutable_welcome();
      welcome->set_protocol_version(kProtocolVersion);
      welcome->set_server_nonce(std::string(32, 's'));
      welcome->set_launcher_proof(
          proto::LauncherProof(honest ? kSecret : "another secret",
                               client_nonce_, welcome->server_nonce()));
      welcome->set_heartbeat_interval_s(heartbeat_interval_s);
      welcome->set_heartbeat_timeout_s(heartbeat_timeout_s);
      link_->Deliver(w);
    } else if (m.has_auth() && !hold_job_spec) {
      link_->Deliver(JobSpec(0));
    }
    if (then) then(m);
  }

  wire::Envelope JobSpec(int generation) const {
    wire::Envelope env;
    auto* job = env.mutable_job_spec();
    job->set_job_id(kJobId);
    job->add_argv("/bin/true");
    job->set_node_rank(1);
    job->set_num_nodes(2);
    job->set_world_size(4);
    job->set_master_addr("127.0.0.1");
    job->set_master_port(29500);
    job->set_kill_grace_s(0.2);
    job->set_heartbeat_interval_s(heartbeat_interval_s);
    job->set_heartbeat_timeout_s(heartbeat_timeout_s);
    job->set_restart_count(generation);
    job->set_host("node1");
    for (int local = 0; local < 2; ++local) {
      auto* r = job->add_ranks();
      r->set_rank(2 + local);
      r->set_local_rank(local);
      r->set_slot(local);
    }
    return env;
  }

  static wire::Envelope Abort(bool restart, bool kill_now = false) {
    wire::Envelope env;
    env.mutable_abort()->set_reason("rank 0 failed");
    env.mutable_abort()->set_restart(restart);
    env.mutable_abort()->set_kill_now(kill_now);
    return env;
  }

  static wire::Envelope Shutdown() {
    wire::Envelope env;
    env.mutable_shutdown();
    return env;
  }

  int Run(Agent& agent) {
    const int code = agent.Run();
    EXPECT_FALSE(link_->timed_out) << "the script did not end the agent";
    return code;
  }

  FakeLink* link_ = nullptr;
  FakeRanks* ranks_ = nullptr;
  std::function<void(const wire::Envelope&)> then;
  std::string client_nonce_;
  bool honest = true;
  bool hold_job_spec = false;
  double heartbeat_interval_s = 0.05;
  double heartbeat_timeout_s = 5;
};

// Connecting -> Spawning -> Running -> Exited: the handshake proves the
// secret both ways, the JobSpec's ranks start, their exits are reported, and
// the launcher's Shutdown ends the agent, which says it is done.
TEST_F(AgentStates, RunsItsRanksAndEndsWhenTheLauncherShutsItDown) {
  auto agent = MakeAgent();
  then = [this](const wire::Envelope& m) {
    if (m.has_worker_started() && ranks_->spawned.size() == 2 &&
        link_->Sent(Case::kWorkerStarted).size() == 2) {
      ranks_->Exit(2, 0);
      ranks_->Exit(3, 0);
    }
    if (m.has_worker_exited() && link_->Sent(Case::kWorkerExited).size() == 2)
      link_->Deliver(Shutdown());
  };
  EXPECT_EQ(Run(*agent), 0);

  EXPECT_EQ(link_->dialled, std::vector<std::string>{"launcher.test:29400"});
  ASSERT_EQ(link_->Sent(Case::kHello).size(), 1u);
  const wire::Hello hello = link_->Sent(Case::kHello)[0].hello();
  EXPECT_EQ(hello.node_rank(), 1);
  EXPECT_EQ(hello.job_id(), kJobId);
  EXPECT_EQ(hello.protocol_version(), kProtocolVersion);
  ASSERT_EQ(link_->Sent(Case::kAuth).size(), 1u);
  EXPECT_EQ(link_->Sent(Case::kAuth)[0].auth().agent_proof(),
            proto::AgentProof(kSecret, client_nonce_, std::string(32, 's')));

  ASSERT_EQ(ranks_->spawned.size(), 2u);
  EXPECT_EQ(ranks_->spawned[0].rank, 2);
  EXPECT_EQ(ranks_->spawned[1].rank, 3);
  EXPECT_EQ(ranks_->spawned[0].argv, std::vector<std::string>{"/bin/true"});
  EXPECT_EQ(ranks_->contained, std::string(kJobId) + "/1");
  EXPECT_EQ(ranks_->guards, 1);
  const auto exited = link_->Sent(Case::kWorkerExited);
  ASSERT_EQ(exited.size(), 2u);
  EXPECT_EQ(exited[0].worker_exited().rank(), 2);
  EXPECT_EQ(exited[0].worker_exited().pid(), 4000002);
  EXPECT_EQ(link_->Sent(Case::kAgentDone).size(), 1u);
  EXPECT_TRUE(ranks_->signals.empty()) << "nothing to stop";
  EXPECT_GE(ranks_->descendants_killed, 1) << "nothing outlives the agent";
  ASSERT_TRUE(link_->closed_with.has_value());
  EXPECT_TRUE(link_->closed_with->ok());
}

// A launcher that cannot prove the secret gets no proof from the agent:
// the link is closed as a protocol error, nothing starts, and the agent
// ends 69 as for a launcher it cannot reach.
TEST_F(AgentStates, ALauncherThatCannotProveTheSecretGetsNothing) {
  honest = false;
  auto agent = MakeAgent();
  EXPECT_EQ(Run(*agent), kExitUnavailable);
  EXPECT_TRUE(link_->Sent(Case::kAuth).empty());
  EXPECT_TRUE(ranks_->spawned.empty());
  ASSERT_TRUE(link_->closed_with.has_value());
  EXPECT_EQ(link_->closed_with->code(), StatusCode::kProtocol);
  EXPECT_NE(link_->closed_with->message().find("failed to prove"),
            std::string::npos);
}

// Running -> Draining -> Exited: an Abort SIGTERMs the ranks; those that
// survive it are SIGKILLed once the JobSpec's grace (0.2 s) has passed.
TEST_F(AgentStates, AnAbortSigtermsTheRanksAndSigkillsThemAfterTheGrace) {
  auto agent = MakeAgent();
  then = [this](const wire::Envelope& m) {
    if (m.has_worker_started() &&
        link_->Sent(Case::kWorkerStarted).size() == 2) {
      ranks_->ignore = {SIGTERM};
      link_->Deliver(Abort(false));
    }
  };
  EXPECT_EQ(Run(*agent), 0);
  EXPECT_EQ(ranks_->signals, (std::vector<int>{SIGTERM, SIGKILL}));
  const auto exited = link_->Sent(Case::kWorkerExited);
  ASSERT_EQ(exited.size(), 2u);
  EXPECT_EQ(exited[0].worker_exited().signal(), SIGKILL);
  EXPECT_TRUE(exited[0].worker_exited().stopped());
  EXPECT_EQ(link_->Sent(Case::kAgentDone).size(), 1u);
}

// Running -> Draining -> Idle -> Spawning: an Abort that restarts ends the
// generation (GenerationEnded with a free port; nothing of it left), and
// the next JobSpec starts the ranks again on the same link.
TEST_F(AgentStates, AnAbortThatRestartsLeavesItIdleForTheNextGeneration) {
  auto agent = MakeAgent();
  then = [this](const wire::Envelope& m) {
    const size_t started = link_->Sent(Case::kWorkerStarted).size();
    if (m.has_worker_started() && started == 2) link_->Deliver(Abort(true));
    if (m.has_generation_ended()) link_->Deliver(JobSpec(1));
    if (m.has_worker_started() && started == 4) {
      ranks_->Exit(2, 0);
      ranks_->Exit(3, 0);
    }
    if (m.has_worker_exited() && link_->Sent(Case::kWorkerExited).size() == 4)
      link_->Deliver(Shutdown());
  };
  EXPECT_EQ(Run(*agent), 0);
  const auto ended = link_->Sent(Case::kGenerationEnded);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].generation_ended().restart_count(), 0);
  EXPECT_GT(ended[0].generation_ended().free_port(), 0);
  EXPECT_EQ(ranks_->generations_ended, 1);
  EXPECT_EQ(ranks_->spawned.size(), 4u) << "both generations' ranks";
  EXPECT_EQ(ranks_->signals, std::vector<int>{SIGTERM});
  EXPECT_EQ(link_->dialled.size(), 1u) << "one connection for both";
  EXPECT_EQ(link_->Sent(Case::kAgentDone).size(), 1u);
}

// Connecting -> Draining -> Idle: an Abort that restarts instead of a
// JobSpec makes the agent a stand-by (a spare, a lost node's new agent): it
// says its generation ended and runs ranks when a JobSpec comes.
TEST_F(AgentStates, AStandByWaitsIdleUntilAJobSpecComes) {
  hold_job_spec = true;
  auto agent = MakeAgent();
  then = [this](const wire::Envelope& m) {
    if (m.has_auth()) link_->Deliver(Abort(true));
    if (m.has_generation_ended()) link_->Deliver(JobSpec(2));
    if (m.has_worker_started() && link_->Sent(Case::kWorkerStarted).size() == 2)
      link_->Deliver(Abort(false));
  };
  EXPECT_EQ(Run(*agent), 0);
  ASSERT_EQ(link_->Sent(Case::kGenerationEnded).size(), 1u);
  EXPECT_EQ(ranks_->spawned.size(), 2u);
  EXPECT_EQ(link_->Sent(Case::kAgentDone).size(), 1u);
}

// Running -> Draining -> Exited 69: the launcher's connection ends; the
// ranks are stopped and the agent says nothing more (there is no one).
TEST_F(AgentStates, ALostLauncherStopsTheRanksAndEnds69) {
  auto agent = MakeAgent();
  then = [this](const wire::Envelope& m) {
    if (m.has_worker_started() && link_->Sent(Case::kWorkerStarted).size() == 2)
      link_->Drop();
  };
  EXPECT_EQ(Run(*agent), kExitUnavailable);
  EXPECT_EQ(ranks_->signals, std::vector<int>{SIGTERM});
  EXPECT_TRUE(ranks_->live.empty());
  EXPECT_TRUE(link_->Sent(Case::kAgentDone).empty());
}

// No heartbeat within the timeout is a lost launcher too.
TEST_F(AgentStates, ASilentLauncherIsALostLauncher) {
  heartbeat_timeout_s = 0.3;
  auto agent = MakeAgent();
  EXPECT_EQ(Run(*agent), kExitUnavailable);
  ASSERT_TRUE(link_->closed_with.has_value());
  EXPECT_NE(link_->closed_with->message().find("no heartbeat"),
            std::string::npos)
      << link_->closed_with->message();
  EXPECT_GE(link_->Sent(Case::kHeartbeat).size(), 2u) << "the agent's own";
}

// A rank that cannot be started: every rank not started "exits" 70 with
// the reason, the ones started are killed at once, and the agent ends 70.
TEST_F(AgentStates, ARankThatCannotStartIsReportedAndTheOthersKilled) {
  auto agent = MakeAgent();
  ranks_->refuse_rank = 3;
  EXPECT_EQ(Run(*agent), kExitSoftware);
  const auto exited = link_->Sent(Case::kWorkerExited);
  ASSERT_EQ(exited.size(), 2u);
  EXPECT_EQ(exited[0].worker_exited().rank(), 3);
  EXPECT_EQ(exited[0].worker_exited().exit_code(), 70);
  EXPECT_NE(exited[0].worker_exited().error().find("no such program"),
            std::string::npos);
  EXPECT_EQ(exited[1].worker_exited().rank(), 2);
  EXPECT_EQ(exited[1].worker_exited().signal(), SIGKILL);
  EXPECT_EQ(ranks_->signals, std::vector<int>{SIGKILL});
}

// Backpressure: while the link is congested the ranks' output is not read;
// it is again once the link drains. The lines themselves go out in order.
TEST_F(AgentStates, ACongestedLinkPausesTheRanksOutputUntilItDrains) {
  auto agent = MakeAgent();
  bool paused_seen = false;
  then = [&](const wire::Envelope& m) {
    if (m.has_worker_started() &&
        link_->Sent(Case::kWorkerStarted).size() == 2) {
      link_->congested_now = true;
      ranks_->Output(2, "first");
    }
    if (m.has_log_batch() && link_->congested_now) {
      // The flush that carried it saw the congestion: reading paused.
      asio::post(link_->io(), [&] {
        paused_seen = ranks_->paused;
        link_->Drained();
        ranks_->Output(2, "second");
      });
    }
    if (m.has_log_batch() && !link_->congested_now) {
      EXPECT_FALSE(ranks_->paused) << "reading resumed";
      link_->Deliver(Abort(false));
    }
  };
  EXPECT_EQ(Run(*agent), 0);
  EXPECT_TRUE(paused_seen);
  const auto logs = link_->Sent(Case::kLogBatch);
  ASSERT_EQ(logs.size(), 2u);
  EXPECT_EQ(logs[0].log_batch().entries(0).line(), "first");
  EXPECT_EQ(logs[1].log_batch().entries(0).line(), "second");
}

// A joining agent's launcher may not be there yet: refused dials are
// retried (with backoff) until it is, within the connect timeout.
TEST_F(AgentStates, AJoiningAgentDialsAgainUntilTheLauncherIsThere) {
  auto agent = MakeAgent(/*join=*/true);
  link_->refusals = 2;
  then = [this](const wire::Envelope& m) {
    if (m.has_worker_started() && link_->Sent(Case::kWorkerStarted).size() == 2)
      link_->Deliver(Abort(false));
  };
  EXPECT_EQ(Run(*agent), 1) << "a joined agent fails with its job";
  EXPECT_EQ(link_->dialled.size(), 3u);
  EXPECT_EQ(ranks_->spawned.size(), 2u);
}

// The liveness probe's file is touched every second while the agent's loop
// runs (aged by a minute here, it is fresh again a second later), and gone
// once the agent ends.
TEST_F(AgentStates, TheAliveFileIsTouchedWhileTheLoopRunsAndGoneAtTheEnd) {
  char dir[] = "/tmp/dsl-alive-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string alive = std::string(dir) + "/alive";
  auto agent = MakeAgent(/*join=*/true, alive);
  int aged = -1, later = -1;
  // On the agent's loop: gone before the agent is.
  std::optional<asio::steady_timer> wait;
  wait.emplace(link_->io());
  then = [&](const wire::Envelope& m) {
    if (!m.has_worker_started() ||
        link_->Sent(Case::kWorkerStarted).size() != 2)
      return;
    struct timespec old[2];
    ::clock_gettime(CLOCK_REALTIME, &old[1]);
    old[1].tv_sec -= 60;
    old[0] = old[1];
    ::utimensat(AT_FDCWD, alive.c_str(), old, 0);
    aged = CheckAlive(alive, 30);
    wait->expires_after(std::chrono::milliseconds(1500));
    wait->async_wait([&](const boost::system::error_code&) {
      later = CheckAlive(alive, 30);
      link_->Deliver(Abort(false));
    });
  };
  EXPECT_EQ(Run(*agent), 1);
  wait.reset();
  agent.reset();
  EXPECT_EQ(aged, 1) << "a minute old";
  EXPECT_EQ(later, 0) << "touched again";
  EXPECT_FALSE(std::filesystem::exists(alive));
  std::filesystem::remove_all(dir);
}

// Another process's SIGTERM to the agent: the launcher hears of it before
// the ranks' exits, so that they count as stopped, not as failures.
TEST_F(AgentStates, ASignalIsToldToTheLauncherBeforeTheRanksStop) {
  auto agent = MakeAgent();
  then = [this](const wire::Envelope& m) {
    if (m.has_worker_started() && link_->Sent(Case::kWorkerStarted).size() == 2)
      ::raise(SIGTERM);  // the agent's signal_set takes it
  };
  EXPECT_EQ(Run(*agent), 0);
  std::vector<Case> order;
  for (const auto& m : link_->sent) {
    if (m.has_agent_signalled() || m.has_worker_exited())
      order.push_back(m.msg_case());
  }
  EXPECT_EQ(order,
            (std::vector<Case>{Case::kAgentSignalled, Case::kWorkerExited,
                               Case::kWorkerExited}));
  EXPECT_EQ(link_->Sent(Case::kAgentSignalled)[0].agent_signalled().signal(),
            SIGTERM);
}

}  // namespace
}  // namespace dslaunch::agent
