#include "coordinator/train_jobs.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "models/train/tasks.h"
#include "worker/es_replica.h"

namespace fucina {
namespace {

namespace v1 = ::fucina::v1;

constexpr int kMaxTasks = 100'000;
constexpr int kMaxIterations = 1'000'000;

bool ValidJobId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::Status AddTasks(const google::protobuf::RepeatedPtrField<v1::TrainTask>& in,
                      const char* field, const Tokenizer& tokenizer, const ChatTemplate* chat,
                      google::protobuf::RepeatedPtrField<wire::EsTask>* out) {
  if (in.size() > kMaxTasks) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", in.size(), " entries, more than ", kMaxTasks));
  }
  for (int i = 0; i < in.size(); ++i) {
    auto task = train::TaskFromText(in[i].prompt(), in[i].answer(), tokenizer, chat);
    if (!task.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: ", task.status().message()));
    }
    wire::EsTask* t = out->Add();
    t->mutable_prompt()->Add(task->prompt.begin(), task->prompt.end());
    t->mutable_answer()->Add(task->answer.begin(), task->answer.end());
    t->set_answer_text(task->answer_text);
  }
  return absl::OkStatus();
}

v1::JobEvent ToEvent(const std::string& job_id, const EsGenerationEvent& e) {
  v1::JobEvent out;
  out.set_job_id(job_id);
  out.set_generation(e.generation);
  out.set_reward_mean(e.reward_mean);
  out.set_reward_min(e.reward_min);
  out.set_reward_max(e.reward_max);
  out.set_sigma(e.sigma);
  out.set_members_done(e.members_done);
  out.set_members_retried(e.members_retried);
  out.set_workers(e.workers);
  out.set_seconds(e.seconds);
  out.set_evaluate_seconds(e.evaluate_seconds);
  out.set_update_seconds(e.update_seconds);
  out.set_communicate_seconds(e.communicate_seconds);
  out.set_bytes_sent(e.bytes_sent);
  out.set_bytes_received(e.bytes_received);
  out.set_checksum(e.checksum);
  out.set_state(v1::JOB_STATE_RUNNING);
  return out;
}

}  // namespace

absl::StatusOr<wire::EsJob> EsJobFromRequest(const v1::StartJobRequest& request,
                                             const std::string& model_path,
                                             const Tokenizer& tokenizer,
                                             const ChatTemplate* chat) {
  wire::EsJob job;
  job.set_job_id(request.job_id());
  job.set_model_path(model_path);
  job.set_mode(request.mode().empty() ? "lora" : request.mode());
  job.set_tensors(request.tensors().empty()
                      ? "blk\\.[0-9]+\\.(attn_q|attn_v|ffn_down)\\.weight"
                      : request.tensors());
  if (request.lora_targets().empty()) {
    static const std::string kDefaultTargets[] = {"q", "v"};
    for (const std::string& t : kDefaultTargets) *job.add_lora_targets() = t;
  } else {
    *job.mutable_lora_targets() = request.lora_targets();
  }
  job.set_lora_rank(request.lora_rank() == 0 ? 8 : request.lora_rank());
  job.set_lora_alpha(request.lora_alpha() == 0.0f ? 16.0f : request.lora_alpha());
  job.set_population(request.population() == 0 ? 16 : request.population());
  job.set_sigma(request.sigma() == 0.0f ? 1e-3f : request.sigma());
  job.set_lr(request.lr() == 0.0f ? 5e-4f : request.lr());
  job.set_weight_decay(request.weight_decay());
  job.set_sigma_decay(request.sigma_decay());
  job.set_lr_decay(request.lr_decay());
  job.set_seed(request.seed());
  job.set_threads(request.threads());
  job.mutable_reward()->set_kind(request.reward().empty() ? "nll" : request.reward());
  job.mutable_reward()->set_rule(request.rule());
  job.mutable_reward()->set_max_tokens(request.max_tokens());
  if (request.iterations() < 0 || request.iterations() > kMaxIterations) {
    return absl::InvalidArgumentError(
        absl::StrCat("iterations must be in [0, ", kMaxIterations, "]"));
  }
  if (request.checkpoint_every() < 0) {
    return absl::InvalidArgumentError("checkpoint_every must not be negative");
  }
  const ChatTemplate* render = request.raw() ? nullptr : chat;
  if (absl::Status s = AddTasks(request.tasks(), "tasks", tokenizer, render, job.mutable_tasks());
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          AddTasks(request.holdout(), "holdout", tokenizer, render, job.mutable_holdout());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateEsJob(job, static_cast<int64_t>(tokenizer.vocab_size()));
      !s.ok()) {
    return s;
  }
  return job;
}

absl::Status RunEsJob(EsDriver& driver,
                      const std::function<void(const v1::JobEvent&)>& on_event) {
  const std::string& id = driver.job().job_id();
  const bool holdout = driver.job().holdout_size() > 0;
  // The unperturbed parameters' scores, into `event`.
  auto score = [&](v1::JobEvent& event) -> absl::Status {
    auto train = driver.EvaluateCenter(false);
    if (!train.ok()) return train.status();
    event.set_train_reward(*train);
    if (holdout) {
      auto held = driver.EvaluateCenter(true);
      if (!held.ok()) return held.status();
      event.set_holdout_reward(*held);
    }
    return absl::OkStatus();
  };
  auto finish = [&](absl::Status status) {
    v1::JobEvent last;
    last.set_job_id(id);
    last.set_generation(driver.generation());
    last.set_checksum(driver.checksum());
    if (status.ok()) status = score(last);
    last.set_state(status.ok()                   ? v1::JOB_STATE_SUCCEEDED
                   : absl::IsCancelled(status) ? v1::JOB_STATE_STOPPED
                                               : v1::JOB_STATE_FAILED);
    if (!status.ok()) last.set_error(status.ToString());
    // An ended job holds no replica: freed before anyone is told it ended.
    driver.ReleaseReplicas();
    on_event(last);
    return status;
  };
  v1::JobEvent first;
  first.set_job_id(id);
  first.set_state(v1::JOB_STATE_RUNNING);
  if (absl::Status s = score(first); !s.ok()) return finish(s);
  first.set_generation(driver.generation());
  first.set_checksum(driver.checksum());
  on_event(first);
  return finish(driver.Run([&](const EsGenerationEvent& e) { on_event(ToEvent(id, e)); }));
}

TrainJobs::TrainJobs(std::string model_path, std::string train_dir, const Tokenizer& tokenizer,
                     const ChatTemplate& chat, EsPlacement placement, EsMetrics* metrics,
                     size_t retained_jobs)
    : model_path_(std::move(model_path)),
      train_dir_(std::move(train_dir)),
      tokenizer_(tokenizer),
      chat_(chat),
      placement_(std::move(placement)),
      metrics_(metrics),
      retained_jobs_(retained_jobs) {}

TrainJobs::~TrainJobs() { Shutdown(std::chrono::steady_clock::time_point::max()); }

void TrainJobs::Shutdown(std::chrono::steady_clock::time_point deadline) {
  std::vector<std::shared_ptr<Job>> jobs;
  std::unique_lock<std::mutex> lock(mu_);
  shutting_down_ = true;
  for (auto& [id, job] : jobs_) {
    job->driver->Stop();
    jobs.push_back(job);
  }
  auto all_ended = [&] {
    return std::all_of(jobs.begin(), jobs.end(), [](const auto& j) { return j->ended(); });
  };
  std::vector<std::shared_ptr<Job>> late;
  if (deadline == std::chrono::steady_clock::time_point::max()) {
    changed_.wait(lock, all_ended);
  } else if (!changed_.wait_until(lock, deadline, all_ended)) {
    for (const auto& job : jobs) {
      if (!job->ended()) late.push_back(job);
    }
  }
  lock.unlock();
  // Aborting calls the workers (EsRelease): not under mu_, which the jobs' events need.
  for (const auto& job : late) job->driver->Abort();
  for (const auto& job : jobs) {
    if (job->thread.joinable()) job->thread.join();
  }
}

std::vector<std::shared_ptr<TrainJobs::Job>> TrainJobs::ForgetEndedLocked() {
  std::vector<std::shared_ptr<Job>> forgotten;
  while (ended_.size() > retained_jobs_) {
    auto it = jobs_.find(ended_.front());
    ended_.erase(ended_.begin());
    if (it == jobs_.end()) continue;
    forgotten.push_back(std::move(it->second));
    jobs_.erase(it);
  }
  return forgotten;
}

absl::StatusOr<std::string> TrainJobs::JobDir(const std::string& name, const char* field) const {
  if (train_dir_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": this coordinator keeps no checkpoints (start it with --train-dir)"));
  }
  bool ok = !name.empty() && name.size() <= 200 && name.front() != '/';
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    // A part of dots only ("..", "...") is refused: no name that a path walk treats specially.
    ok = ok && part.find_first_not_of('.') != absl::string_view::npos &&
         ValidJobId(std::string(part.data(), part.size()));
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " must be a relative folder name of [A-Za-z0-9._-] parts (under the "
        "coordinator's --train-dir), none of dots only"));
  }
  // No part may be a symbolic link: a link planted under --train-dir would lead elsewhere.
  std::string dir = train_dir_;
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    absl::StrAppend(&dir, "/", part);
    std::error_code ec;
    if (std::filesystem::is_symlink(std::filesystem::symlink_status(dir, ec))) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", name, "' leads through a symbolic link"));
    }
  }
  return dir;
}

absl::StatusOr<v1::Job> TrainJobs::Start(const v1::StartJobRequest& request) {
  std::string id = request.job_id();
  if (!id.empty() && !ValidJobId(id)) {
    return absl::InvalidArgumentError(
        "job_id must be 1 to 64 characters of [A-Za-z0-9._-]");
  }
  if (request.iterations() < 0 || request.iterations() > kMaxIterations) {
    return absl::InvalidArgumentError(
        absl::StrCat("iterations must be in [0, ", kMaxIterations, "]"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
    if (id.empty()) {
      while (jobs_.contains(absl::StrCat("job-", next_id_))) ++next_id_;
      id = absl::StrCat("job-", next_id_++);
    } else if (jobs_.contains(id)) {
      return absl::AlreadyExistsError(absl::StrCat("a job named '", id, "' exists"));
    }
  }
  EsDriverOptions options;
  options.iterations = request.iterations() == 0 ? 10 : request.iterations();
  if (!request.out_dir().empty()) {
    auto dir = JobDir(request.out_dir(), "out_dir");
    if (!dir.ok()) return dir.status();
    options.out_dir = *dir;
  }
  std::string resume_dir;
  if (!request.resume_from().empty()) {
    auto dir = JobDir(request.resume_from(), "resume_from");
    if (!dir.ok()) return dir.status();
    resume_dir = *dir;
  }
  options.checkpoint_every = request.checkpoint_every();
  if (request.resume_from().empty()) {
    v1::StartJobRequest named = request;
    named.set_job_id(id);
    auto job = EsJobFromRequest(named, model_path_, tokenizer_, &chat_);
    if (!job.ok()) return job.status();
    options.job = *std::move(job);
  } else {
    options.job.set_job_id(id);  // the rest comes from the checkpoint,
    options.job.set_model_path(model_path_);  // but the model is the served one
    if (request.checkpoint_every() < 0) {
      return absl::InvalidArgumentError("checkpoint_every must not be negative");
    }
  }
  auto record = std::make_shared<Job>();
  record->out_dir = options.out_dir;
  if (metrics_ != nullptr) record->metrics = metrics_->ForJob(id);
  record->driver = std::make_unique<EsDriver>(
      std::move(options),
      [placement = placement_, pipeline = request.pipeline()] { return placement(pipeline); },
      record->metrics.get());
  if (!request.resume_from().empty()) {
    if (absl::Status s = record->driver->Resume(resume_dir); !s.ok()) return s;
  }
  record->info.set_job_id(id);
  record->info.set_state(v1::JOB_STATE_RUNNING);
  record->info.set_iterations(request.iterations() == 0 ? 10 : request.iterations());
  record->info.set_out_dir(request.out_dir());
  record->info.set_generation(record->driver->generation());
  Job* job = record.get();
  std::vector<std::shared_ptr<Job>> forgotten;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return absl::UnavailableError("the coordinator is shutting down");
    if (jobs_.contains(id)) {
      return absl::AlreadyExistsError(absl::StrCat("a job named '", id, "' exists"));
    }
    // One running job per folder: two would overwrite each other's checkpoints.
    for (const auto& [other_id, other] : jobs_) {
      if (!other->ended() && !other->out_dir.empty() &&
          (other->out_dir == record->out_dir || other->out_dir == resume_dir)) {
        return absl::FailedPreconditionError(absl::StrCat(
            record->out_dir == other->out_dir ? "out_dir" : "resume_from", " '",
            record->out_dir == other->out_dir ? request.out_dir() : request.resume_from(),
            "' is the folder of running job '", other_id, "'"));
      }
    }
    jobs_[id] = record;
    job->thread = std::thread([this, job] {
      RunEsJob(*job->driver, [&](const v1::JobEvent& event) {
        std::lock_guard<std::mutex> lock(mu_);
        job->events.push_back(event);
        job->info.set_generation(event.generation());
        job->info.set_checksum(event.checksum());
        job->info.set_state(event.state());
        job->info.set_error(event.error());
        *job->info.mutable_last() = event;
        if (job->ended()) ended_.push_back(job->info.job_id());
        changed_.notify_all();
      }).IgnoreError();  // the last event carries it
    });
    forgotten = ForgetEndedLocked();
  }
  for (const auto& old : forgotten) {
    if (old->thread.joinable()) old->thread.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  return Info(id);
}

absl::StatusOr<v1::Job> TrainJobs::Info(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job named '", job_id, "'"));
  v1::Job info = it->second->info;
  info.set_num_values(it->second->driver->num_values());
  for (const std::string& w : it->second->driver->replica_workers()) info.add_workers(w);
  return info;
}

absl::StatusOr<v1::Job> TrainJobs::Get(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return Info(job_id);
}

absl::StatusOr<v1::Job> TrainJobs::Stop(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job named '", job_id, "'"));
  it->second->driver->Stop();
  return Info(job_id);
}

std::vector<v1::Job> TrainJobs::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::Job> out;
  for (const auto& [id, job] : jobs_) out.push_back(*Info(id));
  return out;
}

absl::Status TrainJobs::Watch(const std::string& job_id,
                              const std::function<bool(const v1::JobEvent&)>& write,
                              const std::function<bool()>& cancelled) const {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job named '", job_id, "'"));
  const std::shared_ptr<const Job> held = it->second;  // alive even if forgotten meanwhile
  const Job& job = *held;
  for (size_t sent = 0;;) {
    while (sent < job.events.size()) {
      const v1::JobEvent event = job.events[sent++];
      lock.unlock();
      const bool more = write(event);
      lock.lock();
      if (!more) return absl::CancelledError("the watcher went away");
    }
    if (job.info.state() != v1::JOB_STATE_RUNNING) return absl::OkStatus();
    if (cancelled && cancelled()) return absl::CancelledError("the watcher went away");
    changed_.wait_for(lock, std::chrono::milliseconds(200));
  }
}

}  // namespace fucina
