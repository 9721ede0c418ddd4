// Authentication of Fucina's gRPC planes, one implementation for the coordinator and the
// workers.
//
// The cluster plane is every fucina.cluster.v1 call: Registry on the coordinator, Worker on each
// worker (from the coordinator, and from stages to expert workers). Its peers prove two things:
//  - the join token, sent on every call as metadata `fucina-cluster-token` (plain metadata, not
//    call credentials: gRPC withholds call credentials on plaintext channels, and plaintext is
//    allowed on loopback);
//  - with TLS (--tls-cert/--tls-key/--tls-ca, one CA for the cluster), a client certificate
//    that CA signed: every process presents its certificate when it dials another.
// The public plane (fucina.v1) asks for `authorization: Bearer KEY` when an API key is set.
// Health and reflection stay open.
//
// Enforcement is CallGate::Admit, the first statement of every handler of our services, with
// the policy keyed by method prefix in that one function. It is not a gRPC server interceptor
// because interceptors of gRPC C++ (1.51) cannot fail a call before its handler runs (the
// handler runs even after TryCancel), and not an AuthMetadataProcessor because those do not
// run on plaintext servers.
#ifndef FUCINA_WORKER_CLUSTER_AUTH_H_
#define FUCINA_WORKER_CLUSTER_AUTH_H_

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"

namespace fucina {

// Metadata key of the join token on cluster calls.
inline constexpr char kClusterTokenMetadata[] = "fucina-cluster-token";
// Method prefixes the gate tells apart.
inline constexpr std::string_view kClusterMethodPrefix = "/fucina.cluster.v1.";
inline constexpr std::string_view kPublicMethodPrefix = "/fucina.v1.";

// ---- the join token ----

struct ClusterToken {
  std::string value;
  std::string source;  // where it came from, for messages (never the token itself)
};

// The join token of this process: the file named by `token_file` (--cluster-token-file) when
// not empty, else $FUCINA_CLUSTER_TOKEN, else $FUCINA_CACHE/cluster-token (FUCINA_CACHE
// defaults to ~/.cache/fucina), created with a fresh random 256-bit token (mode 0600) when it
// does not exist yet. A coordinator and workers on one machine thus share a token with no flags,
// whichever starts first. Errors name the file or variable and what was expected; a token file
// that other users (or, when this user owns it, its group) may open is PERMISSION_DENIED.
absl::StatusOr<ClusterToken> ResolveClusterToken(const std::string& token_file);

// A token as stored in a file or variable: surrounding whitespace is trimmed; the rest must be
// 16 to 4096 printable ASCII characters without spaces (a gRPC metadata value). `what` names
// the file or variable in errors.
absl::StatusOr<std::string> ParseToken(std::string_view text, const std::string& what);

// The token in `path`, written there first when the file does not exist: a fresh token goes to
// a private temporary file that is then hard-linked to `path`, so concurrent callers never see
// a partial file and all end up with the token of whichever linked first. Creates missing
// parent directories (mode 0700).
absl::StatusOr<std::string> ReadOrCreateTokenFile(const std::string& path);

// 64 hex digits of getrandom(2) output (256 bits).
absl::StatusOr<std::string> NewRandomToken();

// Equality whose time does not depend on where `given` first differs from `expected` (nor on
// `given`'s length beyond `expected`'s).
bool ConstantTimeEquals(std::string_view given, std::string_view expected);

// Strips an `authorization` value's "Bearer " scheme (case-insensitive, as RFC 9110 says);
// false when the value has another scheme.
bool ConsumeBearer(std::string_view* value);

// True when only this machine can reach `address` (host:port, [v6]:port or a gRPC target):
// 127.0.0.0/8, ::1, localhost, and unix: sockets. Anything else, 0.0.0.0 and names included,
// may be reachable from elsewhere.
bool IsLoopbackAddress(std::string_view address);

// ---- TLS ----

struct TlsFiles {
  std::string cert, key, ca;  // paths as given; empty: not given
};

struct TlsMaterial {
  std::string cert, key, ca;  // PEM; ca is empty when no CA file was given
};

// The PEM file at `path` (at most 1 MiB) if it holds a `label` block ("CERTIFICATE",
// "PRIVATE KEY"); errors name `flag` and the file. A private key file must be private to its
// owner (PERMISSION_DENIED naming its mode otherwise, as ssh refuses an open key).
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag,
                                    std::string_view label);

// Reads the PEM files. None given: nullopt (plaintext). The certificate and key go together;
// `need_ca` (every process of the cluster plane: it verifies its peers) makes --tls-ca required
// with them. Errors name the flag, the file and what it should hold.
absl::StatusOr<std::optional<TlsMaterial>> LoadTls(const TlsFiles& files, bool need_ca);

enum class ClientCertificates {
  kRequest,  // asked for and verified when presented (a port that also serves the public API)
  kRequire,  // the handshake fails without one the CA signed (a worker: no public clients)
};

// Server credentials: TLS with `tls`'s certificate, verifying client certificates against its
// CA as `mode` says; plaintext without `tls`.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const std::optional<TlsMaterial>& tls, ClientCertificates mode);

// ---- the client side of the cluster plane ----

// What this process presents when it dials another process of the cluster. Copyable; shared
// by every channel it opens.
struct ClusterCredentials {
  std::shared_ptr<grpc::ChannelCredentials> channel;  // TLS with our certificate; null: plaintext
  std::string token;                                  // empty: none sent

  // Plaintext channel credentials unless TLS was configured.
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;
  // Adds the join token to a call's metadata: the one place every cluster ClientContext passes.
  void Prepare(grpc::ClientContext* context) const;
};

ClusterCredentials MakeClusterCredentials(const std::optional<TlsMaterial>& tls,
                                          std::string token);

// ---- the server side: one policy for every call ----

struct CallGateOptions {
  // Cluster calls must carry this token; empty: every cluster call is refused (a server that
  // has no cluster plane, e.g. `fucina serve`).
  std::string cluster_token;
  // Cluster calls must also come over TLS from a peer whose certificate the CA verified.
  bool require_peer_certificate = false;
  // fucina.v1 calls must carry `authorization: Bearer <api_key>`; empty: open.
  std::string api_key;
};

// What the gate looks at in one call, so the decision is testable without a server.
struct CallFacts {
  std::string_view method;  // "/package.Service/Method"
  std::string_view peer;    // for the log, e.g. "ipv4:127.0.0.1:5555"
  bool peer_certificate_verified = false;
  int token_count = 0;  // values of kClusterTokenMetadata
  std::string_view token;
  int authorization_count = 0;
  std::string_view authorization;
};

class CallGate {
 public:
  explicit CallGate(CallGateOptions options) : options_(std::move(options)) {}
  CallGate(const CallGate&) = delete;
  CallGate& operator=(const CallGate&) = delete;

  // OK, or UNAUTHENTICATED naming what is missing (never the expected secret). Refusals are
  // logged on stderr with the peer and the method, at most 10 lines a second (a flood of bad
  // calls cannot flood the log; the lines left out are counted in the next one).
  grpc::Status Admit(const grpc::ServerContext& context, std::string_view method) const;
  grpc::Status Decide(const CallFacts& call) const;

 private:
  void LogRefusal(const CallFacts& call, const std::string& why) const;

  CallGateOptions options_;
  mutable std::mutex log_mu_;
  mutable std::chrono::steady_clock::time_point log_window_;
  mutable int logged_in_window_ = 0;
  mutable int64_t unlogged_ = 0;
};

}  // namespace fucina

#endif  // FUCINA_WORKER_CLUSTER_AUTH_H_
