// The model a one-process benchmark runs (`fucina bench spec`, `fucina bench grammar`): a
// reference resolved (pulled if need be), loaded on a pool of its own, with its tokenizer and
// chat template.
#ifndef FUCINA_BENCH_BENCH_MODEL_H_
#define FUCINA_BENCH_BENCH_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/thread_pool.h"
#include "models/chat/chat_template.h"
#include "models/engine/model.h"
#include "models/tokenizer/tokenizer.h"

namespace fucina::cli {

struct BenchModel {
  std::string path;
  std::unique_ptr<ThreadPool> pool;  // before the model, which computes on it
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  absl::StatusOr<ChatTemplate> chat = absl::NotFoundError("no chat template");

  // `user` as one chat turn with the model's template; raw text (with BOS) without one.
  absl::StatusOr<std::vector<int32_t>> EncodeUserTurn(const std::string& user) const;
};

// threads <= 0: all (the default pool's size).
absl::StatusOr<BenchModel> LoadBenchModel(const std::string& reference, int threads);

}  // namespace fucina::cli

#endif  // FUCINA_BENCH_BENCH_MODEL_H_
