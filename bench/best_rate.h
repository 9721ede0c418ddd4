// Best-of-repeats timing for `fucina bench kernels`: a figure is the fastest of as many passes
// as fit in `min_seconds` (at least one), so a slow pass (a page fault, a descheduled thread)
// does not lower it.
#ifndef FUCINA_BENCH_BEST_RATE_H_
#define FUCINA_BENCH_BEST_RATE_H_

#include <algorithm>
#include <chrono>

namespace fucina::cli {

// `work` (any unit) per second of the fastest call of pass().
template <typename Fn>
double BestRate(double work, double min_seconds, Fn&& pass) {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  double best = 0;
  const Clock::time_point start = Clock::now();
  do {
    const Clock::time_point t0 = Clock::now();
    pass();
    best = std::max(best, work / since(t0));
  } while (since(start) < min_seconds);
  return best;
}

}  // namespace fucina::cli

#endif  // FUCINA_BENCH_BEST_RATE_H_
