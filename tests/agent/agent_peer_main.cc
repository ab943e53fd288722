// A peer agent in a process of its own, for agent_two_process_test: echoes every request
// except method "hold", which it never answers. Prints "ADDRESS <address>" once listening,
// then serves until stdin closes.
//
//   agent_peer --id=node-b --token=... [--transports=uv,shm] [--channels=cma]

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "agent/agent.h"

ABSL_FLAG(std::string, id, "node-b", "agent id");
ABSL_FLAG(std::string, token, "", "cluster token");
ABSL_FLAG(std::string, transports, "", "allowed transports, comma-separated (empty: all)");
ABSL_FLAG(std::string, channels, "", "allowed channels, comma-separated (empty: all)");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  tpd::agent::AgentOptions options;
  options.id = absl::GetFlag(FLAGS_id);
  options.cluster_token = absl::GetFlag(FLAGS_token);
  options.transports = absl::StrSplit(absl::GetFlag(FLAGS_transports), ',', absl::SkipEmpty());
  options.channels = absl::StrSplit(absl::GetFlag(FLAGS_channels), ',', absl::SkipEmpty());
  options.mpt_lanes = 2;
  auto agent = tpd::agent::Agent::Create(options);
  if (!agent.ok()) {
    std::fprintf(stderr, "agent_peer: %s\n", agent.status().ToString().c_str());
    return 1;
  }
  tpd::agent::Agent* raw = agent->get();
  (*agent)->SetHandler(
      tpd::agent::Handler{nullptr, [raw](tpd::agent::InboundRequest request) {
                            if (request.message.header.method() == "hold")
                              return;  // never answered
                            tpd::agent::Message response;
                            response.header.set_method(request.message.header.method());
                            *response.header.mutable_tensors() = request.message.header.tensors();
                            response.payload = request.message.payload;
                            response.tensors = request.message.tensors;
                            response.keepalive = request.message.keepalive;
                            raw->Respond(request.reply_to, std::move(response));
                          }});
  std::printf("ADDRESS %s\n", (*agent)->address().c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}
