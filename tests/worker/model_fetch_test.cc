// The model transfer between a coordinator and a worker without its filesystem: the worker's
// fetcher (worker/model_fetch.h) against the coordinator's service (coordinator/model_source.h),
// or against a faulty one, over gRPC on 127.0.0.1:0 in this process.
#include "worker/model_fetch.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "coordinator/model_source.h"
#include "models/engine/model.h"
#include "models/gguf/gguf.h"
#include "tests/worker/fixture_model.h"
#include "worker/sampling_wire.h"
#include "worker/worker_actor.h"

namespace fucina {
namespace {

constexpr char kToken[] = "model-fetch-test-token-0123456789";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Serves the manifest through the real service and the bytes itself, with faults on demand:
// corrupted bytes for one file offset, a stream cut after some bytes or some calls, chunks out
// of place, an absurd manifest.
class FaultyModelSource final : public wire::ModelSource::Service {
 public:
  FaultyModelSource(ModelSourceService& real, std::string path)
      : real_(real), path_(std::move(path)) {}

  grpc::Status GetModelManifest(grpc::ServerContext* context,
                                const wire::ModelManifestRequest* request,
                                wire::ModelManifest* response) override {
    grpc::Status s = real_.GetModelManifest(context, request, response);
    if (file_size_override > 0) response->set_file_size(file_size_override);
    return s;
  }

  grpc::Status ReadModelRange(grpc::ServerContext*, const wire::ModelRangeRequest* request,
                              grpc::ServerWriter<wire::ModelChunk>* writer) override {
    if (fail_after_calls >= 0 && calls_.fetch_add(1) >= fail_after_calls) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator going away");
    }
    const std::string bytes = ReadFile(path_);
    constexpr uint64_t kChunk = 100;  // small chunks: cuts fall inside tensors
    for (uint64_t at = request->offset(); at < request->offset() + request->size();) {
      const uint64_t n = std::min(kChunk, request->offset() + request->size() - at);
      if (fail_after_bytes >= 0 && sent_ + static_cast<int64_t>(n) > fail_after_bytes) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator going away");
      }
      wire::ModelChunk chunk;
      chunk.set_offset(misplace_chunks ? at + 1 : at);
      chunk.set_data(bytes.substr(at, n));
      if (corrupt_offset >= at && corrupt_offset < at + n && corruptions > 0) {
        --corruptions;
        (*chunk.mutable_data())[corrupt_offset - at] ^= 0x5a;
      }
      if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
      sent_ += static_cast<int64_t>(n);
      at += n;
    }
    return grpc::Status::OK;
  }

  // Knobs, set before the calls they affect.
  uint64_t corrupt_offset = UINT64_MAX;
  int corruptions = 0;           // how many reads of corrupt_offset are corrupted
  int64_t fail_after_bytes = -1;
  int fail_after_calls = -1;
  bool misplace_chunks = false;
  uint64_t file_size_override = 0;

 private:
  ModelSourceService& real_;
  const std::string path_;
  std::atomic<int> calls_{0};
  int64_t sent_ = 0;
};

class ModelFetchTest : public FixtureModelTest {
 protected:
  static void SetUpTestSuite() { MakeModel("model_fetch", /*init_std=*/0.3); }
  static void TearDownTestSuite() { RemoveModel(); }

  void SetUp() override {
    gate_ = std::make_unique<CallGate>(CallGateOptions{.cluster_token = kToken});
    auto real = ModelSourceService::Create(*path_, *gate_);
    ASSERT_TRUE(real.ok()) << real.status();
    real_ = *std::move(real);
    faulty_ = NewFaulty();
    cache_ = testing::TempDir() + "/model_fetch_cache_" + std::to_string(getpid()) + "_" +
             testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(cache_);
    auto file = gguf::File::Open(*path_);
    ASSERT_TRUE(file.ok());
    original_ = *std::move(file);
  }

  void TearDown() override {
    for (auto& s : servers_) s->Shutdown();
    std::filesystem::remove_all(cache_);
  }

  // Owned here: a service must outlive the servers it is registered with (shut down first).
  FaultyModelSource* NewFaulty() {
    faulties_.push_back(std::make_unique<FaultyModelSource>(*real_, *path_));
    return faulties_.back().get();
  }

  // A server on 127.0.0.1:0 with `service`; its address.
  std::string Serve(grpc::Service* service) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service);
    servers_.push_back(builder.BuildAndStart());
    return "127.0.0.1:" + std::to_string(port);
  }

  std::unique_ptr<ModelFetcher> Fetcher(grpc::Service* service, std::string cache = "") {
    const ClusterCredentials credentials = MakeClusterCredentials(std::nullopt, kToken);
    return std::make_unique<ModelFetcher>(
        MakeModelSourceStub(Serve(service), credentials), credentials,
        ModelFetchOptions{.cache_dir = cache.empty() ? cache_ : cache});
  }

  const gguf::TensorInfo& Tensor(const std::string& name) const {
    const gguf::TensorInfo* t = original_->FindTensor(name);
    EXPECT_NE(t, nullptr) << name;
    return *t;
  }
  uint64_t Offset(const std::string& name) const {
    return original_->data_offset() + Tensor(name).offset;
  }
  uint64_t Bytes(const std::vector<std::string>& names) const {
    uint64_t n = 0;
    for (const std::string& name : names) n += Tensor(name).nbytes;
    return n;
  }
  std::vector<std::string> Needed(const wire::LoadShardRequest& r) const {
    return ShardTensorNames(*original_, LoadOptionsFor(r)).value();
  }
  // The tensors the cache's journal lists as verified.
  std::set<std::string> Verified(const FetchReport& r) const {
    std::set<std::string> out;
    std::ifstream in(std::filesystem::path(r.path).parent_path() / "verified");
    std::string line;
    while (std::getline(in, line)) out.insert(line.substr(65));
    return out;
  }
  std::set<std::string> VerifiedIn(const std::string& cache) const {
    for (const auto& entry : std::filesystem::directory_iterator(cache)) {
      FetchReport r;
      r.path = (entry.path() / "model.gguf").string();
      return Verified(r);
    }
    return {};
  }

  std::unique_ptr<CallGate> gate_;
  std::unique_ptr<ModelSourceService> real_;
  std::vector<std::unique_ptr<FaultyModelSource>> faulties_;
  FaultyModelSource* faulty_ = nullptr;
  std::unique_ptr<gguf::File> original_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::string cache_;
};

TEST_F(ModelFetchTest, FetchesOnlyTheShardsTensors) {
  const wire::LoadShardRequest shard = Shard(0, 0, 2, true, false);
  const std::vector<std::string> needed = Needed(shard);
  std::set<std::string> names(needed.begin(), needed.end());
  EXPECT_TRUE(names.contains("token_embd.weight"));
  EXPECT_TRUE(names.contains("blk.1.ffn_down.weight"));
  EXPECT_FALSE(names.contains("blk.2.attn_q.weight"));
  EXPECT_FALSE(names.contains("output_norm.weight"));

  auto fetcher = Fetcher(real_.get());
  auto report = fetcher->Fetch(shard);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(fetcher->bytes_received(), original_->data_offset() + Bytes(needed));
  EXPECT_EQ(report->bytes_received, fetcher->bytes_received());
  EXPECT_EQ(report->tensors_fetched, static_cast<int>(needed.size()));
  EXPECT_TRUE(report->header_fetched);
  EXPECT_EQ(Verified(*report), names);

  // The original layout: the fetched tensors at their offsets, the others never written.
  const std::string got = ReadFile(report->path), want = ReadFile(*path_);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got.substr(0, original_->data_offset()), want.substr(0, original_->data_offset()));
  for (const gguf::TensorInfo& t : original_->tensors()) {
    const uint64_t at = original_->data_offset() + t.offset;
    if (names.contains(t.name)) {
      EXPECT_EQ(got.substr(at, t.nbytes), want.substr(at, t.nbytes)) << t.name;
    } else {
      EXPECT_EQ(got.substr(at, t.nbytes), std::string(t.nbytes, '\0')) << t.name;
    }
  }
}

TEST_F(ModelFetchTest, TheNextLoadReusesTheCacheWithNothingTransferred) {
  const wire::LoadShardRequest shard = Shard(1, 2, 4, false, true);
  ASSERT_TRUE(Fetcher(real_.get())->Fetch(shard).ok());
  auto again = Fetcher(real_.get());  // a new worker process, the same cache
  auto report = again->Fetch(shard);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(again->bytes_received(), 0u);
  EXPECT_EQ(report->tensors_fetched, 0);
  EXPECT_FALSE(report->header_fetched);
  EXPECT_EQ(report->tensors_reused, static_cast<int>(Needed(shard).size()));
  EXPECT_NE(DescribeFetch(*report, 0).find("from the cache"), std::string::npos);

  // Another shard of the same model fetches only what the cache lacks.
  const wire::LoadShardRequest wider = Shard(0, 1, 4, false, true);
  auto more = again->Fetch(wider);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ(again->bytes_received(), Bytes(ShardTensorNames(*original_, {.first_layer = 1,
                                                                         .last_layer = 2,
                                                                         .embeddings = false,
                                                                         .head = false})
                                               .value()));
}

TEST_F(ModelFetchTest, ACorruptedCachedTensorIsDetectedAndRefetched) {
  const wire::LoadShardRequest shard = Shard(0, 0, 4, true, true);
  auto first = Fetcher(real_.get())->Fetch(shard);
  ASSERT_TRUE(first.ok()) << first.status();
  {
    const int fd = ::open(first->path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const char junk = 0x77;
    ASSERT_EQ(::pwrite(fd, &junk, 1, static_cast<off_t>(Offset("blk.2.attn_v.weight") + 5)), 1);
    ::close(fd);
  }
  auto fetcher = Fetcher(real_.get());
  auto report = fetcher->Fetch(shard);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->tensors_refetched, 1);
  EXPECT_EQ(report->tensors_fetched, 1);
  EXPECT_EQ(fetcher->bytes_received(), Tensor("blk.2.attn_v.weight").nbytes);
  EXPECT_EQ(ReadFile(report->path), ReadFile(*path_));  // every tensor: the whole file
}

TEST_F(ModelFetchTest, WrongBytesAreRetriedOnceThenDataLossNamingTheTensor) {
  const wire::LoadShardRequest shard = Shard(0, 0, 2, true, false);
  faulty_->corrupt_offset = Offset("blk.1.attn_k.weight") + 3;
  faulty_->corruptions = 1;  // once: the retry heals it
  auto healed = Fetcher(faulty_)->Fetch(shard);
  ASSERT_TRUE(healed.ok()) << healed.status();
  EXPECT_EQ(healed->tensors_fetched, static_cast<int>(Needed(shard).size()));

  std::filesystem::remove_all(cache_);
  faulty_->corruptions = 2;  // the retry too
  auto report = Fetcher(faulty_)->Fetch(shard);
  ASSERT_TRUE(absl::IsDataLoss(report.status())) << report.status();
  EXPECT_NE(report.status().message().find("tensor blk.1.attn_k.weight"), std::string::npos)
      << report.status();
  // The tensors verified before it stay; the bad one is not recorded.
  const std::set<std::string> verified = VerifiedIn(cache_);
  EXPECT_FALSE(verified.contains("blk.1.attn_k.weight"));
  EXPECT_TRUE(verified.contains("blk.0.attn_q.weight"));
}

TEST_F(ModelFetchTest, AnInterruptedTransferResumesWithWhatWasVerified) {
  const wire::LoadShardRequest shard = Shard(0, 0, 4, true, true);
  const uint64_t total = original_->data_offset() + Bytes(Needed(shard));
  for (const bool by_calls : {true, false}) {
    SCOPED_TRACE(by_calls ? "cut after 4 ranges" : "cut inside a tensor");
    std::filesystem::remove_all(cache_);
    faulty_ = NewFaulty();
    if (by_calls) {
      faulty_->fail_after_calls = 4;  // the header and 3 tensors
    } else {
      faulty_->fail_after_bytes = static_cast<int64_t>(total / 2);
    }
    auto cut = Fetcher(faulty_);
    auto failed = cut->Fetch(shard);
    ASSERT_TRUE(absl::IsUnavailable(failed.status())) << failed.status();
    EXPECT_NE(failed.status().message().find("coordinator going away"), std::string::npos);
    const std::set<std::string> verified = VerifiedIn(cache_);
    if (by_calls) {
      EXPECT_EQ(verified.size(), 3u);
    }
    ASSERT_FALSE(verified.empty());
    ASSERT_LT(verified.size(), Needed(shard).size());

    auto resumed = Fetcher(real_.get());
    auto report = resumed->Fetch(shard);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->tensors_reused, static_cast<int>(verified.size()));
    EXPECT_FALSE(report->header_fetched);
    EXPECT_EQ(resumed->bytes_received(),
              total - original_->data_offset() -
                  Bytes(std::vector<std::string>(verified.begin(), verified.end())));
    EXPECT_EQ(ReadFile(report->path), ReadFile(*path_));
  }
}

TEST_F(ModelFetchTest, AbsurdAnswersAreRefusedWithAClearError) {
  const wire::LoadShardRequest shard = Shard(0, 0, 2, true, false);
  faulty_->file_size_override = uint64_t{1} << 62;
  auto huge = Fetcher(faulty_)->Fetch(shard);
  EXPECT_TRUE(absl::IsInvalidArgument(huge.status())) << huge.status();
  EXPECT_NE(huge.status().message().find("-byte model file"), std::string::npos);

  faulty_->file_size_override = 0;
  faulty_->misplace_chunks = true;
  auto misplaced = Fetcher(faulty_)->Fetch(shard);
  EXPECT_TRUE(absl::IsInvalidArgument(misplaced.status())) << misplaced.status();
  EXPECT_NE(misplaced.status().message().find("expected a non-empty chunk at 0"),
            std::string::npos)
      << misplaced.status();
}

TEST_F(ModelFetchTest, TheSourceServesOnlyItsModelAndOnlyToTheCluster) {
  const ClusterCredentials good = MakeClusterCredentials(std::nullopt, kToken);
  auto stub = MakeModelSourceStub(Serve(real_.get()), good);
  auto call = [&](const ClusterCredentials& credentials, const std::string& path,
                  uint64_t offset, uint64_t size) {
    grpc::ClientContext ctx;
    credentials.Prepare(&ctx);
    wire::ModelRangeRequest r;
    r.set_model_path(path);
    r.set_model_digest(std::string(reinterpret_cast<const char*>(real_->model_digest().data()),
                                   Sha256::kDigestSize));
    r.set_offset(offset);
    r.set_size(size);
    auto reader = stub->ReadModelRange(&ctx, r);
    wire::ModelChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  };
  EXPECT_TRUE(call(good, *path_, 0, 16).ok());
  EXPECT_EQ(call(good, "/etc/passwd", 0, 16).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(call(good, *path_, original_->file_size() - 4, 5).error_code(),
            grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(call(good, *path_, UINT64_MAX, 2).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(call(MakeClusterCredentials(std::nullopt, ""), *path_, 0, 16).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(ModelFetchTest, AWorkerLoadingTheFetchedCacheComputesWhatTheFileGives) {
  // Three stages from the original file, three from their own caches (the middle one holds
  // neither the embeddings nor the head: its cache has no token_embd at all).
  const wire::LoadShardRequest shards[] = {Shard(0, 0, 1, true, false),
                                           Shard(1, 1, 3, false, false),
                                           Shard(2, 3, 4, false, true)};
  std::vector<std::unique_ptr<WorkerActor>> from_file, fetched;
  std::vector<std::unique_ptr<ModelFetcher>> fetchers;
  for (int i = 0; i < 3; ++i) {
    fetchers.push_back(Fetcher(real_.get(), cache_ + "/worker" + std::to_string(i)));
    WorkerOptions options{.threads = 1};
    ModelFetcher* fetcher = fetchers.back().get();
    options.locate_model = [fetcher](const wire::LoadShardRequest& r)
        -> absl::StatusOr<std::string> {
      auto report = fetcher->Fetch(r);
      if (!report.ok()) return report.status();
      return report->path;
    };
    from_file.push_back(std::make_unique<WorkerActor>(WorkerOptions{.threads = 1}));
    fetched.push_back(std::make_unique<WorkerActor>(options));
    ASSERT_TRUE(from_file.back()->LoadShard(shards[i]).ok());
    auto loaded = fetched.back()->LoadShard(shards[i]);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
  }
  EXPECT_LT(fetchers[1]->bytes_received() + Tensor("token_embd.weight").nbytes,
            original_->file_size());
  std::vector<int32_t> ids = {5, 17, 99, 3};
  int64_t pos0 = 0;
  for (int step = 0; step < 4; ++step) {
    wire::ForwardRequest f;
    wire::Segment* seg = f.add_segments();
    seg->set_session_id(1);
    seg->set_pos0(pos0);
    for (int32_t id : ids) seg->add_token_ids(id);
    if (step == 0) {
      SamplingParams greedy;
      greedy.temperature = 0;
      *seg->mutable_sampling() = SamplingToWire(greedy);
    }
    wire::ForwardRequest g = f;
    for (int stage = 0; stage < 3; ++stage) {
      f.set_stage(stage);
      g.set_stage(stage);
      auto a = from_file[stage]->Forward(f);
      auto b = fetched[stage]->Forward(g);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      if (stage < 2) {
        EXPECT_EQ(a->activations().data(), b->activations().data())
            << "step " << step << " stage " << stage;
        *f.mutable_activations() = a->activations();
        *g.mutable_activations() = b->activations();
        continue;
      }
      ASSERT_EQ(a->results_size(), 1);
      ASSERT_EQ(b->results_size(), 1);
      EXPECT_EQ(a->results(0).token(), b->results(0).token()) << "step " << step;
      EXPECT_EQ(a->results(0).logprob(), b->results(0).logprob());
      pos0 += static_cast<int64_t>(ids.size());
      ids = {a->results(0).token()};
    }
  }
}

// A worker's locate_model through `fetcher`, remembering the cached file it gave in `*cached`.
std::function<absl::StatusOr<std::string>(const wire::LoadShardRequest&)> LocateThrough(
    ModelFetcher* fetcher, std::string* cached) {
  return [fetcher, cached](const wire::LoadShardRequest& r) -> absl::StatusOr<std::string> {
    auto report = fetcher->Fetch(r);
    if (!report.ok()) return report.status();
    *cached = report->path;
    return report->path;
  };
}

// Writes `n` bytes of 0x7f at `offset` of `path`, as a stray write would leave.
void Scribble(const std::string& path, uint64_t offset, uint64_t n) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  const std::string junk(n, '\x7f');
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), static_cast<off_t>(offset)),
            static_cast<ssize_t>(junk.size()));
  ::close(fd);
}

// One greedy step of the whole model on `actor` (one stage) for a new session: the token and
// its logprob.
std::pair<int32_t, float> GreedyStep(WorkerActor& actor, uint64_t session) {
  wire::ForwardRequest f;
  f.set_stage(0);
  wire::Segment* seg = f.add_segments();
  seg->set_session_id(session);
  seg->set_pos0(0);
  for (int32_t id : {5, 17, 99, 3}) seg->add_token_ids(id);
  SamplingParams greedy;
  greedy.temperature = 0;
  *seg->mutable_sampling() = SamplingToWire(greedy);
  auto r = actor.Forward(f);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok() || r->results_size() != 1) return {-1, 0};
  return {r->results(0).token(), r->results(0).logprob()};
}

TEST_F(ModelFetchTest, ATensorChangedAfterTheLoadIsRewrittenWhileTheShardServes) {
  const wire::LoadShardRequest shard = Shard(0, 0, 4, true, true);
  auto fetcher = std::make_unique<ModelFetcher>(
      MakeModelSourceStub(Serve(real_.get()), MakeClusterCredentials(std::nullopt, kToken)),
      MakeClusterCredentials(std::nullopt, kToken),
      ModelFetchOptions{.cache_dir = cache_, .recheck_bytes_per_second = 1 << 30});
  WorkerOptions options{.threads = 1};
  ModelFetcher* f = fetcher.get();
  std::string cached;
  options.locate_model = LocateThrough(f, &cached);
  WorkerActor reference(WorkerOptions{.threads = 1}), served(options);
  ASSERT_TRUE(reference.LoadShard(shard).ok());
  auto loaded = served.LoadShard(shard);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::pair<int32_t, float> want = GreedyStep(reference, 1);
  EXPECT_EQ(GreedyStep(served, 1), want);

  // Garbage over a stretch of a tensor of the loaded cache, as a stray write would leave.
  const std::string name = "blk.1.ffn_down.weight";
  const std::string original = ReadFile(*path_).substr(Offset(name), Tensor(name).nbytes);
  Scribble(cached, Offset(name), std::min<uint64_t>(256, Tensor(name).nbytes));
  // The background recheck finds it and writes the coordinator's bytes back in place.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (f->tensors_repaired() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(f->tensors_repaired(), 1);
  EXPECT_EQ(ReadFile(cached).substr(Offset(name), Tensor(name).nbytes), original);
  // The shard, never reloaded, computes what the file gives again.
  EXPECT_EQ(GreedyStep(served, 2), want);
}

TEST_F(ModelFetchTest, RecheckAllRewritesOnlyWhatChanged) {
  const wire::LoadShardRequest shard = Shard(0, 0, 4, true, true);
  auto fetcher = std::make_unique<ModelFetcher>(
      MakeModelSourceStub(Serve(faulty_), MakeClusterCredentials(std::nullopt, kToken)),
      MakeClusterCredentials(std::nullopt, kToken),
      ModelFetchOptions{.cache_dir = cache_, .recheck_bytes_per_second = 0});
  WorkerOptions options{.threads = 1};
  std::string cached;
  options.locate_model = LocateThrough(fetcher.get(), &cached);
  WorkerActor reference(WorkerOptions{.threads = 1}), served(options);
  ASSERT_TRUE(reference.LoadShard(shard).ok());
  auto loaded = served.LoadShard(shard);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::pair<int32_t, float> want = GreedyStep(reference, 1);
  EXPECT_EQ(*fetcher->RecheckAll(), 0);
  const uint64_t received = fetcher->bytes_received();
  const std::string name = "blk.3.ffn_down.weight";
  Scribble(cached, Offset(name), std::min<uint64_t>(4096, Tensor(name).nbytes));
  // (The fixture's f32 weights are copied at load, so this shard does not see the change;
  // SmolLM2's quantized ones are read from the mapping: tests/cluster/model_fetch_cli_test.py.)
  EXPECT_EQ(*fetcher->RecheckAll(), 1);
  EXPECT_EQ(fetcher->bytes_received() - received, Tensor(name).nbytes);
  EXPECT_EQ(ReadFile(cached).substr(Offset(name), Tensor(name).nbytes),
            ReadFile(*path_).substr(Offset(name), Tensor(name).nbytes));
  EXPECT_EQ(GreedyStep(served, 3), want);
  EXPECT_EQ(*fetcher->RecheckAll(), 0);
  // A coordinator sending wrong bytes twice: DATA_LOSS naming the tensor.
  {
    const int fd = ::open(cached.c_str(), O_RDWR);
    const char junk = 0x33;
    ASSERT_EQ(::pwrite(fd, &junk, 1, static_cast<off_t>(Offset(name) + 7)), 1);
    ::close(fd);
  }
  faulty_->corrupt_offset = Offset(name) + 1;
  faulty_->corruptions = 2;
  auto failed = fetcher->RecheckAll();
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(failed.status().message().find(name), std::string::npos) << failed.status();
}

TEST_F(ModelFetchTest, ACacheDeletedUnderTheShardIsNoLongerRechecked) {
  auto fetcher = std::make_unique<ModelFetcher>(
      MakeModelSourceStub(Serve(real_.get()), MakeClusterCredentials(std::nullopt, kToken)),
      MakeClusterCredentials(std::nullopt, kToken),
      ModelFetchOptions{.cache_dir = cache_, .recheck_bytes_per_second = 0});
  const wire::LoadShardRequest shard = Shard(0, 0, 2, true, false);
  ASSERT_TRUE(fetcher->Fetch(shard).ok());
  // An operator clears the cache: the mapping keeps the old file alive, but no path reaches
  // it any more, so there is nothing to hash or repair (and no error to repeat every sweep).
  std::filesystem::remove_all(cache_);
  auto none = fetcher->RecheckAll();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, 0);
  // The next load fetches afresh and is rechecked again.
  auto report = fetcher->Fetch(shard);
  ASSERT_TRUE(report.ok()) << report.status();
  const std::string name = "blk.0.attn_k.weight";
  {
    const int fd = ::open(report->path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const char junk = 0x33;
    ASSERT_EQ(::pwrite(fd, &junk, 1, static_cast<off_t>(Offset(name) + 7)), 1);
    ::close(fd);
  }
  EXPECT_EQ(*fetcher->RecheckAll(), 1);
}

}  // namespace
}  // namespace fucina
