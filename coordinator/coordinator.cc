#include "coordinator/coordinator.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "models/engine/kv_cache.h"
#include "models/engine/lora.h"
#include "models/engine/model_size.h"
#include "models/engine/registry.h"
#include "models/log/log.h"
#include "worker/activations.h"

namespace fucina {

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    const CoordinatorOptions& options, std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<Coordinator> c(new Coordinator());
  c->options_ = options;
  if (options.context < 2) {
    return absl::InvalidArgumentError(absl::StrCat("--ctx must be at least 2, got ",
                                                   options.context));
  }
  if (auto type = ParseKvCacheType(options.cache_type); !type.ok()) return type.status();
  wire::ActivationType activation;
  if (absl::Status s = ParseActivationType(options.activation_type, &activation); !s.ok()) {
    return s;
  }
  if (options.scheduler.batch < 1 || options.scheduler.max_queue < 1 || options.kv_slots < 1) {
    return absl::InvalidArgumentError("--batch, --max-queue and --kv-slots must be at least 1");
  }
  auto file = gguf::File::Open(options.model_path);
  if (!file.ok()) return file.status();
  c->file_ = *std::move(file);
  auto config = ReadModelConfig(*c->file_);
  if (!config.ok()) return config.status();
  c->config_ = *std::move(config);
  c->size_ = MeasureModel(*c->file_, c->config_);
  if (!options.adapter_path.empty()) {
    // A wrong adapter is refused here, before any worker loads a shard and fails with it.
    auto adapter = gguf::File::Open(options.adapter_path);
    if (!adapter.ok()) return adapter.status();
    auto set = ReadLoraFile(**adapter, c->config_.arch);
    if (!set.ok()) return set.status();
    if (absl::Status s = CheckLoraFits(*set, options.adapter_path, *c->file_); !s.ok()) return s;
  }
  if (options.context > kMaxContext) {
    return absl::InvalidArgumentError(absl::StrCat("--ctx must be at most ", kMaxContext,
                                                   " positions, got ", options.context));
  }
  {
    // A context whose KV cache cannot exist would plan "ready" and then fail every request.
    const int64_t kv = KvBytesPerSession(c->config_, 0, c->config_.num_layers, options.context,
                                         *ParseKvCacheType(options.cache_type));
    const int64_t ram = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
    if (ram > 0 && kv > ram) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ctx ", options.context, " needs ", kv, " bytes of ", options.cache_type,
          " KV cache for one session; this machine has ", ram, " bytes of memory"));
    }
  }
  auto text = TextFrontEnd::Create(*c->file_, {.context = options.context,
                                                .system_prompt = options.system_prompt,
                                                .parse_special_in_content =
                                                    options.parse_special_in_content,
                                                .grammar_timeout = options.grammar_timeout});
  if (!text.ok()) return text.status();
  c->text_ = *std::move(text);
  // Model ids are what clients type: the file's stem ("SmolLM2-135M-Instruct.Q4_1"), not
  // general.name's free text ("Smollm2 135M 8k Lc100K Mix1 Ep2"), which stays an alias.
  c->served_name_ = !options.served_name.empty()
                        ? options.served_name
                        : std::filesystem::path(options.model_path).stem().string();
  c->metrics_ = std::make_unique<Metrics>(registry, c->served_name_);
  c->metrics_->SetQueueCapacity(options.scheduler.max_queue);
  c->metrics_->SetWorkers(0, 0);
  c->es_metrics_ = std::make_unique<EsMetrics>(*registry);
  Coordinator* self = c.get();
  c->train_jobs_ = std::make_unique<TrainJobs>(
      options.model_path, options.train_dir, c->text_->tokenizer(), c->text_->chat_template(),
      [self](bool pipeline) { return self->TrainGroups(pipeline); },
      c->es_metrics_.get());
  c->workers_ = std::make_unique<WorkerRegistry>(
      options.heartbeat_ms, options.dead_after_ms, c->metrics_.get(),
      [self](const std::string& id, const absl::Status& why) { self->MarkDead(id, why); });
  c->loader_ = std::make_unique<PlanLoader>(
      c->options_, c->config_, c->size_, *c->workers_,
      [self](std::shared_ptr<const ClusterPlan> plan) {
        std::lock_guard<std::mutex> lock(self->mu_);
        self->plan_ = std::move(plan);
      });
  c->scheduler_ = std::make_unique<Scheduler>(
      options.scheduler, c->text_->tokenizer(), [self] { return self->loader_->Load(); },
      [self](const std::string& id, const absl::Status& why) { self->MarkDead(id, why); },
      c->metrics_.get());
  return c;
}

Coordinator::~Coordinator() {
  train_jobs_.reset();  // its jobs call workers through this object
  // Stopped while this object is whole: the watcher and the last failures call MarkDead.
  if (workers_) workers_->Stop();
  if (scheduler_) scheduler_->Stop();
}

std::string Coordinator::AddWorker(const std::string& address, const WorkerInfo& info,
                                   std::shared_ptr<WorkerClient> client,
                                   const std::string& device) {
  std::string id = workers_->Enroll(address, info, std::move(client), device);
  // Running requests finish on the old plan first.
  scheduler_->RequestReplan(/*drain=*/true);
  return id;
}

std::vector<std::string> Coordinator::AddWorkers(
    const std::vector<std::pair<WorkerInfo, std::shared_ptr<WorkerClient>>>& workers) {
  std::vector<std::string> ids;
  for (const auto& [info, client] : workers) {
    ids.push_back(workers_->Enroll("", info, client, "cpu"));
  }
  scheduler_->RequestReplan(/*drain=*/true);
  return ids;
}

void Coordinator::MarkDead(const std::string& worker_id, const absl::Status& why) {
  if (!workers_->Forget(worker_id, why)) return;
  const std::string address = workers_->AddressOf(worker_id);
  const bool in_plan = plan()->Uses(worker_id);
  // A worker that holds nothing of the current plan (a spare, or a stranger that registered and
  // left) changes nothing for the running requests. One that does: the scheduler learns why
  // first, so the failures the cuts below cause are laid to this death, not to the stages.
  if (in_plan) {
    scheduler_->WorkerDied(worker_id, absl::UnavailableError(absl::StrCat(
        "worker ", worker_id, address.empty() ? "" : absl::StrCat(" (", address, ")"),
        " failed: ", why.message())));
  }
  // Its calls in flight (a re-plan may be loading a shard on it) fail now, later ones at once.
  if (std::shared_ptr<WorkerClient> client = ClientFor(worker_id)) client->Close();
}

std::vector<EsGroup> Coordinator::TrainGroups(bool pipeline) const {
  const std::vector<WorkerRecord> alive = workers_->Alive();
  std::vector<EsGroup> groups;
  if (!pipeline) {
    for (const WorkerRecord& w : alive) groups.push_back({{{w.id, w.client, w.address}}, {}});
    return groups;
  }
  const std::shared_ptr<const ClusterPlan> plan = this->plan();
  if (!plan->ready || plan->stages.empty()) return groups;
  EsGroup group;
  for (const StagePlan& stage : plan->stages) {
    auto w = std::find_if(alive.begin(), alive.end(),
                          [&](const WorkerRecord& r) { return r.id == stage.worker_id; });
    if (w == alive.end()) return groups;  // the next plan will have others
    group.workers.push_back({w->id, w->client, w->address});
    wire::EsShard& shard = group.stages.emplace_back();
    shard.set_first_layer(stage.first_layer);
    shard.set_last_layer(stage.last_layer);
    shard.set_embeddings(stage.embeddings);
    shard.set_head(stage.head);
  }
  groups.push_back(std::move(group));
  return groups;
}

::fucina::v1::Placement Coordinator::placement() const {
  ::fucina::v1::Placement out;
  const std::vector<WorkerRecord> workers = workers_->Workers();
  const std::shared_ptr<const ClusterPlan> plan = this->plan();
  out.set_model(served_name_);
  out.set_ready(plan->ready);
  out.set_status(plan->status);
  out.set_kv_slots(plan->kv_slots);
  out.set_resident_slots(scheduler_->resident_slots());
  out.set_micro_batches(scheduler_->micro_batches());
  auto record = [&](const std::string& id) -> const WorkerRecord* {
    for (const WorkerRecord& w : workers) {
      if (w.id == id) return &w;
    }
    return nullptr;
  };
  for (const StagePlan& s : plan->stages) {
    auto* p = out.add_stages();
    p->set_worker_id(s.worker_id);
    if (const WorkerRecord* w = record(s.worker_id)) {
      p->set_address(w->address);
      p->set_device(w->device);
    }
    p->set_first_layer(s.first_layer);
    p->set_last_layer(s.last_layer);
    p->set_embeddings(s.embeddings);
    p->set_head(s.head);
  }
  for (const ExpertPlan& e : plan->experts) {
    auto* p = out.add_experts();
    p->set_worker_id(e.worker_id);
    if (const WorkerRecord* w = record(e.worker_id)) {
      p->set_address(w->address);
      p->set_device(w->device);
    }
    for (int32_t x : e.experts) p->add_experts(x);
  }
  const auto now = std::chrono::steady_clock::now();
  for (const WorkerRecord& w : workers) {
    ::fucina::v1::WorkerState* p = out.add_workers();
    p->set_worker_id(w.id);
    p->set_address(w.address);
    p->set_device(w.device);
    p->set_cores(w.info.cores);
    p->set_memory_budget(w.info.memory_budget);
    p->set_alive(w.alive);
    if (w.stats.has_value()) {
      ::fucina::v1::WorkerLoad* load = p->mutable_load();
      load->set_sessions(w.stats->sessions());
      load->set_kv_bytes(w.stats->kv_bytes());
      load->set_queue_depth(w.stats->queue_depth());
      load->set_weight_bytes(w.stats->weight_bytes());
      load->set_age_ms(std::chrono::duration_cast<std::chrono::milliseconds>(now - w.stats_at)
                           .count());
    }
  }
  return out;
}

bool Coordinator::Serves(const std::string& model) const {
  return model.empty() || model == served_name_ || (!config_.name.empty() && model == config_.name);
}

}  // namespace fucina
