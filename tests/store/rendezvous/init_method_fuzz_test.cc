// A bounded random driver for ParseInitMethod, the parser of the init_method URL every
// GetGroup and Join carries from a local client: ~50 000 URLs, explicit arguments and client
// environments, grown from valid seeds of every scheme by byte-level mutations and from noise,
// with fixed seeds so that a failure reproduces. libFuzzer would need the clang toolchain;
// this runs in CI under gcc and --config=asan in a few seconds.
//
// What every answer must satisfy (init_method.h):
//  - an error is INVALID_ARGUMENT with a non-empty message under 1 KiB made of printable
//    ASCII only (client bytes are escaped, so they can neither forge log lines nor blow up a
//    gRPC status);
//  - a success has the fields its scheme promises: a non-empty lower-case host of valid
//    characters and a port in 1..65535 (tcp, env, etcd), an absolute path (file), a non-empty
//    prefix without a trailing '/' (etcd); rank >= 0, world_size >= 1 only with a rank, and
//    rank < world_size; explicit arguments come back unchanged; rank and world_size never stay
//    in the leftover query;
//  - the same input gives the same answer, and a parsed tcp:// address written back as a URL
//    parses to the same address.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "store/rendezvous/init_method.h"

namespace tpd::store {
namespace {

using Env = std::map<std::string, std::string>;

// Bounded by the issue's budget: about 50 000 inputs in all, a few seconds under ASan.
constexpr int kMutatedRounds = 40000;
constexpr int kNoiseRounds = 6000;
constexpr int kEnvRounds = 4000;
constexpr size_t kMaxMessageBytes = 1024;

// One call of ParseInitMethod.
struct Input {
  std::string url;
  std::optional<int64_t> rank;
  std::optional<int64_t> world_size;
  Env env;
};

std::string Describe(const Input& input) {
  std::string env;
  for (const auto& [name, value] : input.env) {
    absl::StrAppend(&env, " ", absl::CHexEscape(name.substr(0, 40)), "=\"",
                    absl::CHexEscape(value.substr(0, 60)), "\"");
  }
  return absl::StrCat(
      "url (", input.url.size(), " bytes) \"", absl::CHexEscape(input.url.substr(0, 200)),
      "\" rank=", input.rank ? absl::StrCat(*input.rank) : "none",
      " world_size=", input.world_size ? absl::StrCat(*input.world_size) : "none", " env:", env);
}

// Valid URLs of every scheme and form the parser knows, the mutations' starting points.
const std::vector<std::string>& SeedUrls() {
  static const auto* seeds = new std::vector<std::string>{
      "tcp://node-a:29500?rank=1&world_size=4",
      "tcp://node-a:29500",
      "tcp://10.0.0.1:1?rank=0",
      "tcp://Node-A.example.com:65535/?rank=3&world_size=8&use_libuv=1",
      "tcp://[::1]:29500?rank=0&world_size=1",
      "tcp://[fe80::1%eth0]:29500?world_size=2&rank=1",
      "tcp://[2001:db8::ff]:80",
      "  tcp://h:1?rank=0&&world_size=1&",
      "env://",
      "env:///",
      "env://?rank=1",
      "env://?rank=0&world_size=2",
      "env://?rank=2&world_size=3&timeout=5",
      "file:///tmp/rendezvous?rank=0&world_size=2",
      "file:///var/lib/tpd/rendezvous/job-7",
      "file://localhost/tmp/s?rank=1",
      "file:/tmp/no-authority",
      "file:///a%20b/c?x=y",
      "etcd://etcd-0:2379/prefix?rank=0&world_size=1",
      "etcd://etcd-0:2379",
      "etcd://[::1]:2379/a/b//?rank=2",
      "ETCD://H:1/",
      "TCP://H:2?RANK=0",
  };
  return *seeds;
}

// Pieces that steer the parser into its branches, inserted whole.
const std::vector<std::string>& Tokens() {
  static const auto* tokens = new std::vector<std::string>{
      "%",
      "?",
      "&",
      "=",
      "[",
      "]",
      ":",
      "/",
      "//",
      "#",
      "@",
      " ",
      "-",
      "+",
      ".",
      "_",
      "%25",
      "%00",
      "%zone",
      std::string(1, '\0'),
      "\x7f",
      "\x80",
      "\xff",
      "\xc3\xa9",
      "\t",
      "\r\n",
      "0",
      "-1",
      "-0",
      "65535",
      "65536",
      "99999",
      "4294967296",
      "9223372036854775807",
      "9223372036854775808",
      "-9223372036854775808",
      "-9223372036854775809",
      "18446744073709551616",
      "rank=",
      "world_size=",
      "rank=0",
      "world_size=1",
      "?rank=0&world_size=1",
      "&rank=1",
      "tcp://",
      "env://",
      "file://",
      "etcd://",
      "localhost",
      "[::1]",
      "[::ffff:1.2.3.4]",
      ":29500",
      "user:pw@",
      "::",
  };
  return *tokens;
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }
  bool OneIn(size_t n) { return Below(n) == 0; }

  // A run of digits, now and then far longer than any integer type.
  std::string Digits() {
    const size_t length = OneIn(8) ? 1 + Below(5000) : 1 + Below(25);
    std::string digits(length, '0');
    for (char& c : digits) c = static_cast<char>('0' + Below(10));
    return digits;
  }

  std::string Token() {
    if (OneIn(6)) return Digits();
    return Tokens()[Below(Tokens().size())];
  }

  std::string RandomBytes(size_t length) {
    std::string bytes(length, '\0');
    for (char& c : bytes) c = static_cast<char>(Below(256));
    return bytes;
  }

  // One edit of `text`.
  void MutateOnce(std::string* text) {
    const size_t at = Below(text->size() + 1);
    switch (Below(9)) {
      case 0:  // flip bits of one byte
        if (!text->empty()) (*text)[Below(text->size())] ^= static_cast<char>(1 + Below(255));
        break;
      case 1:  // replace one byte
        if (!text->empty()) (*text)[Below(text->size())] = static_cast<char>(Below(256));
        break;
      case 2:  // truncate
        text->resize(Below(text->size() + 1));
        break;
      case 3:  // cut a range out
        if (at < text->size()) text->erase(at, 1 + Below(text->size() - at));
        break;
      case 4:  // repeat a range
        if (at < text->size()) {
          const std::string piece = text->substr(at, 1 + Below(16));
          for (size_t n = 1 + Below(4); n > 0; --n) text->insert(at, piece);
        }
        break;
      case 5:  // splice in part of another seed
      {
        const std::string& other = SeedUrls()[Below(SeedUrls().size())];
        const size_t from = Below(other.size());
        text->insert(at, other.substr(from, Below(other.size() - from + 1)));
        break;
      }
      default:  // insert a token
        text->insert(at, Token());
        break;
    }
  }

  std::string MutatedUrl() {
    std::string url = SeedUrls()[Below(SeedUrls().size())];
    for (size_t edits = 1 + Below(OneIn(4) ? 12 : 4); edits > 0; --edits) MutateOnce(&url);
    if (OneIn(200)) {
      // Very long: a part of the URL repeated into tens or hundreds of kilobytes.
      const std::string piece = url.empty() ? Token() : url.substr(Below(url.size()));
      const size_t target = 1024 * (1 + Below(256));
      const size_t at = Below(url.size() + 1);
      std::string repeated;
      while (!piece.empty() && repeated.size() < target) repeated += piece;
      url.insert(at, repeated);
    }
    return url;
  }

  std::string NoiseUrl() {
    switch (Below(3)) {
      case 0:
        return RandomBytes(Below(64));
      case 1: {  // a scheme in front of random bytes
        static const char* kSchemes[] = {"tcp://", "env://", "file://", "etcd://", "x://", ""};
        return absl::StrCat(kSchemes[Below(6)], RandomBytes(Below(48)));
      }
      default: {  // tokens only
        std::string url;
        for (size_t n = Below(24); n > 0; --n) url += Token();
        return url;
      }
    }
  }

  std::optional<int64_t> Integer() {
    switch (Below(10)) {
      case 0:
      case 1:
      case 2:
      case 3:
        return std::nullopt;
      case 4:
        return -1 - static_cast<int64_t>(Below(3));
      case 5:
        return std::numeric_limits<int64_t>::max();
      case 6:
        return std::numeric_limits<int64_t>::min();
      default:
        return static_cast<int64_t>(Below(10));
    }
  }

  // A value for an env:// variable: sensible, mutated, or noise.
  std::string EnvValue(absl::string_view name) {
    std::string value;
    if (name == "MASTER_ADDR") {
      static const char* kAddrs[] = {"node-a",       "10.0.0.1",  "::1", "[::1]",
                                     "fe80::1%eth0", "localhost", "",    "["};
      value = kAddrs[Below(8)];
    } else if (name == "MASTER_PORT") {
      static const char* kPorts[] = {"29500", "1", "65535", "0", "65536", "", "-1", "x"};
      value = kPorts[Below(8)];
    } else {
      value = absl::StrCat(Below(8));
    }
    if (OneIn(3)) {
      for (size_t edits = 1 + Below(3); edits > 0; --edits) MutateOnce(&value);
    }
    return value;
  }

  Env RandomEnv() {
    static const char* kNames[] = {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"};
    Env env;
    for (const char* name : kNames) {
      if (!OneIn(5)) env[name] = EnvValue(name);
    }
    if (OneIn(4)) env[RandomBytes(1 + Below(8))] = RandomBytes(Below(16));
    if (OneIn(50)) env["MASTER_ADDR"] = std::string(1 + Below(100000), 'a');
    return env;
  }

  Input RandomInput(std::string url) {
    Input input;
    input.url = std::move(url);
    if (OneIn(3)) {
      input.rank = Integer();
      input.world_size = Integer();
    }
    if (!OneIn(3)) input.env = RandomEnv();
    return input;
  }

 private:
  std::mt19937_64 rng_;
};

bool IsHostNameChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_'; }

// Checks one answer against the contract in the file comment; false after the first failure.
bool CheckAnswer(const Input& input, const absl::StatusOr<InitMethod>& m) {
  SCOPED_TRACE(Describe(input));
  if (!m.ok()) {
    const absl::Status& status = m.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_FALSE(status.message().empty());
    EXPECT_LT(status.message().size(), kMaxMessageBytes)
        << absl::CHexEscape(status.message().substr(0, 300));
    for (char c : status.message()) {
      const unsigned char byte = static_cast<unsigned char>(c);
      if (byte < 0x20 || byte >= 0x7f) {
        ADD_FAILURE() << "byte 0x" << std::hex << int{byte}
                      << " in message: " << absl::CHexEscape(status.message());
        break;
      }
    }
    return !::testing::Test::HasFailure();
  }

  if (m->rank.has_value()) {
    EXPECT_GE(*m->rank, 0);
  }
  if (m->world_size.has_value()) {
    EXPECT_GE(*m->world_size, 1);
    EXPECT_TRUE(m->rank.has_value()) << "world_size " << *m->world_size << " without a rank";
    if (m->rank.has_value()) {
      EXPECT_LT(*m->rank, *m->world_size);
    }
  }
  if (input.rank.has_value()) {
    EXPECT_EQ(m->rank, input.rank);
  }
  if (input.world_size.has_value()) {
    EXPECT_EQ(m->world_size, input.world_size);
  }
  EXPECT_EQ(m->query.count("rank"), 0u);
  EXPECT_EQ(m->query.count("world_size"), 0u);

  if (m->scheme == InitMethodScheme::kFile) {
    EXPECT_TRUE(absl::StartsWith(m->path, "/")) << absl::CHexEscape(m->path);
    EXPECT_TRUE(m->host.empty());
    EXPECT_EQ(m->port, 0);
  } else {
    EXPECT_GE(m->port, 1);
    EXPECT_LE(m->port, 65535);
    EXPECT_FALSE(m->host.empty());
    EXPECT_LE(m->host.size(), 253u);
    for (char c : m->host) {
      if (!(IsHostNameChar(c) || c == ':' || c == '%') || absl::ascii_isupper(c)) {
        ADD_FAILURE() << "host " << absl::CHexEscape(m->host);
        break;
      }
    }
  }
  if (m->scheme == InitMethodScheme::kEtcd) {
    EXPECT_FALSE(m->path.empty());
    EXPECT_FALSE(absl::EndsWith(m->path, "/")) << absl::CHexEscape(m->path);
  }
  if (m->scheme == InitMethodScheme::kTcp) {
    // The address written back as a URL is the same address.
    const bool ipv6 = m->host.find(':') != std::string::npos;
    const std::string again_url =
        absl::StrCat("tcp://", ipv6 ? "[" : "", m->host, ipv6 ? "]" : "", ":", m->port);
    absl::StatusOr<InitMethod> again = ParseInitMethod(again_url, std::nullopt, std::nullopt, {});
    EXPECT_TRUE(again.ok()) << again_url << ": " << again.status();
    if (again.ok()) {
      EXPECT_EQ(again->host, m->host);
      EXPECT_EQ(again->port, m->port);
    }
  }
  return !::testing::Test::HasFailure();
}

bool SameAnswer(const absl::StatusOr<InitMethod>& a, const absl::StatusOr<InitMethod>& b) {
  if (a.ok() != b.ok()) return false;
  if (!a.ok()) return a.status() == b.status();
  return a->scheme == b->scheme && a->host == b->host && a->port == b->port && a->path == b->path &&
         a->rank == b->rank && a->world_size == b->world_size && a->query == b->query;
}

// Parses `input`, checks the answer and that a second parse gives the same one.
bool ParseAndCheck(const Input& input, int64_t* accepted) {
  absl::StatusOr<InitMethod> m =
      ParseInitMethod(input.url, input.rank, input.world_size, input.env);
  if (!CheckAnswer(input, m)) return false;
  if (!SameAnswer(m, ParseInitMethod(input.url, input.rank, input.world_size, input.env))) {
    ADD_FAILURE() << "a second parse answered differently: " << Describe(input);
    return false;
  }
  if (m.ok()) ++*accepted;
  return true;
}

TEST(InitMethodFuzzTest, EverySeedParses) {
  // The mutations start from valid URLs; a seed the parser refuses would waste the run.
  for (const std::string& url : SeedUrls()) {
    Env env = {{"MASTER_ADDR", "node-a"}, {"MASTER_PORT", "29500"}};
    absl::StatusOr<InitMethod> m = ParseInitMethod(url, std::nullopt, std::nullopt, env);
    EXPECT_TRUE(m.ok()) << url << ": " << m.status();
    int64_t accepted = 0;
    ParseAndCheck({url, std::nullopt, std::nullopt, env}, &accepted);
  }
}

TEST(InitMethodFuzzTest, MutatedUrlsAnswerWithinTheContract) {
  Mutator mutator(0x7470642d75726c31);  // fixed: a failure must reproduce
  int64_t accepted = 0;
  for (int i = 0; i < kMutatedRounds; ++i) {
    if (!ParseAndCheck(mutator.RandomInput(mutator.MutatedUrl()), &accepted))
      return;  // one is enough
  }
  // A driver whose inputs all fail early explores nothing: enough of them must parse.
  EXPECT_GT(accepted, kMutatedRounds / 50);
  ::testing::Test::RecordProperty("accepted", static_cast<int>(accepted));
}

TEST(InitMethodFuzzTest, NoiseAnswersWithinTheContract) {
  Mutator mutator(0x7470642d6e6f6973);
  int64_t accepted = 0;
  for (int i = 0; i < kNoiseRounds; ++i) {
    if (!ParseAndCheck(mutator.RandomInput(mutator.NoiseUrl()), &accepted)) return;
  }
}

TEST(InitMethodFuzzTest, EnvUrlsWithRandomEnvironmentsAnswerWithinTheContract) {
  // env:// reads most of its input from the client's environment: fuzz that side mostly.
  Mutator mutator(0x7470642d656e7631);
  int64_t accepted = 0;
  for (int i = 0; i < kEnvRounds; ++i) {
    std::string url = "env://";
    if (mutator.OneIn(2)) url += "?rank=" + std::to_string(mutator.Below(6));
    if (mutator.OneIn(3)) mutator.MutateOnce(&url);
    Input input = mutator.RandomInput(std::move(url));
    input.env = mutator.RandomEnv();
    if (!ParseAndCheck(input, &accepted)) return;
  }
  EXPECT_GT(accepted, kEnvRounds / 50);
  ::testing::Test::RecordProperty("accepted", static_cast<int>(accepted));
}

}  // namespace
}  // namespace tpd::store
