#include "worker/cluster_auth.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <grpc/grpc_security_constants.h>

#include "absl/strings/str_cat.h"
#include "models/log/log.h"

namespace fucina {
namespace {

constexpr size_t kMinTokenChars = 16;
constexpr size_t kMaxTokenChars = 4096;
constexpr size_t kMaxPemBytes = 1 << 20;
constexpr int kLogLinesPerSecond = 10;

std::string Errno() { return std::strerror(errno); }

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

enum class FileKind { kPublic, kSecret };

// A secret others can read is no longer a secret; ssh refuses such a private key and so do we,
// loudly, instead of running on with it. Any access for others is refused. Group access is
// refused when this process's user owns the file (then nobody needs the group to read it); a
// file another user owns may be group-readable, since that group is how this process reads it
// (a Kubernetes secret volume: root owns the files, the pod's fsGroup reads them).
absl::Status CheckPrivate(const struct stat& st, const std::string& path,
                          const std::string& what) {
  const mode_t open_bits = st.st_uid == geteuid() ? (st.st_mode & 077) : (st.st_mode & 007);
  if (open_bits == 0) return absl::OkStatus();
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return absl::PermissionDeniedError(
      absl::StrCat(what, " ", path, " has mode ", mode, ", open to ",
                   (open_bits & 007) != 0 ? "other users" : "its group",
                   "; it holds a secret, so it must be private to its owner: chmod 600 ", path));
}

// Reads a regular file of at most `limit` bytes. Opening does not block (a FIFO with no writer
// would), and anything but a regular file is refused, so a wrong path cannot hang or exhaust
// the process. A kSecret file must be private (CheckPrivate). `what` names the file in errors;
// NOT_FOUND when it does not exist.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t limit,
                                          const std::string& what,
                                          FileKind kind = FileKind::kPublic) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const std::string message = absl::StrCat(what, " ", path, ": ", Errno());
    return errno == ENOENT ? absl::NotFoundError(message) : absl::PermissionDeniedError(message);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is not a regular file"));
  }
  if (kind == FileKind::kSecret) {
    if (absl::Status s = CheckPrivate(st, path, what); !s.ok()) {
      close(fd);
      return s;
    }
  }
  if (static_cast<uint64_t>(st.st_size) > limit) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " has ", st.st_size,
                                                   " bytes; expected at most ", limit));
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  out.resize(got);
  return out;
}

// mkdir -p with mode 0700 for the directories it creates.
absl::Status MakeDirs(const std::string& dir) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string prefix = dir.substr(0, slash);
    if (!prefix.empty() && mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create directory ", prefix, ": ", Errno()));
    }
    if (slash == std::string::npos) return absl::OkStatus();
  }
}

absl::StatusOr<std::string> DefaultTokenPath() {
  // The cache directory as models/hub resolves it ($FUCINA_CACHE, else ~/.cache/fucina).
  std::string cache = Env("FUCINA_CACHE");
  if (cache.empty()) {
    const std::string home = Env("HOME");
    if (home.empty()) {
      return absl::FailedPreconditionError(
          "no cluster token: neither FUCINA_CACHE nor HOME is set (give --cluster-token-file "
          "or FUCINA_CLUSTER_TOKEN)");
    }
    cache = home + "/.cache/fucina";
  }
  return cache + "/cluster-token";
}

// ("PRIVATE KEY" also matches "EC PRIVATE KEY", "RSA PRIVATE KEY", ...)
bool HasPemBlock(std::string_view pem, std::string_view label) {
  const size_t begin = pem.find("-----BEGIN ");
  return begin != std::string_view::npos &&
         pem.find(std::string(label) + "-----", begin) != std::string_view::npos;
}

// Removes `prefix` from the front of *text if it is there.
bool ConsumePrefix(std::string_view* text, std::string_view prefix) {
  if (!text->starts_with(prefix)) return false;
  text->remove_prefix(prefix.size());
  return true;
}

// Removes a leading "Bearer " (the scheme is case-insensitive, RFC 7235).
bool IsSpace(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

}  // namespace

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag,
                                    std::string_view label) {
  // A private key must be private; certificates are public.
  auto text = ReadSmallFile(path, kMaxPemBytes, flag,
                            label.find("PRIVATE") != std::string_view::npos ? FileKind::kSecret
                                                                             : FileKind::kPublic);
  if (!text.ok()) return text.status();
  if (!HasPemBlock(*text, label)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": expected a PEM file with a ", std::string(label),
                     " block"));
  }
  return text;
}

absl::StatusOr<std::string> ParseToken(std::string_view text, const std::string& what) {
  std::string_view token = text;
  while (!token.empty() && IsSpace(token.front())) token.remove_prefix(1);
  while (!token.empty() && IsSpace(token.back())) token.remove_suffix(1);
  if (token.size() < kMinTokenChars || token.size() > kMaxTokenChars) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the cluster token has ", token.size(), " characters; expected ",
        kMinTokenChars, " to ", kMaxTokenChars, " (e.g. `openssl rand -hex 32`)"));
  }
  for (char ch : token) {
    if (ch <= ' ' || ch > '~') {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the cluster token must be printable ASCII without spaces"));
    }
  }
  return std::string(token);
}

absl::StatusOr<std::string> NewRandomToken() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError(absl::StrCat("getrandom: ", Errno()));
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

absl::StatusOr<std::string> ReadOrCreateTokenFile(const std::string& path) {
  const std::string what = "cluster token file " + path;
  auto existing =
      ReadSmallFile(path, kMaxTokenChars + 64, "cluster token file", FileKind::kSecret);
  if (existing.ok()) return ParseToken(*existing, what);
  if (!absl::IsNotFound(existing.status())) return existing.status();

  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (absl::Status s = MakeDirs(path.substr(0, slash)); !s.ok()) return s;
  }
  auto token = NewRandomToken();
  if (!token.ok()) return token.status();
  auto suffix = NewRandomToken();
  if (!suffix.ok()) return suffix.status();
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", suffix->substr(0, 8));
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", tmp, ": ", Errno()));
  }
  const std::string line = *token + "\n";
  const bool written = fchmod(fd, 0600) == 0 &&
                       write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                       fsync(fd) == 0;
  const std::string write_error = Errno();
  close(fd);
  if (!written) {
    unlink(tmp.c_str());
    return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp, ": ", write_error));
  }
  // link() fails if `path` exists: the first process to link wins and the others read its
  // token. The file is whole before it has its name.
  const int linked = link(tmp.c_str(), path.c_str());
  const int link_errno = errno;
  unlink(tmp.c_str());
  if (linked == 0) return *token;
  if (link_errno != EEXIST) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", path, ": ", std::strerror(link_errno)));
  }
  auto winner =
      ReadSmallFile(path, kMaxTokenChars + 64, "cluster token file", FileKind::kSecret);
  if (!winner.ok()) return winner.status();
  return ParseToken(*winner, what);
}

absl::StatusOr<ClusterToken> ResolveClusterToken(const std::string& token_file) {
  ClusterToken out;
  if (!token_file.empty()) {
    out.source = "--cluster-token-file " + token_file;
    auto text = ReadSmallFile(token_file, kMaxTokenChars + 64, "--cluster-token-file",
                              FileKind::kSecret);
    if (!text.ok()) return text.status();
    auto token = ParseToken(*text, out.source);
    if (!token.ok()) return token.status();
    out.value = *std::move(token);
    return out;
  }
  if (const char* env = std::getenv("FUCINA_CLUSTER_TOKEN"); env != nullptr && *env != '\0') {
    out.source = "$FUCINA_CLUSTER_TOKEN";
    auto token = ParseToken(env, out.source);
    if (!token.ok()) return token.status();
    out.value = *std::move(token);
    return out;
  }
  auto path = DefaultTokenPath();
  if (!path.ok()) return path.status();
  out.source = *path;
  auto token = ReadOrCreateTokenFile(*path);
  if (!token.ok()) return token.status();
  out.value = *std::move(token);
  return out;
}

bool ConstantTimeEquals(std::string_view given, std::string_view expected) {
  unsigned diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= g ^ static_cast<unsigned char>(expected[i]);
  }
  return diff == 0;
}

bool ConsumeBearer(std::string_view* value) {
  static constexpr std::string_view kScheme = "bearer ";
  if (value->size() < kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>((*value)[i])) != kScheme[i]) return false;
  }
  value->remove_prefix(kScheme.size());
  return true;
}

bool IsLoopbackAddress(std::string_view address) {
  if (address.starts_with("unix:") || address.starts_with("unix-abstract:")) {
    return true;
  }
  if (ConsumePrefix(&address, "dns:")) {
    // dns:[//authority/]host:port
    if (ConsumePrefix(&address, "//")) {
      const size_t slash = address.find('/');
      if (slash == std::string_view::npos) return false;
      address.remove_prefix(slash + 1);
    }
  } else if (!ConsumePrefix(&address, "ipv4:")) {
    ConsumePrefix(&address, "ipv6:");
  }
  std::string host;
  if (address.starts_with("[")) {
    const size_t close = address.find(']');
    if (close == std::string_view::npos) return false;
    host = std::string(address.substr(1, close - 1));
  } else if (std::count(address.begin(), address.end(), ':') > 1) {
    host = std::string(address);  // a bare IPv6 address
  } else {
    host = std::string(address.substr(0, address.rfind(':')));
  }
  for (char& ch : host) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

absl::StatusOr<std::optional<TlsMaterial>> LoadTls(const TlsFiles& files, bool need_ca) {
  if (files.cert.empty() && files.key.empty() && files.ca.empty()) return std::nullopt;
  if (files.cert.empty() || files.key.empty() || (need_ca && files.ca.empty())) {
    return absl::InvalidArgumentError(
        need_ca ? "--tls-cert, --tls-key and --tls-ca go together (mutual TLS needs this "
                  "process's certificate, its key and the cluster CA)"
                : "--tls-cert and --tls-key go together");
  }
  TlsMaterial tls;
  auto cert = ReadPem(files.cert, "--tls-cert", "CERTIFICATE");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(files.key, "--tls-key", "PRIVATE KEY");
  if (!key.ok()) return key.status();
  tls.cert = *std::move(cert);
  tls.key = *std::move(key);
  if (!files.ca.empty()) {
    auto ca = ReadPem(files.ca, "--tls-ca", "CERTIFICATE");
    if (!ca.ok()) return ca.status();
    tls.ca = *std::move(ca);
  }
  return tls;
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const std::optional<TlsMaterial>& tls, ClientCertificates mode) {
  if (!tls.has_value()) return grpc::InsecureServerCredentials();
  grpc_ssl_client_certificate_request_type request =
      GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  if (!tls->ca.empty()) {
    request = mode == ClientCertificates::kRequire
                  ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                  : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  grpc::SslServerCredentialsOptions options(request);
  options.pem_root_certs = tls->ca;
  options.pem_key_cert_pairs.push_back({tls->key, tls->cert});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ClusterCredentials::ChannelCredentials() const {
  return channel != nullptr ? channel : grpc::InsecureChannelCredentials();
}

void ClusterCredentials::Prepare(grpc::ClientContext* context) const {
  if (!token.empty()) context->AddMetadata(kClusterTokenMetadata, token);
}

ClusterCredentials MakeClusterCredentials(const std::optional<TlsMaterial>& tls,
                                          std::string token) {
  ClusterCredentials out;
  out.token = std::move(token);
  if (tls.has_value()) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = tls->ca;
    options.pem_private_key = tls->key;
    options.pem_cert_chain = tls->cert;
    out.channel = grpc::SslCredentials(options);
  }
  return out;
}

grpc::Status CallGate::Decide(const CallFacts& call) const {
  std::string why;
  if (call.method.starts_with(kClusterMethodPrefix)) {
    if (options_.require_peer_certificate && !call.peer_certificate_verified) {
      why = "no client certificate signed by the cluster CA";
    } else if (options_.cluster_token.empty()) {
      why = "this server takes no cluster calls";
    } else if (call.token_count == 0) {
      why = absl::StrCat("missing cluster token (metadata ", kClusterTokenMetadata, ")");
    } else if (call.token_count > 1) {
      why = "more than one cluster token";
    } else if (!ConstantTimeEquals(call.token, options_.cluster_token)) {
      why = "wrong cluster token";
    }
  } else if (call.method.starts_with(kPublicMethodPrefix) && !options_.api_key.empty()) {
    std::string_view key = call.authorization;
    if (call.authorization_count == 0) {
      why = "missing API key (metadata authorization: Bearer KEY)";
    } else if (call.authorization_count > 1 || !ConsumeBearer(&key) ||
               !ConstantTimeEquals(key, options_.api_key)) {
      why = "invalid API key";
    }
  }
  if (why.empty()) return grpc::Status::OK;
  LogRefusal(call, why);
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why);
}

grpc::Status CallGate::Admit(const grpc::ServerContext& context, std::string_view method) const {
  CallFacts call;
  call.method = method;
  const std::string peer = context.peer();
  call.peer = peer;
  if (std::shared_ptr<const grpc::AuthContext> auth = context.auth_context()) {
    bool tls = false;
    for (const grpc::string_ref& v :
         auth->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME)) {
      tls |= v == GRPC_SSL_TRANSPORT_SECURITY_TYPE;
    }
    // Under TLS the peer has an identity only when it presented a certificate the CA verified
    // (an unverifiable one fails the handshake).
    call.peer_certificate_verified = tls && auth->IsPeerAuthenticated();
  }
  const auto& metadata = context.client_metadata();
  for (auto [it, end] = metadata.equal_range(kClusterTokenMetadata); it != end; ++it) {
    ++call.token_count;
    call.token = std::string_view(it->second.data(), it->second.size());
  }
  for (auto [it, end] = metadata.equal_range("authorization"); it != end; ++it) {
    ++call.authorization_count;
    call.authorization = std::string_view(it->second.data(), it->second.size());
  }
  return Decide(call);
}

void CallGate::LogRefusal(const CallFacts& call, const std::string& why) const {
  std::lock_guard<std::mutex> lock(log_mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now - log_window_ >= std::chrono::seconds(1)) {
    log_window_ = now;
    logged_in_window_ = 0;
  }
  if (logged_in_window_ >= kLogLinesPerSecond) {
    ++unlogged_;
    return;
  }
  ++logged_in_window_;
  std::string skipped;
  if (unlogged_ > 0) {
    skipped = absl::StrCat(" (", unlogged_, " more refused calls not logged)");
    unlogged_ = 0;
  }
  FUCINA_LOG(kWarning) << "refused " << call.method << " from " << call.peer << ": " << why
                       << skipped;
}

}  // namespace fucina
