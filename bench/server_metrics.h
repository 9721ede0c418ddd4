// What the serving benchmarks read from the servers' Prometheus endpoints: the text scraped,
// sums of samples, bytes per token, and the per-step breakdown of the served path
// (`fucina bench cluster-aggregate`).
#ifndef FUCINA_BENCH_SERVER_METRICS_H_
#define FUCINA_BENCH_SERVER_METRICS_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fucina::cli {

// GET http://ADDRESS/metrics (HTTP/1.0, so the body ends with the connection); "" on failure.
std::string ScrapeMetrics(const std::string& address);

// The sum of the samples of `name` whose labels contain every one of `label`'s comma-separated
// pairs, in any order (e.g. direction="sent", or kind="decode",part="queue"); nullopt when
// there is none. Label values must not hold `",`.
std::optional<double> MetricSum(const std::string& text, const std::string& name,
                                const std::string& label = "");

// "X sent / Y received" bytes per generated token of a counter with a direction label, its
// total when it has no such label, "n/a" when the server does not export it.
std::string PerToken(const std::string& before, const std::string& after, const std::string& name,
                     double tokens);

// The per-step breakdown of the served path (ms per step) from the counters of the coordinator
// (fucina_coordinator_step_seconds_total) and of each stage's worker, in stage order
// (fucina_worker_step_seconds_total), scraped before and after a measurement. Each part is
// measured where it happens; the transport of a call is the caller's wait minus the callee's
// own time (worker/step_times.h). The remainder is the step's time (measured on its own) minus
// every part.
std::string StepBreakdown(const std::string& coordinator_before,
                          const std::string& coordinator_after,
                          const std::vector<std::pair<std::string, std::string>>& stages);

}  // namespace fucina::cli

#endif  // FUCINA_BENCH_SERVER_METRICS_H_
