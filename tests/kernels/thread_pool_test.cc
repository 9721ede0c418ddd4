#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <vector>

#include <gtest/gtest.h>

namespace fucina {
namespace {

TEST(ThreadPoolTest, RunCallsEveryPartOnce) {
  for (int n : {1, 2, 5}) {
    ThreadPool pool(n);
    std::vector<std::atomic<int>> calls(n);
    for (int rep = 0; rep < 100; ++rep) pool.Run([&](int t) { calls[t]++; });
    for (int t = 0; t < n; ++t) EXPECT_EQ(calls[t].load(), 100) << "part " << t;
  }
}

TEST(ThreadPoolTest, ParallelForCoversEachIndexExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 7, 1000, 4099}) {
    for (int64_t grain : {1, 3, 64}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, grain, [&](int64_t b, int64_t e, int t) {
        ASSERT_LE(e - b, grain);
        ASSERT_GE(t, 0);
        ASSERT_LT(t, 4);
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPoolTest, ManyShortJobsBackToBack) {
  // Decode issues hundreds of tiny jobs per token: none may be lost or run twice.
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 20000; ++job) {
    pool.ParallelFor(6, 1, [&](int64_t b, int64_t e, int) { sum += e - b; });
  }
  EXPECT_EQ(sum.load(), 6 * 20000);
}

}  // namespace
}  // namespace fucina
