// TrainJobs (coordinator/train_jobs.h) over an in-process worker: an ended job holds no
// replica and the oldest ended jobs are forgotten beyond the retention count (a watcher keeps
// its own); a shutdown deadline cuts a member's scoring in the middle.
#include "coordinator/train_jobs.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "models/engine/fixture.h"
#include "models/gguf/gguf.h"
#include "tests/models/engine/fixture_files.h"
#include "tests/worker/fake_worker_client.h"
#include "worker/worker_actor.h"

namespace fucina {
namespace {

namespace v1 = ::fucina::v1;
using Clock = std::chrono::steady_clock;

// Tasks of a job whose members take about two seconds each on one thread.
constexpr int kLongTasks = 8000;

// Forwards train calls to an actor and says when the first member (not the center) is being
// scored, so a test can act in the middle of a generation without sleeping.
class SignallingClient : public ForwardingWorkerClient {
 public:
  explicit SignallingClient(std::shared_ptr<WorkerActor> actor)
      : ForwardingWorkerClient(std::move(actor)) {}
  std::shared_future<void> member_started() { return started_future_; }

  void EsEvaluateAsync(wire::EsEvaluateRequest r,
                       Callback<wire::EsEvaluateResponse> done) override {
    if (r.members_size() > 0 && r.members(0) >= 0 && !signalled_.exchange(true)) {
      started_.set_value();
    }
    ForwardingWorkerClient::EsEvaluateAsync(std::move(r), std::move(done));
  }

 private:
  std::atomic<bool> signalled_{false};
  std::promise<void> started_;
  std::shared_future<void> started_future_ = started_.get_future().share();
};

class TrainJobsTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    ThreadPool pool(2);
    ASSERT_TRUE(MakeFixture(SmallQwen3Fixture(5), Path(), pool).ok());
    auto file = gguf::File::Open(Path());
    ASSERT_TRUE(file.ok()) << file.status();
    auto tokenizer = Tokenizer::FromGguf(**file);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer).release();
    auto chat = ChatTemplate::FromGguf(**file);
    ASSERT_TRUE(chat.ok()) << chat.status();
    chat_ = new ChatTemplate(*std::move(chat));
  }
  static void TearDownTestSuite() {
    delete chat_;
    delete tokenizer_;
    std::remove(Path().c_str());
  }
  static std::string Path() {
    return testing::TempDir() + "/train_jobs_test_" + std::to_string(getpid()) + ".gguf";
  }

  // Jobs on one in-process worker holding whole replicas.
  std::unique_ptr<TrainJobs> Jobs(size_t retained) {
    return std::make_unique<TrainJobs>(
        Path(), "", *tokenizer_, *chat_,
        [this](bool) { return std::vector<EsGroup>{{{{"w", client_}}, {}}}; }, nullptr,
        retained);
  }

  static v1::StartJobRequest Request(int tasks, int iterations) {
    v1::StartJobRequest r;
    r.set_raw(true);
    r.set_population(2);
    r.set_iterations(iterations);
    for (int i = 0; i < tasks; ++i) {
      v1::TrainTask* t = r.add_tasks();
      t->set_prompt("Question " + std::to_string(i) + ": what comes after " +
                    std::to_string(i) + "?");
      t->set_answer(" " + std::to_string(i + 1));
    }
    return r;
  }

  // The job's last event (its end).
  static v1::JobEvent WatchToEnd(TrainJobs& jobs, const std::string& id) {
    v1::JobEvent last;
    absl::Status s = jobs.Watch(
        id, [&](const v1::JobEvent& e) { return last = e, true; }, nullptr);
    EXPECT_TRUE(s.ok()) << s;
    return last;
  }

  std::shared_ptr<WorkerActor> worker_ =
      std::make_shared<WorkerActor>(WorkerOptions{.threads = 1});
  std::shared_ptr<SignallingClient> client_ = std::make_shared<SignallingClient>(worker_);
  static inline Tokenizer* tokenizer_ = nullptr;
  static inline ChatTemplate* chat_ = nullptr;
};

TEST_F(TrainJobsTest, EndedJobsHoldNoReplicaAndTheOldestAreForgotten) {
  auto jobs = Jobs(/*retained=*/2);
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    auto job = jobs->Start(Request(2, 1));
    ASSERT_TRUE(job.ok()) << job.status();
    ids.push_back(job->job_id());
    EXPECT_EQ(WatchToEnd(*jobs, ids.back()).state(), v1::JOB_STATE_SUCCEEDED);
    auto info = jobs->Get(ids.back());
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->workers_size(), 0) << info->DebugString();
    // The worker freed the replica: another EsUpdate finds no job.
    wire::EsUpdateRequest update;
    update.set_job_id(ids.back());
    EXPECT_TRUE(absl::IsNotFound(worker_->EsUpdate(update).status()));
  }
  // Starting the 4th forgot the 1st (3 ended, 2 kept); the newest stay.
  EXPECT_TRUE(absl::IsNotFound(jobs->Get(ids[0]).status()));
  for (size_t i = 1; i < ids.size(); ++i) EXPECT_TRUE(jobs->Get(ids[i]).ok()) << ids[i];
}

TEST_F(TrainJobsTest, AShutdownDeadlineCutsAGenerationInFlight) {
  auto jobs = Jobs(64);
  // Long members (many tasks) and many generations: only the deadline can end it soon.
  auto job = jobs->Start(Request(kLongTasks, 1000));
  ASSERT_TRUE(job.ok()) << job.status();
  const auto center = Clock::now();
  client_->member_started().wait();  // the center is scored, member 0 is being scored
  const auto start = Clock::now();
  // Scoring the center took as long as a member does: what a stop without the deadline waits.
  const double member = std::chrono::duration<double>(start - center).count();
  jobs->Shutdown(start + std::chrono::milliseconds(50));
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("a member: %.3f s; shutdown with a 50 ms deadline: %.3f s\n", member, took);
  EXPECT_LT(took, member / 2);
  auto info = jobs->Get(job->job_id());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state(), v1::JOB_STATE_STOPPED) << info->DebugString();
  EXPECT_EQ(info->workers_size(), 0);
  // No job starts once shutting down.
  EXPECT_TRUE(absl::IsUnavailable(jobs->Start(Request(2, 1)).status()));
}

}  // namespace
}  // namespace fucina
