// Training tasks and the rewards ES maximises over them.
//
// A task file is JSONL: one {"prompt": "...", "answer": "..."} object per line (blank lines
// skipped). With a chat template the prompt becomes a user turn plus the generation prompt,
// rendered as the model's template renders it; without one the prompt text is used as is.
//
// Rewards (higher is better), all a mean over tasks:
//   nll   the mean log-probability of the answer tokens under teacher forcing (minus the NLL);
//   acc   the fraction of tasks whose greedy completion, trimmed, equals the trimmed answer;
//   rule  the fraction of tasks whose trimmed greedy completion a regex matches (anywhere).
// Every reward is a pure function of the model's parameters and the tasks: the same bits
// whatever the thread count of the model's pool, so replicas of a distributed job agree.
#ifndef FUCINA_MODELS_TRAIN_TASKS_H_
#define FUCINA_MODELS_TRAIN_TASKS_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "models/chat/chat_template.h"
#include "models/engine/model.h"
#include "models/tokenizer/tokenizer.h"
#include "models/train/scoring.h"

namespace fucina::train {

struct Task {
  std::vector<int32_t> prompt;  // non-empty
  std::vector<int32_t> answer;  // non-empty
  std::string answer_text;      // the answer as written in the file (acc compares it)
};

// A task as written in the file.
struct TaskText {
  std::string prompt, answer;
  int64_t line = 0;  // 1-based, for errors
};

// The lines of a task file. Errors name the file, the line and the field (bad JSON, a missing
// or non-string field); nothing is returned for a file with an error.
absl::StatusOr<std::vector<TaskText>> ReadTaskTexts(const std::string& path);
// One task tokenized (the prompt rendered as a user turn with `chat` unless it is null).
// INVALID_ARGUMENT naming the field that tokenizes to nothing.
absl::StatusOr<Task> TaskFromText(const std::string& prompt, const std::string& answer,
                                  const Tokenizer& tokenizer, const ChatTemplate* chat);
// ReadTaskTexts then TaskFromText; errors name the file, the line and the field.
absl::StatusOr<std::vector<Task>> LoadTasks(const std::string& path, const Tokenizer& tokenizer,
                                            const ChatTemplate* chat);

enum class RewardKind { kNll, kAcc, kRule };

struct RewardSpec {
  RewardKind kind = RewardKind::kNll;
  std::string rule;    // kRule: an RE2 regex (train/pattern.h) searched in each completion
  int max_tokens = 0;  // acc / rule: completion length cap; 0 = the kind's default (below)
};

// Default completion caps for max_tokens == 0: acc stops a few tokens past the longest answer
// (a longer completion cannot match); rule has no answer to size from.
inline constexpr int kAccExtraTokens = 4;
inline constexpr int kRuleDefaultTokens = 64;
inline constexpr int kMaxRewardTokens = 4096;

// `kind` is "nll", "acc" or "rule". Errors (INVALID_ARGUMENT, naming the field): an unknown
// kind; rule without a rule, or a rule Pattern::Compile refuses (with its error); max_tokens outside
// [0, kMaxRewardTokens]. The rule is ignored by the other kinds.
absl::StatusOr<RewardSpec> MakeRewardSpec(std::string_view kind, std::string_view rule,
                                          int max_tokens);

// The reward of the model behind `forward` on `tasks` (non-empty). acc and rule decode every
// task greedily (argmax, ties to the lowest id) in lockstep batches, stopping at an
// end-of-generation token (not part of the completion) or after max_tokens tokens; nll does
// not use `tokenizer`. Errors: `spec` as MakeRewardSpec would reject it, no tasks, and the
// model's (a token outside its vocabulary, ...).
absl::StatusOr<float> ScoreTasks(ScoringForward& forward, const Tokenizer& tokenizer,
                                 std::span<const Task> tasks, const RewardSpec& spec);
// The same on a whole local model (Model::is_full(); FAILED_PRECONDITION otherwise).
absl::StatusOr<float> ScoreTasks(Model& model, const Tokenizer& tokenizer,
                                 std::span<const Task> tasks, const RewardSpec& spec);

// The `nll` reward: the mean over tasks of the mean log-probability of each answer token given
// the prompt and the answer tokens before it (teacher forcing), i.e. minus the mean NLL.
// Tasks are packed into batched passes of a bounded number of rows.
absl::StatusOr<float> MeanAnswerLogProb(ScoringForward& forward, std::span<const Task> tasks);
absl::StatusOr<float> MeanAnswerLogProb(Model& model, std::span<const Task> tasks);

}  // namespace fucina::train

#endif  // FUCINA_MODELS_TRAIN_TASKS_H_
