// Task files and the ES rewards (models/train/tasks.h) on small random-weight fixtures: the
// batched nll against a per-task teacher-forced reference computed here from
// ForwardStepAllLogits, acc and rule against greedy continuations decoded here with a plain
// ForwardStep loop, and every reward bit-identical with 1 and 3 threads.
#include "models/train/tasks.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "models/engine/fixture.h"
#include "models/engine/model.h"
#include "tests/models/engine/fixture_files.h"

namespace fucina::train {
namespace {

std::string TempPath(const std::string& name) {
  return testing::TempDir() + "/tasks_test_" + std::to_string(getpid()) + "_" + name;
}

FixtureOptions Small(const char* arch, const char* type) {
  FixtureOptions o;
  o.arch = arch;
  o.type = type;
  o.num_layers = 2;
  o.hidden = 64;
  o.ffn = 128;
  o.num_heads = 4;
  o.num_heads_kv = 2;
  o.head_dim = 16;
  o.init_std = 0.1;  // far from uniform attention and logits, so mixed-up rows show
  o.seed = 11;
  return o;
}

// qwen3 in a quantized type (activations quantized per row); gemma4 with sliding windows of 8
// (long sequences run in rounds), shared K/V and per-layer embeddings (segments need tokens).
std::vector<FixtureVariant> NllVariants() {
  FixtureOptions gemma4 = Small("gemma4", "f32");
  gemma4.num_layers = 6;
  gemma4.head_dim_global = 32;
  gemma4.kv_heads_global = 1;
  gemma4.sliding_window = 8;
  gemma4.global_every = 3;
  gemma4.shared_kv_layers = 3;
  gemma4.per_layer_input = 8;
  return {{"qwen3_q8_0", Small("qwen3", "q8_0")}, {"gemma4_ple", gemma4}};
}

// Clear argmax winners for the greedy rewards (top-2 logit gaps above 0.03 on these prompts,
// far above the rounding that batching moves), with continuations that still depend on the
// context rather than repeating the last token.
FixtureOptions Peaked() {
  FixtureOptions o = Small("qwen3", "f32");
  o.peaked = true;
  o.init_std = 0.2;
  o.seed = 4;
  return o;
}

struct Loaded {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};

Loaded Load(const std::string& path, int threads) {
  Loaded l;
  l.pool = std::make_unique<ThreadPool>(threads);
  auto model = Model::Load(path, LoadOptions{}, *l.pool);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return l;
  l.model = *std::move(model);
  auto tok = Tokenizer::FromGguf(l.model->file());
  EXPECT_TRUE(tok.ok()) << tok.status();
  if (tok.ok()) l.tokenizer = *std::move(tok);
  return l;
}

// Byte-token prompts of assorted lengths; task `long_task` (if any) is `long_len` tokens, longer
// than one batched pass.
std::vector<Task> ByteTasks(int n, int long_task = -1, int long_len = 0) {
  std::vector<Task> tasks;
  for (int i = 0; i < n; ++i) {
    Task t;
    const int len = i == long_task ? long_len : 3 + (i * 7) % 23;
    for (int j = 0; j < len; ++j) t.prompt.push_back((i * 31 + j * 17 + 3) % 200 + 32);
    for (int j = 0; j < 1 + i % 4; ++j) t.answer.push_back((i * 13 + j * 29) % 90 + 33);
    t.answer_text.assign(t.answer.begin(), t.answer.end());
    tasks.push_back(t);
  }
  return tasks;
}

// The nll reward one task at a time, from each task's own teacher-forced logits.
double ReferenceNll(Model& model, std::span<const Task> tasks) {
  const int64_t vocab = model.config().vocab_size;
  double total = 0;
  for (const Task& t : tasks) {
    std::vector<int32_t> seq = t.prompt;
    seq.insert(seq.end(), t.answer.begin(), t.answer.end() - 1);
    auto kv = model.NewKvCache(static_cast<int64_t>(seq.size()), GgmlType::kF32);
    EXPECT_TRUE(kv.ok());
    auto logits = model.ForwardStepAllLogits(**kv, seq, 0);
    EXPECT_TRUE(logits.ok()) << logits.status();
    double sum = 0;
    for (size_t j = 0; j < t.answer.size(); ++j) {
      const float* row = logits->data() + (t.prompt.size() - 1 + j) * vocab;
      const double mx = *std::max_element(row, row + vocab);
      double z = 0;
      for (int64_t v = 0; v < vocab; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
      sum += row[t.answer[j]] - mx - std::log(z);
    }
    total += sum / static_cast<double>(t.answer.size());
  }
  return total / static_cast<double>(tasks.size());
}

// Greedy continuation with one ForwardStep per token: argmax (first of equals), stop at an
// end-of-generation token (not kept) or after max_tokens.
std::vector<int32_t> ReferenceGreedy(Model& model, const Tokenizer& tok,
                                     const std::vector<int32_t>& prompt, int max_tokens) {
  auto kv = model.NewKvCache(static_cast<int64_t>(prompt.size()) + max_tokens, GgmlType::kF32);
  EXPECT_TRUE(kv.ok());
  std::vector<int32_t> out;
  auto logits = model.ForwardStep(**kv, prompt, 0);
  while (logits.ok()) {
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    if (tok.IsEndOfGeneration(next)) break;
    out.push_back(next);
    if (static_cast<int>(out.size()) == max_tokens) break;
    const int32_t step[] = {next};
    logits = model.ForwardStep(**kv, step, (*kv)->len());
  }
  EXPECT_TRUE(logits.ok()) << logits.status();
  return out;
}

std::string Trim(const std::string& s) {
  const char* kSpace = " \t\n\v\f\r";
  const size_t b = s.find_first_not_of(kSpace);
  return b == std::string::npos ? "" : s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// ---- Task files ----

TEST(TaskFileTest, ErrorsNameTheLineAndField) {
  const std::string path = TempPath("tasks.jsonl");
  ThreadPool pool(1);
  const std::string model_path = TempPath("tok.gguf");
  ASSERT_TRUE(MakeFixture(FixtureOptions(), model_path, pool).ok());
  auto file = gguf::File::Open(model_path);
  ASSERT_TRUE(file.ok());
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok());
  struct Case {
    std::string text, want;
  } cases[] = {
      {"{\"prompt\": \"a\", \"answer\": \"b\"}\n\n{\"prompt\": 3, \"answer\": \"b\"}\n",
       ":3: \"prompt\" is missing or not a string"},
      {"{\"prompt\": \"a\"}\n", ":1: \"answer\" is missing"},
      {"{\"prompt\": \"a\", \"answer\": [\"b\"]}\n", ":1: \"answer\" is missing or not a string"},
      {"{\"prompt\": \"a\", \"answer\": \"b\"\n", ":1: not a JSON object"},
      {"[\"a\", \"b\"]\n", ":1: not a JSON object"},
      {"{\"prompt\": \"a\", \"answer\": \"b\"}\n{\"prompt\": \"a\", \"answer\": \"\"}\n",
       ":2: \"answer\" tokenizes to nothing"},
      {"\n", ": no tasks"},
  };
  for (const Case& c : cases) {
    std::ofstream(path) << c.text;
    auto tasks = LoadTasks(path, **tok, nullptr);
    ASSERT_FALSE(tasks.ok()) << c.text;
    EXPECT_EQ(tasks.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(tasks.status().message().find(path + c.want), std::string::npos)
        << tasks.status();
  }
  std::ofstream(path) << "{\"prompt\": \"ab\", \"answer\": \" c\"}\n";
  auto ok = LoadTasks(path, **tok, nullptr);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 1u);
  EXPECT_EQ((*ok)[0].answer, (std::vector<int32_t>{' ', 'c'}));
  EXPECT_EQ((*ok)[0].answer_text, " c");
  std::remove(path.c_str());
  std::remove(model_path.c_str());
  EXPECT_EQ(LoadTasks(path, **tok, nullptr).status().code(), absl::StatusCode::kNotFound);
}

// ---- Reward specs ----

TEST(TaskRewardSpecTest, ErrorsNameTheField) {
  struct Case {
    const char* kind;
    const char* rule;
    int max_tokens;
    const char* want;
  } cases[] = {
      {"bleu", "", 0, "kind"},       {"rule", "", 0, "rule"},
      {"rule", "(", 0, "rule"},      {"rule", "a{2,1}", 0, "rule"},
      {"acc", "", -1, "max_tokens"}, {"nll", "", kMaxRewardTokens + 1, "max_tokens"},
  };
  for (const Case& c : cases) {
    auto spec = MakeRewardSpec(c.kind, c.rule, c.max_tokens);
    ASSERT_FALSE(spec.ok()) << c.kind << " " << c.rule << " " << c.max_tokens;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(spec.status().message(), c.want)) << spec.status();
  }
  // The regex library's own explanation is passed on.
  EXPECT_NE(MakeRewardSpec("rule", "(", 0).status().message().find("not a valid RE2 regex: "),
            std::string::npos);

  auto nll = MakeRewardSpec("nll", "ignored(", 0);
  ASSERT_TRUE(nll.ok()) << nll.status();
  EXPECT_EQ(nll->kind, RewardKind::kNll);
  auto acc = MakeRewardSpec("acc", "", kMaxRewardTokens);
  ASSERT_TRUE(acc.ok());
  EXPECT_EQ(acc->kind, RewardKind::kAcc);
  EXPECT_EQ(acc->max_tokens, kMaxRewardTokens);
  auto rule = MakeRewardSpec("rule", "^[0-9]+$", 7);
  ASSERT_TRUE(rule.ok());
  EXPECT_EQ(rule->kind, RewardKind::kRule);
  EXPECT_EQ(rule->rule, "^[0-9]+$");
  EXPECT_EQ(rule->max_tokens, 7);
}

// ---- nll ----

class TaskNllTest : public testing::TestWithParam<size_t> {
 protected:
  static void SetUpTestSuite() {
    ThreadPool pool(2);
    MakeFixtureFiles("tasks_test_nll", NllVariants(), pool, &paths_);
  }
  static void TearDownTestSuite() { RemoveFixtureFiles(&paths_); }
  static const std::string& Path() { return paths_[GetParam()]; }
  static std::vector<std::string> paths_;
};
std::vector<std::string> TaskNllTest::paths_;

TEST_P(TaskNllTest, BatchedEqualsPerTaskAndIgnoresThreads) {
  // 60 tasks (several packed passes) with one of 700 tokens, which spans passes.
  const std::vector<Task> tasks = ByteTasks(60, /*long_task=*/17, /*long_len=*/700);
  Loaded one = Load(Path(), 1);
  Loaded three = Load(Path(), 3);
  ASSERT_TRUE(one.model && three.model);
  const RewardSpec spec;  // nll
  auto got1 = ScoreTasks(*one.model, *one.tokenizer, tasks, spec);
  auto got3 = ScoreTasks(*three.model, *three.tokenizer, tasks, spec);
  ASSERT_TRUE(got1.ok()) << got1.status();
  ASSERT_TRUE(got3.ok()) << got3.status();
  EXPECT_EQ(Bits(*got1), Bits(*got3)) << *got1 << " vs " << *got3;
  auto wrapper = MeanAnswerLogProb(*one.model, tasks);
  ASSERT_TRUE(wrapper.ok());
  EXPECT_EQ(Bits(*wrapper), Bits(*got1));

  const double want = ReferenceNll(*one.model, tasks);
  EXPECT_LT(want, -1.0);  // not a degenerate model
  EXPECT_NEAR(*got1, want, 1e-5 * std::abs(want));
  std::printf("batched %.9g, per task %.9g\n", *got1, want);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TaskNllTest, testing::Range<size_t>(0, NllVariants().size()),
                         [](const testing::TestParamInfo<size_t>& info) {
                           return std::string(NllVariants()[info.param].name);
                         });

// ---- acc and rule ----

class TaskGreedyRewardTest : public testing::Test {
 protected:
  static constexpr int kMaxTokens = 6;
  static void SetUpTestSuite() {
    ThreadPool pool(2);
    ASSERT_TRUE(MakeFixture(Peaked(), Path(), pool).ok());
  }
  static void TearDownTestSuite() { std::remove(Path().c_str()); }
  static std::string Path() { return TempPath("peaked.gguf"); }

  // 70 tasks (two lockstep groups) whose answers are the model's own greedy continuations.
  // Every fifth prompt ends in <|im_end|>, after which this model tends to stop at once.
  static std::vector<Task> SelfTasks(Loaded& l) {
    std::vector<Task> tasks = ByteTasks(70);
    const int32_t im_end = *l.tokenizer->TokenId("<|im_end|>");
    for (size_t i = 4; i < tasks.size(); i += 5) tasks[i].prompt.push_back(im_end);
    int stopped = 0, nonblank = 0;
    for (Task& t : tasks) {
      const std::vector<int32_t> ids =
          ReferenceGreedy(*l.model, *l.tokenizer, t.prompt, kMaxTokens);
      stopped += static_cast<int>(ids.size()) < kMaxTokens;
      t.answer_text = l.tokenizer->Decode(ids);
      nonblank += !Trim(t.answer_text).empty();
    }
    // Both ways of ending occur, and most texts are not blank (else equality proves little).
    std::printf("%d of %zu continuations stopped early, %d not blank\n", stopped, tasks.size(),
                nonblank);
    EXPECT_GT(stopped, 0);
    EXPECT_LT(stopped, 35);
    EXPECT_GT(nonblank, 50);
    return tasks;
  }
};

TEST_F(TaskGreedyRewardTest, AccCountsExactTrimmedMatches) {
  Loaded l = Load(Path(), 2);
  ASSERT_TRUE(l.model);
  std::vector<Task> tasks = SelfTasks(l);
  const RewardSpec acc{.kind = RewardKind::kAcc, .max_tokens = kMaxTokens};
  auto all = ScoreTasks(*l.model, *l.tokenizer, tasks, acc);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, 1.0f);

  // Whitespace around either side does not count: answers without the whitespace that begins
  // or ends a completion, and padded answers.
  int trimmed = 0;
  for (Task& t : tasks) {
    const std::string bare = Trim(t.answer_text);
    trimmed += bare != t.answer_text;
    t.answer_text = bare != t.answer_text ? bare : " \n" + bare + "\t ";
  }
  EXPECT_GT(trimmed, 0);
  auto padded = ScoreTasks(*l.model, *l.tokenizer, tasks, acc);
  ASSERT_TRUE(padded.ok());
  EXPECT_EQ(*padded, 1.0f);

  // Some continuation that is not blank, changed.
  const auto wrong = std::find_if(tasks.begin(), tasks.end(),
                                  [](const Task& t) { return !Trim(t.answer_text).empty(); });
  ASSERT_NE(wrong, tasks.end());
  wrong->answer_text += "x";
  for (int threads : {1, 3}) {
    Loaded m = Load(Path(), threads);
    auto one_off = ScoreTasks(*m.model, *m.tokenizer, tasks, acc);
    ASSERT_TRUE(one_off.ok());
    EXPECT_EQ(*one_off, static_cast<float>(69.0 / 70.0)) << threads << " threads";
  }
}

TEST_F(TaskGreedyRewardTest, RuleCountsMatches) {
  Loaded l = Load(Path(), 2);
  ASSERT_TRUE(l.model);
  const std::vector<Task> tasks = SelfTasks(l);
  auto score = [&](const std::string& rule) {
    auto spec = MakeRewardSpec("rule", rule, kMaxTokens);
    EXPECT_TRUE(spec.ok()) << spec.status();
    return ScoreTasks(*l.model, *l.tokenizer, tasks, *spec);
  };
  EXPECT_EQ(*score("[\\s\\S]*"), 1.0f);  // anything, also nothing
  EXPECT_EQ(*score("[^\\s\\S]"), 0.0f);  // no character is in the empty set
  // Anchored at the trimmed ends: a completion equal to task 0's matches.
  const std::string text = Trim(tasks[0].answer_text);
  std::string escaped = "^";
  for (char c : text) {
    // RE2 reads patterns as UTF-8 (\xHH is code point U+00HH) and a random model's text need
    // not be UTF-8: a byte past ASCII is matched by \C (any one byte).
    if (static_cast<unsigned char>(c) >= 0x80) {
      escaped += "\\C";
    } else if (std::isalnum(static_cast<unsigned char>(c))) {
      escaped += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", static_cast<unsigned char>(c));
      escaped += hex;
    }
  }
  escaped += "$";
  auto exact = score(escaped);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_GE(*exact, 1.0f / 70);
  EXPECT_LT(*exact, 1.0f);

  // A spec built by hand is checked as MakeRewardSpec checks it.
  const RewardSpec bad{.kind = RewardKind::kRule, .rule = "[a-", .max_tokens = kMaxTokens};
  auto invalid = ScoreTasks(*l.model, *l.tokenizer, tasks, bad);
  ASSERT_FALSE(invalid.ok());
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(invalid.status().message(), "rule")) << invalid.status();
}

TEST_F(TaskGreedyRewardTest, DefaultLengthAndErrors) {
  Loaded l = Load(Path(), 2);
  ASSERT_TRUE(l.model);
  std::vector<Task> tasks = ByteTasks(3);
  // acc's default cap is the longest answer plus a few tokens (here 2 + 4): an answer of the
  // six-token continuation matches, one of the five-token continuation only if the model
  // stopped before five tokens (or the sixth is whitespace).
  for (Task& t : tasks) t.answer = {'a'};
  tasks[0].answer = {'a', 'b'};
  auto greedy_text = [&](const Task& t, int max_tokens) {
    return l.tokenizer->Decode(ReferenceGreedy(*l.model, *l.tokenizer, t.prompt, max_tokens));
  };
  tasks[1].answer_text = greedy_text(tasks[1], 6);
  tasks[2].answer_text = greedy_text(tasks[2], 5);
  int want = 0;
  for (const Task& t : tasks) want += Trim(greedy_text(t, 6)) == Trim(t.answer_text);
  EXPECT_GE(want, 1);
  auto acc = ScoreTasks(*l.model, *l.tokenizer, tasks, RewardSpec{.kind = RewardKind::kAcc});
  ASSERT_TRUE(acc.ok()) << acc.status();
  EXPECT_EQ(*acc, static_cast<float>(want / 3.0));

  EXPECT_EQ(ScoreTasks(*l.model, *l.tokenizer, {}, RewardSpec()).status().code(),
            absl::StatusCode::kInvalidArgument);
  const RewardSpec too_long{.kind = RewardKind::kAcc, .max_tokens = kMaxRewardTokens + 1};
  EXPECT_TRUE(absl::StartsWith(
      ScoreTasks(*l.model, *l.tokenizer, tasks, too_long).status().message(), "max_tokens"));
}

}  // namespace
}  // namespace fucina::train
