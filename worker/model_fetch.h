// A worker's copy of the coordinator's model file, for workers without a shared filesystem:
// the tensors a shard reads are streamed from the coordinator (fucina.cluster.v1.ModelSource)
// into a local cache and checked, tensor by tensor, against the coordinator's SHA-256.
//
// Cache layout, under the cache directory (`fucina worker --model-cache`, default
// $FUCINA_CACHE/model-cache):
//   <model digest hex>/model.gguf  the original file's layout: the header, then each fetched
//                                  tensor at its own offset in a sparse file of the original
//                                  size (the other tensors are holes no shard reads; see
//                                  ShardTensorNames)
//   <model digest hex>/verified    one line per tensor verified: "<sha256 hex> <name>"
//   <model digest hex>/lock        flock'd during a fetch (workers sharing a cache take turns)
// The model digest is the SHA-256 of the header bytes, so a file with another layout gets
// another folder; tensors are reused only when the coordinator's digest equals the recorded one
// and the bytes on disk still hash to it (a corrupted cache is refetched, not trusted). A
// transfer cut short keeps every tensor verified so far: the next load continues from there.
//
// After the load the worker serves from a mapping of that file, so bytes changed in it later
// (a stray write, a failing disk under the page cache) would be served as they are. A
// background thread therefore hashes every tensor fetched or reused again, one tensor at a
// time and at most `recheck_bytes_per_second` (the sweep over a shard takes its size over that
// rate, at least a second), and writes a tensor whose bytes no longer match back in place from
// the coordinator: the mapping shares the file's pages, so the served model is whole again
// without a reload. Nothing is added to a load; the cost is that rate of SHA-256 (a few percent
// of a core at the default) and the exposure one sweep.
//
// Threading: Fetch is called from one thread at a time (the worker actor's executor); the
// recheck thread takes turns with it (a mutex, and the cache folder's lock across processes).
#ifndef FUCINA_WORKER_MODEL_FETCH_H_
#define FUCINA_WORKER_MODEL_FETCH_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "fucina/cluster/v1/worker.grpc.pb.h"
#include "worker/cluster_auth.h"
#include "worker/file_digest.h"
#include "worker/worker_client.h"

namespace fucina {

struct ModelFetchOptions {
  std::string cache_dir;               // created when missing
  int64_t max_bytes_per_second = 0;    // 0: as fast as the network goes
  int manifest_deadline_ms = 600'000;  // hashing a large model's tensors on first request
  // A tensor's stream may take this long plus 1 s per MiB (slower: DEADLINE_EXCEEDED).
  int range_deadline_ms = 60'000;
  // Rate of the background re-hash of fetched tensors (see above); 0: none.
  int64_t recheck_bytes_per_second = 32 << 20;
};

// What one Fetch did, for the worker's log line.
struct FetchReport {
  std::string path;              // the local file to load
  int tensors_reused = 0;        // verified in the cache, not transferred
  int tensors_fetched = 0;
  int tensors_refetched = 0;     // of those, cached ones whose bytes no longer matched
  uint64_t bytes_received = 0;   // tensor and header bytes transferred
  bool header_fetched = false;
};

class ModelFetcher {
 public:
  // `stub` reaches the coordinator's ModelSource; every call carries `credentials`' token.
  ModelFetcher(std::shared_ptr<::fucina::cluster::v1::ModelSource::StubInterface> stub,
               ClusterCredentials credentials, ModelFetchOptions options);
  // Stops the recheck thread (waiting for the tensor it is on).
  ~ModelFetcher();

  // The local path of a file holding the header and every tensor `request`'s shard reads,
  // each verified. Errors: DATA_LOSS naming the tensor when its bytes fail the checksum twice;
  // INVALID_ARGUMENT when the coordinator's answer is absurd (a file over 1 PiB, a header
  // outside the file, a digest of the wrong length, chunks out of place); the coordinator's
  // own status (UNAVAILABLE when it went away mid-transfer: what was verified stays cached).
  absl::StatusOr<FetchReport> Fetch(const wire::LoadShardRequest& request);

  // Bytes transferred by every Fetch so far (and by repairs).
  uint64_t bytes_received() const { return bytes_received_.load(); }

  // One sweep of the recheck now, without pauses: every tensor fetched or reused so far is
  // hashed, and those that no longer match are fetched again in place. Returns how many were.
  // A model whose cache file was deleted or replaced since its loads is dropped from the
  // recheck (its mapping cannot be reached by path). The background thread does the same at
  // its rate; a health check may call this.
  absl::StatusOr<int> RecheckAll();
  // Tensors rewritten by rechecks so far.
  int tensors_repaired() const { return tensors_repaired_.load(); }

 private:
  struct WatchedTensor {
    std::string name;
    uint64_t offset = 0, size = 0;
    Sha256::Digest expected{};
  };
  // The cached tensors of one model (one cache folder) that loads have used.
  struct Watched {
    std::string dir;          // the cache folder (its lock) and model.gguf inside
    std::string model_path;   // the coordinator's, for a repair
    std::string digest_bytes;
    uint64_t device = 0, inode = 0;  // of the model.gguf loads mapped
    std::vector<WatchedTensor> tensors;
  };
  enum class RecheckOutcome {
    kSame,      // the bytes still match
    kRepaired,  // they did not; the coordinator's are back in place
    kBusy,      // another process fetches into the folder: try again next sweep
    kGone,      // the file the loads mapped is no longer at its path: nothing to repair
  };

  absl::StatusOr<FetchReport> FetchLocked(const wire::LoadShardRequest& request,
                                          Watched* watched);
  // Hashes tensor `index` of `w` and rewrites it from the coordinator when it changed. With
  // `wait`, waits for another process's fetch into the folder instead of answering kBusy.
  // Called with mu_ held.
  absl::StatusOr<RecheckOutcome> Recheck(const Watched& w, size_t index, bool wait);
  void RecheckLoop();

  // The coordinator's manifest with the digests of `tensors`, checked for sense.
  absl::StatusOr<::fucina::cluster::v1::ModelManifest> Manifest(
      const std::string& model_path, const std::vector<std::string>& tensors);
  // Streams file bytes [offset, offset + size) into `fd` at the same offset, hashing as it
  // goes; OK with the digest of what arrived (the caller compares). `what` names the range in
  // errors; bytes are counted into `report`.
  absl::StatusOr<Sha256::Digest> ReadRange(const std::string& model_path,
                                           const std::string& digest, int fd, uint64_t offset,
                                           uint64_t size, const std::string& what,
                                           FetchReport* report);

  std::shared_ptr<::fucina::cluster::v1::ModelSource::StubInterface> stub_;
  const ClusterCredentials credentials_;
  const ModelFetchOptions options_;
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<int> tensors_repaired_{0};
  std::chrono::steady_clock::time_point fetch_start_;  // of the Fetch running (rate limit)

  std::mutex mu_;  // held by a Fetch and by each recheck step
  std::vector<Watched> watched_;  // guarded by mu_
  std::condition_variable wake_;
  bool stopping_ = false;  // guarded by mu_
  std::thread recheck_;    // started by the first successful Fetch
};

// A ModelSource stub for the coordinator at `address`, dialled with `credentials`' channel
// credentials (the token is added per call by ModelFetcher).
std::shared_ptr<::fucina::cluster::v1::ModelSource::StubInterface> MakeModelSourceStub(
    const std::string& address, const ClusterCredentials& credentials);

// One line for the worker's log: where the shard's model came from and how many bytes moved.
std::string DescribeFetch(const FetchReport& report, double seconds);

}  // namespace fucina

#endif  // FUCINA_WORKER_MODEL_FETCH_H_
