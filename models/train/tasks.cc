#include "models/train/tasks.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <regex>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace fucina::train {
namespace {

// Rows of one batched pass (teacher forcing, prefill): bounds the activations and the forward
// scratch whatever the number of tasks.
constexpr int64_t kPassRows = 512;
// Rows of one head call: bounds the logits held at once to kHeadRows x vocab floats (39 MB for
// a 151k vocabulary).
constexpr int64_t kHeadRows = 64;
// Greedy decoding holds the caches of a group of tasks for the whole decode: at most this many
// positions (a task longer alone is a group of its own) and this many lockstep streams.
constexpr int64_t kDecodePositions = 4096;
constexpr size_t kDecodeStreams = 64;

// One sequence fed through the model, teacher-forced, into its own cache.
struct Stream {
  std::span<const int32_t> tokens;  // non-empty
  KvCache* kv;                      // holds nothing yet; capacity >= tokens.size()
  int64_t first_out;                // positions >= first_out need their logits
};

// (stream, position, logits[vocab]) of one row whose logits were asked for.
using RowFn = std::function<void(size_t stream, int64_t pos, const float* logits)>;

// Feeds every stream through `model`, rows of consecutive streams packed into passes of at
// most kPassRows rows (a stream that does not fit continues in the next pass from where its
// cache stands), and calls `row` for each wanted position, streams and positions ascending.
// Only wanted rows go through the head. The pass shapes depend on the streams alone, not on
// the pool, and the kernels split work without changing any row's arithmetic, so the results
// do not depend on the thread count.
absl::Status ForwardPacked(Model& model, std::span<const Stream> streams, const RowFn& row) {
  const int64_t hidden = model.config().hidden;
  const int64_t vocab = model.config().vocab_size;
  std::vector<int32_t> tokens;
  std::vector<Model::Segment> segments;
  std::vector<std::pair<size_t, int64_t>> wanted;  // (stream, position)
  std::vector<int64_t> wanted_rows;                // their rows in the pass
  std::vector<float> x, h, logits;
  size_t s = 0;
  int64_t done = 0;  // positions of stream s fed in earlier passes
  while (s < streams.size()) {
    tokens.clear();
    segments.clear();
    wanted.clear();
    wanted_rows.clear();
    while (s < streams.size() && static_cast<int64_t>(tokens.size()) < kPassRows) {
      const Stream& st = streams[s];
      const int64_t len = static_cast<int64_t>(st.tokens.size());
      if (len == 0) return absl::InvalidArgumentError("empty token sequence");
      const int64_t begin = static_cast<int64_t>(tokens.size());
      const int64_t n = std::min(len - done, kPassRows - begin);
      const std::span<const int32_t> part = st.tokens.subspan(done, n);
      segments.push_back({st.kv, begin, n, part});
      tokens.insert(tokens.end(), part.begin(), part.end());
      for (int64_t p = std::max(done, st.first_out); p < done + n; ++p) {
        wanted.emplace_back(s, p);
        wanted_rows.push_back(begin + p - done);
      }
      done += n;
      if (done == len) {
        ++s;
        done = 0;
      }
    }
    const int64_t rows = static_cast<int64_t>(tokens.size());
    x.resize(rows * hidden);
    if (absl::Status st = model.Embed(tokens, x.data()); !st.ok()) return st;
    if (absl::Status st = model.ForwardLayers(x.data(), rows, segments); !st.ok()) return st;
    for (size_t i0 = 0; i0 < wanted.size(); i0 += kHeadRows) {
      const int64_t n = std::min<int64_t>(kHeadRows, static_cast<int64_t>(wanted.size() - i0));
      h.resize(n * hidden);
      for (int64_t i = 0; i < n; ++i) {
        std::copy_n(&x[wanted_rows[i0 + i] * hidden], hidden, &h[i * hidden]);
      }
      logits.resize(n * vocab);
      if (absl::Status st = model.Head(h.data(), n, logits.data()); !st.ok()) return st;
      for (int64_t i = 0; i < n; ++i) {
        row(wanted[i0 + i].first, wanted[i0 + i].second, &logits[i * vocab]);
      }
    }
  }
  return absl::OkStatus();
}

// log softmax(row)[id], in double.
double LogProb(const float* row, int64_t vocab, int32_t id) {
  double mx = row[0];
  for (int64_t v = 1; v < vocab; ++v) mx = std::max<double>(mx, row[v]);
  double z = 0;
  for (int64_t v = 0; v < vocab; ++v) z += std::exp(row[v] - mx);
  return row[id] - mx - std::log(z);
}

// `text` without ASCII whitespace at either end.
std::string_view TrimAscii(std::string_view text) {
  constexpr std::string_view kSpace = " \t\n\v\f\r";
  const size_t begin = text.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(kSpace) - begin + 1);
}

// The first maximal id: ties go to the lowest.
int32_t Argmax(const float* row, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
}

// The end of the group of tasks starting at `begin`: consecutive tasks whose `positions` sum to
// at most `limit` (at least one task), at most `max_tasks` of them.
size_t GroupEnd(std::span<const Task> tasks, size_t begin, int64_t limit, size_t max_tasks,
                const std::function<int64_t(const Task&)>& positions) {
  size_t end = begin;
  int64_t sum = 0;
  while (end < tasks.size() && end - begin < max_tasks) {
    sum += positions(tasks[end]);
    if (end > begin && sum > limit) break;
    ++end;
  }
  return end;
}

absl::Status CheckFull(const Model& model) {
  if (!model.is_full()) return absl::FailedPreconditionError("a reward needs the whole model");
  return absl::OkStatus();
}

// Greedy completions of every task's prompt (argmax, ties to the lowest id), without the
// end-of-generation token that stopped one, at most max_tokens (>= 1) tokens each. Tasks run
// in groups: the prompts of a group are prefilled in packed passes, then every still-running
// completion advances by one token per ForwardStepBatch.
absl::StatusOr<std::vector<std::vector<int32_t>>> GreedyCompletions(
    Model& model, const Tokenizer& tokenizer, std::span<const Task> tasks, int max_tokens) {
  if (absl::Status s = CheckFull(model); !s.ok()) return s;
  const int64_t vocab = model.config().vocab_size;
  std::vector<std::vector<int32_t>> out(tasks.size());
  // Takes task i's next token; whether its completion goes on.
  auto accept = [&](size_t i, int32_t token) {
    if (tokenizer.IsEndOfGeneration(token)) return false;
    out[i].push_back(token);
    return static_cast<int64_t>(out[i].size()) < max_tokens;
  };
  // The last generated token is never fed back: a cache needs prompt + max_tokens - 1.
  auto positions = [&](const Task& t) {
    return static_cast<int64_t>(t.prompt.size()) + max_tokens - 1;
  };
  for (size_t g0 = 0; g0 < tasks.size();) {
    const size_t g1 = GroupEnd(tasks, g0, kDecodePositions, kDecodeStreams, positions);
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<Stream> streams;
    for (size_t i = g0; i < g1; ++i) {
      auto kv = model.NewKvCache(positions(tasks[i]), GgmlType::kF32);
      if (!kv.ok()) return kv.status();
      caches.push_back(*std::move(kv));
      streams.push_back({tasks[i].prompt, caches.back().get(),
                         static_cast<int64_t>(tasks[i].prompt.size()) - 1});
    }
    std::vector<size_t> running;  // indices into the group
    absl::Status prefilled =
        ForwardPacked(model, streams, [&](size_t s, int64_t, const float* row) {
          if (accept(g0 + s, Argmax(row, vocab))) running.push_back(s);
        });
    if (!prefilled.ok()) return prefilled;
    std::vector<KvCache*> step_caches;
    std::vector<int32_t> step_tokens;
    while (!running.empty()) {
      step_caches.clear();
      step_tokens.clear();
      for (size_t s : running) {
        step_caches.push_back(caches[s].get());
        step_tokens.push_back(out[g0 + s].back());
      }
      auto logits = model.ForwardStepBatch(step_caches, step_tokens);
      if (!logits.ok()) return logits.status();
      std::vector<size_t> still;
      for (size_t k = 0; k < running.size(); ++k) {
        if (accept(g0 + running[k], Argmax(logits->data() + k * vocab, vocab))) {
          still.push_back(running[k]);
        }
      }
      running = std::move(still);
    }
    g0 = g1;
  }
  return out;
}

absl::StatusOr<std::regex> CompileRule(std::string_view rule) {
  if (rule.empty()) return absl::InvalidArgumentError("rule: the rule reward needs a regex");
  try {
    return std::regex(rule.begin(), rule.end(), std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("rule: \"", std::string(rule), "\" is not a valid regex: ", e.what()));
  }
}

absl::Status CheckMaxTokens(int max_tokens) {
  if (max_tokens < 0 || max_tokens > kMaxRewardTokens) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens: ", max_tokens,
                                                   " is outside [0, ", kMaxRewardTokens, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<TaskText>> ReadTaskTexts(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the task file"));
  std::vector<TaskText> texts;
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
    texts.push_back({j["prompt"].get<std::string>(), j["answer"].get<std::string>(), number});
  }
  if (texts.empty()) return absl::InvalidArgumentError(path + ": no tasks");
  return texts;
}

absl::StatusOr<Task> TaskFromText(const std::string& prompt, const std::string& answer,
                                  const Tokenizer& tokenizer, const ChatTemplate* chat) {
  Task t;
  t.answer_text = answer;
  if (chat != nullptr) {
    auto rendered = chat->Render({{.role = "user", .content = prompt}}, ChatRenderOptions());
    if (!rendered.ok()) return absl::InvalidArgumentError(rendered.status().ToString());
    t.prompt = tokenizer.Encode(*rendered, /*add_special=*/false, /*parse_special=*/true);
  } else {
    t.prompt = tokenizer.Encode(prompt, /*add_special=*/true, /*parse_special=*/false);
  }
  t.answer = tokenizer.Encode(answer, /*add_special=*/false, /*parse_special=*/false);
  if (t.prompt.empty()) return absl::InvalidArgumentError("\"prompt\" tokenizes to nothing");
  if (t.answer.empty()) return absl::InvalidArgumentError("\"answer\" tokenizes to nothing");
  return t;
}

absl::StatusOr<std::vector<Task>> LoadTasks(const std::string& path, const Tokenizer& tokenizer,
                                            const ChatTemplate* chat) {
  auto texts = ReadTaskTexts(path);
  if (!texts.ok()) return texts.status();
  std::vector<Task> tasks;
  for (const TaskText& text : *texts) {
    auto task = TaskFromText(text.prompt, text.answer, tokenizer, chat);
    if (!task.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", text.line, ": ", task.status().message()));
    }
    tasks.push_back(*std::move(task));
  }
  return tasks;
}

absl::StatusOr<RewardSpec> MakeRewardSpec(std::string_view kind, std::string_view rule,
                                          int max_tokens) {
  RewardSpec spec;
  if (kind == "nll") {
    spec.kind = RewardKind::kNll;
  } else if (kind == "acc") {
    spec.kind = RewardKind::kAcc;
  } else if (kind == "rule") {
    spec.kind = RewardKind::kRule;
    if (auto re = CompileRule(rule); !re.ok()) return re.status();
    spec.rule = std::string(rule);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("kind: unknown reward \"", std::string(kind), "\" (nll, acc or rule)"));
  }
  if (absl::Status s = CheckMaxTokens(max_tokens); !s.ok()) return s;
  spec.max_tokens = max_tokens;
  return spec;
}

absl::StatusOr<float> MeanAnswerLogProb(Model& model, std::span<const Task> tasks) {
  if (tasks.empty()) return absl::InvalidArgumentError("no tasks");
  if (absl::Status s = CheckFull(model); !s.ok()) return s;
  const int64_t vocab = model.config().vocab_size;
  // Each task is teacher-forced on prompt + answer minus its last token; row
  // prompt.size() - 1 + j predicts answer token j. Groups of about one pass hold their caches.
  auto positions = [](const Task& t) {
    return static_cast<int64_t>(t.prompt.size() + t.answer.size()) - 1;
  };
  std::vector<double> sums(tasks.size(), 0.0);
  for (size_t g0 = 0; g0 < tasks.size();) {
    const size_t g1 = GroupEnd(tasks, g0, kPassRows, tasks.size(), positions);
    std::vector<std::vector<int32_t>> sequences;
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<Stream> streams;
    sequences.reserve(g1 - g0);  // streams borrow them
    for (size_t i = g0; i < g1; ++i) {
      const Task& t = tasks[i];
      std::vector<int32_t>& seq = sequences.emplace_back(t.prompt);
      seq.insert(seq.end(), t.answer.begin(), t.answer.end() - 1);
      auto kv = model.NewKvCache(static_cast<int64_t>(seq.size()), GgmlType::kF32);
      if (!kv.ok()) return kv.status();
      caches.push_back(*std::move(kv));
      streams.push_back({seq, caches.back().get(), static_cast<int64_t>(t.prompt.size()) - 1});
    }
    absl::Status s = ForwardPacked(model, streams, [&](size_t k, int64_t pos, const float* row) {
      const Task& t = tasks[g0 + k];
      sums[g0 + k] += LogProb(row, vocab, t.answer[pos - (t.prompt.size() - 1)]);
    });
    if (!s.ok()) return s;
    g0 = g1;
  }
  double total = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    total += sums[i] / static_cast<double>(tasks[i].answer.size());
  }
  return static_cast<float>(total / static_cast<double>(tasks.size()));
}

absl::StatusOr<float> ScoreTasks(Model& model, const Tokenizer& tokenizer,
                                 std::span<const Task> tasks, const RewardSpec& spec) {
  if (tasks.empty()) return absl::InvalidArgumentError("no tasks");
  if (absl::Status s = CheckMaxTokens(spec.max_tokens); !s.ok()) return s;
  int max_tokens = spec.max_tokens;
  std::optional<std::regex> rule;
  switch (spec.kind) {
    case RewardKind::kNll:
      return MeanAnswerLogProb(model, tasks);
    case RewardKind::kAcc:
      if (max_tokens == 0) {
        size_t longest = 0;
        for (const Task& t : tasks) longest = std::max(longest, t.answer.size());
        max_tokens = static_cast<int>(longest) + kAccExtraTokens;
      }
      break;
    case RewardKind::kRule: {
      auto re = CompileRule(spec.rule);
      if (!re.ok()) return re.status();
      rule = *std::move(re);
      if (max_tokens == 0) max_tokens = kRuleDefaultTokens;
      break;
    }
  }
  auto completions = GreedyCompletions(model, tokenizer, tasks, max_tokens);
  if (!completions.ok()) return completions.status();
  int64_t hits = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const std::string text = tokenizer.Decode((*completions)[i]);
    const std::string_view got = TrimAscii(text);
    if (!rule) {
      hits += got == TrimAscii(tasks[i].answer_text);
      continue;
    }
    try {
      hits += std::regex_search(got.begin(), got.end(), *rule);
    } catch (const std::regex_error& e) {
      // libstdc++ gives up on some patterns over long text (error_complexity, error_stack).
      return absl::InvalidArgumentError(
          absl::StrCat("rule: matching \"", spec.rule, "\" failed: ", e.what()));
    }
  }
  return static_cast<float>(static_cast<double>(hits) / static_cast<double>(tasks.size()));
}

}  // namespace fucina::train
