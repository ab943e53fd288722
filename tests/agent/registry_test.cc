// The registry: PyTorch's priorities, unknown names refused, lists narrowing what is
// registered, Describe() saying why each name was or was not chosen, and the prediction of
// TensorPipe's choice. Also the error adapter.

#include "agent/registry.h"

#include <tensorpipe/tensorpipe.h>

#include "agent/tp_error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpd::agent {
namespace {

using ::testing::HasSubstr;

const Candidate* Find(const std::vector<Candidate>& list, const std::string& name) {
  for (const Candidate& c : list) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

TEST(RegistryTest, KnowsPyTorchsPrioritiesHighestFirst) {
  const auto& transports = Registry::KnownTransports();
  ASSERT_EQ(transports.size(), 3u);
  EXPECT_EQ(transports[0].name, "shm");
  EXPECT_EQ(transports[0].priority, 200);
  EXPECT_EQ(transports[1].name, "ibv");
  EXPECT_EQ(transports[1].priority, 100);
  EXPECT_EQ(transports[2].name, "uv");
  EXPECT_EQ(transports[2].priority, 0);
  const auto& channels = Registry::KnownChannels();
  EXPECT_EQ(Find(channels, "cma")->priority, 1200);
  EXPECT_EQ(Find(channels, "mpt_uv")->priority, 1100);
  EXPECT_EQ(Find(channels, "basic")->priority, 1000);
  EXPECT_EQ(Find(channels, "cuda_xth")->priority, 400);
  EXPECT_EQ(Find(channels, "cuda_ipc")->priority, 300);
  EXPECT_EQ(Find(channels, "cuda_gdr")->priority, 200);
  EXPECT_EQ(Find(channels, "cuda_basic")->priority, 0);
  for (size_t i = 1; i < channels.size(); ++i) {
    EXPECT_GT(channels[i - 1].priority, channels[i].priority);
  }
}

TEST(RegistryTest, UnknownNamesAreRefusedInPyTorchsWords) {
  RegistryOptions options;
  options.transports = {"uv", "tcp"};
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Create(options);
  EXPECT_EQ(registry.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(registry.status().message(), HasSubstr("Unknown transport: \"tcp\""));
  options.transports = {};
  options.channels = {"carrier-pigeon"};
  registry = Registry::Create(options);
  EXPECT_THAT(registry.status().message(), HasSubstr("Unknown channel: \"carrier-pigeon\""));
  options.channels = {};
  options.mpt_lanes = 0;
  EXPECT_EQ(Registry::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RegistryTest, UvAndBasicAreAlwaysThereAndCudaIsNotBuilt) {
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Create(RegistryOptions{});
  ASSERT_TRUE(registry.ok()) << registry.status();
  EXPECT_TRUE(Find((*registry)->transports(), "uv")->registered);
  EXPECT_TRUE(Find((*registry)->channels(), "basic")->registered);
  const Candidate* cuda_ipc = Find((*registry)->channels(), "cuda_ipc");
  EXPECT_FALSE(cuda_ipc->registered);
  EXPECT_THAT(cuda_ipc->reason, HasSubstr("not in this build"));
  // Whatever this machine lacks is named with a reason, never silently dropped.
  for (const auto* list : {&(*registry)->transports(), &(*registry)->channels()}) {
    for (const Candidate& c : *list) {
      if (!c.registered) EXPECT_FALSE(c.reason.empty()) << c.name;
    }
  }
  const std::string describe = (*registry)->Describe();
  EXPECT_THAT(describe, HasSubstr("uv (0): registered"));
  EXPECT_THAT(describe, HasSubstr("cuda_ipc (300): not registered, not in this build"));
  EXPECT_EQ((*registry)->BootstrapOrder().front(), "uv") << "pipes bootstrap on uv";
}

TEST(RegistryTest, AGroupsListsNarrowWhatIsRegisteredAndDescribeSaysSo) {
  RegistryOptions options;
  options.transports = {"uv"};
  options.channels = {"basic", "cuda_ipc"};
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Create(options);
  ASSERT_TRUE(registry.ok()) << registry.status();
  EXPECT_FALSE(Find((*registry)->transports(), "shm")->registered);
  EXPECT_THAT(Find((*registry)->transports(), "shm")->reason,
              HasSubstr("not in the allowed transports [uv]"));
  EXPECT_FALSE(Find((*registry)->channels(), "cma")->registered);
  EXPECT_THAT(
      (*registry)->Describe(),
      HasSubstr("cma (1200): not registered, not in the allowed channels [basic, cuda_ipc]"));
  EXPECT_EQ((*registry)->BootstrapOrder(), std::vector<std::string>{"uv"});
  const auto urls = (*registry)->ListenUrls("0");
  ASSERT_EQ(urls.size(), 1u);
  EXPECT_EQ(urls.at("uv"), "uv://127.0.0.1:0");
}

TEST(RegistryTest, XthIsRegisteredOnlyWhenNamed) {
  absl::StatusOr<std::unique_ptr<Registry>> by_default = Registry::Create(RegistryOptions{});
  ASSERT_TRUE(by_default.ok()) << by_default.status();
  EXPECT_FALSE(Find((*by_default)->channels(), "xth")->registered);
  EXPECT_THAT(Find((*by_default)->channels(), "xth")->reason, HasSubstr("only when named"));
  RegistryOptions named;
  named.channels = {"xth", "basic"};
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Create(named);
  ASSERT_TRUE(registry.ok()) << registry.status();
  EXPECT_TRUE(Find((*registry)->channels(), "xth")->registered);
}

TEST(RegistryTest, NothingUsableLeftIsAFailedPrecondition) {
  RegistryOptions options;
  options.channels = {"cuda_ipc"};  // known, but not in this build
  absl::StatusOr<std::unique_ptr<Registry>> registry = Registry::Create(options);
  EXPECT_EQ(registry.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(registry.status().message(), HasSubstr("no usable TensorPipe CPU channel"));
}

TEST(RegistryTest, PredictsTensorPipesChoiceFromBothOffers) {
  absl::StatusOr<std::unique_ptr<Registry>> local = Registry::Create(RegistryOptions{});
  ASSERT_TRUE(local.ok()) << local.status();
  const auto transports = (*local)->TransportDomains();
  const auto channels = (*local)->ChannelCpuDescriptors();
  // A peer like this one (same host, same process): the best registered of each.
  std::string best_transport;
  for (const Candidate& c : (*local)->transports()) {
    if (c.registered && best_transport.empty()) best_transport = c.name;
  }
  EXPECT_EQ((*local)->PickTransport(transports), best_transport);
  EXPECT_NE((*local)->PickChannel(channels), "");
  // A peer offering only uv and basic.
  EXPECT_EQ((*local)->PickTransport({{"uv", transports.at("uv")}}), "uv");
  EXPECT_EQ((*local)->PickChannel({{"basic", channels.at("basic")}}), "basic");
  // A peer on another host: its shm domain differs, so uv.
  if (transports.count("shm") > 0) {
    EXPECT_EQ((*local)->PickTransport({{"shm", "shm:another-host"}, {"uv", transports.at("uv")}}),
              "uv");
  }
  // A peer offering nothing in common.
  EXPECT_EQ((*local)->PickTransport({}), "");
}

TEST(TensorPipeErrorTest, NetworkErrorsAreUnavailableAndMisuseIsInternal) {
  EXPECT_TRUE(TensorPipeErrorToStatus(tensorpipe::Error::kSuccess, "x").ok());
  const tensorpipe::Error eof(std::make_shared<tensorpipe::EOFError>(), "f.cc", 1);
  absl::Status status = TensorPipeErrorToStatus(eof, "pipe to node-b failed");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("pipe to node-b failed: "));
  const tensorpipe::Error closed(std::make_shared<tensorpipe::PipeClosedError>(), "f.cc", 1);
  EXPECT_EQ(TensorPipeErrorToStatus(closed, "x").code(), absl::StatusCode::kUnavailable);
  const tensorpipe::Error logic(std::make_shared<tensorpipe::LogicError>("bad"), "f.cc", 1);
  EXPECT_EQ(TensorPipeErrorToStatus(logic, "x").code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace tpd::agent
