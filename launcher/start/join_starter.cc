#include "launcher/start/join_starter.h"

#include <boost/asio/post.hpp>

namespace dslaunch::launcher {

JoinStarter::JoinStarter(boost::asio::io_context& io,
                         Starter::Delegate* delegate)
    : io_(io), delegate_(delegate) {}

JoinStarter::~JoinStarter() { *alive_ = false; }

std::unique_ptr<Starter> NewJoinStarter(const StarterContext& context) {
  return std::make_unique<JoinStarter>(context.io, context.delegate);
}

// Nothing to start: the control server already listens for them.
void JoinStarter::Start(const AgentBootstrap&, StartDone done) {
  PostStartDone(io_, alive_, Status::Ok(), Started{}, std::move(done));
}

void JoinStarter::Kill(int node_rank) {
  if (!killed_.insert(node_rank).second) return;
  boost::asio::post(io_, [this, node_rank, alive = alive_] {
    if (*alive)
      delegate_->OnAgentProcessExited(
          node_rank, "is not dslaunch's to stop (--launcher join)");
  });
}

}  // namespace dslaunch::launcher
