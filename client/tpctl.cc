// tpctl: the operator's command line for a tpd daemon.
//
//   tpctl status | health
//   tpctl store set KEY VALUE | get KEY | add KEY DELTA | wait KEY... | check KEY...
//               | delete KEY | keys
//
// Output is for people by default and JSON with --json. Exit status: 0 on success, 1 when
// the daemon answered an error (printed as "tpctl: CODE: message"), 2 on a usage error.

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, socket, "", "daemon socket; default $TPD_SOCKET, then /run/tpd/tpd.sock");
ABSL_FLAG(bool, json, false, "print JSON instead of text");
ABSL_FLAG(int64_t, timeout_ms, 0, "wait timeout of get/wait; 0 = the daemon's default");
ABSL_FLAG(std::string, ns, "", "store namespace of store commands");

namespace {

constexpr char kUsage[] = R"(tpctl: talk to a tpd daemon.

  tpctl status                   daemon identity, config and statistics
  tpctl health                   SERVING or NOT_SERVING (exit 1 unless SERVING)
  tpctl store set KEY VALUE      set a key
  tpctl store get KEY            print a key's value, waiting up to --timeout_ms
  tpctl store add KEY DELTA      add to an integer key, print the sum
  tpctl store wait KEY...        wait until every key is set
  tpctl store check KEY...       print whether every key is set
  tpctl store delete KEY         delete a key
  tpctl store keys               print the number of keys

Flags: --socket PATH, --json, --timeout_ms N, --ns NAMESPACE)";

int Usage(const std::string& problem) {
  std::cerr << "tpctl: " << problem << "\n\n" << kUsage << "\n";
  return 2;
}

int Error(const absl::Status& status) {
  std::cerr << "tpctl: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return 1;
}

// A JSON string literal.
std::string Json(absl::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

void Print(const std::string& text, const std::string& json) {
  std::cout << (absl::GetFlag(FLAGS_json) ? json : text) << "\n";
}

int RunStatus(tpd::Client& client) {
  absl::StatusOr<tpd::v1::StatusResponse> status = client.Status();
  if (!status.ok()) return Error(status.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = true;
    options.always_print_primitive_fields = true;
    options.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(*status, &json, options);
    std::cout << json;
    return 0;
  }
  const tpd::v1::StoreStats& store = status->store();
  std::cout << "tpd " << status->version() << " (pid " << status->pid() << ") "
            << status->serving_status() << "\n"
            << "  socket:  " << status->socket_path() << " (mode " << status->config().socket_mode()
            << ")\n"
            << "  uptime:  " << absl::FormatDuration(absl::Seconds(static_cast<int64_t>(status->uptime_seconds())))
            << "\n"
            << "  config:  " << (status->config().config_path().empty() ? "(defaults)" : status->config().config_path())
            << ", log level " << status->config().log_level() << "\n"
            << "  store:   " << store.num_keys() << " keys, " << store.bytes() << " bytes, "
            << store.waiters() << " waiting calls\n";
  if (!store.calls().empty()) {
    std::vector<std::string> calls;
    for (const auto& [method, count] : std::map<std::string, int64_t>(store.calls().begin(), store.calls().end())) {
      calls.push_back(absl::StrCat(method, "=", count));
    }
    std::cout << "  calls:   " << absl::StrJoin(calls, " ") << "\n";
  }
  if (!store.errors().empty()) {
    std::vector<std::string> errors;
    for (const auto& [code, count] : std::map<std::string, int64_t>(store.errors().begin(), store.errors().end())) {
      errors.push_back(absl::StrCat(code, "=", count));
    }
    std::cout << "  errors:  " << absl::StrJoin(errors, " ") << "\n";
  }
  return 0;
}

int RunHealth(tpd::Client& client) {
  absl::StatusOr<bool> serving = client.Serving();
  if (!serving.ok()) return Error(serving.status());
  const char* word = *serving ? "SERVING" : "NOT_SERVING";
  Print(word, absl::StrCat("{\"status\": ", Json(word), "}"));
  return *serving ? 0 : 1;
}

int RunStore(tpd::Client& client, const std::vector<std::string>& args) {
  if (args.empty()) return Usage("store needs a command");
  const std::string& command = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  const absl::Duration timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  auto want = [&](size_t n) { return rest.size() == n; };

  if (command == "set") {
    if (!want(2)) return Usage("usage: tpctl store set KEY VALUE");
    if (absl::Status s = client.Set(rest[0], rest[1]); !s.ok()) return Error(s);
    Print("OK", "{\"ok\": true}");
  } else if (command == "get") {
    if (!want(1)) return Usage("usage: tpctl store get KEY");
    absl::StatusOr<std::string> value = client.Get(rest[0], timeout);
    if (!value.ok()) return Error(value.status());
    Print(*value, absl::StrCat("{\"key\": ", Json(rest[0]), ", \"value\": ", Json(*value), "}"));
  } else if (command == "add") {
    int64_t delta = 0;
    if (!want(2) || !absl::SimpleAtoi(rest[1], &delta)) {
      return Usage("usage: tpctl store add KEY DELTA (DELTA an integer)");
    }
    absl::StatusOr<int64_t> sum = client.Add(rest[0], delta);
    if (!sum.ok()) return Error(sum.status());
    Print(absl::StrCat(*sum), absl::StrCat("{\"key\": ", Json(rest[0]), ", \"value\": ", *sum, "}"));
  } else if (command == "wait") {
    if (rest.empty()) return Usage("usage: tpctl store wait KEY...");
    if (absl::Status s = client.Wait(rest, timeout); !s.ok()) return Error(s);
    Print("OK", "{\"ok\": true}");
  } else if (command == "check") {
    if (rest.empty()) return Usage("usage: tpctl store check KEY...");
    absl::StatusOr<bool> ready = client.Check(rest);
    if (!ready.ok()) return Error(ready.status());
    Print(*ready ? "true" : "false", absl::StrCat("{\"ready\": ", *ready ? "true" : "false", "}"));
  } else if (command == "delete") {
    if (!want(1)) return Usage("usage: tpctl store delete KEY");
    absl::StatusOr<bool> deleted = client.DeleteKey(rest[0]);
    if (!deleted.ok()) return Error(deleted.status());
    Print(*deleted ? "deleted" : "absent",
          absl::StrCat("{\"deleted\": ", *deleted ? "true" : "false", "}"));
  } else if (command == "keys") {
    if (!want(0)) return Usage("usage: tpctl store keys");
    absl::StatusOr<int64_t> count = client.NumKeys();
    if (!count.ok()) return Error(count.status());
    Print(absl::StrCat(*count), absl::StrCat("{\"num_keys\": ", *count, "}"));
  } else {
    return Usage(absl::StrCat("unknown store command \"", command, "\""));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> args(positional.begin() + 1, positional.end());
  if (args.empty()) return Usage("missing command");
  const std::string& command = args[0];
  if (command != "status" && command != "health" && command != "store") {
    return Usage(absl::StrCat("unknown command \"", command, "\""));
  }

  tpd::ClientOptions options;
  options.name_space = absl::GetFlag(FLAGS_ns);
  absl::StatusOr<std::unique_ptr<tpd::Client>> client =
      tpd::Client::Connect(absl::GetFlag(FLAGS_socket), options);
  if (!client.ok()) return Error(client.status());

  if (command == "status") return args.size() == 1 ? RunStatus(**client) : Usage("status takes no arguments");
  if (command == "health") return args.size() == 1 ? RunHealth(**client) : Usage("health takes no arguments");
  return RunStore(**client, {args.begin() + 1, args.end()});
}
