// Plumbing shared by the server commands (serve, coordinator, worker) and the gRPC client:
// exit codes, stop signals, byte-count flags, the gRPC and metrics listeners, and the security
// flags of worker/cluster_auth.h.
#ifndef FUCINA_TOOLS_SERVER_COMMON_H_
#define FUCINA_TOOLS_SERVER_COMMON_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <prometheus/exposer.h>

#include "absl/status/statusor.h"
#include "tools/command_status.h"
#include "worker/cluster_auth.h"

namespace CLI {
class App;
}

namespace fucina::cli {

// SIGINT/SIGTERM are blocked in every thread (call before starting any) and taken by
// WaitForStop on the main thread.
void BlockStopSignals();
void WaitForStop();

// "123", "512M", "4G" (binary units); `flag` names the flag in errors.
absl::StatusOr<int64_t> ParseBytes(const std::string& text, const char* flag);

// The host part of host:port.
std::string Host(const std::string& address);

// A gRPC server with the given services, health and reflection, on `listen`.
struct GrpcServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;  // host:bound-port
};

// Receives at most `max_receive_bytes` per message (the public API's cap on the coordinator, the
// internal protocol's on a worker).
absl::StatusOr<GrpcServer> StartGrpc(const std::string& listen,
                                     const std::vector<grpc::Service*>& services,
                                     std::shared_ptr<grpc::ServerCredentials> credentials,
                                     bool tls, int max_receive_bytes);

// `may_move`: the address is a default, so when its port is taken (a second worker on this
// machine) any free port on the same host serves instead; the bound address is what the
// `listening` line prints. A port given explicitly stays an error when taken.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetrics(const std::string& listen,
                                                                  bool may_move,
                                                                  std::string* bound);

// The gRPC health status of the server and of fucina.v1.Generation.
void SetHealth(grpc::Server* server, bool ready);

// ---- security flags (worker/cluster_auth.h), grouped here for every server command ----

struct SecurityArgs {
  TlsFiles tls;
  std::string token_file;
  bool insecure_cluster = false;
};

// `cluster`: the command is part of the cluster plane (coordinator, worker), which takes the
// join token and needs mutual TLS (a CA) or loopback. `serve` has no cluster plane: TLS there
// only protects its public API.
void AddSecurityFlags(CLI::App* cmd, SecurityArgs* s, bool cluster);

// A plaintext cluster plane stays on this machine unless --insecure-cluster says otherwise.
// `addresses`: (flag, address) pairs this process listens on, dials or advertises (empty ones,
// flags not given, are skipped).
absl::Status CheckPlaintextAllowed(
    const SecurityArgs& s, bool tls,
    const std::vector<std::pair<const char*, std::string>>& addresses);

// The join token of a cluster process, with where it came from on stderr (never the token).
absl::StatusOr<ClusterToken> LoadToken(const SecurityArgs& s);

// A public-API client's channel to a coordinator: TLS verified with `tls_ca` (a PEM file; the
// client presents no certificate) or plaintext when it is empty.
absl::StatusOr<std::shared_ptr<grpc::Channel>> DialCoordinator(const std::string& address,
                                                               const std::string& tls_ca);
// Adds `authorization: Bearer KEY` to a public call: `api_key`, else $FUCINA_API_KEY, else
// nothing.
void AddApiKey(grpc::ClientContext* context, const std::string& api_key);

}  // namespace fucina::cli

#endif  // FUCINA_TOOLS_SERVER_COMMON_H_
