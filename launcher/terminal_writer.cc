#include "launcher/terminal_writer.h"

namespace dslaunch::launcher {

TerminalWriter::TerminalWriter(size_t limit)
    : limit_(limit), thread_([this] { Run(); }) {}

TerminalWriter::~TerminalWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void TerminalWriter::Write(FILE* stream, std::string text) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return queued_bytes_ < limit_ || stop_; });
  queued_bytes_ += text.size();
  queue_.emplace_back(stream, std::move(text));
  cv_.notify_all();
}

void TerminalWriter::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && !writing_; });
}

void TerminalWriter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return !queue_.empty() || stop_; });
    if (queue_.empty()) return;  // stop_ and nothing left
    auto batch = std::move(queue_);
    queue_.clear();
    writing_ = true;
    lock.unlock();
    size_t written = 0;
    for (auto& [stream, text] : batch) {
      std::fwrite(text.data(), 1, text.size(), stream);
      written += text.size();
    }
    std::fflush(stdout);
    std::fflush(stderr);
    lock.lock();
    writing_ = false;
    queued_bytes_ -= written;
    cv_.notify_all();
  }
}

}  // namespace dslaunch::launcher
