#include "worker/es_replica.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/engine/lora.h"
#include "models/engine/model_size.h"
#include "models/gguf/writer.h"
#include "models/train/pattern.h"

namespace fucina {
namespace {

constexpr int kMaxPopulation = 1 << 16;
constexpr std::string_view kTokenEmbeddings = "token_embd.weight";
constexpr int kMaxLoraRank = 4096;
// Positions of one task (prompt + answer): a scored task holds a KV cache this long on every
// replica, so a request's size alone must not decide a worker's memory.
constexpr int64_t kMaxTaskTokens = 32768;

absl::Status CheckTokens(const wire::EsTask& task, int64_t vocab_size, const std::string& at) {
  if (task.prompt().empty()) return absl::InvalidArgumentError(at + ".prompt is empty");
  if (task.answer().empty()) return absl::InvalidArgumentError(at + ".answer is empty");
  if (task.prompt_size() + task.answer_size() > kMaxTaskTokens) {
    return absl::InvalidArgumentError(absl::StrCat(at, " has ", task.prompt_size() +
                                                   task.answer_size(), " tokens, more than ",
                                                   kMaxTaskTokens));
  }
  if (vocab_size <= 0) return absl::OkStatus();
  for (const auto* ids : {&task.prompt(), &task.answer()}) {
    for (int32_t id : *ids) {
      if (id < 0 || id >= vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ": token id ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

train::EsOptions EsOptionsOf(const wire::EsJob& job) {
  train::EsOptions o;
  o.population = job.population();
  o.sigma = job.sigma();
  o.lr = job.lr();
  o.weight_decay = job.weight_decay();
  o.seed = job.seed();
  o.sigma_decay = job.sigma_decay() == 0.0f ? 1.0f : job.sigma_decay();
  o.lr_decay = job.lr_decay() == 0.0f ? 1.0f : job.lr_decay();
  return o;
}

namespace {

std::vector<train::Task> TasksOf(const google::protobuf::RepeatedPtrField<wire::EsTask>& in) {
  std::vector<train::Task> out;
  out.reserve(in.size());
  for (const wire::EsTask& t : in) {
    train::Task task;
    task.prompt.assign(t.prompt().begin(), t.prompt().end());
    task.answer.assign(t.answer().begin(), t.answer().end());
    task.answer_text = t.answer_text();
    out.push_back(std::move(task));
  }
  return out;
}

}  // namespace

absl::Status ValidateEsJob(const wire::EsJob& job, int64_t vocab_size) {
  if (job.job_id().empty() || job.job_id().size() > 128) {
    return absl::InvalidArgumentError("job_id must have 1 to 128 characters");
  }
  if (job.model_path().empty()) return absl::InvalidArgumentError("model_path is empty");
  if (job.mode() != "full" && job.mode() != "lora") {
    return absl::InvalidArgumentError(
        absl::StrCat("mode '", job.mode(), "' is not one of full, lora"));
  }
  if (job.mode() == "full") {
    if (auto re = train::Pattern::Compile(job.tensors(), "tensors"); !re.ok()) {
      return re.status();
    }
  } else {
    if (job.lora_rank() < 1 || job.lora_rank() > kMaxLoraRank) {
      return absl::InvalidArgumentError(
          absl::StrCat("lora_rank (", job.lora_rank(), ") must be in [1, ", kMaxLoraRank, "]"));
    }
    if (!(job.lora_alpha() > 0.0f) || !std::isfinite(job.lora_alpha())) {
      return absl::InvalidArgumentError("lora_alpha must be positive and finite");
    }
    auto targets = ParseLoraTargets(absl::StrJoin(job.lora_targets(), ","));
    if (!targets.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("lora_targets: ", targets.status().message()));
    }
  }
  if (job.population() > kMaxPopulation) {
    return absl::InvalidArgumentError(
        absl::StrCat("population (", job.population(), ") exceeds ", kMaxPopulation));
  }
  if (absl::Status s = EsOptionsOf(job).Validate(); !s.ok()) return s;
  auto reward = train::MakeRewardSpec(job.reward().kind(), job.reward().rule(),
                                      job.reward().max_tokens());
  if (!reward.ok()) return reward.status();
  if (job.tasks().empty()) return absl::InvalidArgumentError("tasks is empty");
  for (int i = 0; i < job.tasks_size(); ++i) {
    if (absl::Status s = CheckTokens(job.tasks(i), vocab_size, absl::StrCat("tasks[", i, "]"));
        !s.ok()) {
      return s;
    }
  }
  for (int i = 0; i < job.holdout_size(); ++i) {
    if (absl::Status s =
            CheckTokens(job.holdout(i), vocab_size, absl::StrCat("holdout[", i, "]"));
        !s.ok()) {
      return s;
    }
  }
  if (job.threads() < 0) return absl::InvalidArgumentError("threads must not be negative");
  if (job.has_shard() &&
      (job.shard().first_layer() < 0 || job.shard().last_layer() <= job.shard().first_layer())) {
    return absl::InvalidArgumentError("shard: layers must be [first, last) with 0 <= first < last");
  }
  if (job.has_next_stage() && (!job.has_shard() || job.shard().head())) {
    return absl::InvalidArgumentError("next_stage: only a stage without the head has one");
  }
  if (job.has_shard() && !job.shard().head() && !job.has_next_stage()) {
    return absl::InvalidArgumentError("next_stage: a stage without the head needs one");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EsReplica>> EsReplica::Create(const wire::EsJob& job,
                                                             const std::string& model_path,
                                                             int max_threads) {
  if (absl::Status s = ValidateEsJob(job); !s.ok()) return s;
  std::unique_ptr<EsReplica> r(new EsReplica());
  r->job_ = job;
  const int threads =
      job.threads() > 0 ? std::min(job.threads(), max_threads) : std::max(1, max_threads);
  r->pool_ = std::make_unique<ThreadPool>(threads);
  LoadOptions load;
  if (job.has_shard()) {
    load.first_layer = job.shard().first_layer();
    load.last_layer = job.shard().last_layer();
    load.embeddings = job.shard().embeddings();
    load.head = job.shard().head();
  }
  const bool lora = job.mode() == "lora";
  if (!lora) {
    auto pattern = train::Pattern::Compile(job.tensors(), "tensors");
    if (!pattern.ok()) return pattern.status();
    load.f32_tensors = [pattern = *std::move(pattern)](std::string_view name) {
      return pattern.FullMatch(name);
    };
  }
  auto model = Model::Load(model_path, load, *r->pool_);
  if (!model.ok()) return model.status();
  r->model_ = *std::move(model);
  if (!job.has_shard() && !r->model_->is_full()) {
    return absl::FailedPreconditionError(
        absl::StrCat(model_path, ": training needs every tensor of the model"));
  }
  if (absl::Status s = ValidateEsJob(job, r->model_->config().vocab_size); !s.ok()) return s;
  if (lora) {
    auto targets = ParseLoraTargets(absl::StrJoin(job.lora_targets(), ","));
    if (!targets.ok()) return targets.status();
    if (absl::Status s = r->model_->AddLora(*targets, job.lora_rank(), job.lora_alpha(),
                                            job.seed());
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("lora_rank: ", s.message()));
    }
  }
  auto tokenizer = Tokenizer::FromGguf(r->model_->file());
  if (!tokenizer.ok()) return tokenizer.status();
  r->tokenizer_ = *std::move(tokenizer);
  auto reward = train::MakeRewardSpec(job.reward().kind(), job.reward().rule(),
                                      job.reward().max_tokens());
  if (!reward.ok()) return reward.status();
  r->reward_ = *reward;
  r->tasks_ = TasksOf(job.tasks());
  r->holdout_ = TasksOf(job.holdout());
  auto trainer = train::EsTrainer::Create(*r->model_, EsOptionsOf(job), *r->pool_,
                                         /*allow_none=*/job.has_shard());
  if (!trainer.ok()) {
    return absl::Status(trainer.status().code(),
                        absl::StrCat(lora ? "lora_targets: " : "tensors: ",
                                     trainer.status().message()));
  }
  r->trainer_ = *std::move(trainer);
  // Every replica scores through passes (StagePass), a whole one as a pipeline of one stage,
  // so the worker can run each pass as its own executor task.
  r->stage_ = std::make_unique<train::StageScorer>(*r->model_);
  if (job.has_shard()) {
    // A tied head holds the token embeddings too; the stage with the embeddings reports them.
    if (!job.shard().embeddings()) {
      r->trainer_->SetReported([](std::string_view name) { return name != kTokenEmbeddings; });
    }
  }
  r->model_->VisitParameters([&](const Parameter& p) {
    for (const ParameterLocation& loc : p.locations) {
      if (loc.owned) r->owned_bytes_ += RowBytes(loc.view.type, loc.view.cols) * loc.view.rows;
    }
  });
  const ModelConfig& c = r->model_->config();
  r->mapped_bytes_ = MeasureModel(r->model_->file(), c)
                         .StageBytes(r->model_->first_layer(), r->model_->last_layer(),
                                     c.num_experts, load.embeddings, load.head);
  return r;
}

wire::EsState EsReplica::State() const {
  wire::EsState state;
  state.set_job_id(job_.job_id());
  state.set_generation(generation_);
  state.set_checksum(trainer_->Checksum());
  state.set_num_values(trainer_->num_values());
  state.set_num_tensors(static_cast<int32_t>(trainer_->tensor_names().size()));
  return state;
}

absl::StatusOr<float> EsReplica::Score(train::ScoringForward& forward, int member,
                                       bool holdout) const {
  const std::vector<train::Task>& tasks = holdout ? holdout_ : tasks_;
  if (tasks.empty()) return absl::InvalidArgumentError("the job has no holdout tasks");
  auto f = train::ScoreTasks(forward, *tokenizer_, tasks, reward_);
  if (f.ok() && !std::isfinite(*f)) {
    return absl::InvalidArgumentError(train::NonFiniteFitness(member, generation_, *f));
  }
  return f;
}

absl::StatusOr<std::vector<train::ScoringForward::Verdict>> EsReplica::StagePass(
    int64_t generation, int member, std::span<const int64_t> new_streams,
    std::span<const train::ScoringForward::Segment> segments, std::vector<float>& x,
    std::span<const train::ScoringForward::Row> rows) {
  if (generation != generation_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a pass of generation ", generation, " for a replica at ", generation_));
  }
  if (absl::Status s = trainer_->Select(generation, member); !s.ok()) return s;
  if (!new_streams.empty()) {
    if (absl::Status s = stage_->ResetStreams(new_streams); !s.ok()) return s;
  }
  if (absl::Status s = stage_->Layers(segments, x); !s.ok()) return s;
  if (!model_->has_head()) return std::vector<train::ScoringForward::Verdict>();
  return stage_->Verdicts(x.data(), static_cast<int64_t>(x.size()) / model_->config().hidden,
                          rows);
}

absl::Status EsReplica::Update(const wire::EsUpdateRequest& request) {
  if (absl::Status s = BeginUpdate(request); !s.ok()) return s;
  while (!UpdateStep()) {
  }
  return absl::OkStatus();
}

absl::Status EsReplica::BeginUpdate(const wire::EsUpdateRequest& request) {
  if (request.generation() != generation_) {
    return absl::FailedPreconditionError(
        absl::StrCat("update of generation ", request.generation(), " for a replica at ",
                     generation_));
  }
  for (float v : request.shaped()) {
    // One non-finite value would turn every trainable value into NaN for good.
    if (!std::isfinite(v)) return absl::InvalidArgumentError("shaped: a value is not finite");
  }
  return trainer_->BeginUpdate(
      generation_, {request.shaped().data(), static_cast<size_t>(request.shaped_size())});
}

bool EsReplica::UpdateStep() {
  if (!trainer_->UpdateStep()) return false;
  ++generation_;
  return true;
}

absl::StatusOr<bool> EsReplica::SelectStep(int64_t generation, int member) {
  if (generation != generation_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a pass of generation ", generation, " for a replica at ", generation_));
  }
  return trainer_->SelectStep(generation, member);
}

absl::StatusOr<wire::EsSnapshotChunk> EsReplica::Snapshot() {
  // Adapters are saved from the model's copies, which may hold a stage's last member.
  if (absl::Status s = trainer_->Select(generation_, train::EsTrainer::kCenter); !s.ok()) {
    return s;
  }
  const bool lora = job_.mode() == "lora";
  const std::string name = lora ? "adapters.gguf" : "tensors.gguf";
  auto bytes = gguf::FileBytes([&](const std::string& path) {
    return lora ? model_->SaveLora(path) : trainer_->SaveTensors(path);
  });
  if (!bytes.ok()) return bytes.status();
  wire::EsSnapshotChunk chunk;
  chunk.set_file_name(name);
  chunk.set_generation(generation_);
  *chunk.mutable_data() = *std::move(bytes);
  return chunk;
}

}  // namespace fucina
