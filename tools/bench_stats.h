// Statistics shared by the benchmarks (`fucina run --bench`, `fucina bench ...`).
#ifndef FUCINA_TOOLS_BENCH_STATS_H_
#define FUCINA_TOOLS_BENCH_STATS_H_

#include <algorithm>
#include <vector>

namespace fucina::cli {

// The median of repeated measurements (the upper one of an even count); 0 for none.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The q-quantile (q in [0, 1]) by the nearest-rank rule: the smallest value with at least
// q of the values at or below it; 0 for none.
inline double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = q * static_cast<double>(v.size());
  size_t i = static_cast<size_t>(rank);
  if (static_cast<double>(i) == rank && i > 0) --i;  // an exact rank is that value itself
  return v[std::min(i, v.size() - 1)];
}

}  // namespace fucina::cli

#endif  // FUCINA_TOOLS_BENCH_STATS_H_
