#include "coordinator/coordinator.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "coordinator/request_fields.h"
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
  auto tokenizer = Tokenizer::FromGguf(*c->file_);
  if (!tokenizer.ok()) return tokenizer.status();
  c->tokenizer_ = *std::move(tokenizer);
  if (auto tmpl = ChatTemplate::FromGguf(*c->file_); tmpl.ok()) {
    c->chat_template_ = *std::move(tmpl);
  }
  // Model ids are what clients type: the file's stem ("SmolLM2-135M-Instruct.Q4_1"), not
  // general.name's free text ("Smollm2 135M 8k Lc100K Mix1 Ep2"), which stays an alias.
  c->served_name_ = !options.served_name.empty()
                        ? options.served_name
                        : std::filesystem::path(options.model_path).stem().string();
  for (int32_t id = 0; id < c->tokenizer_->vocab_size(); ++id) {
    c->max_token_bytes_ = std::max(c->max_token_bytes_, c->tokenizer_->TokenToPiece(id).size());
  }
  c->metrics_ = std::make_unique<Metrics>(registry, c->served_name_);
  c->metrics_->SetQueueCapacity(options.scheduler.max_queue);
  c->metrics_->SetWorkers(0, 0);
  c->es_metrics_ = std::make_unique<EsMetrics>(*registry);
  Coordinator* self = c.get();
  c->train_jobs_ = std::make_unique<TrainJobs>(
      options.model_path, options.train_dir, *c->tokenizer_, c->chat_template_,
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
      options.scheduler, *c->tokenizer_, [self] { return self->loader_->Load(); },
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

absl::StatusOr<std::vector<int32_t>> Coordinator::Encode(
    std::string_view text, bool add_special,
    std::span<const std::pair<size_t, size_t>> plain) const {
  // Each token stands for at most max_token_bytes_ bytes of text (+1: a prefix space SPM may
  // add), so longer text has more tokens than the context holds.
  const uint64_t limit =
      static_cast<uint64_t>(options_.context) * (max_token_bytes_ + 1) + max_token_bytes_;
  if (text.size() > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt's ", text.size(), " bytes cannot fit the context of ",
                     options_.context, " tokens (--ctx; at most ", limit, " bytes)"));
  }
  return tokenizer_->EncodeWithPlainRanges(text, add_special, plain);
}

absl::StatusOr<std::vector<int32_t>> Coordinator::EncodeChat(std::vector<ChatMessage> messages,
                                                             const ChatRenderOptions& options,
                                                             std::string* rendered) const {
  const bool has_system = std::any_of(messages.begin(), messages.end(),
                                      [](const ChatMessage& m) { return m.role == "system"; });
  if (!has_system && !options_.system_prompt.empty()) {
    ChatMessage system;
    system.role = "system";
    system.content = options_.system_prompt;
    messages.insert(messages.begin(), std::move(system));
  }
  auto text = chat_template_.Render(messages, options);
  if (!text.ok()) return text.status();
  auto ids = Encode(*text, true,
                    options_.parse_special_in_content
                        ? std::vector<std::pair<size_t, size_t>>()
                        : UserContentRanges(*text, messages));
  if (rendered != nullptr) *rendered = *std::move(text);
  return ids;
}

absl::Status Coordinator::CheckGrammar(const GrammarSpec& spec) const {
  if (spec.empty()) return absl::OkStatus();
  std::shared_ptr<const GrammarVocab> vocab;
  {
    std::lock_guard<std::mutex> lock(grammar_mu_);
    if (grammar_vocab_ == nullptr) {
      auto made = GrammarVocab::Create(*tokenizer_);
      if (!made.ok()) return made.status();
      grammar_vocab_ = *std::move(made);
    }
    vocab = grammar_vocab_;
  }
  auto matcher = vocab->Compile(spec, options_.grammar_timeout);
  if (matcher.status().code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::InvalidArgumentError(
        absl::StrCat(matcher.status().message(), "; --grammar-timeout sets the limit"));
  }
  return matcher.status();
}

absl::StatusOr<GenerateJob> JobFromRequest(const Coordinator& c,
                                           const ::fucina::v1::GenerateRequest& request) {
  const CoordinatorOptions& o = c.options();
  // The fields as sent; the one validation module maps and checks them (request_fields.h).
  RequestFields fields;
  const ::fucina::v1::Sampling& s = request.sampling();
  if (s.has_temperature()) fields.temperature = s.temperature();
  if (s.has_top_k()) fields.top_k = s.top_k();
  if (s.has_top_p()) fields.top_p = s.top_p();
  if (s.has_min_p()) fields.min_p = s.min_p();
  if (s.has_repetition_penalty()) fields.repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) fields.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) fields.frequency_penalty = s.frequency_penalty();
  if (s.has_penalty_last_n()) fields.penalty_last_n = s.penalty_last_n();
  if (s.has_seed()) fields.seed = s.seed();
  // Sorted by id: a proto map's order is unspecified, the sampler's result must not depend on it.
  std::map<int32_t, float> bias(s.logit_bias().begin(), s.logit_bias().end());
  for (const auto& [id, b] : bias) fields.logit_bias.emplace_back(id, b);
  if (request.has_max_tokens()) fields.max_tokens = request.max_tokens();
  fields.top_logprobs = request.top_logprobs();
  fields.stop.assign(request.stop().begin(), request.stop().end());
  fields.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  fields.ignore_eos = request.ignore_eos();
  if (request.has_speculative()) fields.speculative = request.speculative();
  GenerateJob job;
  if (absl::Status st = ResolveRequestFields(fields, o.sampling, o.max_tokens,
                                             c.tokenizer().vocab_size(), &job);
      !st.ok()) {
    return st;
  }
  const ::fucina::v1::Constraint& k = s.constraint();
  switch (k.kind_case()) {
    case ::fucina::v1::Constraint::kJsonSchema:
      job.grammar = GrammarSpec::JsonSchema(k.json_schema());
      break;
    case ::fucina::v1::Constraint::kJsonObject:
      if (k.json_object()) job.grammar = GrammarSpec::JsonObject();
      break;
    case ::fucina::v1::Constraint::kRegex:
      job.grammar = GrammarSpec::Regex(k.regex());
      break;
    case ::fucina::v1::Constraint::kLark:
      job.grammar = GrammarSpec::Lark(k.lark());
      break;
    case ::fucina::v1::Constraint::KIND_NOT_SET:
      break;
  }
  if (absl::Status st = c.CheckGrammar(job.grammar); !st.ok()) {
    // Compiles full (RESOURCE_EXHAUSTED) is the server's state, not the grammar's fault: the
    // client may retry as it is.
    return absl::Status(absl::IsResourceExhausted(st) ? st.code()
                                                      : absl::StatusCode::kInvalidArgument,
                        absl::StrCat("sampling.constraint: ", st.message()));
  }
  absl::StatusOr<std::vector<int32_t>> prompt;
  switch (request.input_case()) {
    case ::fucina::v1::GenerateRequest::kPrompt:
      prompt = c.Encode(request.prompt(), true);
      break;
    case ::fucina::v1::GenerateRequest::kTokenIds:
      prompt = std::vector<int32_t>(request.token_ids().ids().begin(),
                                    request.token_ids().ids().end());
      break;
    case ::fucina::v1::GenerateRequest::kMessages: {
      std::vector<ChatMessage> messages;
      for (int i = 0; i < request.messages().messages_size(); ++i) {
        const auto& m = request.messages().messages(i);
        auto role = NormalizeChatRole(m.role(), absl::StrCat("messages[", i, "]"));
        if (!role.ok()) return role.status();
        ChatMessage msg;
        msg.role = *std::move(role);
        msg.content = m.content();
        messages.push_back(std::move(msg));
      }
      if (messages.empty()) return absl::InvalidArgumentError("field 'messages' is empty");
      ChatRenderOptions render;
      if (request.messages().has_enable_thinking()) {
        render.enable_thinking = request.messages().enable_thinking();
      }
      prompt = c.EncodeChat(std::move(messages), render);
      break;
    }
    default:
      return absl::InvalidArgumentError("one of prompt, token_ids or messages is required");
  }
  if (!prompt.ok()) return prompt.status();
  job.prompt = *std::move(prompt);
  if (job.prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  return job;
}

}  // namespace fucina
