// Training tasks and the rewards ES maximises over them.
//
// A task file is JSONL: one {"prompt": "...", "answer": "..."} object per line (blank lines
// skipped). With a chat template the prompt becomes a user turn plus the generation prompt,
// rendered as the model's template renders it; without one the prompt text is used as is.
#ifndef FUCINA_MODELS_TRAIN_TASKS_H_
#define FUCINA_MODELS_TRAIN_TASKS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/chat/chat_template.h"
#include "models/engine/model.h"
#include "models/tokenizer/tokenizer.h"

namespace fucina::train {

struct Task {
  std::vector<int32_t> prompt;  // non-empty
  std::vector<int32_t> answer;  // non-empty
};

// Errors name the file, the line and the field (bad JSON, a missing or non-string field, an
// answer that tokenizes to nothing); nothing is returned for a file with an error.
absl::StatusOr<std::vector<Task>> LoadTasks(const std::string& path, const Tokenizer& tokenizer,
                                            const ChatTemplate* chat);

// The `nll` reward: the mean over tasks of the mean log-probability of each answer token given
// the prompt and the answer tokens before it (teacher forcing), i.e. minus the mean NLL.
// Requires a whole model (Model::is_full()).
absl::StatusOr<float> MeanAnswerLogProb(Model& model, std::span<const Task> tasks);

}  // namespace fucina::train

#endif  // FUCINA_MODELS_TRAIN_TASKS_H_
