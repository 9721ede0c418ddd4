#include "coordinator/model_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/grpc_util.h"

namespace fucina {
namespace {

namespace wire = ::fucina::cluster::v1;

constexpr char kMethod[] = "/fucina.cluster.v1.ModelSource/";
// Tensors asked for in one manifest request (a model has a few thousand at most).
constexpr int kMaxManifestTensors = 1 << 16;

}  // namespace

absl::StatusOr<std::unique_ptr<ModelSourceService>> ModelSourceService::Create(
    std::string model_path, const CallGate& gate) {
  std::unique_ptr<ModelSourceService> s(new ModelSourceService(std::move(model_path), gate));
  auto file = gguf::File::Open(s->path_);
  if (!file.ok()) return file.status();
  s->file_ = *std::move(file);
  s->fd_ = ::open(s->path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (s->fd_ < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat(s->path_, ": cannot open"));
  }
  s->file_size_ = s->file_->file_size();
  s->header_size_ = std::min(s->file_->data_offset(), s->file_size_);
  auto digest = Sha256OfRange(s->fd_, 0, s->header_size_, s->path_);
  if (!digest.ok()) return digest.status();
  s->model_digest_ = *digest;
  return s;
}

ModelSourceService::~ModelSourceService() {
  if (fd_ >= 0) ::close(fd_);
}

grpc::Status ModelSourceService::CheckPath(const std::string& path) const {
  if (path != path_) {
    // Never a file the coordinator does not serve: the cluster plane is not a file server.
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "this coordinator serves only its own model file, not the one asked for");
  }
  if (file_->num_splits() > 1) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat(path_, " is a split model, which is not sent over the "
                                            "network: give the workers a filesystem holding it"));
  }
  return grpc::Status::OK;
}

absl::StatusOr<Sha256::Digest> ModelSourceService::TensorDigest(const gguf::TensorInfo& t) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = digests_.find(t.name); it != digests_.end()) return it->second;
  }
  // Hashed without the lock (two workers asking at once may both hash; the results agree).
  auto digest = Sha256OfRange(fd_, file_->data_offset() + t.offset, t.nbytes,
                              absl::StrCat(path_, ": tensor ", t.name));
  if (!digest.ok()) return digest.status();
  std::lock_guard<std::mutex> lock(mu_);
  digests_.emplace(t.name, *digest);
  return *digest;
}

grpc::Status ModelSourceService::GetModelManifest(grpc::ServerContext* context,
                                                  const wire::ModelManifestRequest* request,
                                                  wire::ModelManifest* response) {
  if (grpc::Status s = gate_.Admit(*context, absl::StrCat(kMethod, "GetModelManifest"));
      !s.ok()) {
    return s;
  }
  if (grpc::Status s = CheckPath(request->model_path()); !s.ok()) return s;
  if (request->tensors_size() > kMaxManifestTensors) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("at most ", kMaxManifestTensors, " tensors per request, got ",
                                     request->tensors_size()));
  }
  response->set_model_digest(model_digest_.data(), model_digest_.size());
  response->set_file_size(file_size_);
  response->set_header_size(header_size_);
  for (const std::string& name : request->tensors()) {
    const gguf::TensorInfo* t = file_->FindTensor(name);
    if (t == nullptr) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("the model has no tensor '", name.substr(0, 80), "'"));
    }
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    auto digest = TensorDigest(*t);
    if (!digest.ok()) return ToGrpc(digest.status());
    wire::ModelTensorDigest* d = response->add_tensors();
    d->set_name(name);
    d->set_sha256(digest->data(), digest->size());
  }
  return grpc::Status::OK;
}

grpc::Status ModelSourceService::ReadModelRange(grpc::ServerContext* context,
                                                const wire::ModelRangeRequest* request,
                                                grpc::ServerWriter<wire::ModelChunk>* writer) {
  if (grpc::Status s = gate_.Admit(*context, absl::StrCat(kMethod, "ReadModelRange"));
      !s.ok()) {
    return s;
  }
  if (grpc::Status s = CheckPath(request->model_path()); !s.ok()) return s;
  if (request->model_digest() !=
      std::string_view(reinterpret_cast<const char*>(model_digest_.data()), Sha256::kDigestSize)) {
    return grpc::Status(grpc::StatusCode::ABORTED,
                        "the model digest is not this file's: the coordinator's model changed "
                        "since the manifest (load the shard again)");
  }
  const uint64_t offset = request->offset(), size = request->size();
  if (offset > file_size_ || size > file_size_ - offset) {
    return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                        absl::StrCat("range [", offset, ", +", size, ") is outside the ",
                                     file_size_, "-byte model file"));
  }
  wire::ModelChunk chunk;
  uint64_t done = 0;
  while (done < size) {
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    const uint64_t want = std::min(kModelChunkBytes, size - done);
    std::string* data = chunk.mutable_data();
    data->resize(want);
    uint64_t got = 0;
    while (got < want) {
      const ssize_t n = ::pread(fd_, data->data() + got, want - got,
                                static_cast<off_t>(offset + done + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return grpc::Status(grpc::StatusCode::DATA_LOSS,
                            absl::StrCat(path_, ": cannot read at ", offset + done + got,
                                         n == 0 ? " (the file shrank while served)"
                                                : absl::StrCat(": ", std::strerror(errno))));
      }
      got += static_cast<uint64_t>(n);
    }
    chunk.set_offset(offset + done);
    if (!writer->Write(chunk)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the worker went away");
    }
    done += want;
  }
  return grpc::Status::OK;
}

}  // namespace fucina
