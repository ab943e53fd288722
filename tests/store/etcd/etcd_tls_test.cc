// EtcdStore over TLS to a real etcd that requires client certificates (--client-cert-auth):
// a CA, a member certificate (SAN 127.0.0.1 and localhost) and a client certificate made with
// openssl in the test's directory. The conformance suite with the CA and the client
// certificate; no client certificate, another CA, a plain connection or a host the member's
// certificate does not name fail, naming the endpoint. Skips, saying why, without etcd or
// openssl.

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/etcd/etcd_store.h"
#include "tests/store/etcd/etcd_cluster.h"
#include "tests/store/etcd/shared_cluster.h"
#include "tests/store/store_conformance.h"
#include "tests/testing/daemon_process.h"

namespace tpd::store {
namespace {

using ::testing::AllOf;
using testing::EtcdBinary;
using testing::EtcdCluster;
using ::testing::HasSubstr;

constexpr char kOpenssl[] = "/usr/bin/openssl";
constexpr char kNoOpensslMessage[] =
    "no /usr/bin/openssl to make the test's certificates: install Debian's openssl";

bool CanRun(std::string* why) {
  if (EtcdBinary().empty()) {
    *why = testing::kNoEtcdMessage;
    return false;
  }
  if (access(kOpenssl, X_OK) != 0) {
    *why = kNoOpensslMessage;
    return false;
  }
  return true;
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// A CA, and certificates it signed, in PEM files under one directory.
struct TestPki {
  ::tpd::testing::TempDir dir;
  std::string ca_cert, server_cert, server_key, client_cert, client_key;  // paths
  std::string other_ca_cert;  // a CA that signed nothing here

  std::string Path(const std::string& name) const { return absl::StrCat(dir.path(), "/", name); }
};

absl::Status Run(const std::string& command) {
  if (std::system(command.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("failed: ", command));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TestPki>> MakePki() {
  auto pki = std::make_unique<TestPki>();
  const auto p = [&](const std::string& name) { return pki->Path(name); };
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string quiet = " 2>/dev/null";
  pki->dir.WriteFile("server.ext",
                     "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                     "extendedKeyUsage=serverAuth,clientAuth\n");
  pki->dir.WriteFile("client.ext", "extendedKeyUsage=clientAuth\n");
  for (const std::string& command :
       {absl::StrCat(kOpenssl, " req -x509 ", key, " -keyout ", p("ca.key"), " -out ", p("ca.crt"),
                     " -days 2 -subj /CN=tpd-test-ca", quiet),
        absl::StrCat(kOpenssl, " req -x509 ", key, " -keyout ", p("other-ca.key"), " -out ",
                     p("other-ca.crt"), " -days 2 -subj /CN=tpd-test-other-ca", quiet),
        absl::StrCat(kOpenssl, " req ", key, " -keyout ", p("server.key"), " -out ",
                     p("server.csr"), " -subj /CN=etcd", quiet),
        absl::StrCat(kOpenssl, " x509 -req -in ", p("server.csr"), " -CA ", p("ca.crt"), " -CAkey ",
                     p("ca.key"), " -CAcreateserial -days 2 -extfile ", p("server.ext"), " -out ",
                     p("server.crt"), quiet),
        absl::StrCat(kOpenssl, " req ", key, " -keyout ", p("client.key"), " -out ",
                     p("client.csr"), " -subj /CN=tpd", quiet),
        absl::StrCat(kOpenssl, " x509 -req -in ", p("client.csr"), " -CA ", p("ca.crt"), " -CAkey ",
                     p("ca.key"), " -CAcreateserial -days 2 -extfile ", p("client.ext"), " -out ",
                     p("client.crt"), quiet)}) {
    if (absl::Status status = Run(command); !status.ok()) return status;
  }
  pki->ca_cert = p("ca.crt");
  pki->other_ca_cert = p("other-ca.crt");
  pki->server_cert = p("server.crt");
  pki->server_key = p("server.key");
  pki->client_cert = p("client.crt");
  pki->client_key = p("client.key");
  return pki;
}

struct Shared {
  std::unique_ptr<TestPki> pki;
  std::unique_ptr<EtcdCluster> cluster;
};

Shared& State() {
  static auto* state = new Shared();
  return *state;
}

// The PKI and a one-member cluster serving clients over TLS only, for the whole binary.
Shared* SharedTls() {
  Shared& state = State();
  if (state.cluster == nullptr) {
    absl::StatusOr<std::unique_ptr<TestPki>> pki = MakePki();
    if (!pki.ok()) {
      ADD_FAILURE() << pki.status();
      return nullptr;
    }
    testing::EtcdClusterOptions options;
    options.cert_file = (*pki)->server_cert;
    options.key_file = (*pki)->server_key;
    options.client_ca_file = (*pki)->ca_cert;
    options.probe_root_certs = ReadFile((*pki)->ca_cert);
    options.probe_cert_chain = ReadFile((*pki)->client_cert);
    options.probe_private_key = ReadFile((*pki)->client_key);
    absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster =
        EtcdCluster::Start(1, absl::Seconds(30), options);
    if (!cluster.ok()) {
      ADD_FAILURE() << cluster.status();
      return nullptr;
    }
    state.pki = *std::move(pki);
    state.cluster = *std::move(cluster);
  }
  return &state;
}

class StopCluster : public ::testing::Environment {
 public:
  void TearDown() override {
    State().cluster.reset();
    State().pki.reset();
  }
};
::testing::Environment* const kStopCluster = ::testing::AddGlobalTestEnvironment(new StopCluster);

using testing::FreshPrefix;

// TLS with the test CA and its client certificate.
EtcdStoreOptions WithClientCertificate(const TestPki& pki) {
  EtcdStoreOptions options;
  options.credentials.root_certs = ReadFile(pki.ca_cert);
  options.credentials.cert_chain = ReadFile(pki.client_cert);
  options.credentials.private_key = ReadFile(pki.client_key);
  // Fail fast where a test expects no connection.
  options.call_timeout = absl::Seconds(3);
  options.connect_timeout = absl::Seconds(1);
  return options;
}

std::unique_ptr<EtcdStore> MakeStore(const EtcdCluster& cluster, EtcdStoreOptions options) {
  absl::StatusOr<std::unique_ptr<EtcdStore>> store =
      EtcdStore::Create(cluster.ClientAddresses(), FreshPrefix(), std::move(options));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

class TlsEtcd : public StoreUnderTest {
 public:
  static std::unique_ptr<StoreUnderTest> Make(int64_t max_waiters) {
    Shared* shared = SharedTls();
    if (shared == nullptr) return nullptr;
    EtcdStoreOptions options = WithClientCertificate(*shared->pki);
    options.call_timeout = absl::Seconds(10);
    options.max_waiters = max_waiters;
    auto under_test = std::make_unique<TlsEtcd>();
    under_test->store_ = MakeStore(*shared->cluster, options);
    if (under_test->store_ == nullptr) return nullptr;
    return under_test;
  }

  Store& store() override { return *store_; }
  int64_t waiters() override { return store_->Stats().waiters; }

 private:
  std::unique_ptr<EtcdStore> store_;
};

// Without etcd or openssl the suite has no instance; this test says why.
TEST(EtcdTlsInstalledTest, EtcdAndOpensslAreInstalled) {
  std::string why;
  if (!CanRun(&why)) GTEST_SKIP() << why;
}

std::vector<StoreFactory> Factories() {
  std::string why;
  if (!CanRun(&why)) return {};
  return {StoreFactory(TlsEtcd::Make)};
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StoreConformanceTest);
INSTANTIATE_TEST_SUITE_P(EtcdStoreOverTls, StoreConformanceTest, ::testing::ValuesIn(Factories()));

class EtcdTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!CanRun(&why)) GTEST_SKIP() << why;
    shared_ = SharedTls();
    ASSERT_NE(shared_, nullptr);
  }

  // A store with `options` fails its first call UNAVAILABLE naming the endpoint and TLS.
  void ExpectNoConnection(EtcdStoreOptions options) {
    std::unique_ptr<EtcdStore> store = MakeStore(*shared_->cluster, std::move(options));
    ASSERT_NE(store, nullptr);
    absl::Status status = store->Set("k", "v");
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr(shared_->cluster->ClientAddress(0)));
  }

  Shared* shared_ = nullptr;
};

TEST_F(EtcdTlsTest, WithoutAClientCertificateTheConnectionFailsNamingTheEndpointAndTls) {
  EtcdStoreOptions options = WithClientCertificate(*shared_->pki);
  options.credentials.cert_chain.clear();
  options.credentials.private_key.clear();
  std::unique_ptr<EtcdStore> store = MakeStore(*shared_->cluster, options);
  ASSERT_NE(store, nullptr);
  absl::Status status = store->Set("k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr(shared_->cluster->ClientAddress(0)),
                                      HasSubstr("over TLS"), HasSubstr("client certificate")));
}

TEST_F(EtcdTlsTest, AMemberCertificateFromAnotherCaIsRefused) {
  EtcdStoreOptions options = WithClientCertificate(*shared_->pki);
  options.credentials.root_certs = ReadFile(shared_->pki->other_ca_cert);
  ExpectNoConnection(options);
}

TEST_F(EtcdTlsTest, APlainConnectionToATlsMemberFails) {
  EtcdStoreOptions options;
  options.call_timeout = absl::Seconds(3);
  options.connect_timeout = absl::Seconds(1);
  ExpectNoConnection(options);
}

// The store dials resolved addresses; the certificate is checked against the URL's host.
TEST_F(EtcdTlsTest, TheCertificateIsCheckedAgainstTheEndpointsHostName) {
  EtcdStoreOptions options = WithClientCertificate(*shared_->pki);
  options.endpoint_hosts = {"localhost"};  // in the member certificate's SAN
  std::unique_ptr<EtcdStore> store = MakeStore(*shared_->cluster, options);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->Set("k", "v").ok());

  options.endpoint_hosts = {"etcd.example"};  // not in it
  ExpectNoConnection(options);
}

}  // namespace
}  // namespace tpd::store
