// How the agent reaches its launcher through its LauncherLink: dialling
// (and, for a joining agent, redialling with backoff until the launcher is
// there), what a closed link means, the Hello once connected, and the ready
// file of a joined agent. Part of Agent
// (agent/agent.h); io_context thread only.
#include <fcntl.h>  // open
#include <spdlog/spdlog.h>
#include <sys/stat.h>  // futimens
#include <unistd.h>    // unlink, write

#include <cerrno>
#include <cstring>

#include "agent/agent.h"
#include "agent/node_facts.h"
#include "agent/probe_files.h"
#include "base/host_info.h"  // JoinHostPort
#include "base/unix_time.h"
#include "proto/auth.h"
#include "proto/version.h"

namespace dslaunch::agent {

static int64_t Jitter(int64_t n) {
  uint32_t r = 0;
  const std::string bytes = proto::RandomBytes(sizeof(r));
  std::memcpy(&r, bytes.data(), sizeof(r));
  return static_cast<int64_t>(r % static_cast<uint64_t>(n));
}

void Agent::Connect() {
  ArmConnectTimer();
  Dial();
}

void Agent::ArmConnectTimer() {
  connect_timer_armed_ = true;
  connect_timer_.expires_after(base::Millis(options_.connect_timeout_s));
  connect_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    connect_timer_armed_ = false;
    if (state_ != State::kConnecting) return;
    const std::string within =
        " within " + FormatSeconds(options_.connect_timeout_s) + " s" +
        (last_dial_error_.empty() ? "" : " (" + last_dial_error_ + ")");
    OnLauncherLost(options_.join
                       ? "could not join " +
                             base::JoinHostPort(options_.launcher_host,
                                                options_.launcher_port) +
                             within
                       : "no job from the launcher" + within);
  });
}

void Agent::Dial() {
  link_->Dial(options_.launcher_host, options_.launcher_port);
}

// A launcher that cannot be found or refuses is gone (or never was): no
// retry, so an agent whose launcher died does not linger. A joining agent's
// launcher (and its Service's DNS name) may come up after it: dial again
// until the join timeout.
void Agent::DialFailed(bool resolving, const std::string& why) {
  if (options_.join) return RetryDial(why, resolving);
  OnLauncherLost(why);
}

void Agent::RetryDial(const std::string& why, bool resolving) {
  // Only while no job arrived, for a connection the launcher accepted and
  // then dropped (shed under a flood of strangers, or a deadline it set).
  // The connect timeout bounds the retries.
  if (state_ != State::kConnecting) return OnLauncherLost(why);
  last_dial_error_ = why;
  auth_sent_ = false;
  // A joined agent waits for the others without a deadline of its own; if
  // its connection drops meanwhile, the join timeout runs again.
  if (!connect_timer_armed_) ArmConnectTimer();
  // Exponential backoff with jitter (half to the full delay), 50 ms to 2 s.
  const auto delay = std::chrono::milliseconds(dial_delay_ms_ / 2 +
                                               Jitter(dial_delay_ms_ / 2 + 1));
  // A joining agent waits for a launcher that may start any moment (pods
  // start in any order): it keeps dialling at most 250 ms apart, so the
  // job starts within that of the launcher; a refused connect costs nothing.
  // A name that does not resolve (the Service's DNS not there yet) is asked
  // at most once a second.
  const int64_t cap = !options_.join ? 2000 : resolving ? 1000 : 250;
  dial_delay_ms_ = std::min<int64_t>(dial_delay_ms_ * 2, cap);
  spdlog::info("{}; retrying in {} ms", why, delay.count());
  retry_timer_.expires_after(delay);
  retry_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && state_ == State::kConnecting) Dial();
  });
}

void Agent::OnClosed(const Status& st) {
  if (state_ == State::kExited) return io_.stop();
  const std::string why = st.ok() ? "connection closed" : st.message();
  // A launcher that misbehaved (or failed to prove the secret) is not
  // dialled again; one that dropped the connection is. A joining agent the
  // launcher accepted has joined: losing it now is losing the launcher
  // (within the heartbeat timeout), not a reason to dial for the rest of the
  // join timeout.
  if (state_ == State::kConnecting && st.code() == StatusCode::kUnavailable &&
      !accepted_)
    return RetryDial(why);
  OnLauncherLost(why);
}

void Agent::OnConnected() {
  client_nonce_ = proto::RandomBytes(proto::kNonceBytes);
  wire::Envelope env;
  auto* hello = env.mutable_hello();
  hello->set_protocol_version(kProtocolVersion);
  hello->set_agent_version(kVersion);
  hello->set_node_rank(options_.node_rank);
  hello->set_client_nonce(client_nonce_);
  hello->set_job_id(options_.job_id);
  *hello->mutable_facts() = CollectNodeFacts();
  Send(env);
}

void Agent::RemoveReadyFile() {
  if (ready_file_made_) ::unlink(options_.ready_file.c_str());
  ready_file_made_ = false;
}

// The liveness probe's file: made at the start (never over another file or
// through a link), then touched every second by this loop; a loop that is
// stuck or stopped leaves it to age.
void Agent::MakeAliveFile() {
  if (options_.alive_file.empty()) return;
  alive_fd_ =
      ::open(options_.alive_file.c_str(),
             O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (alive_fd_ < 0) {
    spdlog::warn("--alive_file {}: {}", options_.alive_file,
                 std::strerror(errno));
    return;
  }
  (void)!::write(alive_fd_, kAliveText, sizeof(kAliveText) - 1);
  TouchAliveFile();
}

void Agent::TouchAliveFile() {
  ::futimens(alive_fd_, nullptr);
  alive_timer_.expires_after(std::chrono::seconds(1));
  alive_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) TouchAliveFile();
  });
}

void Agent::MakeReadyFile() {
  if (options_.ready_file.empty()) return;
  if (ready_file_made_) return;
  // Ours alone: never an existing file, never through a symlink (it is
  // removed at the end).
  const int fd =
      ::open(options_.ready_file.c_str(),
             O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    spdlog::warn("--ready_file {}: {}", options_.ready_file,
                 std::strerror(errno));
    return;
  }
  const std::string text =
      ReadyFileText(state_ == State::kConnecting ? -1 : job_.node_rank());
  (void)!::write(fd, text.data(), text.size());
  ::close(fd);
  ready_file_made_ = true;
}

}  // namespace dslaunch::agent
