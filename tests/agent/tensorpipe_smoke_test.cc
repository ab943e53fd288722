// @system//:tensorpipe links and works: a context with the uv transport and the basic channel
// sends one message (a payload and a tensor) to itself over loopback.

#include <tensorpipe/tensorpipe.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace {

constexpr absl::Duration kTimeout = absl::Seconds(20);

TEST(TensorPipeSmokeTest, UvAndBasicCarryAPayloadAndATensorOverLoopback) {
  auto context = std::make_shared<tensorpipe::Context>();
  context->registerTransport(0, "uv", tensorpipe::transport::uv::create());
  context->registerChannel(0, "basic", tensorpipe::channel::basic::create());

  std::shared_ptr<tensorpipe::Listener> listener = context->listen({"uv://127.0.0.1:0"});
  const std::string url = listener->url("uv");
  ASSERT_EQ(url.rfind("uv://127.0.0.1:", 0), 0u) << url;

  std::shared_ptr<tensorpipe::Pipe> server_pipe;
  absl::Notification accepted;
  listener->accept([&](const tensorpipe::Error& error, std::shared_ptr<tensorpipe::Pipe> pipe) {
    EXPECT_FALSE(error) << error.what();
    server_pipe = std::move(pipe);
    accepted.Notify();
  });
  std::shared_ptr<tensorpipe::Pipe> client_pipe = context->connect(url);

  std::string payload = "hello";
  std::vector<char> tensor(4096);
  for (size_t i = 0; i < tensor.size(); ++i) tensor[i] = static_cast<char>(i * 7);

  tensorpipe::Message message;
  message.metadata = "smoke";
  message.payloads.push_back({payload.data(), payload.size(), ""});
  tensorpipe::Message::Tensor out_tensor;
  out_tensor.buffer = tensorpipe::CpuBuffer{tensor.data()};
  out_tensor.length = tensor.size();
  message.tensors.push_back(std::move(out_tensor));
  absl::Notification written;
  client_pipe->write(std::move(message), [&](const tensorpipe::Error& error) {
    EXPECT_FALSE(error) << error.what();
    written.Notify();
  });

  ASSERT_TRUE(accepted.WaitForNotificationWithTimeout(kTimeout));
  std::string payload_in;
  std::vector<char> tensor_in;
  absl::Notification read;
  server_pipe->readDescriptor(
      [&](const tensorpipe::Error& error, tensorpipe::Descriptor descriptor) {
        ASSERT_FALSE(error) << error.what();
        EXPECT_EQ(descriptor.metadata, "smoke");
        ASSERT_EQ(descriptor.payloads.size(), 1u);
        ASSERT_EQ(descriptor.tensors.size(), 1u);
        payload_in.resize(descriptor.payloads[0].length);
        tensor_in.resize(descriptor.tensors[0].length);
        tensorpipe::Allocation allocation;
        allocation.payloads.push_back({payload_in.data()});
        allocation.tensors.push_back({tensorpipe::CpuBuffer{tensor_in.data()}});
        server_pipe->read(std::move(allocation), [&](const tensorpipe::Error& error) {
          EXPECT_FALSE(error) << error.what();
          read.Notify();
        });
      });
  ASSERT_TRUE(read.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_TRUE(written.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_EQ(payload_in, payload);
  EXPECT_EQ(tensor_in, tensor);

  client_pipe->close();
  server_pipe->close();
  listener->close();
  context->close();
  context->join();
}

}  // namespace
