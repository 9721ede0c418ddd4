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
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_METRICS_H_
