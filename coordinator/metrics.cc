#include "coordinator/metrics.h"

#include "coordinator/request.h"

namespace fucina {
namespace {

// vLLM's bucket boundaries (vllm/engine/metrics.py).
const prometheus::Histogram::BucketBoundaries kTtftBuckets = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const prometheus::Histogram::BucketBoundaries kItlBuckets = {
    0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4, 0.5,
    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const prometheus::Histogram::BucketBoundaries kE2eBuckets = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,  15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

}  // namespace

Metrics::Metrics(std::shared_ptr<prometheus::Registry> registry, const std::string& model_name)
    : registry_(std::move(registry)), model_name_(model_name) {
  const prometheus::Labels labels = {{"model_name", model_name}};
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add(labels);
  };
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add(labels);
  };
  auto histogram = [&](const char* name, const char* help,
                       const prometheus::Histogram::BucketBoundaries& buckets) {
    return &prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_).Add(labels,
                                                                                        buckets);
  };
  running_ = gauge("fucina_num_requests_running", "Requests being stepped through the pipeline.");
  waiting_ = gauge("fucina_num_requests_waiting", "Requests admitted and waiting to run.");
  kv_usage_ = gauge("fucina_kv_cache_usage_perc",
                    "Fraction of KV slots resident on the workers (1 = all in use).");
  prompt_tokens_ = counter("fucina_prompt_tokens_total", "Prompt tokens of finished requests.");
  generation_tokens_ = counter("fucina_generation_tokens_total", "Generated tokens.");
  prefix_queries_ = counter("fucina_prefix_cache_queries_total",
                            "Prompt tokens looked up in the resident KV slots.");
  prefix_hits_ = counter("fucina_prefix_cache_hits_total",
                         "Prompt tokens served from a resident KV slot.");
  success_ = &prometheus::BuildCounter()
                  .Name("fucina_request_success_total")
                  .Help("Requests finished, by finish reason.")
                  .Register(*registry_);
  // "abort": the client cancelled or went away (vLLM counts those here, not as failures).
  for (const char* reason : {"stop", "length", "abort"}) {
    success_->Add({{"model_name", model_name}, {"finished_reason", reason}});
  }
  failed_ = counter("fucina_request_failure_total", "Requests that ended with an error.");
  ttft_ = histogram("fucina_time_to_first_token_seconds", "Time to first token.", kTtftBuckets);
  itl_ = histogram("fucina_inter_token_latency_seconds", "Time between generated tokens.",
                   kItlBuckets);
  e2e_ = histogram("fucina_e2e_request_latency_seconds", "Request latency, admission to finish.",
                   kE2eBuckets);
  auto& forward = prometheus::BuildCounter()
                      .Name("fucina_coordinator_forward_bytes_total")
                      .Help("Serialized bytes of the forward calls the coordinator makes.")
                      .Register(*registry_);
  forward_sent_ = &forward.Add({{"model_name", model_name}, {"direction", "sent"}});
  forward_received_ = &forward.Add({{"model_name", model_name}, {"direction", "received"}});
  activation_bytes_ = counter("fucina_coordinator_activation_bytes_total",
                              "Activation bytes the coordinator sent or received (stages pass "
                              "activations among themselves, so 0 in a healthy pipeline).");
  auto& steps = prometheus::BuildCounter()
                    .Name("fucina_coordinator_steps_total")
                    .Help("Pipeline steps the coordinator ran, by kind (decode: every "
                          "segment one row, or one plus its drafts).")
                    .Register(*registry_);
  auto& step = prometheus::BuildCounter()
                   .Name("fucina_coordinator_step_seconds_total")
                   .Help("Seconds of the pipeline steps on the coordinator, by kind and part; "
                         "part=step is their whole time, assembly to reply handled.")
                   .Register(*registry_);
  for (int kind = 0; kind < 2; ++kind) {
    const std::string kind_name = kind == 0 ? "decode" : "other";
    auto part = [&](const char* name) {
      return &step.Add({{"model_name", model_name}, {"kind", kind_name}, {"part", name}});
    };
    step_counters_[kind] = {
        .steps = &steps.Add({{"model_name", model_name}, {"kind", kind_name}}),
        .step = part("step"),
        .assemble = part("assemble"),
        .round_trip = part("round_trip"),
        .mailbox = part("mailbox"),
        .reply = part("reply"),
        .output_text = part("output_text")};
  }
  queue_capacity_ = gauge("fucina_queue_capacity",
                          "Requests the admission queue holds before refusing (--max-queue).");
  auto& workers = prometheus::BuildGauge()
                      .Name("fucina_workers")
                      .Help("Workers registered with the coordinator, by state.")
                      .Register(*registry_);
  workers_alive_ = &workers.Add({{"model_name", model_name}, {"state", "alive"}});
  workers_dead_ = &workers.Add({{"model_name", model_name}, {"state", "dead"}});
  spec_drafts_ = counter("fucina_spec_decode_num_drafts_total",
                         "Verify steps that carried drafts (speculative decoding).");
  spec_draft_tokens_ = counter("fucina_spec_decode_num_draft_tokens_total",
                               "Draft tokens proposed.");
  spec_accepted_tokens_ = counter("fucina_spec_decode_num_accepted_tokens_total",
                                  "Draft tokens accepted.");
  spec_accepted_per_pos_ = &prometheus::BuildCounter()
                                .Name("fucina_spec_decode_num_accepted_tokens_per_pos_total")
                                .Help("Verify steps whose draft at this position was accepted.")
                                .Register(*registry_);
}

void Metrics::SetWorkers(int alive, int dead) {
  workers_alive_->Set(alive);
  workers_dead_->Set(dead);
}

void Metrics::OnDraft(int drafted, int accepted) {
  spec_drafts_->Increment();
  spec_draft_tokens_->Increment(drafted);
  spec_accepted_tokens_->Increment(accepted);
  for (int i = 0; i < accepted; ++i) {
    spec_accepted_per_pos_->Add({{"model_name", model_name_}, {"position", std::to_string(i)}})
        .Increment();
  }
}

void Metrics::OnForwardCall(int64_t sent, int64_t received, int64_t activations) {
  forward_sent_->Increment(static_cast<double>(sent));
  forward_received_->Increment(static_cast<double>(received));
  activation_bytes_->Increment(static_cast<double>(activations));
}

void Metrics::OnStep(const StepSeconds& s, bool decode) {
  const StepCounters& c = step_counters_[decode ? 0 : 1];
  c.steps->Increment();
  c.step->Increment(s.step);
  c.assemble->Increment(s.assemble);
  c.round_trip->Increment(s.round_trip);
  c.mailbox->Increment(s.mailbox);
  c.reply->Increment(s.reply);
  c.output_text->Increment(s.output_text);
}

void Metrics::SetQueue(int running, int waiting) {
  running_->Set(running);
  waiting_->Set(waiting);
}

void Metrics::SetKvUsage(double fraction) { kv_usage_->Set(fraction); }

void Metrics::OnPrefixQuery(int64_t prompt_tokens, int64_t cached_tokens) {
  prefix_queries_->Increment(static_cast<double>(prompt_tokens));
  prefix_hits_->Increment(static_cast<double>(cached_tokens));
}

void Metrics::OnFinished(const Outcome& outcome, double e2e_seconds) {
  if (absl::IsCancelled(outcome.status)) {
    success_->Add({{"model_name", model_name_}, {"finished_reason", "abort"}}).Increment();
    e2e_->Observe(e2e_seconds);
    return;
  }
  if (!outcome.status.ok()) {
    failed_->Increment();
    return;
  }
  prompt_tokens_->Increment(static_cast<double>(outcome.prompt_tokens));
  success_->Add({{"model_name", model_name_}, {"finished_reason", outcome.finish_reason}})
      .Increment();
  e2e_->Observe(e2e_seconds);
}

}  // namespace fucina

namespace fucina {
namespace {

const prometheus::Histogram::BucketBoundaries kMemberBuckets = {
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0};

}  // namespace

EsMetrics::EsMetrics(prometheus::Registry& registry)
    : generation_(&prometheus::BuildGauge()
                       .Name("fucina_es_generation")
                       .Help("Generations a train job has finished.")
                       .Register(registry)),
      reward_(&prometheus::BuildGauge()
                   .Name("fucina_es_reward")
                   .Help("Members' raw fitness in a train job's last generation (stat: mean, "
                         "min, max).")
                   .Register(registry)),
      member_seconds_(&prometheus::BuildHistogram()
                           .Name("fucina_es_member_eval_seconds")
                           .Help("Time a worker spent evaluating one population member.")
                           .Register(registry)),
      bytes_sent_(&prometheus::BuildCounter()
                       .Name("fucina_es_bytes_sent_total")
                       .Help("Serialized bytes of the evaluate and update calls the "
                             "coordinator sent to replicas.")
                       .Register(registry)),
      members_(&prometheus::BuildCounter()
                    .Name("fucina_es_members_total")
                    .Help("Member evaluations (outcome: evaluated, or retried after its "
                          "worker failed).")
                    .Register(registry)) {}

std::unique_ptr<EsJobMetrics> EsMetrics::ForJob(const std::string& job_id) {
  const prometheus::Labels job = {{"job", job_id}};
  auto with = [&](const char* key, const char* value) {
    prometheus::Labels l = job;
    l[key] = value;
    return l;
  };
  return std::make_unique<EsJobMetrics>(
      &generation_->Add(job), &reward_->Add(with("stat", "mean")),
      &reward_->Add(with("stat", "min")), &reward_->Add(with("stat", "max")),
      &member_seconds_->Add(job, kMemberBuckets), &bytes_sent_->Add(job),
      &members_->Add(with("outcome", "evaluated")), &members_->Add(with("outcome", "retried")));
}

}  // namespace fucina
