#include "worker/worker_actor.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <limits>
#include <span>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "models/engine/model_size.h"
#include "models/speculative/verify.h"
#include "worker/activations.h"
#include "worker/forward_reply.h"
#include "worker/remote_experts.h"
#include "worker/sampling_wire.h"

namespace fucina {

WorkerActor::WorkerActor(const WorkerOptions& options, PeerResolver resolver)
    : options_(options),
      resolver_(std::move(resolver)),
      max_threads_(options.threads > 0 ? options.threads : ThreadPool::Default().num_threads()),
      pool_(std::make_unique<ThreadPool>(max_threads_)) {
  if (!resolver_) {
    resolver_ = [](const wire::Peer& peer) -> std::shared_ptr<WorkerClient> {
      return MakeGrpcWorkerClient(peer.address(), ClusterCredentials{});
    };
  }
}

WorkerActor::~WorkerActor() {
  // The train calls still running off the executor post to it: they end before it goes. Joined
  // outside the lock: a finishing call's `done` may start another.
  for (;;) {
    std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> running;
    {
      std::lock_guard<std::mutex> lock(off_mu_);
      running.swap(off_threads_);
    }
    if (running.empty()) return;
    for (auto& [thread, finished] : running) thread.join();
  }
}

void WorkerActor::LoadShardAsync(wire::LoadShardRequest request, LoadShardCallback done) {
  executor_.Post([this, request = std::move(request), done = std::move(done)] {
    done(DoLoadShard(request));
  });
}

void WorkerActor::CancelInFlight() {
  // Not through the executor: the call to cut is the one occupying it.
  std::vector<std::shared_ptr<WorkerClient>> peers;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    peers = peers_;
  }
  for (const auto& peer : peers) peer->CancelInFlight();
}

void WorkerActor::ForwardAsync(wire::ForwardRequest request, ForwardCallback done) {
  const auto arrived = StepLaps::Clock::now();
  const bool decode = IsDecodeStep(request);
  // The reply, with the step's time from its arrival here added to `served`.
  done = [times = step_times_, decode, arrived, done = std::move(done)](
             absl::StatusOr<wire::ForwardResponse> reply) {
    StepTimes t;
    t.served = Seconds(StepLaps::Clock::now() - arrived);
    times->Add(decode, t);
    done(std::move(reply));
  };
  executor_.Post([this, decode, arrived, request = std::move(request),
                  done = std::move(done)]() mutable {
    StepLaps laps(arrived);
    laps.Lap(&StepTimes::queue);
    auto reply = DoForward(request, laps);
    // The next stage gets the rows that ran here, and the session operations in any case.
    if (!reply.ok() || next_stage_ == nullptr ||
        (!reply->has_activations() && request.session_ops_size() == 0)) {
      step_times_->Add(decode, laps.times());
      done(std::move(reply));
      return;
    }
    // Hand the rows to the next stage and free the executor for the next step: the reply to
    // our caller is the next stage's, re-indexed, and comes on that call's thread.
    wire::ForwardRequest next;
    next.set_stage(request.stage() + 1);
    std::vector<bool> failed(request.segments_size(), false);
    for (const wire::SegmentError& e : reply->errors()) failed[e.index()] = true;
    std::vector<int> index;  // next's segment j is request's index[j]
    for (int i = 0; i < request.segments_size(); ++i) {
      if (failed[i]) continue;
      index.push_back(i);
      *next.add_segments() = std::move(*request.mutable_segments(i));
    }
    if (reply->has_activations()) {
      *next.mutable_activations() = std::move(*reply->mutable_activations());
    }
    *next.mutable_session_ops() = std::move(*request.mutable_session_ops());
    const auto sent = StepLaps::Clock::now();
    next_stage_->ForwardAsync(
        std::move(next),
        [own = std::move(*reply), index = std::move(index), next_id = shard_.next_stage().worker_id(),
         times = step_times_, decode, sent, done = std::move(done)](
            absl::StatusOr<wire::ForwardResponse> later) mutable {
          StepTimes t;
          t.chain = Seconds(StepLaps::Clock::now() - sent);
          times->Add(decode, t);
          done(MergeChainReply(std::move(own), index, next_id, std::move(later)));
        });
    laps.Lap(&StepTimes::send);
    step_times_->Add(decode, laps.times());
  });
}

void WorkerActor::ExpertForwardAsync(wire::ExpertForwardRequest request,
                                     Callback<wire::ExpertForwardResponse> done) {
  executor_.Post([this, request = std::move(request), done = std::move(done)] {
    done(DoExpertForward(request));
  });
}

void WorkerActor::GetStatsAsync(Callback<wire::WorkerStats> done) {
  const int depth = executor_.pending();
  executor_.Post([this, depth, done = std::move(done)] {
    wire::WorkerStats stats = DoStats();
    stats.set_queue_depth(depth);
    done(std::move(stats));
  });
}

void WorkerActor::OffExecutor(std::function<void()> body) {
  std::lock_guard<std::mutex> lock(off_mu_);
  std::erase_if(off_threads_, [](auto& t) {
    if (!*t.second) return false;
    t.first.join();
    return true;
  });
  auto finished = std::make_shared<std::atomic<bool>>(false);
  off_threads_.emplace_back(
      std::thread([scope = CallScope::Current(), body = std::move(body), finished] {
        {
          CallScope::Enter enter(scope);
          body();
        }
        *finished = true;
      }),
      finished);
}

int64_t WorkerActor::UsedBytes() const {
  int64_t total = weight_bytes_ + KvBytes();
  for (const auto& [id, job] : es_jobs_) total += ReplicaBytes(*job.replica);
  return total;
}

int64_t WorkerActor::FreeBudgetBytes() const {
  if (options_.memory_budget <= 0) return std::numeric_limits<int64_t>::max() / 4;
  return std::max<int64_t>(0, options_.memory_budget - UsedBytes());
}

int64_t WorkerActor::KvBytes() const {
  int64_t total = 0;
  for (const auto& [id, s] : sessions_) total += static_cast<int64_t>(s.kv->bytes());
  return total;
}

wire::WorkerStats WorkerActor::DoStats() const {
  wire::WorkerStats stats;
  stats.set_memory_budget(options_.memory_budget);
  stats.set_threads(pool_->num_threads());
  stats.set_weight_bytes(weight_bytes_);
  stats.set_kv_bytes(KvBytes());
  stats.set_sessions(static_cast<int32_t>(sessions_.size()));
  stats.set_forwarded_positions(forwarded_positions_);
  stats.set_expert_tokens(expert_tokens_);
  stats.set_activation_bytes_in(activation_bytes_in_);
  stats.set_activation_bytes_out(activation_bytes_out_);
  std::vector<std::pair<uint64_t, int64_t>> ids;
  for (const auto& [id, s] : sessions_) ids.emplace_back(id, s.kv->len());
  std::sort(ids.begin(), ids.end());
  for (const auto& [id, len] : ids) {
    stats.add_session_ids(static_cast<int64_t>(id));
    stats.add_session_lengths(len);
  }
  for (int64_t n : expert_counts_) stats.add_expert_token_counts(n);
  step_times_->ToWire(&stats);
  return stats;
}

namespace {

// A cgroup's memory limit in bytes, or 0 where none is set or none can be read: v2's
// memory.max ("max" when unlimited), else v1's memory.limit_in_bytes (a huge number then).
int64_t CgroupMemoryLimit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max",
                           "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::FILE* f = std::fopen(path, "r");
    if (f == nullptr) continue;
    char line[64] = {};
    const bool read = std::fgets(line, sizeof(line), f) != nullptr;
    std::fclose(f);
    if (!read) continue;
    int64_t bytes = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &bytes) && bytes > 0 &&
        bytes < (int64_t{1} << 60)) {
      return bytes;
    }
    return 0;  // "max", or v1's "unlimited" sentinel
  }
  return 0;
}

}  // namespace

int64_t DefaultMemoryBudget(int64_t cgroup_limit, int64_t physical) {
  int64_t limit = physical > 0 ? physical : 0;
  if (cgroup_limit > 0 && (limit == 0 || cgroup_limit < limit)) limit = cgroup_limit;
  return limit / 5 * 4;
}

int64_t DefaultMemoryBudget() {
  const int64_t pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return DefaultMemoryBudget(CgroupMemoryLimit(), pages > 0 && page > 0 ? pages * page : 0);
}

LoadOptions LoadOptionsFor(const wire::LoadShardRequest& request) {
  LoadOptions options;
  options.first_layer = request.first_layer();
  options.last_layer = request.last_layer();
  options.embeddings = request.embeddings();
  options.head = request.head();
  options.experts_only = request.stage() < 0;
  return options;
}

void WorkerActor::ClearShard() {
  sessions_.clear();
  next_stage_.reset();
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    peers_.clear();
  }
  model_.reset();  // before the expert FFN it points to
  remote_experts_.reset();
  shard_ = wire::LoadShardRequest();
  weight_bytes_ = kv_bytes_per_session_ = 0;
  expert_counts_.clear();
  grammar_vocab_.reset();
}

absl::StatusOr<wire::LoadShardResponse> WorkerActor::DoLoadShard(
    const wire::LoadShardRequest& request) {
  // The old shard and its sessions go first: the new one may need their memory.
  ClearShard();
  absl::StatusOr<wire::LoadShardResponse> loaded = LoadNewShard(request);
  // A load that failed part way leaves no shard: no peers for CancelInFlight to reach, no
  // weights counted against the budget, nothing pointing into the model it built.
  if (!loaded.ok()) ClearShard();
  return loaded;
}

absl::StatusOr<wire::LoadShardResponse> WorkerActor::LoadNewShard(
    const wire::LoadShardRequest& request) {
  auto cache_type = ParseKvCacheType(request.cache_type().empty() ? "f16" : request.cache_type());
  if (!cache_type.ok()) return cache_type.status();
  if (request.context() <= 0 || request.context() > kMaxContext) {
    return absl::InvalidArgumentError(absl::StrCat("context must be in [1, ", kMaxContext,
                                                   "], got ", request.context()));
  }
  const LoadOptions options = LoadOptionsFor(request);
  std::string path = request.model_path();
  if (options_.locate_model) {
    auto located = options_.locate_model(request);
    if (!located.ok()) return located.status();
    path = *std::move(located);
  }
  auto file = gguf::File::Open(path);
  if (!file.ok()) return file.status();
  const int threads = request.threads() > 0 ? std::min(request.threads(), max_threads_)
                                            : max_threads_;
  if (threads != pool_->num_threads()) pool_ = std::make_unique<ThreadPool>(threads);
  auto model = Model::FromFile(*std::move(file), options, *pool_);
  if (!model.ok()) return model.status();
  if (!request.adapter_path().empty() && !options.experts_only) {
    // Not fetched from the coordinator like the model: a worker without the file says so.
    if (absl::Status s = (*model)->LoadLora(request.adapter_path()); !s.ok()) {
      return absl::Status(s.code() == absl::StatusCode::kNotFound
                              ? absl::StatusCode::kFailedPrecondition
                              : s.code(),
                          absl::StrCat("adapter: ", s.message()));
    }
  }
  const ModelConfig& c = (*model)->config();
  if (!options.experts_only) {
    if (absl::Status s = (*model)->CheckKvType(*cache_type); !s.ok()) return s;
  }
  const ModelSize size = MeasureModel((*model)->file(), c);
  const int64_t first = (*model)->first_layer(), last = (*model)->last_layer();
  if (options.experts_only) {
    weight_bytes_ = size.ExpertBytes(first, last, request.serve_experts_size());
  } else {
    int64_t remote = 0;
    for (const wire::Peer& peer : request.expert_peers()) remote += peer.experts_size();
    weight_bytes_ = size.StageBytes(first, last, c.num_experts - remote, request.embeddings(),
                                    request.head());
    kv_bytes_per_session_ = KvBytesPerSession(c, first, last, request.context(), *cache_type);
  }
  if (options_.memory_budget > 0 && weight_bytes_ > options_.memory_budget) {
    return absl::ResourceExhaustedError(absl::StrCat("shard needs ", weight_bytes_,
                                                     " bytes of weights; budget is ",
                                                     options_.memory_budget));
  }
  if (options_.memory_budget > 0 &&
      kv_bytes_per_session_ > options_.memory_budget - weight_bytes_) {
    // Refused here rather than at the first session: a shard that can hold none serves nothing.
    return absl::ResourceExhaustedError(absl::StrCat(
        "context ", request.context(), " needs ", kv_bytes_per_session_,
        " bytes of KV cache for one session; the memory budget (", options_.memory_budget,
        ") leaves ", options_.memory_budget - weight_bytes_, " after the weights"));
  }
  expert_counts_.assign(c.num_experts, 0);
  if (request.expert_peers_size() > 0 && !c.IsMoe()) {
    return absl::InvalidArgumentError("expert peers for a dense model");
  }
  // Built here and kept only once the whole shard is: a failure below drops them with the model.
  std::unique_ptr<RemoteExperts> remote;
  std::vector<std::shared_ptr<WorkerClient>> all_peers;  // expert peers, then the next stage
  if (c.IsMoe() && !options.experts_only) {
    // Experts go through RemoteExperts even when all are local, so they are counted.
    std::vector<int> owner(c.num_experts, -1);
    std::vector<std::shared_ptr<WorkerClient>> peers;
    std::vector<std::string> names;
    for (const wire::Peer& peer : request.expert_peers()) {
      names.push_back(absl::StrCat(peer.worker_id(), peer.address().empty() ? "" : " at ",
                                   peer.address()));
      for (int32_t e : peer.experts()) {
        if (e < 0 || e >= c.num_experts) {
          return absl::InvalidArgumentError(absl::StrCat("expert peer lists expert ", e,
                                                         " outside [0, ", c.num_experts, ")"));
        }
        owner[e] = static_cast<int>(peers.size());
      }
      auto client = resolver_(peer);
      if (client == nullptr) {
        return absl::InvalidArgumentError("cannot reach expert peer " + peer.worker_id() + " " +
                                          peer.address());
      }
      peers.push_back(std::move(client));
    }
    all_peers = peers;
    remote = std::make_unique<RemoteExperts>(**model, std::move(peers), std::move(names),
                                             std::move(owner), &expert_counts_);
    (*model)->SetExpertFfn(remote.get());
  }
  std::shared_ptr<WorkerClient> next_stage;
  if (request.has_next_stage()) {
    if ((*model)->has_head() || options.experts_only) {
      return absl::InvalidArgumentError("only a stage before the last has a next stage");
    }
    next_stage = resolver_(request.next_stage());
    if (next_stage == nullptr) {
      return absl::InvalidArgumentError("cannot reach next stage " +
                                        request.next_stage().worker_id() + " " +
                                        request.next_stage().address());
    }
    all_peers.push_back(next_stage);
  }
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    peers_ = std::move(all_peers);
  }
  next_stage_ = std::move(next_stage);
  remote_experts_ = std::move(remote);
  model_ = *std::move(model);
  grammar_vocab_.reset();  // another model's tokens
  shard_ = request;
  wire::LoadShardResponse response;
  response.set_weight_bytes(weight_bytes_);
  response.set_kv_bytes_per_session(kv_bytes_per_session_);
  return response;
}

absl::StatusOr<wire::ForwardResponse> WorkerActor::DoForward(
    const wire::ForwardRequest& request, StepLaps& laps) {
  // A worker without the shard the plan gave it (it restarted, or a load failed) cannot serve
  // until a re-plan: the worker's failure.
  if (model_ == nullptr || model_->experts_only()) {
    return WorkerDeclaredFailure(
        absl::FailedPreconditionError("this worker holds no pipeline stage"));
  }
  if (request.stage() != shard_.stage()) {
    return RequestFailure(absl::InvalidArgumentError(absl::StrCat(
        "stage ", request.stage(), " is not this worker's stage ", shard_.stage())));
  }
  // A model file truncated while served must fail the step, not SIGBUS the process.
  if (absl::Status s = model_->file().CheckMappedIntact(); !s.ok()) {
    return WorkerDeclaredFailure(s);
  }
  const ModelConfig& c = model_->config();
  const int64_t hidden = c.hidden;
  const bool first = model_->has_embeddings();
  if (first && request.has_activations()) {
    return RequestFailure(
        absl::InvalidArgumentError("stage 0 embeds tokens and takes no activations"));
  }
  if (!first && request.segments_size() > 0 && !request.has_activations()) {
    return RequestFailure(absl::InvalidArgumentError("this stage needs activations"));
  }
  // The session operations first, in order: a release frees budget for the step's new
  // sessions, a copy or truncation prepares the session a segment then extends. A failed one
  // fails the segments of its session (below); the rest go on.
  wire::ForwardResponse response;
  absl::flat_hash_map<uint64_t, absl::Status> failed_sessions;
  for (int i = 0; i < request.session_ops_size(); ++i) {
    const wire::SessionOp& op = request.session_ops(i);
    if (absl::Status s = ApplySessionOp(op); !s.ok()) {
      wire::SessionOpError* e = response.add_op_errors();
      e->set_index(i);
      e->set_code(static_cast<int>(s.code()));
      e->set_message(std::string(s.message()));
      failed_sessions.try_emplace(SessionOpTarget(op), std::move(s));
    } else if (op.kind_case() != wire::SessionOp::kRelease) {
      failed_sessions.erase(SessionOpTarget(op));  // a later op made it whole again
    }
  }
  laps.Lap(&StepTimes::session_ops);
  int64_t total_rows = 0;
  for (const wire::Segment& seg : request.segments()) total_rows += seg.token_ids_size();
  const int64_t free_bytes = FreeBudgetBytes();
  if (!first && total_rows * hidden * static_cast<int64_t>(sizeof(float)) > free_bytes) {
    return RequestFailure(absl::ResourceExhaustedError(absl::StrCat(
        "activations: ", total_rows, " rows of ", hidden, " floats exceed the ", free_bytes,
        " bytes of the memory budget that are free")));
  }
  // Reused across steps (decode runs every token): grown, never shrunk.
  StepBuffers& b = buffers_;
  std::vector<float>& input = b.input;
  if (!first && request.segments_size() > 0) {
    input.resize(total_rows * hidden);
    if (absl::Status s = DecodeActivations(request.activations(), total_rows, hidden,
                                           input.data());
        !s.ok()) {
      return RequestFailure(s);
    }
    activation_bytes_in_ += static_cast<int64_t>(request.activations().data().size());
  }
  laps.Lap(&StepTimes::input);

  // Validate every segment; the bad ones are reported and left out.
  std::vector<int>& ok = b.ok;
  ok.clear();
  int64_t new_kv_bytes = 0;
  int64_t step_bytes = 0;  // rows and logits of the segments accepted so far
  absl::flat_hash_map<uint64_t, int> seen;
  std::vector<std::unique_ptr<GrammarMatcher>>& grammars = b.grammars;
  grammars.clear();
  grammars.resize(request.segments_size());
  for (int i = 0; i < request.segments_size(); ++i) {
    const wire::Segment& seg = request.segments(i);
    auto op_failed = failed_sessions.find(seg.session_id());
    absl::Status s = op_failed != failed_sessions.end() ? op_failed->second
                     : seen.contains(seg.session_id())
                         ? absl::InvalidArgumentError(absl::StrCat(
                               "session ", seg.session_id(), " appears twice in one step"))
                         : CheckSegment(seg, &new_kv_bytes);
    seen[seg.session_id()] = i;
    if (s.ok()) {
      // What the step holds for this segment: its rows (in and out), and the head's logits.
      const int64_t count = seg.token_ids_size();
      const int64_t head_rows =
          !model_->has_head() || seg.prefill_only() ? 0
          : seg.all_logits()                        ? 2 * count  // computed, then copied out
                                                    : seg.drafts() + 1;
      const int64_t bytes = static_cast<int64_t>(sizeof(float)) *
                            (2 * count * hidden + head_rows * c.vocab_size);
      // Against what the budget leaves free before this step's new sessions: the rows are
      // transient, and a budget sized for the sessions still runs their small steps.
      if (step_bytes + bytes > free_bytes) {
        s = absl::ResourceExhaustedError(absl::StrCat(
            "session ", seg.session_id(), ": segments: the step's rows and logits need ",
            step_bytes + bytes, " bytes; ", free_bytes, " of the memory budget are free"));
      } else {
        step_bytes += bytes;
      }
    }
    if (s.ok() && model_->has_head() && seg.has_sampling() &&
        !seg.sampling().grammar_kind().empty()) {
      auto compiled = CompileGrammar(seg.sampling());
      if (compiled.ok()) {
        grammars[i] = *std::move(compiled);
      } else {
        // The request's own message: its client reads it as the reply's error, and the error
        // already rides with the segment's index, so no session id is prefixed.
        s = compiled.status();
      }
    }
    if (s.ok()) {
      ok.push_back(i);
    } else {
      AddSegmentError(i, s, &response);
    }
  }
  // Every segment failed for a reason of its own request (a grammar, a rollback its ring
  // refuses, a bad token): the call succeeds with the errors, which end those requests only. A
  // failed call would read as this worker's failure, whatever the code, and cost a re-plan.
  laps.Lap(&StepTimes::validate);
  if (ok.empty()) return response;

  // Rows of the segments that run, in order.
  std::vector<int64_t>& offsets = b.offsets;
  offsets.assign(request.segments_size() + 1, 0);
  for (int i = 0; i < request.segments_size(); ++i) {
    offsets[i + 1] = offsets[i] + request.segments(i).token_ids_size();
  }
  int64_t rows = 0;
  for (int i : ok) rows += request.segments(i).token_ids_size();
  std::vector<float>& x = b.x;
  x.resize(rows * hidden);
  std::vector<Model::Segment>& segments = b.segments;
  segments.clear();
  std::vector<Session*>& sessions = b.sessions;
  sessions.clear();
  int64_t r = 0;
  for (size_t j = 0; j < ok.size(); ++j) {
    const int i = ok[j];
    const wire::Segment& seg = request.segments(i);
    const int64_t count = seg.token_ids_size();
    // The embeddings, and the per-layer embeddings of the families that have them, read the
    // segment's ids where the request holds them.
    const std::span<const int32_t> ids(seg.token_ids().data(), static_cast<size_t>(count));
    if (first) {
      if (absl::Status s = model_->Embed(ids, &x[r * hidden]); !s.ok()) {
        return WorkerDeclaredFailure(s);  // the ids were checked against the vocabulary
      }
    } else {
      std::memcpy(&x[r * hidden], &input[offsets[i] * hidden], count * hidden * sizeof(float));
    }
    auto session = SessionOrNew(seg.session_id());
    if (!session.ok()) return RequestFailure(session.status());
    if (seg.pos0() < (*session)->kv->len()) {
      // Checked with the segment (MinTruncateLength): the rows past pos0 go.
      if (absl::Status t = (*session)->kv->Truncate(seg.pos0()); !t.ok()) {
        return RequestFailure(t);
      }
      (*session)->history.resize(std::min<size_t>((*session)->history.size(), seg.pos0()));
    }
    sessions.push_back(*session);
    segments.push_back({(*session)->kv.get(), r, count, ids});
    r += count;
  }
  laps.Lap(&StepTimes::input);
  const auto t0 = std::chrono::steady_clock::now();
  const double attention0 = model_->attention_seconds();
  if (absl::Status s = model_->ForwardLayers(x.data(), rows, segments); !s.ok()) {
    // ABORTED: an expert peer failed (RemoteExperts); its own heartbeats speak for it.
    return absl::IsAborted(s) ? RequestFailure(s) : WorkerDeclaredFailure(s);
  }
  // The layers' time, split: attention as the model measured it, the rest kernels.
  const double attention = model_->attention_seconds() - attention0;
  laps.Lap(&StepTimes::kernels);
  laps.Move(&StepTimes::kernels, &StepTimes::attention, attention);
  forwarded_positions_ += rows;
  for (size_t j = 0; j < ok.size(); ++j) {
    const wire::Segment& seg = request.segments(ok[j]);
    sessions[j]->history.insert(sessions[j]->history.end(), seg.token_ids().begin(),
                                seg.token_ids().end());
  }

  auto observe = [&] {
    if (options_.on_forward) {
      options_.on_forward(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  };
  if (!model_->has_head()) {
    EncodeActivations(x.data(), rows, hidden, shard_.activation_type(),
                      response.mutable_activations());
    activation_bytes_out_ += static_cast<int64_t>(response.activations().data().size());
    observe();
    laps.Lap(&StepTimes::output);
    return response;
  }

  // Last stage: the head over each sampling segment's last row, or its last drafts + 1 rows
  // (one pass for all of them), and over every row of the all-logits ones.
  const int64_t vocab = c.vocab_size;
  std::vector<float>& last_rows = b.last_rows;
  last_rows.clear();
  int64_t head_rows = 0;
  for (size_t j = 0; j < ok.size(); ++j) {
    const wire::Segment& seg = request.segments(ok[j]);
    if (seg.all_logits() || seg.prefill_only()) continue;
    const Model::Segment& ms = segments[j];
    const int64_t n = seg.drafts() + 1;
    const float* row = &x[(ms.begin + ms.count - n) * hidden];
    last_rows.insert(last_rows.end(), row, row + n * hidden);
    head_rows += n;
  }
  std::vector<float>& logits = logits_;  // reused: vocabulary-sized rows every step
  if (static_cast<int64_t>(logits.size()) < head_rows * vocab) logits.resize(head_rows * vocab);
  if (head_rows > 0) {
    if (absl::Status s = model_->Head(last_rows.data(), head_rows, logits.data()); !s.ok()) {
      return WorkerDeclaredFailure(s);
    }
  }
  laps.Lap(&StepTimes::head);
  // Every sampled segment's rows at once, across the pool's threads (each session has its own
  // sampler and grammar); the results then go out in segment order.
  std::vector<int64_t>& first_row = b.first_row;  // of segment j in `logits`; -1: not sampled
  first_row.assign(ok.size(), -1);
  int64_t next_row = 0;
  for (size_t j = 0; j < ok.size(); ++j) {
    const wire::Segment& seg = request.segments(ok[j]);
    if (seg.prefill_only() || seg.all_logits()) continue;
    if (seg.has_sampling()) {
      // Validated with the segment, before any row ran.
      sessions[j]->sampler = std::make_unique<Sampler>(
          *SamplingFromWire(seg.sampling(), static_cast<int32_t>(vocab)));
      sessions[j]->grammar = std::move(grammars[ok[j]]);
    }
    first_row[j] = next_row;
    next_row += seg.drafts() + 1;
  }
  std::vector<absl::StatusOr<Verified>>& verified = b.verified;
  verified.assign(ok.size(), absl::StatusOr<Verified>(Verified()));
  pool_->ParallelFor(static_cast<int64_t>(ok.size()), 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t j = begin; j < end; ++j) {
      if (first_row[j] < 0) continue;
      Session& session = *sessions[j];
      // The history ends with the segment's tokens: the last one emitted, then the drafts.
      const int64_t k = request.segments(ok[j]).drafts();
      const std::span<const float> rows(&logits[first_row[j] * vocab], (k + 1) * vocab);
      verified[j] = VerifyDrafts(*session.sampler, rows, vocab, session.history,
                                 static_cast<size_t>(k), session.grammar.get());
    }
  });
  for (size_t j = 0; j < ok.size(); ++j) {
    const wire::Segment& seg = request.segments(ok[j]);
    if (seg.prefill_only()) continue;
    if (seg.all_logits()) {
      wire::SegmentResult* result = response.add_results();
      result->set_session_id(seg.session_id());
      const Model::Segment& ms = segments[j];
      std::vector<float> all(ms.count * vocab);
      if (absl::Status s = model_->Head(&x[ms.begin * hidden], ms.count, all.data()); !s.ok()) {
        return WorkerDeclaredFailure(s);
      }
      result->mutable_logits()->Assign(all.begin(), all.end());
      continue;
    }
    if (!verified[j].ok()) {
      // Only a grammar fails here (its matcher gave up, e.g. a lexer grown too complex): that
      // request ends with the reason, the others in the step go on.
      sessions[j]->grammar.reset();
      AddSegmentError(ok[j], absl::InvalidArgumentError(verified[j].status().message()),
                      &response);
      continue;
    }
    wire::SegmentResult* result = response.add_results();
    result->set_session_id(seg.session_id());
    VerifiedToWire(*verified[j], result);
  }
  observe();
  laps.Lap(&StepTimes::sampling);
  return response;
}

absl::StatusOr<wire::ExpertForwardResponse> WorkerActor::DoExpertForward(
    const wire::ExpertForwardRequest& request) {
  if (model_ == nullptr) {
    return WorkerDeclaredFailure(absl::FailedPreconditionError("no shard loaded"));
  }
  if (absl::Status s = model_->file().CheckMappedIntact(); !s.ok()) {
    return WorkerDeclaredFailure(s);
  }
  const ModelConfig& c = model_->config();
  if (request.hidden() != c.hidden) {
    return absl::InvalidArgumentError(absl::StrCat("hidden ", request.hidden(), ", expected ",
                                                   c.hidden));
  }
  const int64_t row_bytes = c.hidden * static_cast<int64_t>(sizeof(float));
  if (request.x().size() % row_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("x has ", request.x().size(),
                                                   " bytes, not a multiple of a row (",
                                                   row_bytes, ")"));
  }
  const int64_t rows = static_cast<int64_t>(request.x().size()) / row_bytes;
  if ((rows + request.pair_rows_size()) * row_bytes > FreeBudgetBytes()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pair_rows: ", request.pair_rows_size(), " pairs over ", rows, " rows need ",
        (rows + request.pair_rows_size()) * row_bytes, " bytes; ", FreeBudgetBytes(),
        " of the memory budget are free"));
  }
  if (request.pair_rows_size() != request.pair_experts_size()) {
    return absl::InvalidArgumentError("pair_rows and pair_experts differ in length");
  }
  if (request.layer() < model_->first_layer() || request.layer() >= model_->last_layer()) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", request.layer(), " is outside [",
                                                   model_->first_layer(), ", ",
                                                   model_->last_layer(), ")"));
  }
  for (int32_t row : request.pair_rows()) {
    if (row < 0 || row >= rows) {
      return absl::InvalidArgumentError(absl::StrCat("pair row ", row, " outside [0, ", rows,
                                                     ")"));
    }
  }
  if (shard_.stage() < 0) {
    for (int32_t e : request.pair_experts()) {
      if (std::find(shard_.serve_experts().begin(), shard_.serve_experts().end(), e) ==
          shard_.serve_experts().end()) {
        return absl::InvalidArgumentError(absl::StrCat("expert ", e, " is not served here"));
      }
    }
  }
  // Copy out of the message: protobuf bytes need not be float-aligned.
  std::vector<float> x(rows * c.hidden);
  std::memcpy(x.data(), request.x().data(), request.x().size());
  std::vector<int32_t> pair_rows(request.pair_rows().begin(), request.pair_rows().end());
  std::vector<int32_t> pair_experts(request.pair_experts().begin(), request.pair_experts().end());
  std::vector<float> y(pair_rows.size() * c.hidden);
  if (absl::Status s = model_->ExpertOutputs(request.layer(), x.data(), pair_rows, pair_experts,
                                             y.data());
      !s.ok()) {
    return WorkerDeclaredFailure(s);  // the request's rows, layer and experts were checked
  }
  expert_tokens_ += static_cast<int64_t>(pair_rows.size());
  for (int32_t e : pair_experts) ++expert_counts_[e];
  activation_bytes_in_ += static_cast<int64_t>(request.x().size());
  wire::ExpertForwardResponse response;
  response.set_y(reinterpret_cast<const char*>(y.data()), y.size() * sizeof(float));
  activation_bytes_out_ += static_cast<int64_t>(response.y().size());
  return response;
}

}  // namespace fucina
