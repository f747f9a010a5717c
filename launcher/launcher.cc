#include "launcher/launcher.h"

#include <fcntl.h>  // open
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>  // setrlimit: descriptors for large jobs
#include <sys/stat.h>      // fstat: where stdout goes
#include <unistd.h>        // getpid

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>  // getenv
#include <cstring>  // strerror
#include <ctime>    // strftime
#include <map>
#include <string_view>

#include "base/exit_status.h"
#include "base/unix_time.h"
#include "launcher/plan/addresses.h"
#include "launcher/report/log_sink.h"
#include "launcher/report/prometheus_text.h"
#include "launcher/report/tensorboard_sink.h"
#include "launcher/start/start_mode.h"
#include "proto/auth.h"

namespace dslaunch::launcher {

static ControlServer::Options ServerOptions(
    const LaunchOptions& o, const std::string& job_id, int num_nodes,
    std::function<std::optional<std::string>(int)> node_secret) {
  ControlServer::Options s;
  s.join = StartModeNamed(o.launcher).agents_join;
  s.node_secret = std::move(node_secret);
  s.job_id = job_id;
  s.num_nodes = num_nodes;
  s.heartbeat_interval_s = o.heartbeat_interval_s;
  s.heartbeat_timeout_s = o.heartbeat_timeout_s;
  return s;
}

Launcher::Launcher(LaunchOptions options, Plan plan, EnvList job_env,
                   RankCommand command, std::string secret)
    : options_(std::move(options)),
      job_id_(proto::HexEncode(proto::RandomBytes(8))),
      console_(stdout, stderr),
      server_(io_,
              ServerOptions(
                  options_, job_id_,
                  static_cast<int>(plan.nodes.size() + plan.spares.size()),
                  [this](int node) { return job_.NodeSecret(node); }),
              &job_),
      job_(io_, options_, std::move(plan), std::move(job_env),
           std::move(command), console_, job_id_,
           secret.empty()
               ? proto::HexEncode(proto::RandomBytes(proto::kSecretBytes))
               : std::move(secret)),
      signals_(io_, SIGINT, SIGTERM, SIGHUP) {}

Launcher::~Launcher() = default;

// --log_dir, or DeepSpeed's --enable_each_rank_log DIR: each rank's output in
// DIR/<YYYYmmddHHMMSS>_rank<N>.log (the launch time, as DeepSpeed names
// them) instead of on the console.
static Console::LogLayout LogLayoutFor(const LaunchOptions& o) {
  if (o.each_rank_log_dir.empty()) return {o.log_dir};
  char stamp[32] = {0};
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  std::strftime(stamp, sizeof(stamp), "%Y%m%d%H%M%S", &local);
  return {o.each_rank_log_dir, std::string(stamp) + "_rank", false,
          "--enable_each_rank_log"};
}

// DeepSpeed's --save_pid: /tmp/<pid>.deepspeed holds our pid while the job
// runs, for whoever started us to signal; refused if the file exists.
class PidFile {
 public:
  Status Create() {
    path_ = "/tmp/" + std::to_string(::getpid()) + ".deepspeed";
    const int fd =
        ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int err = errno;
      path_.clear();
      return ErrnoStatus("--save_pid: cannot create /tmp/" +
                             std::to_string(::getpid()) + ".deepspeed",
                         err);
    }
    const std::string pid = std::to_string(::getpid());
    const bool ok =
        ::write(fd, pid.data(), pid.size()) == static_cast<ssize_t>(pid.size());
    ::close(fd);
    if (!ok) return ErrnoStatus("--save_pid: cannot write " + path_, EIO);
    return Status::Ok();
  }
  ~PidFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }

 private:
  std::string path_;
};

// Routes the default logger through the console's terminal writer while it
// lives, and back to plain stderr after.
class ScopedLogSink {
 public:
  explicit ScopedLogSink(TerminalWriter* terminal)
      : logger_(spdlog::default_logger()), saved_(logger_->sinks()) {
    auto sink = std::make_shared<TerminalLogSink>(terminal);
    if (!saved_.empty()) sink->set_level(saved_.front()->level());
    logger_->sinks() = {sink};
    logger_->set_pattern(pattern_);
  }
  ~ScopedLogSink() { logger_->sinks() = saved_; }

 private:
  std::shared_ptr<spdlog::logger> logger_;
  std::vector<spdlog::sink_ptr> saved_;
  std::string pattern_ = "[%H:%M:%S.%e launcher %l] %v";
};

// Where the ranks' stdout goes cannot reach the terminal behind the table's
// back: it is that terminal itself (one writer thread orders both), a file,
// or /dev/null. A pipe (`| tee log`) may well end on the screen.
static bool StdoutSafeBesideTable() {
  struct stat out {
  }, err{};
  if (::fstat(STDOUT_FILENO, &out) != 0 || ::fstat(STDERR_FILENO, &err) != 0)
    return false;
  if (out.st_dev == err.st_dev && out.st_ino == err.st_ino) return true;
  if (S_ISREG(out.st_mode)) return true;
  struct stat null {};
  return S_ISCHR(out.st_mode) && ::stat("/dev/null", &null) == 0 &&
         out.st_rdev == null.st_rdev;
}

// --console: auto is the table where stderr is a terminal that can draw it
// and stdout cannot cut into it, else lines; table/all asked for where it
// cannot be drawn fall back to lines (said once).
static Console::View ViewFor(const LaunchOptions& o, std::string* note) {
  using Mode = Console::Mode;
  Console::View view;
  view.fold = !o.no_fold;
  const char* term = std::getenv("TERM");
  const bool tty = ::isatty(STDERR_FILENO) == 1 && term != nullptr &&
                   std::string_view(term) != "dumb";
  const bool drawable = tty && StdoutSafeBesideTable();
  const std::map<std::string, Mode> modes = {{"table", Mode::kTable},
                                             {"all", Mode::kAll},
                                             {"lines", Mode::kLines},
                                             {"rank0", Mode::kRank0},
                                             {"none", Mode::kNone}};
  view.mode = o.console == "auto" ? (drawable ? Mode::kTable : Mode::kLines)
                                  : modes.at(o.console);
  if ((view.mode == Mode::kTable || view.mode == Mode::kAll) && !drawable) {
    *note = "--console " + o.console +
            (tty ? " needs stdout on the same terminal, in a file or "
                   "/dev/null (not a pipe); showing lines instead"
                 : " needs stderr to be a terminal; showing lines instead");
    view.mode = Mode::kLines;
  }
  std::string locale;
  for (const char* name : {"LC_ALL", "LC_CTYPE", "LANG"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') {
      locale = v;
      break;
    }
  }
  view.unicode = locale.find("UTF-8") != std::string::npos ||
                 locale.find("utf8") != std::string::npos ||
                 locale.find("UTF8") != std::string::npos ||
                 locale.find("utf-8") != std::string::npos;
  return view;
}

// The launcher holds per rank a log file and an event file (--tensorboard),
// per node a connection: a large job needs more descriptors than the usual
// soft limit of 1024. Raised as far as needed and the hard limit allows
// (not beyond: children inherit it, and select()-based programs break on
// descriptors past 1023).
static void RaiseFileLimit(size_t ranks, size_t nodes) {
  const rlim_t needed = 3 * ranks + 2 * nodes + 256;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= needed) return;
  const rlim_t want =
      lim.rlim_max == RLIM_INFINITY ? needed : std::min(needed, lim.rlim_max);
  if (want <= lim.rlim_cur) return;
  lim.rlim_cur = want;
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0)
    spdlog::warn("cannot raise the open-file limit to {}: {}", want,
                 std::strerror(errno));
}

int Launcher::Run() {
  ::signal(SIGPIPE, SIG_IGN);
  size_t ranks = 0;
  for (const auto& node : job_.pool().nodes) ranks += node.slots.size();
  RaiseFileLimit(ranks, job_.pool().nodes.size());
  std::string view_note;
  console_.SetView(ViewFor(options_, &view_note));
  if (!view_note.empty()) console_.Note(view_note);
  ScopedLogSink log_sink(&console_.terminal());
  const Console::LogLayout layout = LogLayoutFor(options_);
  Status st = console_.Open(job_.plan(), layout);
  // join: the plan is final once the agents have joined; the console then
  // learns their hosts and opens the logs of ranks added by their GPUs.
  job_.SetOnPlanFinal(
      [this, layout](const Plan& plan) { return console_.Open(plan, layout); });
  if (st.ok() && !options_.tensorboard_dir.empty()) {
    auto tensorboard =
        TensorBoardSink::Create(options_.tensorboard_dir, console_.board());
    st = tensorboard.status();
    if (st.ok()) console_.SetProgressSink(std::move(tensorboard).value());
  }
  PidFile pid_file;
  if (st.ok() && options_.save_pid) st = pid_file.Create();
  std::vector<std::string> hosts;
  for (const auto& node : job_.pool().nodes) hosts.push_back(node.host);
  // join: on --control_addr (default every address) at --control_port.
  const std::vector<std::string> listen_on =
      StartModeNamed(options_.launcher).agents_join
          ? std::vector<std::string>{options_.control_addr.empty()
                                         ? "0.0.0.0"
                                         : options_.control_addr}
          : ChooseControlAddresses(hosts, options_.bind_addr,
                                   options_.control_addr,
                                   AddressLookup::System());
  StatusOr<int> port =
      st.ok() ? server_.Listen(listen_on, options_.control_port) : st;
  if (port.ok() && options_.metrics_port != 0) {
    // By default where the agents reach us and no further: an all-local
    // job's metrics stay on loopback.
    const std::vector<std::string> metrics_on =
        options_.metrics_addr.empty()
            ? listen_on
            : std::vector<std::string>{options_.metrics_addr};
    if (Status metrics = StartMetrics(metrics_on); !metrics.ok())
      port = metrics;
  }
  if (port.ok()) {
    spdlog::info("job {}: control server on port {}", job_.job_id(), *port);
    auto starter = MakeStarter({io_, &job_, options_, job_.pool()});
    if (starter.ok()) starter_ = std::move(starter).value();
    st = starter.status();
  } else {
    st = port.status();
  }
  if (!st.ok()) {
    console_.Note(st.message());
    console_.DrainTerminal();
    return ExitStatusFor(st);
  }
  WatchSignals();
  job_.Start(starter_.get(), &server_, *port);
  io_.run();
  if (metrics_) metrics_->Stop();  // the port closes with the job
  console_.Close();  // sink errors are known before the exit status
  const int code = job_.Finish();
  console_.Flush();
  console_.DrainTerminal();
  return code;
}

Status Launcher::StartMetrics(const std::vector<std::string>& addrs) {
  const double started_at = base::UnixSeconds();
  // Rendered at most twice a second, however often someone asks: a peer
  // hammering /metrics must not take the event loop from the job.
  // Responses being written share the text they started with.
  auto cache =
      std::make_shared<std::pair<double, std::shared_ptr<const std::string>>>(
          -1, nullptr);
  metrics_ = std::make_unique<MetricsServer>(io_, [this, started_at, cache] {
    const double now = base::SteadySeconds();
    if (cache->first >= 0 && now - cache->first < 0.5) return cache->second;
    JobCounters counters;
    counters.restarts = job_.restarts();
    counters.progress_records = console_.progress_records();
    counters.malformed_progress = console_.malformed_progress();
    counters.dropped_lines = console_.dropped_lines();
    counters.started_at = started_at;
    *cache = {now, std::make_shared<const std::string>(
                       RenderMetrics(console_.board(), counters, now))};
    return cache->second;
  });
  StatusOr<int> port = metrics_->Listen(addrs, options_.metrics_port);
  if (!port.ok()) return port.status();
  for (const std::string& addr : addrs) {
    const bool v6 = addr.find(':') != std::string::npos;
    spdlog::info("metrics on http://{}{}{}:{}/metrics", v6 ? "[" : "", addr,
                 v6 ? "]" : "", *port);
  }
  return Status::Ok();
}

void Launcher::WatchSignals() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    job_.OnSignal(sig);
    WatchSignals();
  });
}

}  // namespace dslaunch::launcher
