// The real tpd under systemd's logging contract (docs/operations.md "Logs"): started with
// $JOURNAL_STREAM naming its stderr, it sends its lines to the journal's socket as entries in
// journald's native protocol, with PRIORITY and the TPD_* fields of the objects they name.
// The test plays journald: in a mount namespace of the daemon's own, /run/systemd/journal is
// a tmpfs whose `socket` leads to a datagram socket the test reads; the machine's /run (and
// any journald on it) is untouched. Then the same with systemd's journald itself in the
// middle, and journalctl filtering what it stored by priority and by field.

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait_until.h"

namespace tpd {
namespace {

using Entry = std::map<std::string, std::string>;

// One datagram of the native protocol: "KEY=value\n" lines (this daemon's values carry no
// newline; the binary form, KEY\n<64-bit length><value>\n, is read too).
Entry ParseEntry(const std::string& datagram) {
  Entry entry;
  size_t at = 0;
  while (at < datagram.size()) {
    const size_t newline = datagram.find('\n', at);
    if (newline == std::string::npos) break;
    const std::string line = datagram.substr(at, newline - at);
    const size_t equals = line.find('=');
    if (equals != std::string::npos) {
      entry[line.substr(0, equals)] = line.substr(equals + 1);
      at = newline + 1;
    } else {
      uint64_t length = 0;
      if (newline + 1 + 8 > datagram.size()) break;
      memcpy(&length, datagram.data() + newline + 1, 8);
      entry[line] = datagram.substr(newline + 9, length);
      at = newline + 9 + length + 1;
    }
  }
  return entry;
}

class FakeJournal {
 public:
  explicit FakeJournal(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
    bound_ = bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    timeval timeout{0, 100000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~FakeJournal() { close(fd_); }
  bool bound() const { return bound_; }

  // Every entry received so far.
  const std::vector<Entry>& Read() {
    std::string buffer(1 << 20, '\0');
    for (ssize_t n; (n = recv(fd_, buffer.data(), buffer.size(), 0)) > 0;) {
      entries_.push_back(ParseEntry(buffer.substr(0, n)));
    }
    return entries_;
  }

 private:
  int fd_ = -1;
  bool bound_ = false;
  std::vector<Entry> entries_;
};

// The first entry whose MESSAGE contains `text`, or an empty one.
Entry Find(const std::vector<Entry>& entries, const std::string& text) {
  for (const Entry& entry : entries) {
    auto message = entry.find("MESSAGE");
    if (message != entry.end() && absl::StrContains(message->second, text)) return entry;
  }
  return {};
}

// Forks `sh -c script` in a mount namespace of its own, with the daemon's path and
// `--socket socket` as its arguments ($@); its output goes to `log` unless that is empty.
pid_t ForkInMountNamespace(const std::string& script, const std::string& socket,
                           const std::string& log) {
  const pid_t child = fork();
  if (child != 0) return child;
  if (!log.empty()) {
    freopen(log.c_str(), "w", stdout);
    freopen(log.c_str(), "w", stderr);
  }
  const std::string tpd = testing::RunfilePath("daemon/tpd");
  execl("/usr/bin/unshare", "unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
        script.c_str(), "sh", tpd.c_str(), "--socket", socket.c_str(), static_cast<char*>(nullptr));
  _exit(127);
}

// A client of the daemon at `socket` attached to shared memory, once the daemon serves;
// nullptr if it never does.
std::unique_ptr<Client> ConnectWhenServing(const std::string& socket) {
  std::unique_ptr<Client> client;
  testing::WaitUntil([&] {
    absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(socket);
    if (connected.ok() && (*connected)->Status().ok()) client = *std::move(connected);
    return client != nullptr;
  });
  if (client == nullptr || !client->AttachSharedMemory().ok()) return nullptr;
  return client;
}

TEST(JournalTest, UnderSystemdLinesBecomeEntriesWithPrioritiesAndFields) {
  if (getuid() != 0 || access("/usr/bin/unshare", X_OK) != 0) {
    GTEST_SKIP() << "needs root and unshare(1) for a mount namespace of the daemon's own";
  }
  testing::TempDir dir;
  FakeJournal journal(dir.path() + "/journal.sock");
  ASSERT_TRUE(journal.bound());
  const std::string socket = dir.path() + "/tpd.sock";
  const std::string log = dir.path() + "/stderr.log";
  // systemd's contract: JOURNAL_STREAM is "device:inode" of the stream stderr is.
  const std::string script = absl::StrCat(
      "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal && ln -s ", dir.path(),
      "/journal.sock /run/systemd/journal/socket && export JOURNAL_STREAM=$(stat -L -c %d:%i "
      "/proc/self/fd/2) && exec \"$@\"");
  const pid_t daemon = ForkInMountNamespace(script, socket, log);
  ASSERT_GE(daemon, 0);
  std::unique_ptr<Client> client = ConnectWhenServing(socket);
  ASSERT_NE(client, nullptr) << "the daemon never served";
  absl::StatusOr<v1::StatusResponse> status = client->Status();
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->attached_sessions_size(), 1);
  const std::string handle = status->attached_sessions(0).handle();

  std::vector<Entry> entries;
  ASSERT_TRUE(testing::WaitUntil([&] {
    entries = journal.Read();
    return !Find(entries, "attached to shared memory").empty();
  })) << entries.size()
      << " entries";
  client.reset();
  kill(daemon, SIGTERM);
  int wait_status = 0;
  waitpid(daemon, &wait_status, 0);
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;

  const Entry serving = Find(entries, "serving (pid");
  ASSERT_FALSE(serving.empty());
  EXPECT_EQ(serving.at("PRIORITY"), "6");
  EXPECT_EQ(serving.at("SYSLOG_IDENTIFIER"), "tpd");
  EXPECT_EQ(serving.at("TPD_COMPONENT"), "daemon");
  EXPECT_EQ(serving.at("TPD_SOCKET"), socket);
  EXPECT_TRUE(absl::StartsWith(serving.at("MESSAGE"), "[socket "))
      << "the journal stamps time and level itself: " << serving.at("MESSAGE");
  const Entry attached = Find(entries, "attached to shared memory");
  EXPECT_EQ(attached.at("TPD_SESSION"), handle);
  EXPECT_EQ(attached.at("TPD_UID"), "0");
  std::ifstream stream(log);
  const std::string written((std::istreambuf_iterator<char>(stream)),
                            std::istreambuf_iterator<char>());
  EXPECT_EQ(written, "") << "nothing is written twice, to the stream too";
}

// A socket file nobody listens on, as a daemon that died leaves it.
void LeaveStaleSocket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  close(fd);
}

// The same contract with systemd's own journald in the middle: journalctl then filters the
// daemon's entries by priority and by the fields it sets. journald runs in a mount namespace
// whose /run is a tmpfs and whose /run/log/journal is the test's directory, so the machine's
// journal (if any) is untouched and the test reads the files journald wrote.
TEST(JournalTest, UnderARealJournaldJournalctlFiltersByPriorityAndField) {
  constexpr char kJournald[] = "/lib/systemd/systemd-journald";
  if (getuid() != 0 || access("/usr/bin/unshare", X_OK) != 0 || access(kJournald, X_OK) != 0 ||
      access("/usr/bin/systemd-cat", X_OK) != 0 || access("/usr/bin/journalctl", X_OK) != 0) {
    GTEST_SKIP() << "needs root, unshare(1), and systemd's journald, systemd-cat and journalctl "
                    "(Debian's systemd)";
  }
  testing::TempDir dir;
  const std::string journal_dir = dir.path() + "/journal";
  ASSERT_EQ(mkdir(journal_dir.c_str(), 0755), 0);
  const std::string socket = dir.path() + "/tpd.sock";
  LeaveStaleSocket(socket);  // the daemon warns that it removed it
  // systemd-cat connects the daemon's stdout and stderr to journald's stream socket, as
  // systemd does for a unit; JOURNAL_STREAM names that stream, as systemd sets it.
  const std::string script = absl::StrCat(
      "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal /run/log/journal && "
      "mount --bind ",
      journal_dir, " /run/log/journal || exit 1\n", kJournald, " & journald=$!\n",
      "while [ ! -S /run/systemd/journal/stdout ]; do sleep 0.05; done\n",
      "systemd-cat -t tpd /bin/sh -c 'export JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2); "
      "exec \"$@\"' sh \"$@\" & daemon=$!\n",
      "trap 'kill -TERM $daemon' TERM\n", "wait $daemon; status=$?\n",
      "if [ $status -gt 128 ]; then wait $daemon; status=$?; fi\n",
      "kill -TERM $journald; wait $journald\n", "exit $status\n");
  const pid_t child = ForkInMountNamespace(script, socket, "");
  ASSERT_GE(child, 0);
  std::unique_ptr<Client> client = ConnectWhenServing(socket);
  ASSERT_NE(client, nullptr) << "the daemon never served";
  absl::StatusOr<v1::StatusResponse> status = client->Status();
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->attached_sessions_size(), 1);
  const std::string handle = status->attached_sessions(0).handle();
  client.reset();
  kill(child, SIGTERM);
  int wait_status = 0;
  waitpid(child, &wait_status, 0);
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;

  const auto journalctl = [&](const std::vector<std::string>& filters) {
    std::vector<std::string> argv = {"/usr/bin/journalctl", "-D", journal_dir,
                                     "--no-pager",          "-o", "json"};
    argv.insert(argv.end(), filters.begin(), filters.end());
    const testing::ProcessResult result = testing::RunProcess(argv);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return result.output;
  };
  // `journalctl -t tpd -p warning`: the warning, not the lines of lower priority.
  const std::string warnings = journalctl({"-t", "tpd", "-p", "warning"});
  EXPECT_THAT(warnings, ::testing::HasSubstr("removed a stale socket file"));
  EXPECT_THAT(warnings, ::testing::HasSubstr("\"PRIORITY\":\"4\""));
  EXPECT_THAT(warnings, ::testing::HasSubstr(absl::StrCat("\"TPD_SOCKET\":\"", socket, "\"")));
  EXPECT_THAT(warnings, ::testing::Not(::testing::HasSubstr("serving (pid")));
  // Every line the session's handle names, by the field: the attach among them.
  const std::string session = journalctl({absl::StrCat("TPD_SESSION=", handle)});
  EXPECT_THAT(session, ::testing::HasSubstr("attached to shared memory"));
  EXPECT_THAT(session, ::testing::HasSubstr("\"TPD_UID\":\"0\""));
  EXPECT_THAT(session, ::testing::Not(::testing::HasSubstr("serving (pid")));
  // Native entries, not lines of the stream: the stream stayed empty.
  EXPECT_THAT(journalctl({"_TRANSPORT=stdout"}), ::testing::Not(::testing::HasSubstr("tpd")));
  EXPECT_THAT(journalctl({"-t", "tpd"}), ::testing::HasSubstr("\"_TRANSPORT\":\"journal\""));
}

}  // namespace
}  // namespace tpd
