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

}  // namespace fucina::cli

#endif  // FUCINA_TOOLS_BENCH_STATS_H_
