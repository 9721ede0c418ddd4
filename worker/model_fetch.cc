#include "worker/model_fetch.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/engine/model.h"
#include "models/gguf/gguf.h"
#include "models/log/log.h"
#include "worker/file_digest.h"
#include "worker/grpc_util.h"
#include "worker/worker_actor.h"

namespace fucina {
namespace {

namespace wire = ::fucina::cluster::v1;

// What a coordinator may claim before the claim is taken as a bug or a lie: a model file up to
// 1 PiB, a header (metadata + tensor infos) up to 1 GiB.
constexpr uint64_t kMaxModelBytes = uint64_t{1} << 50;
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 30;

std::string_view AsBytes(const Sha256::Digest& d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

absl::Status ErrnoError(const std::string& what) {
  const int err = errno;
  return absl::ErrnoToStatus(err, what);
}

absl::Status WithContext(const absl::Status& s, const std::string& what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// "<sha256 hex> <name>" lines; a malformed line (a write cut by a crash) is skipped, and a
// later line for the same tensor wins.
absl::flat_hash_map<std::string, Sha256::Digest> ReadVerified(const std::string& path) {
  absl::flat_hash_map<std::string, Sha256::Digest> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    Sha256::Digest d;
    if (line.size() < 2 * Sha256::kDigestSize + 2 || line[2 * Sha256::kDigestSize] != ' ' ||
        !DigestFromHex(std::string_view(line).substr(0, 2 * Sha256::kDigestSize), &d)) {
      continue;
    }
    out[line.substr(2 * Sha256::kDigestSize + 1)] = d;
  }
  return out;
}

absl::Status WriteAll(int fd, const void* data, size_t size, uint64_t offset,
                      const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = offset == UINT64_MAX
                          ? ::write(fd, p + done, size - done)
                          : ::pwrite(fd, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(absl::StrCat(path, ": write failed"));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// An open file descriptor, closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

ModelFetcher::ModelFetcher(std::shared_ptr<wire::ModelSource::StubInterface> stub,
                           ClusterCredentials credentials, ModelFetchOptions options)
    : stub_(std::move(stub)), credentials_(std::move(credentials)), options_(std::move(options)) {}

ModelFetcher::~ModelFetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (recheck_.joinable()) recheck_.join();
}

absl::StatusOr<Sha256::Digest> ModelFetcher::ReadRange(const std::string& model_path,
                                                       const std::string& digest, int fd,
                                                       uint64_t offset, uint64_t size,
                                                       const std::string& what,
                                                       FetchReport* report) {
  grpc::ClientContext ctx;
  credentials_.Prepare(&ctx);
  int64_t deadline_ms = options_.range_deadline_ms + static_cast<int64_t>(size >> 20) * 1000;
  if (options_.max_bytes_per_second > 0) {
    deadline_ms += static_cast<int64_t>(size * 1000 / options_.max_bytes_per_second);
  }
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  wire::ModelRangeRequest request;
  request.set_model_path(model_path);
  request.set_model_digest(digest);
  request.set_offset(offset);
  request.set_size(size);
  std::unique_ptr<grpc::ClientReaderInterface<wire::ModelChunk>> reader =
      stub_->ReadModelRange(&ctx, request);
  Sha256 hasher;
  const uint64_t end = offset + size;
  uint64_t next = offset;
  wire::ModelChunk chunk;
  absl::Status failed;
  while (reader->Read(&chunk)) {
    const uint64_t n = chunk.data().size();
    if (chunk.offset() != next || n == 0 || n > end - next) {
      failed = absl::InvalidArgumentError(absl::StrCat(
          what, ": the coordinator sent ", n, " bytes at offset ", chunk.offset(),
          "; expected a non-empty chunk at ", next, " within [", offset, ", ", end, ")"));
      break;
    }
    if (absl::Status s = WriteAll(fd, chunk.data().data(), n, next, what); !s.ok()) {
      failed = s;
      break;
    }
    hasher.Update(chunk.data().data(), n);
    next += n;
    report->bytes_received += n;
    bytes_received_ += n;
    if (options_.max_bytes_per_second > 0) {
      // Ahead of the allowed rate (counted over the whole load): wait until back on it.
      const auto due = fetch_start_ + std::chrono::microseconds(static_cast<int64_t>(
                                          report->bytes_received * 1'000'000.0 /
                                          options_.max_bytes_per_second));
      std::this_thread::sleep_until(due);
    }
  }
  if (!failed.ok()) ctx.TryCancel();
  const grpc::Status status = reader->Finish();
  if (!failed.ok()) return failed;
  if (!status.ok()) {
    return WithContext(FromGrpc(status), absl::StrCat(what, ": fetching from the coordinator"));
  }
  if (next != end) {
    return absl::DataLossError(absl::StrCat(what, ": the coordinator's stream ended at offset ",
                                            next, ", ", end - next, " bytes short of ", end));
  }
  return hasher.Finish();
}

absl::StatusOr<wire::ModelManifest> ModelFetcher::Manifest(
    const std::string& model_path, const std::vector<std::string>& tensors) {
  grpc::ClientContext ctx;
  credentials_.Prepare(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(options_.manifest_deadline_ms));
  wire::ModelManifestRequest request;
  request.set_model_path(model_path);
  for (const std::string& t : tensors) request.add_tensors(t);
  wire::ModelManifest manifest;
  const grpc::Status s = stub_->GetModelManifest(&ctx, request, &manifest);
  if (!s.ok()) {
    return WithContext(FromGrpc(s), "asking the coordinator for the model's manifest");
  }
  Sha256::Digest digest;
  if (!DigestFromBytes(manifest.model_digest(), &digest)) {
    return absl::InvalidArgumentError(absl::StrCat("the coordinator's model digest has ",
                                                   manifest.model_digest().size(),
                                                   " bytes, expected ", Sha256::kDigestSize));
  }
  if (manifest.file_size() > kMaxModelBytes || manifest.header_size() == 0 ||
      manifest.header_size() > kMaxHeaderBytes ||
      manifest.header_size() > manifest.file_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the coordinator describes a ", manifest.file_size(), "-byte model file with a ",
        manifest.header_size(), "-byte header (expected a header of 1 byte to 1 GiB within a "
                                "file of at most 1 PiB)"));
  }
  if (manifest.tensors_size() != static_cast<int>(tensors.size())) {
    return absl::InvalidArgumentError(absl::StrCat("asked the coordinator for the digests of ",
                                                   tensors.size(), " tensors, got ",
                                                   manifest.tensors_size()));
  }
  for (int i = 0; i < manifest.tensors_size(); ++i) {
    const wire::ModelTensorDigest& t = manifest.tensors(i);
    if (t.name() != tensors[i] || t.sha256().size() != Sha256::kDigestSize) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the coordinator's digest ", i, " is for '", t.name().substr(0, 80), "' with ",
          t.sha256().size(), " bytes; expected 32 bytes for '", tensors[i], "'"));
    }
  }
  return manifest;
}

absl::StatusOr<FetchReport> ModelFetcher::Fetch(const wire::LoadShardRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  Watched loaded;
  auto report = FetchLocked(request, &loaded);
  if (!report.ok()) return report;
  // Remember the shard's tensors for the recheck (several shards of a model share a folder).
  auto same = std::find_if(watched_.begin(), watched_.end(),
                           [&](const Watched& w) { return w.dir == loaded.dir; });
  if (same == watched_.end() || same->digest_bytes != loaded.digest_bytes ||
      same->inode != loaded.inode || same->device != loaded.device) {
    if (same != watched_.end()) watched_.erase(same);
    watched_.push_back(std::move(loaded));
  } else {
    for (WatchedTensor& t : loaded.tensors) {
      if (std::none_of(same->tensors.begin(), same->tensors.end(),
                       [&](const WatchedTensor& u) { return u.name == t.name; })) {
        same->tensors.push_back(std::move(t));
      }
    }
  }
  if (options_.recheck_bytes_per_second > 0 && !recheck_.joinable()) {
    recheck_ = std::thread([this] { RecheckLoop(); });
  }
  return report;
}

absl::StatusOr<ModelFetcher::RecheckOutcome> ModelFetcher::Recheck(const Watched& w,
                                                                   size_t index, bool wait) {
  const WatchedTensor& t = w.tensors[index];
  // Across processes sharing the cache: not while another one fetches into this folder.
  Fd lock{::open((w.dir + "/lock").c_str(), O_RDWR | O_CLOEXEC)};
  if (lock.fd < 0 && errno == ENOENT) return RecheckOutcome::kGone;
  if (lock.fd < 0) return ErrnoError(absl::StrCat(w.dir, "/lock: cannot open"));
  while (::flock(lock.fd, wait ? LOCK_EX : LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return RecheckOutcome::kBusy;
    if (errno != EINTR) return ErrnoError(absl::StrCat(w.dir, "/lock: cannot lock"));
  }
  const std::string path = w.dir + "/model.gguf";
  Fd fd{::open(path.c_str(), O_RDWR | O_CLOEXEC)};
  struct stat st;
  if (fd.fd < 0 && errno == ENOENT) return RecheckOutcome::kGone;
  if (fd.fd < 0 || ::fstat(fd.fd, &st) != 0) return ErrnoError(absl::StrCat(path, ": cannot open"));
  if (static_cast<uint64_t>(st.st_dev) != w.device ||
      static_cast<uint64_t>(st.st_ino) != w.inode) {
    return RecheckOutcome::kGone;
  }
  // pread goes through the page cache, the same pages the worker's mapping reads.
  auto local = Sha256OfRange(fd.fd, t.offset, t.size, path);
  if (local.ok() && *local == t.expected) return RecheckOutcome::kSame;
  const std::string what = absl::StrCat("tensor ", t.name);
  FUCINA_LOG(kWarning) << "model cache " << path << ": " << what
                       << " changed after it was verified ("
                       << (local.ok() ? absl::StrCat("SHA-256 ", DigestHex(*local))
                                      : std::string(local.status().message()))
                       << "); fetching it again in place";
  FetchReport report;
  fetch_start_ = std::chrono::steady_clock::now();
  for (int attempt = 0;; ++attempt) {
    auto got = ReadRange(w.model_path, w.digest_bytes, fd.fd, t.offset, t.size, what, &report);
    if (!got.ok()) return got.status();
    if (*got == t.expected) break;
    if (attempt == 1) {
      return absl::DataLossError(absl::StrCat(
          what, ": the SHA-256 of the bytes received is ", DigestHex(*got),
          ", not the coordinator's ", DigestHex(t.expected), " (received twice)"));
    }
  }
  ++tensors_repaired_;
  return RecheckOutcome::kRepaired;
}

absl::StatusOr<int> ModelFetcher::RecheckAll() {
  std::lock_guard<std::mutex> lock(mu_);
  int repaired = 0;
  for (size_t m = 0; m < watched_.size();) {
    bool gone = false;
    for (size_t i = 0; i < watched_[m].tensors.size() && !gone; ++i) {
      auto outcome = Recheck(watched_[m], i, /*wait=*/true);
      if (!outcome.ok()) return outcome.status();
      repaired += *outcome == RecheckOutcome::kRepaired ? 1 : 0;
      gone = *outcome == RecheckOutcome::kGone;
    }
    if (gone) {
      watched_.erase(watched_.begin() + static_cast<ptrdiff_t>(m));
    } else {
      ++m;
    }
  }
  return repaired;
}

void ModelFetcher::RecheckLoop() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mu_);
  size_t model = 0, tensor = 0;
  bool failed = false;  // a repair failed this sweep: the next one waits longer
  auto sweep_start = Clock::now();
  while (!stopping_) {
    if (model >= watched_.size()) {
      // A sweep is done: start the next one no sooner than a second after this one began
      // (half a minute after one whose repair failed, so a coordinator away is not hammered).
      model = tensor = 0;
      wake_.wait_until(lock, sweep_start + std::chrono::seconds(failed ? 30 : 1),
                       [&] { return stopping_; });
      sweep_start = Clock::now();
      failed = false;
      continue;
    }
    Watched& w = watched_[model];
    if (tensor >= w.tensors.size()) {
      ++model;
      tensor = 0;
      continue;
    }
    const uint64_t bytes = w.tensors[tensor].size;
    auto outcome = Recheck(w, tensor, /*wait=*/false);
    if (!outcome.ok()) {
      // The coordinator may be away for now: a later sweep tries again.
      FUCINA_LOG(kWarning) << "model cache recheck: " << outcome.status().ToString();
      failed = true;
    } else if (*outcome == RecheckOutcome::kGone) {
      FUCINA_LOG(kWarning) << "model cache " << w.dir
                           << "/model.gguf: deleted or replaced since it was loaded; no longer "
                              "rechecked";
      watched_.erase(watched_.begin() + static_cast<ptrdiff_t>(model));
      tensor = 0;
      continue;
    }
    ++tensor;
    // Paced by the bytes hashed; Fetch may run meanwhile (the mutex is released while waiting).
    const auto pause = std::chrono::microseconds(
        static_cast<int64_t>(bytes * 1e6 / options_.recheck_bytes_per_second));
    wake_.wait_for(lock, pause, [&] { return stopping_; });
  }
}

absl::StatusOr<FetchReport> ModelFetcher::FetchLocked(const wire::LoadShardRequest& request,
                                                      Watched* watched) {
  FetchReport report;
  fetch_start_ = std::chrono::steady_clock::now();
  const std::string& model_path = request.model_path();
  auto first = Manifest(model_path, {});
  if (!first.ok()) return first.status();
  Sha256::Digest model_digest;
  DigestFromBytes(first->model_digest(), &model_digest);
  const uint64_t file_size = first->file_size(), header_size = first->header_size();

  // The cache folder of this model, held for the whole fetch.
  const std::string dir = absl::StrCat(options_.cache_dir, "/", DigestHex(model_digest));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat(dir, ": cannot create the model cache folder: ", ec.message()));
  }
  Fd lock{::open((dir + "/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)};
  if (lock.fd < 0) return ErrnoError(absl::StrCat(dir, "/lock: cannot open"));
  while (::flock(lock.fd, LOCK_EX) != 0) {
    if (errno != EINTR) return ErrnoError(absl::StrCat(dir, "/lock: cannot lock"));
  }
  report.path = dir + "/model.gguf";
  Fd fd{::open(report.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)};
  if (fd.fd < 0) return ErrnoError(absl::StrCat(report.path, ": cannot open"));
  struct stat st;
  if (::fstat(fd.fd, &st) != 0) return ErrnoError(absl::StrCat(report.path, ": cannot stat"));
  if (static_cast<uint64_t>(st.st_size) != file_size &&
      ::ftruncate(fd.fd, static_cast<off_t>(file_size)) != 0) {
    return ErrnoError(absl::StrCat(report.path, ": cannot size it to ", file_size, " bytes"));
  }
  const std::string digest_bytes(AsBytes(model_digest));

  // The header: checked whole against the model digest on every load (it is small).
  auto local_header = Sha256OfRange(fd.fd, 0, header_size, report.path);
  if (!local_header.ok()) return local_header.status();
  if (*local_header != model_digest) {
    for (int attempt = 0;; ++attempt) {
      auto got = ReadRange(model_path, digest_bytes, fd.fd, 0, header_size, "the model header",
                           &report);
      if (!got.ok()) return got.status();
      if (*got == model_digest) break;
      if (attempt == 1) {
        return absl::DataLossError(absl::StrCat(
            "the model header's SHA-256 ", DigestHex(*got),
            " is not the model digest ", DigestHex(model_digest), " (received twice)"));
      }
    }
    report.header_fetched = true;
  }
  // The tensor table, from the verified header (the data section is not read here).
  auto file = gguf::File::Open(report.path);
  if (!file.ok()) return WithContext(file.status(), "the model header the coordinator sent");
  if ((*file)->file_size() != file_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        report.path, ": the header describes a ", (*file)->file_size(), "-byte file, the "
        "coordinator a ", file_size, "-byte one"));
  }
  auto names = ShardTensorNames(**file, LoadOptionsFor(request));
  if (!names.ok()) return WithContext(names.status(), "the model header the coordinator sent");
  auto manifest = Manifest(model_path, *names);
  if (!manifest.ok()) return manifest.status();
  if (manifest->model_digest() != digest_bytes) {
    return absl::AbortedError("the coordinator's model changed during the fetch; load again");
  }

  watched->dir = dir;
  watched->model_path = model_path;
  watched->digest_bytes = digest_bytes;
  watched->device = static_cast<uint64_t>(st.st_dev);
  watched->inode = static_cast<uint64_t>(st.st_ino);

  const std::string journal_path = dir + "/verified";
  absl::flat_hash_map<std::string, Sha256::Digest> verified = ReadVerified(journal_path);
  Fd journal{::open(journal_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)};
  if (journal.fd < 0) return ErrnoError(absl::StrCat(journal_path, ": cannot open"));
  for (int i = 0; i < manifest->tensors_size(); ++i) {
    const std::string& name = manifest->tensors(i).name();
    Sha256::Digest expected;
    DigestFromBytes(manifest->tensors(i).sha256(), &expected);
    const gguf::TensorInfo* t = (*file)->FindTensor(name);
    const uint64_t offset = (*file)->data_offset() + t->offset;
    const std::string what = absl::StrCat("tensor ", name);
    watched->tensors.push_back({name, offset, t->nbytes, expected});
    if (auto it = verified.find(name); it != verified.end() && it->second == expected) {
      auto local = Sha256OfRange(fd.fd, offset, t->nbytes, report.path);
      if (!local.ok()) return local.status();
      if (*local == expected) {
        ++report.tensors_reused;
        continue;
      }
      ++report.tensors_refetched;
    }
    for (int attempt = 0;; ++attempt) {
      auto got = ReadRange(model_path, digest_bytes, fd.fd, offset, t->nbytes, what, &report);
      if (!got.ok()) return got.status();
      if (*got == expected) break;
      if (attempt == 1) {
        return absl::DataLossError(absl::StrCat(
            what, ": the SHA-256 of the bytes received is ", DigestHex(*got),
            ", not the coordinator's ", DigestHex(expected), " (received twice)"));
      }
    }
    ++report.tensors_fetched;
    const std::string line = absl::StrCat(DigestHex(expected), " ", name, "\n");
    if (absl::Status s = WriteAll(journal.fd, line.data(), line.size(), UINT64_MAX,
                                  journal_path);
        !s.ok()) {
      return s;
    }
  }
  return report;
}

std::shared_ptr<wire::ModelSource::StubInterface> MakeModelSourceStub(
    const std::string& address, const ClusterCredentials& credentials) {
  return wire::ModelSource::NewStub(
      grpc::CreateChannel(address, credentials.ChannelCredentials()));
}

std::string DescribeFetch(const FetchReport& r, double seconds) {
  if (r.tensors_fetched == 0 && !r.header_fetched) {
    return absl::StrCat("from the cache ", r.path, ": ", r.tensors_reused,
                        " tensors verified, 0 bytes moved");
  }
  return absl::StrFormat(
      "from the network: %d bytes moved in %.1f s (%d tensors fetched%s, %d reused from the "
      "cache) into %s",
      r.bytes_received, seconds, r.tensors_fetched,
      r.tensors_refetched > 0
          ? absl::StrCat(", ", r.tensors_refetched, " of them to replace corrupted cache copies")
          : "",
      r.tensors_reused, r.path);
}

}  // namespace fucina
