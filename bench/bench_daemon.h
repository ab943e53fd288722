// A tpd daemon for a benchmark: a child process with a config and a log file of its own in a
// directory the benchmark chose, stopped (SIGTERM, then SIGKILL after 5 s) when this goes. The
// benchmarks run where there is no Bazel (the GPU machine), so the binary is found next to
// them as well as in their runfiles.
//
// Thread safety: belongs to the thread that started it.

#ifndef TPD_BENCH_BENCH_DAEMON_H_
#define TPD_BENCH_BENCH_DAEMON_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

namespace tpd::bench {

class BenchDaemon {
 public:
  // Writes `config` (TOML) to <dir>/<name>.toml and runs `tpd --socket <dir>/<name>.sock
  // --config <dir>/<name>.toml --log_level <log_level>`, its output in <dir>/<name>.log; waits
  // until it logs that it serves. Null, with its log on stderr, if it exits first or takes more
  // than 30 s. With `netns` (a network namespace's file, /run/netns/NAME) the daemon runs in
  // that namespace: its peer port and pipes see that namespace's interfaces.
  static std::unique_ptr<BenchDaemon> Start(const std::string& tpd, const std::string& dir,
                                            const std::string& name, const std::string& config,
                                            const std::string& log_level = "info",
                                            const std::string& netns = "");
  ~BenchDaemon();

  const std::string& socket() const { return socket_; }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_; }
  // Everything it logged so far.
  std::string Log() const;

 private:
  BenchDaemon(std::string socket, std::string log)
      : socket_(std::move(socket)), log_(std::move(log)) {}
  bool WaitServing();

  pid_t pid_ = -1;
  const std::string socket_;
  const std::string log_;
};

// The start of a benchmark daemon's config: [peer] listening on `host` (any port, token
// "bench", node name `node`) and [data] with `arena_bytes`; the caller appends what else it
// sets.
std::string PeerConfig(const std::string& node, const std::string& host, int64_t arena_bytes);
// `csv` ("shm,uv") as a TOML list of strings: ["shm", "uv"].
std::string TomlStrings(const std::string& csv);

// Moves the calling thread (in a child just forked: the process) into the network namespace
// whose file is `netns`; false, with errno, when it cannot.
bool EnterNetns(const std::string& netns);

// The tpd binary: `flag` when set, else daemon/tpd in this binary's runfiles, else `tpd` next
// to it (a bundle of tools/device_bundle.sh); "" when none is executable.
std::string FindTpd(const std::string& flag, const char* argv0);

}  // namespace tpd::bench

#endif  // TPD_BENCH_BENCH_DAEMON_H_
