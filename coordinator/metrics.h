// The coordinator's Prometheus metrics: vLLM's names under the `fucina_` prefix (no colons:
// those are for recording rules), every series labelled with model_name.
#ifndef FUCINA_COORDINATOR_METRICS_H_
#define FUCINA_COORDINATOR_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace fucina {

struct Outcome;

class Metrics {
 public:
  Metrics(std::shared_ptr<prometheus::Registry> registry, const std::string& model_name);

  void SetQueue(int running, int waiting);
  void SetKvUsage(double fraction);
  void OnPrefixQuery(int64_t prompt_tokens, int64_t cached_tokens);
  void OnGenerated(int64_t tokens) { generation_tokens_->Increment(static_cast<double>(tokens)); }
  void ObserveTtft(double seconds) { ttft_->Observe(seconds); }
  void ObserveItl(double seconds) { itl_->Observe(seconds); }
  // A finished request: success by finish reason ("abort" when the client cancelled), or a
  // failure (counted apart).
  void OnFinished(const Outcome& outcome, double e2e_seconds);
  // Bytes of one forward call as the coordinator sends and receives them (serialized), and
  // the activation payload among them (zero while stages pass activations among themselves).
  void OnForwardCall(int64_t sent, int64_t received, int64_t activations);
  // Where one pipeline step's time went on the coordinator (seconds): assembling it, waiting
  // for its reply from the call's start (the stages' own time and the transport),
  // waiting for the scheduler thread once the reply was in, and handling the reply, of which
  // `output_text` turned samples into the requests' text. `step` is the whole, measured on its
  // own: from assembly to the reply handled.
  struct StepSeconds {
    double step = 0, assemble = 0, round_trip = 0, mailbox = 0, reply = 0, output_text = 0;
  };
  // `decode`: every segment of the step is one row, or one plus its drafts (IsDecodeStep, the
  // workers' rule), counted apart.
  void OnStep(const StepSeconds& s, bool decode);
  // One verify step of speculative decoding: `drafted` draft tokens (> 0), the first
  // `accepted` of them accepted (vLLM's spec_decode counters under our prefix).
  void OnDraft(int drafted, int accepted);
  // Registered workers by state (the dashboard's "workers up", the worker-down alert).
  void SetWorkers(int alive, int dead);
  // The admission queue's size (--max-queue): the queue-saturated alert divides by it.
  void SetQueueCapacity(int capacity) { queue_capacity_->Set(capacity); }

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::string model_name_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_usage_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* prefix_queries_;
  prometheus::Counter* prefix_hits_;
  prometheus::Family<prometheus::Counter>* success_;
  prometheus::Counter* failed_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
  prometheus::Counter* forward_sent_;
  prometheus::Counter* forward_received_;
  prometheus::Counter* activation_bytes_;
  prometheus::Gauge* queue_capacity_;
  prometheus::Gauge* workers_alive_;
  prometheus::Gauge* workers_dead_;
  // By kind of step: [0] decode, [1] other.
  struct StepCounters {
    prometheus::Counter *steps, *step, *assemble, *round_trip, *mailbox, *reply, *output_text;
  };
  StepCounters step_counters_[2];
  prometheus::Counter* spec_drafts_;
  prometheus::Counter* spec_draft_tokens_;
  prometheus::Counter* spec_accepted_tokens_;
  prometheus::Family<prometheus::Counter>* spec_accepted_per_pos_;
};

// One evolution-strategies train job's series (labelled job=<id>): made by EsMetrics.
class EsJobMetrics {
 public:
  EsJobMetrics(prometheus::Gauge* generation, prometheus::Gauge* reward_mean,
               prometheus::Gauge* reward_min, prometheus::Gauge* reward_max,
               prometheus::Histogram* member_seconds, prometheus::Counter* bytes_sent,
               prometheus::Counter* members_ok, prometheus::Counter* members_retried)
      : generation_(generation), reward_mean_(reward_mean), reward_min_(reward_min),
        reward_max_(reward_max), member_seconds_(member_seconds), bytes_sent_(bytes_sent),
        members_ok_(members_ok), members_retried_(members_retried) {}

  void OnGeneration(int64_t generation, float mean, float min, float max) {
    generation_->Set(static_cast<double>(generation));
    reward_mean_->Set(mean);
    reward_min_->Set(min);
    reward_max_->Set(max);
  }
  // A member evaluated (`seconds` on its worker), or lost with its worker and queued again.
  void OnMember(double seconds) {
    member_seconds_->Observe(seconds);
    members_ok_->Increment();
  }
  void OnMemberRetried() { members_retried_->Increment(); }
  void OnBytesSent(int64_t bytes) { bytes_sent_->Increment(static_cast<double>(bytes)); }

 private:
  prometheus::Gauge *generation_, *reward_mean_, *reward_min_, *reward_max_;
  prometheus::Histogram* member_seconds_;
  prometheus::Counter *bytes_sent_, *members_ok_, *members_retried_;
};

// The families of train jobs' metrics: fucina_es_generation, fucina_es_reward{stat},
// fucina_es_member_eval_seconds, fucina_es_bytes_sent_total (the coordinator's serialized
// requests to replicas), fucina_es_members_total{outcome=evaluated|retried}.
class EsMetrics {
 public:
  explicit EsMetrics(prometheus::Registry& registry);
  std::unique_ptr<EsJobMetrics> ForJob(const std::string& job_id);

 private:
  prometheus::Family<prometheus::Gauge>* generation_;
  prometheus::Family<prometheus::Gauge>* reward_;
  prometheus::Family<prometheus::Histogram>* member_seconds_;
  prometheus::Family<prometheus::Counter>* bytes_sent_;
  prometheus::Family<prometheus::Counter>* members_;
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_METRICS_H_
