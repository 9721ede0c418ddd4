// The cluster plane's authentication pieces without a server: the join token (its file, its
// sources and their order), the gate's decisions for every kind of call, the loopback rule and
// the TLS file checks. The multi-process test (tests/cluster/cluster_cli_test.py) drives the
// same pieces over real sockets.
#include "worker/cluster_auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fucina {
namespace {

using ::testing::HasSubstr;

class TempDir : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = testing::TempDir() + "/cluster_auth_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  // Private to this user, as secrets must be (see SecretsOthersMayOpenAreRefused).
  std::string Write(const std::string& name, const std::string& text, mode_t mode = 0600) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    EXPECT_EQ(chmod(path.c_str(), mode), 0) << path;
    return path;
  }

  std::string dir_;
};

int Mode(const std::string& path) {
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// ---- tokens ----

TEST(ParseTokenTest, TrimsAndChecksTheCharacters) {
  EXPECT_EQ(*ParseToken("  0123456789abcdef\n", "f"), "0123456789abcdef");
  auto short_token = ParseToken("0123456789abcde", "file x");
  ASSERT_FALSE(short_token.ok());
  EXPECT_THAT(short_token.status().message(), HasSubstr("file x"));
  EXPECT_THAT(short_token.status().message(), HasSubstr("15 characters"));
  EXPECT_FALSE(ParseToken("", "f").ok());
  EXPECT_FALSE(ParseToken(std::string(4097, 'a'), "f").ok());
  EXPECT_TRUE(ParseToken(std::string(4096, 'a'), "f").ok());
  for (std::string bad : {"0123456789 abcdef", "0123456789\tabcdef", "0123456789\x01" "abcdef",
                          "0123456789abcdef\xc3\xa9"}) {
    EXPECT_FALSE(ParseToken(bad, "f").ok()) << bad;
  }
}

TEST(NewRandomTokenTest, Is256BitsOfHex) {
  auto a = NewRandomToken();
  auto b = NewRandomToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_THAT(*a, ::testing::MatchesRegex("[0-9a-f]{64}"));
  EXPECT_NE(*a, *b);
}

using TokenFileTest = TempDir;

TEST_F(TokenFileTest, CreatesAPrivateFileOnceAndReadsItAfter) {
  const std::string path = dir_ + "/a/b/cluster-token";
  auto first = ReadOrCreateTokenFile(path);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 64u);
  EXPECT_EQ(Mode(path), 0600);
  EXPECT_EQ(Mode(dir_ + "/a"), 0700);
  EXPECT_EQ(Mode(dir_ + "/a/b"), 0700);
  auto again = ReadOrCreateTokenFile(path);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *first);
}

TEST_F(TokenFileTest, ConcurrentCreatorsAllGetTheSameToken) {
  const std::string path = dir_ + "/cluster-token";
  std::vector<std::string> tokens(16);
  std::vector<std::thread> threads;
  for (std::string& out : tokens) {
    threads.emplace_back([&out, &path] {
      auto token = ReadOrCreateTokenFile(path);
      out = token.ok() ? *token : std::string(token.status().message());
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(std::set<std::string>(tokens.begin(), tokens.end()).size(), 1u) << tokens[0];
  EXPECT_EQ(tokens[0].size(), 64u) << tokens[0];
  // No temporary file is left behind.
  EXPECT_EQ(std::system(("test $(ls -A '" + dir_ + "' | wc -l) -eq 1").c_str()), 0);
}

TEST_F(TokenFileTest, BadFilesAreErrorsNamingThePath) {
  const std::string empty = Write("empty", "\n");
  auto token = ReadOrCreateTokenFile(empty);
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(token.status().message(), HasSubstr(empty));

  ASSERT_EQ(mkdir((dir_ + "/dir").c_str(), 0700), 0);
  token = ReadOrCreateTokenFile(dir_ + "/dir");
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(token.status().message(), HasSubstr("not a regular file"));

  // A FIFO with no writer would block a plain open(): refused at once instead.
  ASSERT_EQ(mkfifo((dir_ + "/fifo").c_str(), 0600), 0);
  auto fifo = ResolveClusterToken(dir_ + "/fifo");
  ASSERT_FALSE(fifo.ok());
  EXPECT_THAT(fifo.status().message(), HasSubstr("--cluster-token-file"));

  const std::string huge = Write("huge", std::string(1 << 20, 'a'));
  EXPECT_FALSE(ResolveClusterToken(huge).ok());
  EXPECT_FALSE(ResolveClusterToken(dir_ + "/missing").ok());
}

class ResolveTokenTest : public TempDir {
 protected:
  void SetUp() override {
    TempDir::SetUp();
    for (const char* name : {"FUCINA_CACHE", "FUCINA_CLUSTER_TOKEN", "HOME"}) {
      const char* v = std::getenv(name);
      saved_.push_back({name, v ? std::optional<std::string>(v) : std::nullopt});
    }
    setenv("FUCINA_CACHE", dir_.c_str(), 1);
    unsetenv("FUCINA_CLUSTER_TOKEN");
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
    TempDir::TearDown();
  }

  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST_F(ResolveTokenTest, FlagThenEnvironmentThenTheCacheFile) {
  const std::string file = Write("token", "from-the-flag-file-0123\n");
  setenv("FUCINA_CLUSTER_TOKEN", "from-the-environment-0123", 1);
  auto token = ResolveClusterToken(file);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(token->value, "from-the-flag-file-0123");
  EXPECT_EQ(token->source, "--cluster-token-file " + file);

  token = ResolveClusterToken("");
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->value, "from-the-environment-0123");
  EXPECT_EQ(token->source, "$FUCINA_CLUSTER_TOKEN");
  setenv("FUCINA_CLUSTER_TOKEN", "short", 1);
  EXPECT_FALSE(ResolveClusterToken("").ok());

  unsetenv("FUCINA_CLUSTER_TOKEN");
  token = ResolveClusterToken("");
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->source, dir_ + "/cluster-token");
  EXPECT_EQ(token->value.size(), 64u);
  EXPECT_EQ(ResolveClusterToken("")->value, token->value);

  unsetenv("FUCINA_CACHE");
  setenv("HOME", dir_.c_str(), 1);
  token = ResolveClusterToken("");
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->source, dir_ + "/.cache/fucina/cluster-token");
}

// ---- comparisons and addresses ----

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secreT", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secre", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secrets", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("", "secret"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("secret\0", 7), "secret"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(IsLoopbackAddressTest, OnlyAddressesThisMachineAloneReaches) {
  for (const char* a : {"127.0.0.1:50051", "127.1.2.3:1", "localhost:50051", "LocalHost:1",
                        "[::1]:50051", "::1", "ipv4:127.0.0.1:5", "ipv6:[::1]:5",
                        "dns:///localhost:50051", "dns://8.8.8.8/localhost:1",
                        "unix:/tmp/fucina.sock", "[::ffff:127.0.0.1]:1"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"0.0.0.0:50051", "[::]:50051", "10.0.0.5:50051", "192.0.2.1:1",
                        "example.com:50051", "localhost.example.com:1", "128.0.0.1:1",
                        "[::2]:1", "dns:///example.com:1", "", ":50051", "[::1"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

// ---- the gate ----

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

CallFacts Call(std::string_view method, int tokens = 0, std::string_view token = "") {
  CallFacts c;
  c.method = method;
  c.peer = "ipv4:127.0.0.1:4242";
  c.token_count = tokens;
  c.token = token;
  return c;
}

TEST(CallGateTest, ClusterCallsNeedExactlyTheToken) {
  CallGate gate({.cluster_token = kToken, .require_peer_certificate = false, .api_key = ""});
  const std::string_view method = "/fucina.cluster.v1.Worker/Forward";
  EXPECT_TRUE(gate.Decide(Call(method, 1, kToken)).ok());
  for (const CallFacts& c : {Call(method), Call(method, 1, "0123456789abcdef"),
                             Call(method, 1, std::string(kToken) + "0"), Call(method, 2, kToken),
                             Call("/fucina.cluster.v1.Registry/Register", 1, "x")}) {
    grpc::Status s = gate.Decide(c);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << c.token;
    EXPECT_THAT(s.error_message(), HasSubstr("cluster token"));
    EXPECT_THAT(s.error_message(), ::testing::Not(HasSubstr(kToken)));
  }
  // Calls outside the cluster plane pass: no API key is set.
  EXPECT_TRUE(gate.Decide(Call("/fucina.v1.Generation/Generate")).ok());
  EXPECT_TRUE(gate.Decide(Call("/grpc.health.v1.Health/Check")).ok());
}

TEST(CallGateTest, UnderTlsClusterCallsAlsoNeedAVerifiedCertificate) {
  CallGate gate({.cluster_token = kToken, .require_peer_certificate = true, .api_key = ""});
  CallFacts c = Call("/fucina.cluster.v1.Registry/Heartbeat", 1, kToken);
  grpc::Status s = gate.Decide(c);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("certificate"));
  c.peer_certificate_verified = true;
  EXPECT_TRUE(gate.Decide(c).ok());
}

TEST(CallGateTest, AServerWithoutAClusterTokenTakesNoClusterCalls) {
  CallGate gate({.cluster_token = "", .require_peer_certificate = false, .api_key = ""});
  EXPECT_EQ(gate.Decide(Call("/fucina.cluster.v1.Worker/GetStats", 1, "")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(gate.Decide(Call("/fucina.cluster.v1.Worker/GetStats")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST(CallGateTest, PublicCallsNeedTheBearerKeyWhenOneIsSet) {
  CallGate gate({.cluster_token = kToken, .require_peer_certificate = false,
                 .api_key = "the-api-key"});
  auto with = [](std::string_view method, std::string_view authorization, int count = 1) {
    CallFacts c = Call(method);
    c.authorization_count = count;
    c.authorization = authorization;
    return c;
  };
  const std::string_view generate = "/fucina.v1.Generation/Generate";
  EXPECT_TRUE(gate.Decide(with(generate, "Bearer the-api-key")).ok());
  EXPECT_TRUE(gate.Decide(with(generate, "bearer the-api-key")).ok());
  for (const CallFacts& c :
       {with(generate, "", 0), with(generate, "the-api-key"), with(generate, "Bearer the-api-ke"),
        with(generate, "Bearer  the-api-key"), with(generate, "Basic the-api-key"),
        with(generate, "Bearer the-api-key", 2)}) {
    grpc::Status s = gate.Decide(c);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << c.authorization;
    EXPECT_THAT(s.error_message(), HasSubstr("API key"));
  }
  // Health and reflection stay open; the key does not open the cluster plane.
  EXPECT_TRUE(gate.Decide(Call("/grpc.health.v1.Health/Check")).ok());
  EXPECT_TRUE(
      gate.Decide(Call("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")).ok());
  EXPECT_FALSE(gate.Decide(with("/fucina.cluster.v1.Worker/Forward", "Bearer the-api-key")).ok());
}

TEST(CallGateTest, RefusalsAreLoggedWithPeerAndMethodAtMostTenASecond) {
  CallGate gate({.cluster_token = kToken, .require_peer_certificate = false, .api_key = ""});
  testing::internal::CaptureStderr();
  for (int i = 0; i < 25; ++i) {
    gate.Decide(Call("/fucina.cluster.v1.Registry/Register", 1, "wrong-token-0123456789"))
        .IgnoreError();
  }
  const std::string log = testing::internal::GetCapturedStderr();
  // 10 lines a window: the 25 calls take microseconds, so 10 lines (20 if they straddled the
  // turn of a window), never one per call.
  const auto lines = std::count(log.begin(), log.end(), '\n');
  EXPECT_GE(lines, 10) << log;
  EXPECT_LE(lines, 20) << log;
  EXPECT_THAT(log, HasSubstr("refused /fucina.cluster.v1.Registry/Register from "
                             "ipv4:127.0.0.1:4242: wrong cluster token\n"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("wrong-token")));
  EXPECT_THAT(log, ::testing::Not(HasSubstr(kToken)));
}

// ---- TLS files ----

using TlsFilesTest = TempDir;

TEST_F(TlsFilesTest, FlagsGoTogetherAndFilesMustHoldPem) {
  auto none = LoadTls({}, true);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  const std::string cert =
      Write("c.pem", "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n");
  const std::string key =
      Write("k.pem", "-----BEGIN EC PRIVATE KEY-----\nx\n-----END EC PRIVATE KEY-----\n");
  const std::string junk = Write("junk.pem", "not pem");

  auto partial = LoadTls({.cert = cert, .key = "", .ca = ""}, false);
  ASSERT_FALSE(partial.ok());
  EXPECT_THAT(partial.status().message(), HasSubstr("--tls-key"));
  auto no_ca = LoadTls({.cert = cert, .key = key, .ca = ""}, true);
  ASSERT_FALSE(no_ca.ok());
  EXPECT_THAT(no_ca.status().message(), HasSubstr("--tls-ca"));

  auto loaded = LoadTls({.cert = cert, .key = key, .ca = cert}, true);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->has_value());
  EXPECT_THAT((*loaded)->key, HasSubstr("EC PRIVATE KEY"));
  EXPECT_TRUE(LoadTls({.cert = cert, .key = key, .ca = ""}, false).ok());

  auto bad_key = LoadTls({.cert = cert, .key = junk, .ca = cert}, true);
  ASSERT_FALSE(bad_key.ok());
  EXPECT_THAT(bad_key.status().message(), HasSubstr("--tls-key " + junk));
  EXPECT_THAT(bad_key.status().message(), HasSubstr("PRIVATE KEY"));
  auto key_as_cert = LoadTls({.cert = key, .key = key, .ca = cert}, true);
  ASSERT_FALSE(key_as_cert.ok());
  EXPECT_THAT(key_as_cert.status().message(), HasSubstr("--tls-cert"));
  auto missing = LoadTls({.cert = cert, .key = key, .ca = dir_ + "/missing.pem"}, true);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("--tls-ca"));
}

// A token file or private key that other users may open is refused with its mode and the fix,
// as ssh refuses an open private key; certificates are public.
TEST_F(TlsFilesTest, SecretsOthersMayOpenAreRefused) {
  constexpr char kKey[] = "-----BEGIN EC PRIVATE KEY-----\nx\n-----END EC PRIVATE KEY-----\n";
  const std::string cert =
      Write("c.pem", "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n", 0644);
  for (const auto& [mode, text] : std::vector<std::pair<mode_t, std::string>>{
           {0644, "mode 0644, open to other users"},
           {0604, "mode 0604, open to other users"},
           {0640, "mode 0640, open to its group"},
           {0660, "mode 0660, open to its group"}}) {
    SCOPED_TRACE(text);
    const std::string key = Write("k.pem", kKey, mode);
    auto tls = LoadTls({.cert = cert, .key = key, .ca = cert}, true);
    ASSERT_FALSE(tls.ok());
    EXPECT_EQ(tls.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(tls.status().message(), HasSubstr("--tls-key " + key + " has " + text));
    EXPECT_THAT(tls.status().message(), HasSubstr("chmod 600 " + key));

    const std::string token = Write("token", "from-the-flag-file-0123\n", mode);
    auto resolved = ResolveClusterToken(token);
    ASSERT_FALSE(resolved.ok());
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(resolved.status().message(),
                HasSubstr("--cluster-token-file " + token + " has " + text));
    EXPECT_THAT(resolved.status().message(), HasSubstr("chmod 600 " + token));
    // The shared token file in the cache directory too.
    EXPECT_EQ(ReadOrCreateTokenFile(token).status().code(), absl::StatusCode::kPermissionDenied);
  }
  for (mode_t mode : {0600, 0400}) {
    const std::string key = Write("k.pem", kKey, mode);
    EXPECT_TRUE(LoadTls({.cert = cert, .key = key, .ca = cert}, true).ok()) << mode;
    EXPECT_TRUE(ResolveClusterToken(Write("token", "from-the-flag-file-0123\n", mode)).ok());
  }
  // A file another user owns (a Kubernetes secret volume: root's files, the pod's fsGroup
  // reads them) may be group-readable; never world-readable. Only root can make one here.
  if (geteuid() == 0) {
    const std::string key = Write("k.pem", kKey, 0640);
    ASSERT_EQ(chown(key.c_str(), 12345, 12345), 0);
    EXPECT_TRUE(LoadTls({.cert = cert, .key = key, .ca = cert}, true).ok());
    ASSERT_EQ(chmod(key.c_str(), 0644), 0);
    EXPECT_FALSE(LoadTls({.cert = cert, .key = key, .ca = cert}, true).ok());
  }
}

}  // namespace
}  // namespace fucina
