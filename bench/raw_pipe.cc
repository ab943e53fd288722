#include "bench/raw_pipe.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "agent/registry.h"

namespace tpd::bench {

std::shared_ptr<tensorpipe::Context> RawContext(const std::string& transport,
                                                const std::string& channel, int lanes,
                                                const std::string& name, const std::string& host) {
  auto context = std::make_shared<tensorpipe::Context>(tensorpipe::ContextOptions().name(name));
  context->registerTransport(tpd::agent::kUvTransportPriority, "uv",
                             tensorpipe::transport::uv::create());
  if (transport == "shm") {
    context->registerTransport(tpd::agent::kShmTransportPriority, "shm",
                               tensorpipe::transport::shm::create());
  }
  if (channel == "basic") {
    context->registerChannel(tpd::agent::kBasicChannelPriority, "basic",
                             tensorpipe::channel::basic::create());
  } else if (channel == "cma") {
    context->registerChannel(tpd::agent::kCmaChannelPriority, "cma",
                             tensorpipe::channel::cma::create());
  } else if (channel == "mpt_uv") {
    std::vector<std::shared_ptr<tensorpipe::transport::Context>> contexts;
    std::vector<std::shared_ptr<tensorpipe::transport::Listener>> listeners;
    for (int i = 0; i < lanes; ++i) {
      contexts.push_back(tensorpipe::transport::uv::create());
      listeners.push_back(contexts.back()->listen(host));
    }
    context->registerChannel(
        tpd::agent::kMultiplexedUvChannelPriority, "mpt_uv",
        tensorpipe::channel::mpt::create(std::move(contexts), std::move(listeners)));
  }
  return context;
}

RawServer::RawServer(tensorpipe::Context& context, bool shm, size_t max_bytes, bool echo,
                     char* buffer, const std::string& host)
    : echo_(echo),
      own_buffer_(buffer == nullptr ? std::max<size_t>(max_bytes, 1) : 0),
      buffer_(buffer == nullptr ? own_buffer_.data() : buffer),
      buffer_size_(buffer == nullptr ? own_buffer_.size() : max_bytes) {
  std::vector<std::string> urls = {absl::StrCat("uv://", host, ":0")};
  if (shm)
    urls.push_back(
        absl::StrCat("shm://tpd-raw-pipe-", getpid(), "-", reinterpret_cast<uintptr_t>(this)));
  listener_ = context.listen(urls);
  url_ = listener_->url("uv");
  listener_->accept([this](const tensorpipe::Error& error, std::shared_ptr<tensorpipe::Pipe> pipe) {
    if (error) return;
    pipe_ = std::move(pipe);
    Serve();
  });
}

RawServer::~RawServer() {
  if (pipe_) pipe_->close();
  listener_->close();
}

void RawServer::Serve() {
  pipe_->readDescriptor([this](const tensorpipe::Error& error, tensorpipe::Descriptor d) {
    if (error) return;
    tensorpipe::Allocation allocation;
    for (size_t i = 0; i < d.payloads.size(); ++i) allocation.payloads.push_back({buffer_});
    // Tensors side by side in the buffer (from its start again where one would not fit).
    std::vector<std::pair<char*, size_t>> tensors;
    size_t offset = 0;
    for (const auto& tensor : d.tensors) {
      if (offset + tensor.length > buffer_size_) offset = 0;
      tensors.emplace_back(buffer_ + offset, tensor.length);
      allocation.tensors.push_back({tensorpipe::CpuBuffer{buffer_ + offset}});
      offset += tensor.length;
    }
    pipe_->read(std::move(allocation), [this, tensors](const tensorpipe::Error& error) {
      if (error) return;
      tensorpipe::Message answer;
      if (echo_) {
        for (const auto& [data, length] : tensors) {
          tensorpipe::Message::Tensor tensor;
          tensor.buffer = tensorpipe::CpuBuffer{data};
          tensor.length = length;
          answer.tensors.push_back(std::move(tensor));
        }
      }
      pipe_->write(std::move(answer), [](const tensorpipe::Error&) {});
      Serve();
    });
  });
}

bool RawRoundTrip(tensorpipe::Pipe& pipe, const char* data, size_t size, int count, char* reply) {
  tensorpipe::Message message;
  if (size > 0) {
    for (int i = 0; i < count; ++i) {
      tensorpipe::Message::Tensor tensor;
      tensor.buffer = tensorpipe::CpuBuffer{const_cast<char*>(data) + i * size};
      tensor.length = size;
      message.tensors.push_back(std::move(tensor));
    }
  }
  absl::Notification written;
  absl::Notification answered;
  bool ok = true;
  pipe.write(std::move(message), [&](const tensorpipe::Error& error) {
    if (error) ok = false;
    written.Notify();
  });
  pipe.readDescriptor([&](const tensorpipe::Error& error, tensorpipe::Descriptor d) {
    if (error) {
      ok = false;
      answered.Notify();
      return;
    }
    tensorpipe::Allocation allocation;
    for (size_t i = 0; i < d.tensors.size(); ++i) {
      if (reply == nullptr || d.tensors[i].length != size) {
        ok = false;  // an answer with tensors, and nowhere to put them
        answered.Notify();
        return;
      }
      allocation.tensors.push_back({tensorpipe::CpuBuffer{reply + i * size}});
    }
    pipe.read(std::move(allocation), [&](const tensorpipe::Error& error) {
      if (error) ok = false;
      answered.Notify();
    });
  });
  answered.WaitForNotification();
  written.WaitForNotification();
  return ok;
}

}  // namespace tpd::bench
