#include "coordinator/es_driver.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/es_members.h"
#include "models/gguf/gguf.h"
#include "models/gguf/writer.h"
#include "models/log/log.h"
#include "models/train/es.h"
#include "worker/es_replica.h"
#include "worker/file_digest.h"

namespace fucina {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Version 2 adds "model_sha256"; version 1 checkpoints resume without the identity check.
constexpr int kStateVersion = 2;
// What a snapshot may hold beyond its values' f32 bytes (the GGUF header, names, padding).
constexpr int64_t kSnapshotSlack = 16 << 20;

// The only file a replica's snapshot may be: the name is joined onto out_dir.
std::string SnapshotFileName(const wire::EsJob& job) {
  return job.mode() == "lora" ? "adapters.gguf" : "tensors.gguf";
}

// The model's identity in a checkpoint: the SHA-256 of its GGUF header (metadata and tensor
// table), as workers name the model they fetch. Hex.
absl::StatusOr<std::string> ModelHeaderSha256(const std::string& path) {
  auto file = gguf::File::Open(path);
  if (!file.ok()) return file.status();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  auto digest = Sha256OfRange(fd, 0, std::min((*file)->data_offset(), (*file)->file_size()),
                              path);
  ::close(fd);
  if (!digest.ok()) return digest.status();
  return DigestHex(*digest);
}

// Writes `bytes` to `path` through a temporary file renamed into place: a reader sees the old
// file or the new one, never half of one.
absl::Status WriteAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat(tmp, ": cannot write"));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat(path, ": cannot rename into place: ",
                                                  ec.message()));
  return absl::OkStatus();
}

// Whether two groups are the same replica: the same workers, reached the same way.
bool SameClients(const EsGroup& a, const EsGroup& b) {
  if (a.workers.size() != b.workers.size()) return false;
  for (size_t i = 0; i < a.workers.size(); ++i) {
    if (a.workers[i].client != b.workers[i].client) return false;
  }
  return true;
}

// Every (group, stage) pair of `groups`, group by group: one call each.
std::vector<std::pair<size_t, size_t>> StageCalls(const std::vector<const EsGroup*>& groups) {
  std::vector<std::pair<size_t, size_t>> calls;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g]->workers.size(); ++i) calls.emplace_back(g, i);
  }
  return calls;
}

}  // namespace

std::string EsGroup::id() const {
  std::string id;
  for (size_t i = 0; i < workers.size(); ++i) {
    if (i > 0) id += "+";
    id += workers[i].id;
    if (i < stages.size()) {
      absl::StrAppend(&id, "[", stages[i].first_layer(), ",", stages[i].last_layer(), ")");
    }
  }
  return id;
}

EsGroupSource WholeReplicas(std::function<std::vector<EsWorker>()> workers) {
  return [workers = std::move(workers)] {
    std::vector<EsGroup> groups;
    for (EsWorker& w : workers()) groups.push_back({{std::move(w)}, {}});
    return groups;
  };
}

absl::StatusOr<std::vector<wire::EsShard>> EvenStages(const ModelConfig& config, int stages) {
  const int64_t n = config.num_layers;
  if (stages < 1 || stages > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages: ", stages, " is outside [1, ", n, "] (the model's layers)"));
  }
  std::vector<wire::EsShard> out;
  int64_t first = 0;
  for (int i = 0; i < stages; ++i) {
    int64_t last = n * (i + 1) / stages;
    // The next cut the model allows (a shared-KV layer stays with its source).
    while (last < n && !config.CanSplitAt(last)) ++last;
    if (last <= first || (i + 1 < stages && last >= n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stages: this ", config.arch, " model cannot be cut into ", stages, " stages"));
    }
    wire::EsShard& shard = out.emplace_back();
    shard.set_first_layer(first);
    shard.set_last_layer(i + 1 == stages ? n : last);
    shard.set_embeddings(i == 0);
    shard.set_head(i + 1 == stages);
    first = shard.last_layer();
  }
  return out;
}

EsDriver::EsDriver(EsDriverOptions options, EsGroupSource groups, EsJobMetrics* metrics)
    : options_(std::move(options)), groups_(std::move(groups)), metrics_(metrics) {}

EsDriver::~EsDriver() { ReleaseReplicas(); }

void EsDriver::ReleaseReplicas() {
  // Replicas hold a model each: free them on the workers still reachable.
  std::map<std::string, Replica> replicas;
  {
    std::lock_guard<std::mutex> lock(mu_);
    replicas.swap(replicas_);
  }
  for (auto& [id, replica] : replicas) Release(replica);
}

void EsDriver::Release(const EsGroup& group) {
  wire::EsReleaseRequest release;
  release.set_job_id(options_.job.job_id());
  for (const EsWorker& w : group.workers) (void)w.client->EsRelease(release);
}

wire::EsJob EsDriver::StageJob(const EsGroup& group, size_t i) const {
  wire::EsJob job = options_.job;
  job.clear_shard();
  job.clear_next_stage();
  if (group.stages.empty()) return job;
  *job.mutable_shard() = group.stages[i];
  if (i + 1 < group.workers.size()) {
    job.mutable_next_stage()->set_worker_id(group.workers[i + 1].id);
    job.mutable_next_stage()->set_address(group.workers[i + 1].address);
  }
  return job;
}

std::vector<absl::StatusOr<wire::EsState>> EsDriver::UpdateGroups(
    const std::vector<const EsGroup*>& groups, const wire::EsUpdateRequest& update) {
  const std::vector<std::pair<size_t, size_t>> calls = StageCalls(groups);
  const int64_t sent = static_cast<int64_t>(update.ByteSizeLong());
  const auto states = CallAll<wire::EsState>(calls.size(), [&](size_t c, auto done) {
    groups[calls[c].first]->workers[calls[c].second].client->EsUpdateAsync(
        update, [this, sent, done = std::move(done)](absl::StatusOr<wire::EsState> state) {
          Count(sent, state.ok() ? static_cast<int64_t>(state->ByteSizeLong()) : 0);
          done(std::move(state));
        });
  });
  std::vector<absl::StatusOr<wire::EsState>> sums(groups.size(), wire::EsState());
  for (size_t c = 0; c < calls.size(); ++c) {
    absl::StatusOr<wire::EsState>& sum = sums[calls[c].first];
    if (!sum.ok()) continue;  // the group's first failing stage names it
    if (!states[c].ok()) {
      sum = states[c].status();
      continue;
    }
    // Wraps: the stages' sums add up to the whole model's.
    sum->set_checksum(sum->checksum() + states[c]->checksum());
    sum->set_num_values(sum->num_values() + states[c]->num_values());
    sum->set_seconds(std::max(sum->seconds(), states[c]->seconds()));
    sum->set_generation(states[c]->generation());
  }
  return sums;
}

std::vector<std::string> EsDriver::replica_workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> ids;
  for (const auto& [id, r] : replicas_) ids.push_back(id);
  return ids;
}

void EsDriver::Count(int64_t sent, int64_t received) {
  std::lock_guard<std::mutex> lock(mu_);
  sent_ += sent;
  received_ += received;
  if (metrics_ != nullptr) metrics_->OnBytesSent(sent);
}

void EsDriver::Drop(const std::string& id, const absl::Status& why) {
  std::optional<EsGroup> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = replicas_.find(id);
    if (it == replicas_.end()) return;
    dropped = std::move(it->second);
    replicas_.erase(it);
  }
  FUCINA_LOG(kWarning).Request(options_.job.job_id())
      << "replica " << id << " left the train job: " << why.ToString();
  // The other stages of a pipeline hold their layers for nothing now.
  if (dropped->workers.size() > 1) Release(*dropped);
}

std::vector<absl::Status> EsDriver::JoinAll(const std::vector<EsGroup>& groups) {
  // Every stage of every group loads at once: each maps and copies its layers.
  std::vector<const EsGroup*> all;
  for (const EsGroup& g : groups) all.push_back(&g);
  const std::vector<std::pair<size_t, size_t>> calls = StageCalls(all);
  const auto loads = CallAll<wire::EsState>(calls.size(), [&](size_t c, auto done) {
    const auto [g, i] = calls[c];
    groups[g].workers[i].client->EsLoadAsync(StageJob(groups[g], i), std::move(done));
  });
  std::vector<absl::Status> results(groups.size());
  std::vector<int64_t> num_values(groups.size(), 0);
  std::vector<uint64_t> checksums(groups.size(), 0);
  std::vector<bool> loaded_any(groups.size(), false);
  for (size_t c = 0; c < calls.size(); ++c) {
    const size_t g = calls[c].first;
    if (!loads[c].ok()) {
      if (results[g].ok()) results[g] = loads[c].status();  // the first failing stage's
      continue;
    }
    loaded_any[g] = true;
    num_values[g] += loads[c]->num_values();
    checksums[g] += loads[c]->checksum();
  }
  std::vector<size_t> live;  // the groups still joining
  for (size_t g = 0; g < groups.size(); ++g) {
    if (results[g].ok() && num_values[g] == 0) {
      results[g] = absl::InvalidArgumentError(
          options_.job.mode() == "lora" ? "lora_targets: no adapters in the model"
                                        : "tensors: no trainable tensor of the model matches");
    }
    if (!results[g].ok()) {
      if (loaded_any[g]) Release(groups[g]);  // the stages that did load
      continue;
    }
    live.push_back(g);
  }
  // Replay: the same updates in the same order give the same values, bit for bit (the groups
  // side by side, one generation at a time).
  for (size_t gen = 0; gen < log_.size() && !live.empty(); ++gen) {
    wire::EsUpdateRequest update;
    update.set_job_id(options_.job.job_id());
    update.set_generation(static_cast<int64_t>(gen));
    update.mutable_shaped()->Add(log_[gen].begin(), log_[gen].end());
    std::vector<const EsGroup*> replaying;
    for (size_t g : live) replaying.push_back(&groups[g]);
    const auto states = UpdateGroups(replaying, update);
    std::vector<size_t> still;
    for (size_t k = 0; k < states.size(); ++k) {
      const size_t g = live[k];
      if (!states[k].ok()) {
        results[g] = states[k].status();
        continue;
      }
      checksums[g] = states[k]->checksum();
      if (checksums_[gen] != 0 && checksums[g] != checksums_[gen]) {
        results[g] = absl::DataLossError(absl::StrFormat(
            "replaying generation %d gave checksum %016x, the job's is %016x", gen + 1,
            checksums[g], checksums_[gen]));
        continue;
      }
      still.push_back(g);
    }
    live.swap(still);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t g : live) {
    num_values_ = num_values[g];
    if (log_.empty()) checksum_ = checksums[g];
    replicas_[groups[g].id()] = groups[g];
  }
  return results;
}

absl::StatusOr<std::vector<std::pair<std::string, EsDriver::Replica>>> EsDriver::Join() {
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.wait_for_workers_ms);
  absl::Status last_error;
  for (;;) {
    if (abort_) return absl::CancelledError("the job was stopped at a shutdown deadline");
    std::vector<EsGroup> available = groups_();
    std::vector<EsGroup> fresh;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // A worker that registered again has a new client: its old replica is gone with it.
      for (auto it = replicas_.begin(); it != replicas_.end();) {
        auto found = std::find_if(available.begin(), available.end(),
                                  [&](const EsGroup& g) { return g.id() == it->first; });
        it = found == available.end() || !SameClients(*found, it->second)
                 ? replicas_.erase(it)
                 : std::next(it);
      }
      for (const EsGroup& g : available) {
        if (g.workers.empty()) continue;
        auto no_room = no_room_.find(g.id());
        // One that had no room for a replica is not asked again (each try loads a model).
        if (no_room != no_room_.end() && no_room->second == g.workers[0].client) continue;
        if (!replicas_.contains(g.id())) fresh.push_back(g);
      }
    }
    const std::vector<absl::Status> results = JoinAll(fresh);
    std::vector<absl::Status> refused;  // RESOURCE_EXHAUSTED: no room for a replica
    for (size_t i = 0; i < fresh.size(); ++i) {
      if (!results[i].ok()) {
        // A worker refusing the job itself (bad job) is the job's error, not the worker's;
        // one without the memory for a replica just takes no part.
        const bool no_room = absl::IsResourceExhausted(results[i]);
        if ((!IsWorkerFailure(results[i]) && !no_room) || absl::IsDataLoss(results[i])) {
          return results[i];
        }
        if (no_room) {
          refused.push_back(results[i]);
          std::lock_guard<std::mutex> lock(mu_);
          no_room_[fresh[i].id()] = fresh[i].workers[0].client;
        }
        last_error = results[i];
        FUCINA_LOG(kWarning).Request(options_.job.job_id())
            << "replica " << fresh[i].id() << " cannot take the train job: "
            << results[i].ToString();
      }
    }
    std::vector<std::pair<std::string, Replica>> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready.assign(replicas_.begin(), replicas_.end());
    }
    if (!ready.empty()) return ready;
    // Every worker there is lacks the memory: waiting would not change that.
    if (!available.empty() && fresh.size() == available.size() &&
        refused.size() == available.size()) {
      return refused.back();
    }
    if (stop_) return absl::CancelledError("the job was stopped");
    if (Clock::now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "no worker could take the job within ", options_.wait_for_workers_ms, " ms",
          last_error.ok() ? "" : absl::StrCat(" (last error: ", last_error.ToString(), ")")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

absl::StatusOr<float> EsDriver::EvaluateCenter(bool holdout) {
  // As a member: a few replicas may fail under it, then it is the job's failure.
  absl::Status last;
  for (int attempt = 0; attempt < options_.max_member_attempts; ++attempt) {
    if (stop_) return absl::CancelledError("the job was stopped");
    auto ready = Join();
    if (!ready.ok()) return ready.status();
    wire::EsEvaluateRequest request;
    request.set_job_id(options_.job.job_id());
    request.set_generation(generation());
    request.add_members(train::EsTrainer::kCenter);
    request.set_holdout(holdout);
    auto reply = ready->front().second.workers[0].client->EsEvaluate(request);
    if (reply.ok() && reply->fitness_size() != 1) {
      reply = absl::InternalError(
          absl::StrCat(reply->fitness_size(), " fitness values for the center"));
    }
    if (reply.ok()) {
      if (!std::isfinite(reply->fitness(0))) {
        return absl::InvalidArgumentError(train::NonFiniteFitness(
            train::EsTrainer::kCenter, generation(), reply->fitness(0)));
      }
      return reply->fitness(0);
    }
    if (!IsWorkerFailure(reply.status())) return reply.status();
    last = reply.status();
    Drop(ready->front().first, reply.status());
  }
  return absl::Status(last.code(), absl::StrCat("the center of generation ", generation(),
                                                " failed on ", options_.max_member_attempts,
                                                " replicas; the last: ", last.message()));
}

absl::Status EsDriver::Run(const std::function<void(const EsGenerationEvent&)>& on_generation) {
  const wire::EsJob& job = options_.job;
  const int population = job.population();
  while (generation() < options_.iterations) {
    if (stop_) return Stopped();
    const auto start = Clock::now();
    const int64_t g = generation();
    {
      std::lock_guard<std::mutex> lock(mu_);
      sent_ = received_ = 0;
    }
    EsGenerationEvent event;
    event.generation = g + 1;

    // ---- Members: one queue, every replica takes the next member when free. ----
    EsMemberQueue members(
        population, options_.max_member_attempts, g,
        {.on_member = [this](const EsScored& s) {
           if (metrics_ != nullptr) metrics_->OnMember(s.worker_seconds);
         },
         .on_retried = [this] {
           if (metrics_ != nullptr) metrics_->OnMemberRetried();
         }});
    int replicas_used = 0;
    while (!members.finished()) {
      auto ready = Join();
      if (!ready.ok()) return ready.status();
      replicas_used = std::max<int>(replicas_used, static_cast<int>(ready->size()));
      std::map<std::string, std::shared_ptr<WorkerClient>> clients;
      std::vector<std::string> ids;
      for (const auto& [id, replica] : *ready) {
        clients[id] = replica.workers[0].client;
        ids.push_back(id);
      }
      const EsMemberQueue::Score score = [&](const std::string& id, int member,
                                             Callback<EsScored> done) {
        wire::EsEvaluateRequest request;
        request.set_job_id(job.job_id());
        request.set_generation(g);
        request.add_members(member);
        const int64_t sent = static_cast<int64_t>(request.ByteSizeLong());
        clients.at(id)->EsEvaluateAsync(
            std::move(request), [this, g, member, sent, call = Clock::now(),
                                 done = std::move(done)](
                                    absl::StatusOr<wire::EsEvaluateResponse> reply) {
              Count(sent, reply.ok() ? static_cast<int64_t>(reply->ByteSizeLong()) : 0);
              if (!reply.ok()) return done(reply.status());
              if (reply->fitness_size() != 1) {
                return done(absl::InternalError(
                    absl::StrCat(reply->fitness_size(), " fitness values for one member")));
              }
              if (!std::isfinite(reply->fitness(0))) {
                return done(absl::InvalidArgumentError(
                    train::NonFiniteFitness(member, g, reply->fitness(0))));
              }
              done(EsScored{reply->fitness(0), reply->seconds(), Since(call)});
            });
      };
      // Dropping calls the group's other workers: after the members' callbacks, not in them.
      for (const auto& [id, why] : members.RunOn(ids, score, stop_)) Drop(id, why);
      if (absl::Status error = members.error(); !error.ok()) return error;
      if (stop_ && !members.finished()) return Stopped();
    }
    const std::vector<float> fitness = members.fitness();
    double overhead = members.overhead();  // summed over replicas: call time not on the worker
    event.evaluate_seconds = Since(start);

    // ---- The update, on every replica; their checksums must agree. ----
    const auto update_start = Clock::now();
    const std::vector<float> shaped = train::EsTrainer::ShapeFitness(fitness);
    wire::EsUpdateRequest update;
    update.set_job_id(job.job_id());
    update.set_generation(g);
    update.mutable_shaped()->Add(shaped.begin(), shaped.end());
    std::vector<std::pair<std::string, Replica>> targets;
    {
      std::lock_guard<std::mutex> lock(mu_);
      targets.assign(replicas_.begin(), replicas_.end());
    }
    std::vector<const EsGroup*> groups;
    for (const auto& [id, group] : targets) groups.push_back(&group);
    const auto call = Clock::now();
    const auto states = UpdateGroups(groups, update);
    const double wall = Since(call);  // each replica's call: all were in flight together
    uint64_t checksum = 0;
    std::string first_id;
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!states[i].ok()) {
        if (!IsWorkerFailure(states[i].status())) return states[i].status();
        Drop(targets[i].first, states[i].status());
        continue;
      }
      overhead += std::max(0.0, wall - states[i]->seconds());
      if (first_id.empty()) {
        first_id = targets[i].first;
        checksum = states[i]->checksum();
      } else if (states[i]->checksum() != checksum) {
        return absl::DataLossError(absl::StrFormat(
            "after generation %d replica %s has checksum %016x, replica %s %016x: the "
            "replicas diverged", g + 1, targets[i].first, states[i]->checksum(), first_id,
            checksum));
      }
    }
    log_.push_back(shaped);
    checksums_.push_back(checksum);  // 0 when every replica died: the next one replays
    if (checksum != 0) checksum_ = checksum;
    event.update_seconds = Since(update_start);

    float lo = fitness[0], hi = fitness[0];
    double sum = 0;
    for (float f : fitness) lo = std::min(lo, f), hi = std::max(hi, f), sum += f;
    event.reward_mean = static_cast<float>(sum / population);
    event.reward_min = lo;
    event.reward_max = hi;
    event.sigma = EsOptionsOf(job).SigmaAt(g);  // as the replicas compute it
    event.members_done = members.done();
    event.members_retried = members.retried();
    event.workers = replicas_used;
    event.communicate_seconds = replicas_used > 0 ? overhead / replicas_used : 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      event.bytes_sent = sent_;
      event.bytes_received = received_;
    }
    event.checksum = checksum_;
    if (metrics_ != nullptr) {
      metrics_->OnGeneration(generation(), event.reward_mean, lo, hi);
    }
    const bool last = generation() == options_.iterations;
    if (!options_.out_dir.empty() &&
        (last || stop_ ||
         (options_.checkpoint_every > 0 && generation() % options_.checkpoint_every == 0))) {
      if (absl::Status s = WriteCheckpoint(); !s.ok()) return s;
    }
    event.seconds = Since(start);
    if (on_generation) on_generation(event);
  }
  return absl::OkStatus();
}

absl::Status EsDriver::Stopped() {
  if (!options_.out_dir.empty() && checkpointed_ != generation()) {
    if (absl::Status s = WriteCheckpoint(); !s.ok()) return s;
  }
  return absl::CancelledError("the job was stopped");
}

absl::StatusOr<wire::EsSnapshotChunk> EsDriver::SnapshotGroup(const EsGroup& group) {
  wire::EsSnapshotRequest request;
  request.set_job_id(options_.job.job_id());
  // The values as f32 and a header naming each tensor: nothing a replica sends is larger.
  request.set_max_bytes(num_values_ * static_cast<int64_t>(sizeof(float)) + kSnapshotSlack);
  const std::string expected = SnapshotFileName(options_.job);
  // Only the one name the mode writes is taken: the name is joined onto out_dir.
  auto check = [&](const absl::StatusOr<wire::EsSnapshotChunk>& part,
                   size_t stage) -> absl::Status {
    if (!part.ok() || part->file_name() == expected) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(
        "the snapshot of replica ", group.workers[stage].id, " is not named ", expected));
  };
  if (group.workers.size() == 1) {
    auto whole = group.workers[0].client->EsSnapshot(request);
    if (absl::Status s = check(whole, 0); !s.ok()) return s;
    return whole;
  }
  // Each stage saves its own layers' values; one file holds them all, in stage order (the
  // order a whole replica saves them in).
  std::vector<std::unique_ptr<gguf::File>> parts;
  wire::EsSnapshotChunk merged;
  for (size_t i = 0; i < group.workers.size(); ++i) {
    auto part = group.workers[i].client->EsSnapshot(request);
    if (!part.ok()) return part.status();
    if (absl::Status s = check(part, i); !s.ok()) return s;
    if (i == 0) {
      merged.set_file_name(part->file_name());
      merged.set_generation(part->generation());
    } else if (part->file_name() != merged.file_name() ||
               part->generation() != merged.generation()) {
      return absl::InternalError(absl::StrCat(
          "stage ", i, " sent ", part->file_name(), " of generation ", part->generation(),
          ", stage 0 ", merged.file_name(), " of generation ", merged.generation()));
    }
    auto file = gguf::File::FromBytes(
        {reinterpret_cast<const uint8_t*>(part->data().data()), part->data().size()},
        absl::StrCat("stage ", i, "'s ", part->file_name()));
    if (!file.ok()) return file.status();
    parts.push_back(*std::move(file));
  }
  std::vector<const gguf::File*> views;
  for (const auto& p : parts) views.push_back(p.get());
  auto bytes = gguf::FileBytes(
      [&](const std::string& path) { return gguf::ConcatenateTensors(views, path); });
  if (!bytes.ok()) return bytes.status();
  *merged.mutable_data() = *std::move(bytes);
  return merged;
}

absl::Status EsDriver::WriteCheckpoint() {
  if (options_.out_dir.empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(options_.out_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(options_.out_dir, ": cannot create: ", ec.message()));
  }
  // The values first: state.json, written last, names a generation whose file is in place.
  wire::EsSnapshotRequest request;
  request.set_job_id(options_.job.job_id());
  absl::StatusOr<wire::EsSnapshotChunk> snapshot = absl::UnavailableError("no replica");
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto ready = Join();
    if (!ready.ok()) return ready.status();
    snapshot = SnapshotGroup(ready->front().second);
    if (snapshot.ok() || !IsWorkerFailure(snapshot.status())) break;
    Drop(ready->front().first, snapshot.status());
  }
  if (!snapshot.ok()) return snapshot.status();
  if (snapshot->generation() != generation()) {
    return absl::InternalError(absl::StrCat("the snapshot is of generation ",
                                            snapshot->generation(), ", the job at ",
                                            generation()));
  }
  const std::string dir = options_.out_dir;
  if (absl::Status s = WriteAtomically(dir + "/" + snapshot->file_name(), snapshot->data());
      !s.ok()) {
    return s;
  }
  nlohmann::json state;
  auto model = ModelHeaderSha256(options_.job.model_path());
  if (!model.ok()) return model.status();
  state["version"] = kStateVersion;
  state["model_sha256"] = *model;
  state["job"] = absl::Base64Escape(options_.job.SerializeAsString());
  state["generation"] = generation();
  state["checksum"] = absl::StrFormat("%016x", checksum_);
  state["values"] = snapshot->file_name();
  nlohmann::json log = nlohmann::json::array();
  for (const std::vector<float>& shaped : log_) log.push_back(shaped);
  state["shaped"] = std::move(log);
  nlohmann::json sums = nlohmann::json::array();
  for (uint64_t c : checksums_) sums.push_back(absl::StrFormat("%016x", c));
  state["checksums"] = std::move(sums);
  if (absl::Status s = WriteAtomically(dir + "/state.json", state.dump(1) + "\n"); !s.ok()) {
    return s;
  }
  checkpointed_ = generation();
  return absl::OkStatus();
}

absl::Status EsDriver::Resume(const std::string& dir) {
  const std::string path = dir + "/state.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the job's state"));
  const nlohmann::json state = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (state.is_discarded() || !state.is_object()) return bad("not a JSON object");
  if (!state.contains("version") || !state["version"].is_number_integer() ||
      state["version"].get<int64_t>() < 1 || state["version"].get<int64_t>() > kStateVersion) {
    return bad(absl::StrCat("\"version\" is not 1 to ", kStateVersion));
  }
  // The served model is trained, whatever the checkpoint names: no path from the file is ever
  // opened, and a checkpoint of another model is refused by its identity.
  const std::string& model_path = options_.job.model_path();
  if (model_path.empty()) {
    return absl::FailedPreconditionError("resuming needs the served model's path");
  }
  if (state["version"].get<int64_t>() >= 2) {
    if (!state.contains("model_sha256") || !state["model_sha256"].is_string()) {
      return bad("\"model_sha256\" is missing");
    }
    auto served = ModelHeaderSha256(model_path);
    if (!served.ok()) return served.status();
    if (state["model_sha256"].get<std::string>() != *served) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": the checkpoint was trained on another model (its header SHA-256 differs "
          "from the served model's, ", *served, ")"));
    }
  }
  std::string job_bytes;
  wire::EsJob job;
  if (!state.contains("job") || !state["job"].is_string() ||
      !absl::Base64Unescape(state["job"].get<std::string>(), &job_bytes) ||
      !job.ParseFromString(job_bytes)) {
    return bad("\"job\" is not a base64 EsJob");
  }
  if (!state.contains("shaped") || !state["shaped"].is_array() || !state.contains("checksums") ||
      !state["checksums"].is_array() || state["checksums"].size() != state["shaped"].size()) {
    return bad("\"shaped\" and \"checksums\" must be arrays of one entry per generation");
  }
  std::vector<std::vector<float>> log;
  std::vector<uint64_t> sums;
  for (size_t g = 0; g < state["shaped"].size(); ++g) {
    const nlohmann::json& row = state["shaped"][g];
    if (!row.is_array() || static_cast<int>(row.size()) != job.population()) {
      return bad(absl::StrCat("\"shaped\"[", g, "] must hold ", job.population(), " numbers"));
    }
    std::vector<float> shaped;
    for (const nlohmann::json& v : row) {
      // Read as double: 1e300 is a valid JSON number but no float.
      const double d = v.is_number() ? v.get<double>() : 0.0;
      if (!v.is_number() || !(std::abs(d) <= std::numeric_limits<float>::max())) {
        return bad(absl::StrCat("\"shaped\"[", g, "] holds a non-number or one no float holds"));
      }
      shaped.push_back(static_cast<float>(d));
    }
    log.push_back(std::move(shaped));
    const nlohmann::json& c = state["checksums"][g];
    uint64_t sum = 0;
    char* end = nullptr;
    const std::string text = c.is_string() ? c.get<std::string>() : "";
    if (text.size() == 16) sum = std::strtoull(text.c_str(), &end, 16);
    if (end != text.c_str() + 16) {
      return bad(absl::StrCat("\"checksums\"[", g, "] is not a hex checksum"));
    }
    sums.push_back(sum);
  }
  job.set_job_id(options_.job.job_id());  // the id is the running job's, not the math's
  job.set_model_path(model_path);
  // Checked as a new job is: the file may have been edited (step sizes, regexes, tasks).
  if (absl::Status s = ValidateEsJob(job); !s.ok()) {
    return bad(absl::StrCat("\"job\": ", s.message()));
  }
  options_.job = std::move(job);
  log_ = std::move(log);
  checksums_ = std::move(sums);
  checksum_ = checksums_.empty() ? 0 : checksums_.back();
  return absl::OkStatus();
}

}  // namespace fucina
