#include "models/train/tasks.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "models/train/pattern.h"

namespace fucina::train {
namespace {

// Greedy decoding holds the caches of a group of tasks for the whole decode: at most this many
// positions (a task longer alone is a group of its own) and this many lockstep streams.
constexpr int64_t kDecodePositions = 4096;
constexpr size_t kDecodeStreams = 64;
static_assert(512 <= kMaxPassRows && kDecodeStreams <= kMaxScoringStreams);

// One sequence fed through the model, teacher-forced, into stream `index` of the group.
struct Stream {
  std::span<const int32_t> tokens;  // non-empty; its stream has room for all of them
  int64_t first_out;                // positions >= first_out need a verdict
};

// (stream, position, verdict) of one row whose verdict was asked for.
using RowFn = std::function<void(size_t stream, int64_t pos, const ScoringForward::Verdict&)>;
// The target of (stream, position): -1 when only the argmax is wanted.
using TargetFn = std::function<int32_t(size_t stream, int64_t pos)>;

// Starts one stream per entry of `streams` (with room for `room[i]` positions, or for its tokens
// when `room` is empty) and feeds them through `forward`, rows of consecutive streams packed
// into passes of at most forward.pass_rows() rows (a stream that does not fit continues in the
// next pass from where its cache stands), and calls `row` for each wanted position, streams
// and positions ascending. The pass shapes depend on the streams and the model alone.
absl::Status ForwardPacked(ScoringForward& forward, std::span<const Stream> streams,
                           const TargetFn& target, const RowFn& row,
                           std::span<const int64_t> room = {}) {
  std::vector<int64_t> capacities;
  for (size_t i = 0; i < streams.size(); ++i) {
    if (streams[i].tokens.empty()) return absl::InvalidArgumentError("empty token sequence");
    capacities.push_back(room.empty() ? static_cast<int64_t>(streams[i].tokens.size()) : room[i]);
  }
  if (absl::Status s = forward.ResetStreams(capacities); !s.ok()) return s;
  std::vector<ScoringForward::Segment> segments;
  std::vector<std::pair<size_t, int64_t>> wanted;  // (stream, position)
  std::vector<ScoringForward::Row> rows;           // their rows in the pass
  const int64_t pass_rows = forward.pass_rows();
  size_t s = 0;
  int64_t done = 0;  // positions of stream s fed in earlier passes
  while (s < streams.size()) {
    segments.clear();
    wanted.clear();
    rows.clear();
    int64_t used = 0;
    while (s < streams.size() && used < pass_rows) {
      const Stream& st = streams[s];
      const int64_t len = static_cast<int64_t>(st.tokens.size());
      const int64_t n = std::min(len - done, pass_rows - used);
      segments.push_back({static_cast<int32_t>(s), st.tokens.subspan(done, n)});
      for (int64_t p = std::max(done, st.first_out); p < done + n; ++p) {
        wanted.emplace_back(s, p);
        rows.push_back({used + p - done, target(s, p)});
      }
      used += n;
      done += n;
      if (done == len) {
        ++s;
        done = 0;
      }
    }
    auto verdicts = forward.Pass(segments, rows);
    if (!verdicts.ok()) return verdicts.status();
    if (verdicts->size() != rows.size()) {
      return absl::InternalError(absl::StrCat(verdicts->size(), " verdicts for ", rows.size(),
                                              " rows"));
    }
    for (size_t i = 0; i < wanted.size(); ++i) row(wanted[i].first, wanted[i].second, (*verdicts)[i]);
  }
  return absl::OkStatus();
}

// `text` without ASCII whitespace at either end.
std::string_view TrimAscii(std::string_view text) {
  constexpr std::string_view kSpace = " \t\n\v\f\r";
  const size_t begin = text.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(kSpace) - begin + 1);
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

// Greedy completions of every task's prompt (argmax, ties to the lowest id), without the
// end-of-generation token that stopped one, at most max_tokens (>= 1) tokens each. Tasks run
// in groups: the prompts of a group are prefilled in packed passes, then every still-running
// completion advances by one token per pass.
absl::StatusOr<std::vector<std::vector<int32_t>>> GreedyCompletions(
    ScoringForward& forward, const Tokenizer& tokenizer, std::span<const Task> tasks,
    int max_tokens) {
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
  auto no_target = [](size_t, int64_t) { return -1; };
  for (size_t g0 = 0; g0 < tasks.size();) {
    const size_t g1 = GroupEnd(tasks, g0, kDecodePositions, kDecodeStreams, positions);
    std::vector<Stream> streams;
    std::vector<int64_t> capacities;
    for (size_t i = g0; i < g1; ++i) {
      streams.push_back({tasks[i].prompt, static_cast<int64_t>(tasks[i].prompt.size()) - 1});
      capacities.push_back(positions(tasks[i]));
    }
    std::vector<size_t> running;  // indices into the group
    absl::Status prefilled = ForwardPacked(
        forward, streams, no_target,
        [&](size_t s, int64_t, const ScoringForward::Verdict& v) {
          if (accept(g0 + s, v.argmax)) running.push_back(s);
        },
        capacities);
    if (!prefilled.ok()) return prefilled;
    std::vector<ScoringForward::Segment> segments;
    std::vector<ScoringForward::Row> rows;
    while (!running.empty()) {
      segments.clear();
      rows.clear();
      for (size_t k = 0; k < running.size(); ++k) {
        const std::vector<int32_t>& done = out[g0 + running[k]];
        segments.push_back({static_cast<int32_t>(running[k]), {&done.back(), 1}});
        rows.push_back({static_cast<int64_t>(k), -1});
      }
      auto verdicts = forward.Pass(segments, rows);
      if (!verdicts.ok()) return verdicts.status();
      if (verdicts->size() != rows.size()) {
        return absl::InternalError(absl::StrCat(verdicts->size(), " verdicts for ",
                                                rows.size(), " rows"));
      }
      std::vector<size_t> still;
      for (size_t k = 0; k < running.size(); ++k) {
        if (accept(g0 + running[k], (*verdicts)[k].argmax)) still.push_back(running[k]);
      }
      running = std::move(still);
    }
    g0 = g1;
  }
  return out;
}

absl::StatusOr<Pattern> CompileRule(std::string_view rule) {
  if (rule.empty()) return absl::InvalidArgumentError("rule: the rule reward needs a regex");
  return Pattern::Compile(rule, "rule");
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

absl::StatusOr<float> MeanAnswerLogProb(ScoringForward& forward, std::span<const Task> tasks) {
  if (tasks.empty()) return absl::InvalidArgumentError("no tasks");
  // Each task is teacher-forced on prompt + answer minus its last token; row
  // prompt.size() - 1 + j predicts answer token j. Groups of about one pass hold their caches.
  auto positions = [](const Task& t) {
    return static_cast<int64_t>(t.prompt.size() + t.answer.size()) - 1;
  };
  std::vector<double> sums(tasks.size(), 0.0);
  for (size_t g0 = 0; g0 < tasks.size();) {
    const size_t g1 = GroupEnd(tasks, g0, forward.pass_rows(), tasks.size(), positions);
    std::vector<std::vector<int32_t>> sequences;
    std::vector<Stream> streams;
    sequences.reserve(g1 - g0);  // streams borrow them
    for (size_t i = g0; i < g1; ++i) {
      const Task& t = tasks[i];
      std::vector<int32_t>& seq = sequences.emplace_back(t.prompt);
      seq.insert(seq.end(), t.answer.begin(), t.answer.end() - 1);
      streams.push_back({seq, static_cast<int64_t>(t.prompt.size()) - 1});
    }
    auto answer_token = [&](size_t k, int64_t pos) {
      const Task& t = tasks[g0 + k];
      return t.answer[pos - (t.prompt.size() - 1)];
    };
    absl::Status s = ForwardPacked(
        forward, streams, answer_token,
        [&](size_t k, int64_t, const ScoringForward::Verdict& v) { sums[g0 + k] += v.logprob; });
    if (!s.ok()) return s;
    g0 = g1;
  }
  double total = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    total += sums[i] / static_cast<double>(tasks[i].answer.size());
  }
  return static_cast<float>(total / static_cast<double>(tasks.size()));
}

absl::StatusOr<float> MeanAnswerLogProb(Model& model, std::span<const Task> tasks) {
  if (!model.is_full()) return absl::FailedPreconditionError("a reward needs the whole model");
  LocalScoring forward(model);
  return MeanAnswerLogProb(forward, tasks);
}

absl::StatusOr<float> ScoreTasks(Model& model, const Tokenizer& tokenizer,
                                 std::span<const Task> tasks, const RewardSpec& spec) {
  if (!model.is_full()) return absl::FailedPreconditionError("a reward needs the whole model");
  LocalScoring forward(model);
  return ScoreTasks(forward, tokenizer, tasks, spec);
}

absl::StatusOr<float> ScoreTasks(ScoringForward& forward, const Tokenizer& tokenizer,
                                 std::span<const Task> tasks, const RewardSpec& spec) {
  if (tasks.empty()) return absl::InvalidArgumentError("no tasks");
  if (absl::Status s = CheckMaxTokens(spec.max_tokens); !s.ok()) return s;
  int max_tokens = spec.max_tokens;
  std::optional<Pattern> rule;
  switch (spec.kind) {
    case RewardKind::kNll:
      return MeanAnswerLogProb(forward, tasks);
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
  auto completions = GreedyCompletions(forward, tokenizer, tasks, max_tokens);
  if (!completions.ok()) return completions.status();
  int64_t hits = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const std::string text = tokenizer.Decode((*completions)[i]);
    const std::string_view got = TrimAscii(text);
    if (!rule) {
      hits += got == TrimAscii(tasks[i].answer_text);
      continue;
    }
    hits += rule->Search(got);
  }
  return static_cast<float>(static_cast<double>(hits) / static_cast<double>(tasks.size()));
}

}  // namespace fucina::train
