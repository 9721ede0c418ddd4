#include "models/train/tasks.h"

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace fucina::train {

absl::StatusOr<std::vector<Task>> LoadTasks(const std::string& path, const Tokenizer& tokenizer,
                                            const ChatTemplate* chat) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the task file"));
  std::vector<Task> tasks;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = absl::StrCat(path, ":", number, ": ");
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(at + "not a JSON object");
    }
    for (const char* field : {"prompt", "answer"}) {
      if (!j.contains(field) || !j[field].is_string()) {
        return absl::InvalidArgumentError(at + "\"" + field + "\" is missing or not a string");
      }
    }
    const std::string prompt = j["prompt"].get<std::string>();
    const std::string answer = j["answer"].get<std::string>();
    Task t;
    if (chat != nullptr) {
      auto rendered = chat->Render({{.role = "user", .content = prompt}}, ChatRenderOptions());
      if (!rendered.ok()) return absl::InvalidArgumentError(at + rendered.status().ToString());
      t.prompt = tokenizer.Encode(*rendered, /*add_special=*/false, /*parse_special=*/true);
    } else {
      t.prompt = tokenizer.Encode(prompt, /*add_special=*/true, /*parse_special=*/false);
    }
    t.answer = tokenizer.Encode(answer, /*add_special=*/false, /*parse_special=*/false);
    if (t.prompt.empty()) return absl::InvalidArgumentError(at + "\"prompt\" tokenizes to nothing");
    if (t.answer.empty()) return absl::InvalidArgumentError(at + "\"answer\" tokenizes to nothing");
    tasks.push_back(std::move(t));
  }
  if (tasks.empty()) return absl::InvalidArgumentError(path + ": no tasks");
  return tasks;
}

absl::StatusOr<float> MeanAnswerLogProb(Model& model, std::span<const Task> tasks) {
  if (tasks.empty()) return absl::InvalidArgumentError("no tasks");
  const int64_t vocab = model.config().vocab_size;
  double total = 0;
  for (const Task& t : tasks) {
    std::vector<int32_t> tokens = t.prompt;
    tokens.insert(tokens.end(), t.answer.begin(), t.answer.end() - 1);
    auto kv = model.NewKvCache(static_cast<int64_t>(tokens.size()), GgmlType::kF32);
    if (!kv.ok()) return kv.status();
    auto logits = model.ForwardStepAllLogits(**kv, tokens, 0);
    if (!logits.ok()) return logits.status();
    // Row prompt.size() - 1 + j predicts answer token j.
    double sum = 0;
    for (size_t j = 0; j < t.answer.size(); ++j) {
      const float* row = logits->data() + (t.prompt.size() - 1 + j) * vocab;
      double mx = row[0];
      for (int64_t v = 1; v < vocab; ++v) mx = std::max<double>(mx, row[v]);
      double z = 0;
      for (int64_t v = 0; v < vocab; ++v) z += std::exp(row[v] - mx);
      sum += row[t.answer[j]] - mx - std::log(z);
    }
    total += sum / static_cast<double>(t.answer.size());
  }
  return static_cast<float>(total / static_cast<double>(tasks.size()));
}

}  // namespace fucina::train
