#include "launcher/ssh_connection.h"

#include <gtest/gtest.h>

#include "launcher/ssh_starter.h"

namespace dslaunch::launcher {
namespace {

TEST(ShellQuote, QuotesEveryWordSoNothingIsEvaluated) {
  EXPECT_EQ(ShellQuote("plain"), "'plain'");
  EXPECT_EQ(ShellQuote(""), "''");
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
  EXPECT_EQ(ShellQuote("$(rm -rf /) `id` *"), "'$(rm -rf /) `id` *'");
}

TEST(SshTargets, HostfileOverridesFlags) {
  LaunchOptions o;
  o.ssh_port = 2200;
  o.ssh_user = "flaguser";
  o.ssh_host_key_check = "accept-new";
  Plan plan;
  NodePlan a;
  a.host = "a";
  NodePlan b;
  b.host = "b";
  b.ssh_port = 22;
  b.ssh_user = "fileuser";
  plan.nodes = {a, b};
  auto t = SshTargets(o, plan);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].port, 2200);
  EXPECT_EQ(t[0].user, "flaguser");
  EXPECT_EQ(t[1].port, 22);
  EXPECT_EQ(t[1].user, "fileuser");
  EXPECT_EQ(t[1].check, HostKeyCheck::kAcceptNew);
}

TEST(SshConnection, UnresolvableHostFailsAtResolve) {
  SshConnection c;
  SshTarget t;
  t.host = "no-such-host.invalid";
  SshFailure f;
  EXPECT_FALSE(c.Open(t, &f));
  EXPECT_EQ(f.stage, "resolve");
  EXPECT_FALSE(f.hint.empty());
}

TEST(SshConnection, RefusedPortFailsAtConnect) {
  SshConnection c;
  SshTarget t;
  t.host = "127.0.0.1";
  t.port = 1;  // nothing listens there
  t.timeout_s = 2;
  SshFailure f;
  EXPECT_FALSE(c.Open(t, &f));
  EXPECT_EQ(f.stage, "connect");
}

}  // namespace
}  // namespace dslaunch::launcher
