#include "tools/server_common.h"

#include <signal.h>

#include <cstdio>

#include <CLI/CLI.hpp>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/grpc_util.h"

namespace fucina::cli {

// SIGINT/SIGTERM are blocked in every thread (call before starting any) and taken by
// WaitForStop on the main thread.
void BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void WaitForStop() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "signal %d: draining\n", sig);
}

// "123", "512M", "4G" (binary units); `flag` names the flag in errors.
absl::StatusOr<int64_t> ParseBytes(const std::string& text, const char* flag) {
  if (text.empty()) return 0;
  int64_t scale = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K': case 'k': scale = int64_t{1} << 10; break;
    case 'M': case 'm': scale = int64_t{1} << 20; break;
    case 'G': case 'g': scale = int64_t{1} << 30; break;
    case 'T': case 't': scale = int64_t{1} << 40; break;
    default: scale = 1;
  }
  if (scale != 1) digits.pop_back();
  int64_t n;
  if (!absl::SimpleAtoi(digits, &n) || n < 0 || n > (int64_t{1} << 50) / scale) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " must be a byte count like 4G, got '",
                                                   text, "'"));
  }
  return n * scale;
}

std::string Host(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

// A gRPC server with the given services, health and reflection, on `listen`.
// Receives at most `max_receive_bytes` per message (the public API's cap on the coordinator, the
// internal protocol's on a worker).
absl::StatusOr<GrpcServer> StartGrpc(const std::string& listen,
                                     const std::vector<grpc::Service*>& services,
                                     std::shared_ptr<grpc::ServerCredentials> credentials,
                                     bool tls, int max_receive_bytes) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, std::move(credentials), &port);
  builder.SetMaxReceiveMessageSize(max_receive_bytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  for (grpc::Service* s : services) builder.RegisterService(s);
  GrpcServer out;
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", listen, " (gRPC)",
        tls ? "; check that --tls-key is the key of --tls-cert" : ""));
  }
  out.address = absl::StrCat(Host(listen), ":", port);
  return out;
}

// `may_move`: the address is a default, so when its port is taken (a second worker on this
// machine) any free port on the same host serves instead; the bound address is what the
// `listening` line prints. A port given explicitly stays an error when taken.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetrics(const std::string& listen,
                                                                  bool may_move,
                                                                  std::string* bound) {
  std::string address = listen;
  while (true) {
    try {
      auto exposer = std::make_unique<prometheus::Exposer>(address);
      const std::vector<int> ports = exposer->GetListeningPorts();
      *bound = absl::StrCat(Host(address), ":", ports.empty() ? 0 : ports[0]);
      if (address != listen) {
        std::fprintf(stderr, "metrics: %s is taken; serving metrics on %s\n", listen.c_str(),
                     bound->c_str());
      }
      return exposer;
    } catch (const std::exception& e) {
      if (!may_move || address != listen) {
        return absl::UnavailableError(
            absl::StrCat("cannot listen on ", address, " (metrics): ", e.what()));
      }
      address = Host(listen) + ":0";
    }
  }
}

void SetHealth(grpc::Server* server, bool ready) {
  if (auto* health = server->GetHealthCheckService()) {
    health->SetServingStatus(ready);
    health->SetServingStatus("fucina.v1.Generation", ready);
  }
}

// ---- security flags (worker/cluster_auth.h), grouped here for every server command ----

// `cluster`: the command is part of the cluster plane (coordinator, worker), which takes the
// join token and needs mutual TLS (a CA) or loopback. `serve` has no cluster plane: TLS there
// only protects its public API.
void AddSecurityFlags(CLI::App* cmd, SecurityArgs* s, bool cluster) {
  cmd->add_option("--tls-cert", s->tls.cert,
                  cluster ? "PEM certificate this process serves and dials other cluster "
                            "processes with (scripts/make-cluster-certs.sh)"
                          : "PEM certificate to serve gRPC over TLS");
  cmd->add_option("--tls-key", s->tls.key, "PEM private key of --tls-cert");
  cmd->add_option("--tls-ca", s->tls.ca,
                  cluster ? "PEM CA of the cluster: peers must present certificates it signed"
                          : "PEM CA verifying client certificates when presented (optional)");
  if (!cluster) return;
  cmd->add_option("--cluster-token-file", s->token_file,
                  "File with the cluster's join token (default: $FUCINA_CLUSTER_TOKEN, else "
                  "$FUCINA_CACHE/cluster-token, created when missing)");
  cmd->add_flag("--insecure-cluster", s->insecure_cluster,
                "Allow a plaintext cluster plane off loopback (traffic and token in the clear)");
}

// A plaintext cluster plane stays on this machine unless --insecure-cluster says otherwise.
// `addresses`: (flag, address) pairs this process listens on or dials.
absl::Status CheckPlaintextAllowed(
    const SecurityArgs& s, bool tls,
    const std::vector<std::pair<const char*, std::string>>& addresses) {
  if (tls || s.insecure_cluster) return absl::OkStatus();
  for (const auto& [flag, address] : addresses) {
    if (!address.empty() && !IsLoopbackAddress(address)) {  // empty: a flag not given
      return absl::FailedPreconditionError(absl::StrCat(
          flag, " ", address,
          " is not a loopback address and the cluster plane has no TLS: give --tls-cert, "
          "--tls-key and --tls-ca (scripts/make-cluster-certs.sh makes them), or "
          "--insecure-cluster to send cluster traffic and its join token in the clear"));
    }
  }
  return absl::OkStatus();
}

// The join token of a cluster process, with where it came from on stderr (never the token).
absl::StatusOr<ClusterToken> LoadToken(const SecurityArgs& s) {
  auto token = ResolveClusterToken(s.token_file);
  if (token.ok()) std::fprintf(stderr, "cluster token: %s\n", token->source.c_str());
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> DialCoordinator(const std::string& address,
                                                               const std::string& tls_ca) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!tls_ca.empty()) {
    // Server authentication only: public clients present no certificate.
    auto ca = ReadPem(tls_ca, "--tls-ca", "CERTIFICATE");
    if (!ca.ok()) return ca.status();
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = *std::move(ca);
    credentials = grpc::SslCredentials(options);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(address, credentials, args);
}

void AddApiKey(grpc::ClientContext* context, const std::string& api_key) {
  std::string key = api_key;
  if (key.empty()) {
    if (const char* env = std::getenv("FUCINA_API_KEY")) key = env;
  }
  if (!key.empty()) context->AddMetadata("authorization", "Bearer " + key);
}

}  // namespace fucina::cli
