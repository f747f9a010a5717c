#include "agent/stack_helper.h"

#include <signal.h>  // SIGKILL, SIGPIPE
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>  // socketpair
#include <unistd.h>      // access, close

#include <boost/asio/generic/stream_protocol.hpp>

#include "agent/stack_collector.h"
#include "base/exit_status.h"  // kExitSoftware
#include "proto/progress.h"    // EscapeControlChars

namespace dslaunch::agent {

namespace asio = boost::asio;

namespace {

// A request is a few bytes; an answer at most 256 KiB of text and an error.
constexpr size_t kMaxRequestBytes = 4096;
constexpr size_t kMaxAnswerBytes = 1u << 20;

proto::Channel::Limits HelperLimits(size_t max_frame_bytes) {
  proto::Channel::Limits limits;
  limits.max_frame_bytes = max_frame_bytes;
  limits.soft_queue_bytes = 8u << 20;
  limits.hard_queue_bytes = 64u << 20;  // then the peer is given up
  limits.read_buffer_bytes = 64u << 10;
  return limits;
}

StatusOr<proto::Channel::Socket> SocketOf(asio::io_context& io, int fd) {
  proto::Channel::Socket socket(io);
  boost::system::error_code ec;
  socket.assign(asio::generic::stream_protocol(AF_UNIX, 0), fd, ec);
  if (ec) return Internal("stack helper socket: " + ec.message());
  return socket;
}

std::string HowItEnded(const base::ExitInfo& info) {
  if (!info.error.empty()) return info.error;
  if (info.signal != 0)
    return "it was killed by signal " + std::to_string(info.signal);
  return "it exited with status " + std::to_string(info.exit_code);
}

}  // namespace

std::vector<std::string> StackHelperCommand() {
  // The running binary, even if its file was replaced since: the same
  // version of this protocol on both ends.
  return {"/proc/self/exe", kStackHelperFlag};
}

StackHelperClient::StackHelperClient(asio::io_context& io, Reply reply,
                                     StackHelperOptions options)
    : io_(io),
      reply_(std::move(reply)),
      options_(std::move(options)),
      process_(io, this) {}

StackHelperClient::~StackHelperClient() {
  *alive_ = false;
  stopped_ = true;
  if (channel_) channel_->Close(Status::Ok());
  // process_ SIGKILLs the helper's group if it still runs.
}

pid_t StackHelperClient::Tracer() {
  if (!started_ && !stopped_) {
    started_ = true;
    if (Status st = Start(); !st.ok()) {
      spdlog::warn("no stack helper: {}; stacks will not be collected",
                   st.message());
      gone_ = "could not start: " + st.message();
    }
  }
  return pid_;
}

Status StackHelperClient::Start() {
  if (options_.argv.empty()) return Unavailable("none configured");
  // Not there: no pid at all (ProcessSet would give one that exits 127).
  if (::access(options_.argv[0].c_str(), X_OK) != 0)
    return ErrnoStatus(options_.argv[0], errno);
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    return ErrnoStatus("socketpair", errno);
  base::ProcessSpec spec;
  spec.argv = options_.argv;
  spec.inherit_env = true;  // the tools run as the agent's user, its env
  if (!options_.path_env.empty()) spec.env = {"PATH=" + options_.path_env};
  spec.stdin_fd = fds[1];
  spec.death_signal = SIGKILL;  // it never outlives the agent
  StatusOr<pid_t> pid = process_.Spawn(spec);
  ::close(fds[1]);
  if (!pid.ok()) {
    ::close(fds[0]);
    return pid.status();
  }
  auto socket = SocketOf(io_, fds[0]);
  if (!socket.ok()) {
    ::close(fds[0]);
    process_.Signal(*pid, SIGKILL);
    return socket.status();
  }
  pid_ = *pid;
  channel_ = proto::Channel::Create(std::move(socket).value(), "stack helper",
                                    HelperLimits(kMaxAnswerBytes));
  channel_->Start({
      .on_message =
          [this](wire::Envelope&& msg) { HandleMessage(std::move(msg)); },
      .on_close =
          [this, alive = alive_](const Status& st) {
            if (*alive)
              OnHelperGone("its connection closed (" + st.message() + ")");
          },
      .on_drain = nullptr,
  });
  spdlog::info("stack helper started (pid {})", pid_);
  return Status::Ok();
}

void StackHelperClient::Collect(int rank, pid_t pid) {
  if (stopped_ || pending_.count(rank)) return;  // merged
  Tracer();
  if (!gone_.empty() || !channel_)
    return AnswerError(rank, "no stacks: the stack helper " + gone_);
  auto timer = std::make_unique<asio::steady_timer>(io_);
  timer->expires_after(options_.answer_within);
  timer->async_wait(
      [this, rank, alive = alive_](const boost::system::error_code& ec) {
        if (ec || !*alive || !pending_.count(rank)) return;
        pending_.erase(rank);
        AnswerError(rank, "no stacks: the stack helper gave no answer within " +
                              std::to_string(options_.answer_within.count()) +
                              " ms");
      });
  pending_[rank] = std::move(timer);
  wire::Envelope env;
  env.mutable_stack_request()->set_rank(rank);
  env.mutable_stack_request()->set_pid(pid);
  if (Status st = channel_->Send(env); !st.ok())
    OnHelperGone("cannot reach it: " + st.message());
}

void StackHelperClient::Exited(int rank) {
  if (stopped_ || !pending_.count(rank) || !channel_) return;
  wire::Envelope env;
  env.mutable_stack_request()->set_rank(rank);
  env.mutable_stack_request()->set_exited(true);
  if (Status st = channel_->Send(env); !st.ok())
    OnHelperGone("cannot reach it: " + st.message());
}

void StackHelperClient::Stop() {
  stopped_ = true;
  pending_.clear();                             // their timers are cancelled
  if (channel_) channel_->Close(Status::Ok());  // the helper's EOF
}

void StackHelperClient::HandleMessage(wire::Envelope&& msg) {
  if (!msg.has_stacks()) {
    return channel_->Close(
        ProtocolError("the stack helper sent " + proto::MessageName(msg)));
  }
  Answer(msg.stacks());
}

void StackHelperClient::Answer(const wire::Stacks& stacks) {
  // A late answer (the backstop gave one already) or one never asked for.
  if (stopped_ || pending_.erase(stacks.rank()) == 0) return;
  reply_(stacks);
}

void StackHelperClient::AnswerError(int rank, const std::string& error) {
  wire::Stacks stacks;
  stacks.set_rank(rank);
  stacks.set_error(error);
  reply_(stacks);
}

void StackHelperClient::OnHelperGone(const std::string& why) {
  if (!gone_.empty()) return;
  const pid_t pid = pid_;
  pid_ = 0;  // ranks spawned from now on name no tracer
  gone_ = "(pid " + std::to_string(pid) + ") is gone: " + why;
  if (channel_) channel_->Close(Status::Ok());
  if (stopped_) return;  // our EOF ends it (and the destructor kills it)
  if (pid > 0) process_.Signal(pid, SIGKILL);
  // At the job's end the agent's teardown may kill it: no news then.
  if (pending_.empty()) {
    spdlog::info("stack helper {}", gone_);
  } else {
    spdlog::warn("stack helper {}", gone_);
  }
  auto pending = std::move(pending_);
  pending_.clear();
  for (const auto& [rank, timer] : pending)
    AnswerError(rank, "no stacks: the stack helper " + gone_);
}

void StackHelperClient::OnProcessOutput(pid_t, bool, std::string line, bool) {
  if (line.size() > 1000) line.resize(1000);
  spdlog::warn("stack helper: {}", proto::EscapeControlChars(line));
}

void StackHelperClient::OnProcessExited(pid_t, const base::ExitInfo& info) {
  OnHelperGone(HowItEnded(info));
}

// ---- The helper's side ----

namespace {

void Serve(StackCollector& collector, proto::Channel& channel,
           const wire::Envelope& msg) {
  if (!msg.has_stack_request()) {
    return channel.Close(ProtocolError("expected a stack request, got " +
                                       proto::MessageName(msg)));
  }
  const wire::StackRequest& r = msg.stack_request();
  if (r.exited()) return collector.Exited(r.rank());
  // Never pid 0 or below: those name process groups to a tool or kill().
  if (r.pid() <= 0) {
    return channel.Close(
        ProtocolError("stack request for pid " + std::to_string(r.pid())));
  }
  collector.Collect(r.rank(), r.pid());
}

// Our stdout and stderr are pipes the agent reads and relays into its log
// (nothing of ours may reach the agent's own stdout: under pdsh the launcher
// reads that); what we log goes to stderr, warnings and errors only.
void SetUpHelperOutput() {
  ::signal(SIGPIPE, SIG_IGN);
  auto logger = spdlog::stderr_color_mt("stack-helper");
  logger->set_pattern("%l: %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::warn);
}

}  // namespace

int RunStackHelper(int fd) {
  SetUpHelperOutput();
  asio::io_context io;
  auto socket = SocketOf(io, fd);
  if (!socket.ok()) {
    spdlog::error("{}", socket.status().message());
    return kExitSoftware;
  }
  std::shared_ptr<proto::Channel> channel = proto::Channel::Create(
      std::move(socket).value(), "agent", HelperLimits(kMaxRequestBytes));
  StackCollector collector(io, [&channel](const wire::Stacks& s) {
    wire::Envelope env;
    *env.mutable_stacks() = s;
    (void)channel->Send(env);  // a failure closes the channel: we end
  });
  Status why = Status::Ok();
  channel->Start({
      .on_message =
          [&](wire::Envelope&& msg) { Serve(collector, *channel, msg); },
      .on_close =
          [&](const Status& st) {
            why = st;
            collector.Stop();
            io.stop();
          },
      .on_drain = nullptr,
  });
  io.run();
  // The agent's EOF is the normal end; anything else is said.
  if (why.ok() || why.code() == StatusCode::kUnavailable) return kExitOk;
  spdlog::error("{}", why.message());
  return kExitSoftware;
}

}  // namespace dslaunch::agent
