#include "base/safe_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>  // mkdtemp
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace dslaunch::base {
namespace {

namespace fs = std::filesystem;

constexpr uid_t kNobody = 65534;

class SafeFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsl-safe-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string Read(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static void Write(const fs::path& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  static bool Root() { return ::geteuid() == 0; }
  // Writes `text` as a new file in `dir` through its descriptor.
  static void Put(const SafeDir& dir, const std::string& name,
                  const std::string& text) {
    auto fd = dir.CreateNew(name, 0600);
    ASSERT_TRUE(fd.ok()) << fd.status().message();
    ASSERT_EQ(::write(*fd, text.data(), text.size()),
              static_cast<ssize_t>(text.size()));
    ::close(*fd);
  }

  fs::path dir_;
};

#define NEEDS_ROOT() \
  if (!Root()) GTEST_SKIP() << "needs root to give a file to another user"

TEST(FileModes, GroupMayReadOnlyWhenTheUmaskDeniesOthers) {
  EXPECT_EQ(PrivateFileMode(022), 0600u);
  EXPECT_EQ(PrivateFileMode(002), 0600u);
  EXPECT_EQ(PrivateFileMode(000), 0600u);
  EXPECT_EQ(PrivateFileMode(027), 0640u);
  EXPECT_EQ(PrivateFileMode(007), 0640u);
  EXPECT_EQ(PrivateFileMode(077), 0600u);
  EXPECT_EQ(PrivateFileMode(0277), 0400u);
  EXPECT_EQ(PrivateDirMode(022), 0700u);
  EXPECT_EQ(PrivateDirMode(027), 0750u);
}

TEST_F(SafeFilesTest, MakesMissingDirectoriesPrivate) {
  const mode_t old = ::umask(022);
  auto d = SafeDir::Open((dir_ / "a" / "b").string(), "--log_dir");
  ::umask(old);
  ASSERT_TRUE(d.ok()) << d.status().message();
  for (const fs::path& p : {dir_ / "a", dir_ / "a" / "b"}) {
    struct stat st;
    ASSERT_EQ(::stat(p.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u) << p;
  }
  Put(*d, "f", "x");
  EXPECT_EQ(Read(dir_ / "a" / "b" / "f"), "x");
}

TEST_F(SafeFilesTest, WithoutCreateAMissingDirectoryIsAnError) {
  auto d = SafeDir::Open((dir_ / "none").string(), "--log_dir", false);
  ASSERT_FALSE(d.ok());
  EXPECT_FALSE(fs::exists(dir_ / "none"));
}

TEST_F(SafeFilesTest, AFileInThePathIsNotADirectory) {
  Write(dir_ / "file", "x");
  for (const fs::path& p : {dir_ / "file", dir_ / "file" / "sub"}) {
    auto d = SafeDir::Open(p.string(), "--tensorboard");
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), StatusCode::kIoError);
    EXPECT_EQ(d.status().message().find("--tensorboard " + p.string() + ": "),
              0u)
        << d.status().message();
    EXPECT_NE(d.status().message().find("not a directory"), std::string::npos)
        << d.status().message();
  }
}

TEST_F(SafeFilesTest, RefusesADirectoryOfAnotherUserNamingIt) {
  NEEDS_ROOT();
  const fs::path theirs = dir_ / "theirs";
  fs::create_directories(theirs);
  ASSERT_EQ(::chown(theirs.c_str(), kNobody, kNobody), 0);
  auto d = SafeDir::Open(theirs.string(), "--log_dir");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kIoError);
  EXPECT_EQ(d.status().message(),
            "--log_dir " + theirs.string() + ": " + theirs.string() +
                " belongs to another user (uid 65534); nothing is written "
                "there");
}

TEST_F(SafeFilesTest, RefusesADirectoryUnderAnotherUsersDirectory) {
  NEEDS_ROOT();
  // Ours, but inside one whose owner can rename it and put theirs there.
  const fs::path theirs = dir_ / "theirs";
  fs::create_directories(theirs / "ours");
  ASSERT_EQ(::chown(theirs.c_str(), kNobody, kNobody), 0);
  auto d = SafeDir::Open((theirs / "ours").string(), "--log_dir");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(
      d.status().message().find(theirs.string() + " belongs to another user"),
      std::string::npos)
      << d.status().message();
  // Nor made there.
  EXPECT_FALSE(SafeDir::Open((theirs / "new").string(), "--log_dir").ok());
  EXPECT_FALSE(fs::exists(theirs / "new"));
}

TEST_F(SafeFilesTest, FollowsALinkOfThisUserOnTheWay) {
  fs::create_directories(dir_ / "real");
  fs::create_directory_symlink(dir_ / "real", dir_ / "abs");
  fs::create_directory_symlink("real", dir_ / "rel");
  for (const char* link : {"abs", "rel"}) {
    auto d = SafeDir::Open((dir_ / link / "logs").string(), "--log_dir");
    ASSERT_TRUE(d.ok()) << d.status().message();
    Put(*d, std::string("via-") + link, "x");
    EXPECT_TRUE(
        fs::exists(dir_ / "real" / "logs" / ("via-" + std::string(link))));
  }
  // The directory itself may be one (~/logs -> /scratch/me/logs).
  fs::create_directory_symlink(dir_ / "real", dir_ / "last");
  EXPECT_TRUE(SafeDir::Open((dir_ / "last").string(), "--log_dir").ok());
}

TEST_F(SafeFilesTest, RefusesALinkOfAnotherUserOnTheWay) {
  NEEDS_ROOT();
  fs::create_directories(dir_ / "real");
  fs::create_directory_symlink(dir_ / "real", dir_ / "planted");
  ASSERT_EQ(::lchown((dir_ / "planted").c_str(), kNobody, kNobody), 0);
  auto d = SafeDir::Open((dir_ / "planted" / "logs").string(), "--log_dir");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("a symbolic link of another user"),
            std::string::npos)
      << d.status().message();
  EXPECT_FALSE(fs::exists(dir_ / "real" / "logs"));
}

TEST_F(SafeFilesTest, ALinkLoopIsAnErrorNotAHang) {
  fs::create_directory_symlink(dir_ / "b", dir_ / "a");
  fs::create_directory_symlink(dir_ / "a", dir_ / "b");
  EXPECT_FALSE(SafeDir::Open((dir_ / "a" / "x").string(), "--log_dir").ok());
}

// Root's directories above ours are fine (/tmp, /home); one of root's as the
// directory itself is not this user's. Checked as another uid in a child.
TEST_F(SafeFilesTest, AnotherUidAcceptsRootsDirectoriesAboveOnly) {
  NEEDS_ROOT();
  fs::create_directories(dir_ / "shared");
  ::chmod(dir_.c_str(), 0755);
  ::chmod((dir_ / "shared").c_str(), 01777);  // as /tmp
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(10);
    const bool below =
        SafeDir::Open((dir_ / "shared" / "mine").string(), "t").ok();
    const auto itself = SafeDir::Open((dir_ / "shared").string(), "t");
    const bool named = !itself.ok() && itself.status().message().find(
                                           "belongs to another user (uid 0)") !=
                                           std::string::npos;
    ::_exit(below ? (named ? 0 : 2) : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "1: a directory under root's refused; 2: root's own accepted";
}

TEST_F(SafeFilesTest, ChildIsNeverALinkNorAnotherUsers) {
  auto d = SafeDir::Open(dir_.string(), "--tensorboard");
  ASSERT_TRUE(d.ok());
  fs::create_directories(dir_ / "elsewhere");
  fs::create_directory_symlink(dir_ / "elsewhere", dir_ / "run");
  auto run = d->Child("run");
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find("symbolic link"), std::string::npos)
      << run.status().message();
  EXPECT_FALSE(d->Child("../x").ok());
  EXPECT_FALSE(d->Child("..").ok());
  auto made = d->Child("new");
  ASSERT_TRUE(made.ok()) << made.status().message();
  EXPECT_EQ(made->path(), dir_.string() + "/new");
  if (!Root()) return;
  fs::create_directories(dir_ / "theirs");
  ASSERT_EQ(::chown((dir_ / "theirs").c_str(), kNobody, kNobody), 0);
  auto theirs = d->Child("theirs");
  ASSERT_FALSE(theirs.ok());
  EXPECT_NE(theirs.status().message().find("belongs to another user"),
            std::string::npos);
}

// By construction: once opened, a directory swapped for a link (or for
// another user's) by path changes nothing; files go where the fd points.
TEST_F(SafeFilesTest, WritesIntoTheDirectoryOpenedEvenIfItIsSwapped) {
  fs::create_directories(dir_ / "victim");
  auto top = SafeDir::Open(dir_.string(), "t");
  ASSERT_TRUE(top.ok());
  auto run = top->Child("run");
  ASSERT_TRUE(run.ok());
  fs::rename(dir_ / "run", dir_ / "moved");
  fs::create_directory_symlink(dir_ / "victim", dir_ / "run");
  Put(*run, "events", "x");
  EXPECT_TRUE(fs::is_empty(dir_ / "victim"));
  EXPECT_EQ(Read(dir_ / "moved" / "events"), "x");
}

TEST_F(SafeFilesTest, CreateNewNeverOpensWhatExists) {
  auto d = SafeDir::Open(dir_.string(), "t");
  ASSERT_TRUE(d.ok());
  Write(dir_ / "victim", "precious");
  fs::create_symlink(dir_ / "victim", dir_ / "link");
  Write(dir_ / "there", "old");
  for (const char* name : {"link", "there"}) {
    bool exists = false;
    auto fd = d->CreateNew(name, 0600, &exists);
    EXPECT_FALSE(fd.ok());
    EXPECT_TRUE(exists) << name;
  }
  EXPECT_EQ(Read(dir_ / "victim"), "precious");
}

TEST_F(SafeFilesTest, OpenLogTruncatesAFileOfThisUserAndTightensIt) {
  auto d = SafeDir::Open(dir_.string(), "t");
  ASSERT_TRUE(d.ok());
  Write(dir_ / "rank-0.log", "old run");
  ::chmod((dir_ / "rank-0.log").c_str(), 0666);
  auto fd = d->OpenLog("rank-0.log", 0600);
  ASSERT_TRUE(fd.ok()) << fd.status().message();
  ASSERT_EQ(::write(*fd, "new", 3), 3);
  ::close(*fd);
  EXPECT_EQ(Read(dir_ / "rank-0.log"), "new");
  struct stat st;
  ASSERT_EQ(::stat((dir_ / "rank-0.log").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(SafeFilesTest, OpenLogRefusesAFileOfAnotherUserWithoutTruncatingIt) {
  NEEDS_ROOT();
  auto d = SafeDir::Open(dir_.string(), "t");
  ASSERT_TRUE(d.ok());
  // Planted in a shared directory, world-writable, for its owner to read.
  Write(dir_ / "rank-0.log", "theirs");
  ::chmod((dir_ / "rank-0.log").c_str(), 0666);
  ASSERT_EQ(::chown((dir_ / "rank-0.log").c_str(), kNobody, kNobody), 0);
  auto fd = d->OpenLog("rank-0.log", 0600);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().message(),
            "cannot write " + dir_.string() +
                "/rank-0.log: the file belongs to another user (uid 65534)");
  EXPECT_EQ(Read(dir_ / "rank-0.log"), "theirs");
}

TEST_F(SafeFilesTest, OpenLogRefusesAHardLinkToAnotherFile) {
  auto d = SafeDir::Open(dir_.string(), "t");
  ASSERT_TRUE(d.ok());
  Write(dir_ / "precious", "keep");
  fs::create_hard_link(dir_ / "precious", dir_ / "rank-0.log");
  auto fd = d->OpenLog("rank-0.log", 0600);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("hard links"), std::string::npos);
  EXPECT_EQ(Read(dir_ / "precious"), "keep");
}

TEST_F(SafeFilesTest, OpenLogOnAPipeNobodyReadsFailsAtOnce) {
  auto d = SafeDir::Open(dir_.string(), "t");
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(::mkfifo((dir_ / "rank-0.log").c_str(), 0600), 0);
  auto fd = d->OpenLog("rank-0.log", 0600);  // would block without O_NONBLOCK
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("a pipe that nobody reads"),
            std::string::npos)
      << fd.status().message();
}

TEST_F(SafeFilesTest, OpenLogFollowsALinkOnlyToADeviceOrAPipeOfOurs) {
  auto d = SafeDir::Open(dir_.string(), "t");
  ASSERT_TRUE(d.ok());
  fs::create_symlink("/dev/null", dir_ / "null.log");
  auto fd = d->OpenLog("null.log", 0600);
  ASSERT_TRUE(fd.ok()) << fd.status().message();
  ::close(*fd);
  Write(dir_ / "victim", "precious");
  fs::create_symlink(dir_ / "victim", dir_ / "file.log");
  EXPECT_FALSE(d->OpenLog("file.log", 0600).ok());
  EXPECT_EQ(Read(dir_ / "victim"), "precious");
}

// A link another user planted in a directory they may write (a project
// directory their group shares) is not followed, even to a device: it
// would send our logs wherever they chose (/dev/kmsg, a terminal).
TEST_F(SafeFilesTest, OpenLogNeverFollowsALinkOfAnotherUser) {
  NEEDS_ROOT();
  ASSERT_EQ(::chown(dir_.c_str(), 0, kNobody), 0);
  ::chmod(dir_.c_str(), 0770);
  auto d = SafeDir::Open(dir_.string(), "t");
  ASSERT_TRUE(d.ok()) << d.status().message();
  fs::create_symlink("/dev/null", dir_ / "rank-0.log");
  ASSERT_EQ(::lchown((dir_ / "rank-0.log").c_str(), kNobody, kNobody), 0);
  auto fd = d->OpenLog("rank-0.log", 0600);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find(
                "a symbolic link of another user (uid 65534), not followed"),
            std::string::npos)
      << fd.status().message();
}

// Our own directory that every user may write (not sticky): anybody could
// plant names in it, so nothing is written there.
TEST_F(SafeFilesTest, RefusesADirectoryOfOursThatEveryoneMayWrite) {
  ::chmod(dir_.c_str(), 0777);
  auto d = SafeDir::Open(dir_.string(), "--log_dir");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("is writable by every user"),
            std::string::npos)
      << d.status().message();
  ::chmod(dir_.c_str(), 01777);  // sticky: nobody replaces our names
  EXPECT_TRUE(SafeDir::Open(dir_.string(), "--log_dir").ok());
}

TEST_F(SafeFilesTest, OpenUnnamedLeavesNothingBehind) {
  auto d = SafeDir::Open(dir_.string(), "t");
  ASSERT_TRUE(d.ok());
  const int fd = d->OpenUnnamed();
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::write(fd, "x", 1), 1);
  ::close(fd);
  EXPECT_TRUE(fs::is_empty(dir_));
}

// ---- ReadTrustedFile ----

TEST_F(SafeFilesTest, ReadsASmallFileOfThisUserAlsoThroughALink) {
  Write(dir_ / "env", "A=1\n");
  fs::create_symlink(dir_ / "env", dir_ / ".deepspeed_env");
  auto text =
      ReadTrustedFile((dir_ / ".deepspeed_env").string(), "env file", 1024);
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, "A=1\n");
}

TEST_F(SafeFilesTest, AMissingFileIsNotFound) {
  auto text = ReadTrustedFile((dir_ / "none").string(), "env file", 1024);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kNotFound);
}

TEST_F(SafeFilesTest, RefusesAPipeWithoutBlockingAndDevices) {
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", dir_ / "zero");
  for (const fs::path& p : {fifo, dir_ / "zero", dir_}) {
    auto text = ReadTrustedFile(p.string(), "env file", 1024);
    ASSERT_FALSE(text.ok()) << p;
    EXPECT_EQ(text.status().code(), StatusCode::kDataError);
    EXPECT_EQ(text.status().message(),
              "env file " + p.string() +
                  ": not a regular file (a pipe, a device or a directory is "
                  "never read)");
  }
}

TEST_F(SafeFilesTest, RefusesAFileWritableByEveryone) {
  Write(dir_ / "env", "LD_PRELOAD=/tmp/x.so\n");
  ::chmod((dir_ / "env").c_str(), 0666);
  auto text = ReadTrustedFile((dir_ / "env").string(), "env file", 1024);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().message(), "env file " + (dir_ / "env").string() +
                                         ": writable by every user; not read");
}

TEST_F(SafeFilesTest, RefusesAFileOfAnotherUser) {
  NEEDS_ROOT();
  Write(dir_ / "env", "LD_PRELOAD=/tmp/x.so\n");
  ::chmod((dir_ / "env").c_str(), 0644);
  ASSERT_EQ(::chown((dir_ / "env").c_str(), kNobody, kNobody), 0);
  auto text = ReadTrustedFile((dir_ / "env").string(), "env file", 1024);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kDataError);
  EXPECT_EQ(text.status().message(),
            "env file " + (dir_ / "env").string() +
                ": belongs to another user (uid 65534); not read");
}

TEST_F(SafeFilesTest, RefusesALinkOfAnotherUserToAFileOfOurs) {
  NEEDS_ROOT();
  Write(dir_ / "ours", "A=1\n");
  fs::create_symlink(dir_ / "ours", dir_ / ".deepspeed_env");
  ASSERT_EQ(::lchown((dir_ / ".deepspeed_env").c_str(), kNobody, kNobody), 0);
  auto text =
      ReadTrustedFile((dir_ / ".deepspeed_env").string(), "env file", 1024);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().message(),
            "env file " + (dir_ / ".deepspeed_env").string() +
                ": a symbolic link of another user (uid 65534); not followed");
}

// Writable by a group others belong to: any of them could add LD_PRELOAD.
// The owner's own group (no other member) is fine: umask 002 makes every
// file so.
TEST_F(SafeFilesTest, RefusesAFileWritableByASharedGroup) {
  NEEDS_ROOT();
  Write(dir_ / "env", "A=1\n");
  ::chmod((dir_ / "env").c_str(), 0664);
  ASSERT_EQ(::chown((dir_ / "env").c_str(), 0, kNobody), 0);  // nogroup
  auto text = ReadTrustedFile((dir_ / "env").string(), "env file", 1024);
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("writable by group 65534"),
            std::string::npos)
      << text.status().message();
  ASSERT_EQ(::chown((dir_ / "env").c_str(), 0, 0), 0);  // root's own group
  EXPECT_TRUE(ReadTrustedFile((dir_ / "env").string(), "env file", 1024).ok());
}

// Root's file under a second name that another user made (a hard link
// into a shared directory) is not read by that user's victim.
TEST_F(SafeFilesTest, AnotherUidRefusesRootsFileWithASecondName) {
  NEEDS_ROOT();
  ::chmod(dir_.c_str(), 0755);
  Write(dir_ / "secret", "root:x:1:2\n");
  ::chmod((dir_ / "secret").c_str(), 0644);
  ASSERT_EQ(::link((dir_ / "secret").c_str(), (dir_ / "env").c_str()), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(10);
    auto text = ReadTrustedFile((dir_ / "env").string(), "env file", 1024);
    ::_exit(!text.ok() && text.status().message().find("more than one name") !=
                              std::string::npos
                ? 0
                : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(SafeFilesTest, RefusesAFileLargerThanTheCap) {
  Write(dir_ / "big", std::string(1025, 'x'));
  Write(dir_ / "fits", std::string(1024, 'x'));
  auto big = ReadTrustedFile((dir_ / "big").string(), "env file", 1024);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("larger than 1024 bytes"),
            std::string::npos);
  EXPECT_TRUE(ReadTrustedFile((dir_ / "fits").string(), "env file", 1024).ok());
}

}  // namespace
}  // namespace dslaunch::base
