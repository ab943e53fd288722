#include "agent/agent.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/agent_impl.h"

namespace tpd::agent {

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(const AgentOptions& options) {
  absl::StatusOr<std::unique_ptr<AgentImpl>> impl = AgentImpl::Create(options);
  if (!impl.ok()) return impl.status();
  return std::unique_ptr<Agent>(new Agent(*std::move(impl)));
}

Agent::Agent(std::unique_ptr<AgentImpl> impl) : impl_(std::move(impl)) {}

Agent::~Agent() = default;

void Agent::SetHandler(Handler handler) { impl_->SetHandler(std::move(handler)); }

void Agent::Send(const PeerId& peer, Message msg, absl::Time deadline, Callback done,
                 Allocator reply_allocator) {
  impl_->Send(peer, std::move(msg), deadline, std::move(done), std::move(reply_allocator));
}

void Agent::Ping(const PeerId& peer, absl::Time deadline,
                 absl::AnyInvocable<void(absl::StatusOr<PingResult>)> done) {
  Message ping;
  ping.header.set_method(kPingMethod);
  const absl::Time sent = absl::Now();
  impl_->Send(
      peer, std::move(ping), deadline,
      [sent, done = std::move(done)](absl::StatusOr<Message> answer) mutable {
        const absl::Time back = absl::Now();
        if (!answer.ok()) {
          done(answer.status());
          return;
        }
        if (answer->header.kind() != v1::AgentMessage::RESPONSE ||
            answer->header.unix_time_ns() == 0) {
          done(absl::UnimplementedError(
              absl::StrCat("the peer's agent did not answer the ping (an older tpd?): ",
                           answer->header.status_message())));
          return;
        }
        PingResult result;
        result.round_trip = back - sent;
        result.clock_offset =
            absl::FromUnixNanos(answer->header.unix_time_ns()) - (sent + result.round_trip / 2);
        done(result);
      },
      /*reply_allocator=*/nullptr);
}

void Agent::Respond(const ReplyTo& to, Message response, SentCallback sent) {
  impl_->Respond(to, std::move(response), std::move(sent));
}

void Agent::FailPeer(const PeerId& peer, const absl::Status& status) {
  impl_->FailPeer(peer, status);
}

const std::string& Agent::address() const { return impl_->address(); }

const std::vector<std::string>& Agent::urls() const { return impl_->urls(); }

const std::string& Agent::id() const { return impl_->id(); }

const Registry& Agent::registry() const { return impl_->registry(); }

AgentStats Agent::Stats() const { return impl_->Stats(); }

}  // namespace tpd::agent
