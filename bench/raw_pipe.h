// Tier B1 building blocks: a minimal raw TensorPipe pipe (no tpd code on the data path), used
// as the baseline beside the agent (agent_bench) and the daemons' relay (relay_bench).
//
// Thread safety: a RawServer serves one pipe on its context's loop; RawRoundTrip blocks the
// calling thread, one round trip at a time per pipe.

#ifndef TPD_BENCH_RAW_PIPE_H_
#define TPD_BENCH_RAW_PIPE_H_

#include <tensorpipe/tensorpipe.h>

#include <memory>
#include <string>
#include <vector>

namespace tpd::bench {

// A context registering exactly `transport` ("uv" or "shm"; shm also registers uv, which
// bootstraps it, as daemons do) and `channel` ("basic", "cma" or "mpt_uv" with `lanes`
// connections, listening on `host`), at the agent's priorities.
std::shared_ptr<tensorpipe::Context> RawContext(const std::string& transport,
                                                const std::string& channel, int lanes,
                                                const std::string& name,
                                                const std::string& host = "127.0.0.1");

// Accepts one pipe and answers every message it reads: with an empty message, or, when
// `echo`, with the same tensors (read side by side into one buffer of `max_bytes`, written
// back from there). Listens on uv at `host`, and on shm when `shm` (a pipe moves to shm only if
// the listener has it).
class RawServer {
 public:
  // `buffer`, when given, holds `max_bytes` and is used instead of a heap buffer of its own.
  RawServer(tensorpipe::Context& context, bool shm, size_t max_bytes, bool echo = false,
            char* buffer = nullptr, const std::string& host = "127.0.0.1");
  ~RawServer();
  RawServer(const RawServer&) = delete;
  RawServer& operator=(const RawServer&) = delete;

  // The uv URL to connect to.
  const std::string& url() const { return url_; }

 private:
  void Serve();

  const bool echo_;
  std::vector<char> own_buffer_;
  char* const buffer_;
  const size_t buffer_size_;
  std::shared_ptr<tensorpipe::Listener> listener_;
  std::shared_ptr<tensorpipe::Pipe> pipe_;
  std::string url_;
};

// One round trip on `pipe`: `count` tensors of `size` bytes each, tensor i read from
// `data + i * size` (none when `count` or `size` is 0: an empty message), and the answer,
// whose tensors (if the server echoes) land at `reply + i * size`. Both buffers hold
// count * size bytes. False on a pipe error or an answer that does not fit.
bool RawRoundTrip(tensorpipe::Pipe& pipe, const char* data, size_t size, int count = 1,
                  char* reply = nullptr);

}  // namespace tpd::bench

#endif  // TPD_BENCH_RAW_PIPE_H_
