// fucina.cluster.v1.ModelSource: the coordinator serves the bytes of its model file to workers
// that cannot open it (no shared filesystem). Only that one file is served, through the same
// gate as every cluster call (join token; with TLS, the peer's certificate).
//
// Threading: handlers run on gRPC's threads, several at once. The file is read with pread (a
// file truncated while served gives short reads, never SIGBUS); tensor digests are computed on
// first request and kept (a guarded map), so each tensor is hashed once per process.
#ifndef FUCINA_COORDINATOR_MODEL_SOURCE_H_
#define FUCINA_COORDINATOR_MODEL_SOURCE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "fucina/cluster/v1/worker.grpc.pb.h"
#include "models/gguf/gguf.h"
#include "worker/cluster_auth.h"
#include "worker/file_digest.h"

namespace fucina {

// Chunks of a ReadModelRange stream: far below gRPC's default 4 MiB message limit.
inline constexpr uint64_t kModelChunkBytes = 1 << 20;

class ModelSourceService final : public ::fucina::cluster::v1::ModelSource::Service {
 public:
  // Opens `model_path` (parsed once for its tensor table; the header is hashed now). Errors:
  // the file cannot be opened or parsed, or it is a split model. Borrows the gate.
  static absl::StatusOr<std::unique_ptr<ModelSourceService>> Create(std::string model_path,
                                                                    const CallGate& gate);
  ~ModelSourceService() override;

  grpc::Status GetModelManifest(grpc::ServerContext* context,
                                const ::fucina::cluster::v1::ModelManifestRequest* request,
                                ::fucina::cluster::v1::ModelManifest* response) override;
  grpc::Status ReadModelRange(
      grpc::ServerContext* context, const ::fucina::cluster::v1::ModelRangeRequest* request,
      grpc::ServerWriter<::fucina::cluster::v1::ModelChunk>* writer) override;

  const Sha256::Digest& model_digest() const { return model_digest_; }

 private:
  ModelSourceService(std::string model_path, const CallGate& gate)
      : path_(std::move(model_path)), gate_(gate) {}
  grpc::Status CheckPath(const std::string& path) const;
  // The tensor's digest, hashed on first use.
  absl::StatusOr<Sha256::Digest> TensorDigest(const gguf::TensorInfo& tensor);

  const std::string path_;
  const CallGate& gate_;
  int fd_ = -1;
  std::unique_ptr<gguf::File> file_;  // the tensor table (data is read with pread on fd_)
  uint64_t file_size_ = 0;
  uint64_t header_size_ = 0;
  Sha256::Digest model_digest_{};
  std::mutex mu_;
  absl::flat_hash_map<std::string, Sha256::Digest> digests_;  // guarded by mu_
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_MODEL_SOURCE_H_
