// The ES driver over in-process worker actors (coordinator/es_driver.h): a job on two
// replicas ends bit-identical to one process running the trainer directly; traffic per
// generation does not grow with the parameter count; a worker dying mid-generation, a worker
// joining late and a resume from a checkpoint all end with the parameters of an uninterrupted
// run; diverging replicas and bad jobs fail naming what is wrong. Pipelined replicas (stage
// workers holding a layer each, members scored through them) end bit-identical too, score and
// checkpoint as a whole replica does, and survive a stage dying mid-generation.
#include "coordinator/es_driver.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "models/engine/fixture.h"
#include "models/engine/model.h"
#include "models/engine/registry.h"
#include "models/tokenizer/tokenizer.h"
#include "tests/worker/fake_worker_client.h"
#include "models/train/es.h"
#include "models/train/tasks.h"
#include "tests/models/engine/fixture_files.h"
#include "worker/es_replica.h"
#include "worker/worker_actor.h"

namespace fucina {
namespace {

constexpr char kSmallTensors[] = "blk\\.1\\.ffn_down\\.weight";
constexpr char kLargeTensors[] = "token_embd\\.weight|blk\\.[0-9]+\\.ffn_(down|up|gate)\\.weight";

std::string TempPath(const std::string& name) {
  return testing::TempDir() + "/es_driver_test_" + std::to_string(getpid()) + "_" + name;
}

// Byte-vocabulary prompts whose answer is always token 65 ('A').
void AddTasks(wire::EsJob& job) {
  for (int i = 0; i < 4; ++i) {
    wire::EsTask* t = job.add_tasks();
    for (int j = 0; j < 5; ++j) t->add_prompt((i * 31 + j * 17 + 3) % 200 + 20);
    t->add_answer(65);
    t->set_answer_text("A");
  }
}

// A client that forwards to a real actor until it "dies": from the `die_at`-th EsEvaluate on
// (1-based) every call fails UNAVAILABLE, as a killed worker's would. Its death can be
// announced to another client (`death`) that waits for it before evaluating (`start_after`),
// which orders the two workers' calls.
class DyingClient : public ForwardingWorkerClient {
 public:
  DyingClient(std::shared_ptr<WorkerActor> actor, int die_at)
      : ForwardingWorkerClient(actor), actor_(actor), die_at_(die_at) {}
  // An evaluation may wait for another client's death: each runs on a thread of its own, so
  // a caller fanning out from one thread is not held by it.
  ~DyingClient() override {
    std::lock_guard<std::mutex> lock(threads_mu_);
    for (std::thread& t : threads_) {
      if (t.get_id() == std::this_thread::get_id()) {
        t.detach();
      } else {
        t.join();
      }
    }
  }
  std::shared_future<void> death() { return death_.get_future().share(); }
  void StartAfter(std::shared_future<void> f) { start_after_ = f; }
  void EsLoadAsync(wire::EsJob job, Callback<wire::EsState> done) override {
    if (dead()) return done(Gone());
    ForwardingWorkerClient::EsLoadAsync(std::move(job), std::move(done));
  }
  void EsEvaluateAsync(wire::EsEvaluateRequest r,
                       Callback<wire::EsEvaluateResponse> done) override {
    std::lock_guard<std::mutex> lock(threads_mu_);
    threads_.emplace_back([this, r = std::move(r), done = std::move(done)] {
      done(Evaluate(r));
    });
  }
  void EsUpdateAsync(wire::EsUpdateRequest r, Callback<wire::EsState> done) override {
    if (dead()) return done(Gone());
    auto state = actor_->EsUpdate(r);
    if (state.ok() && corrupt_checksum_) state->set_checksum(state->checksum() ^ 1);
    done(std::move(state));
  }
  void EsSnapshotAsync(wire::EsSnapshotRequest r,
                       Callback<wire::EsSnapshotChunk> done) override {
    if (dead()) return done(Gone());
    auto chunk = actor_->EsSnapshot(r);
    if (chunk.ok() && !snapshot_name_.empty()) chunk->set_file_name(snapshot_name_);
    done(std::move(chunk));
  }
  // A later pipeline stage: its EsForward calls count toward its death instead.
  void EsForwardAsync(wire::EsForwardRequest r, Callback<wire::EsForwardResponse> done) override {
    if (die_on_forward_) {
      if (++evaluations_ == die_at_) death_.set_value();
    }
    if (dead()) return done(Gone());
    ForwardingWorkerClient::EsForwardAsync(std::move(r), std::move(done));
  }
  void DieOnForward() { die_on_forward_ = true; }
  void CorruptChecksums() { corrupt_checksum_ = true; }
  // A worker that lies: every fitness it reports is `f`; its snapshots are named `name`.
  void ReportFitness(float f) { fitness_ = f; }
  void NameSnapshots(std::string name) { snapshot_name_ = std::move(name); }

 private:
  absl::StatusOr<wire::EsEvaluateResponse> Evaluate(const wire::EsEvaluateRequest& r) {
    if (start_after_.valid()) start_after_.wait();
    if (++evaluations_ == die_at_) death_.set_value();
    if (evaluations_ >= die_at_) return Gone();
    auto reply = actor_->EsEvaluate(r);
    if (reply.ok() && fitness_.has_value()) {
      for (int i = 0; i < reply->fitness_size(); ++i) reply->set_fitness(i, *fitness_);
    }
    return reply;
  }
  bool dead() const { return evaluations_ >= die_at_; }
  static absl::Status Gone() { return absl::UnavailableError("connection reset (test)"); }
  std::shared_ptr<WorkerActor> actor_;
  const int die_at_;
  std::atomic<int> evaluations_{0};
  std::atomic<bool> corrupt_checksum_{false};
  bool die_on_forward_ = false;
  std::optional<float> fitness_;
  std::string snapshot_name_;
  std::promise<void> death_;
  std::shared_future<void> start_after_;
  std::mutex threads_mu_;
  std::vector<std::thread> threads_;
};

class EsDriverTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    ThreadPool pool(2);
    ASSERT_TRUE(MakeFixture(SmallQwen3Fixture(5), Path(), pool).ok());
  }
  static void TearDownTestSuite() { std::remove(Path().c_str()); }
  static std::string Path() { return TempPath("model.gguf"); }

  static wire::EsJob Job(const std::string& tensors = kSmallTensors) {
    wire::EsJob job;
    job.set_job_id("t");
    job.set_model_path(Path());
    job.set_mode("full");
    job.set_tensors(tensors);
    job.set_population(8);
    job.set_sigma(0.05f);
    job.set_lr(0.1f);
    job.set_seed(11);
    job.mutable_reward()->set_kind("nll");
    job.set_threads(1);
    AddTasks(job);
    return job;
  }

  static std::shared_ptr<WorkerActor> Actor(int threads = 1) {
    WorkerOptions o;
    o.threads = threads;
    return std::make_shared<WorkerActor>(o);
  }

  // The job run in this process by the trainer itself, no driver, no workers: the reference.
  static uint64_t OneProcessChecksum(const wire::EsJob& job, int generations) {
    ThreadPool pool(3);
    LoadOptions load;
    const std::regex pattern(job.tensors());
    load.f32_tensors = [&](std::string_view n) {
      return std::regex_match(n.begin(), n.end(), pattern);
    };
    auto model = Model::Load(Path(), load, pool);
    EXPECT_TRUE(model.ok()) << model.status();
    auto tokenizer = Tokenizer::FromGguf((*model)->file());
    EXPECT_TRUE(tokenizer.ok());
    auto trainer = train::EsTrainer::Create(**model, EsOptionsOf(job), pool);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    std::vector<train::Task> tasks;
    for (const wire::EsTask& t : job.tasks()) {
      tasks.push_back({{t.prompt().begin(), t.prompt().end()},
                       {t.answer().begin(), t.answer().end()},
                       t.answer_text()});
    }
    auto spec = train::MakeRewardSpec("nll", "", 0);
    for (int g = 0; g < generations; ++g) {
      EXPECT_TRUE((*trainer)
                      ->Step(g, [&](Model& m) {
                        return train::ScoreTasks(m, **tokenizer, tasks, *spec);
                      })
                      .ok());
    }
    return (*trainer)->Checksum();
  }

  static EsDriverOptions Options(const wire::EsJob& job, int iterations) {
    EsDriverOptions o;
    o.job = job;
    o.iterations = iterations;
    o.wait_for_workers_ms = 2000;
    return o;
  }
};

TEST_F(EsDriverTest, TwoReplicasMatchOneProcessBitForBit) {
  const wire::EsJob job = Job();
  std::vector<EsWorker> workers = {{"a", Actor(1)}, {"b", Actor(2)}};
  EsDriver driver(Options(job, 3), WholeReplicas([&] { return workers; }));
  std::vector<EsGenerationEvent> events;
  ASSERT_TRUE(driver.Run([&](const EsGenerationEvent& e) { events.push_back(e); }).ok());
  ASSERT_EQ(events.size(), 3u);
  for (const EsGenerationEvent& e : events) {
    EXPECT_EQ(e.members_done, 8);
    EXPECT_EQ(e.members_retried, 0);
    EXPECT_EQ(e.workers, 2);
    EXPECT_LE(e.reward_min, e.reward_mean);
    EXPECT_LE(e.reward_mean, e.reward_max);
  }
  EXPECT_EQ(driver.checksum(), OneProcessChecksum(job, 3));
  EXPECT_EQ(driver.generation(), 3);
  // Training moved the parameters.
  EsDriver untrained(Options(job, 0), WholeReplicas([&] { return workers; }));
  ASSERT_TRUE(untrained.Run(nullptr).ok());
  ASSERT_TRUE(untrained.EvaluateCenter(false).ok());
  EXPECT_NE(untrained.checksum(), driver.checksum());
}

// Stage workers reached by id, as a coordinator's embedded workers are.
class StageWorkers {
 public:
  std::shared_ptr<WorkerActor> Actor() {
    WorkerOptions o;
    o.threads = 1;
    return std::make_shared<WorkerActor>(o, [this](const wire::Peer& peer) {
      auto it = peers_.find(peer.worker_id());
      return it == peers_.end() ? nullptr : it->second;
    });
  }
  // The group of `workers` (reached as `ids` by the stage before) over the model's layers cut
  // in as many stages.
  EsGroup Group(const std::vector<std::string>& ids,
                const std::vector<std::shared_ptr<WorkerClient>>& workers,
                const std::string& model_path) {
    EsGroup group;
    for (size_t i = 0; i < ids.size(); ++i) {
      peers_[ids[i]] = workers[i];
      group.workers.push_back({ids[i], workers[i]});
    }
    auto file = gguf::File::Open(model_path);
    EXPECT_TRUE(file.ok()) << file.status();
    auto config = ReadModelConfig(**file);
    EXPECT_TRUE(config.ok()) << config.status();
    auto stages = EvenStages(*config, static_cast<int>(ids.size()));
    EXPECT_TRUE(stages.ok()) << stages.status();
    group.stages = *stages;
    return group;
  }

 private:
  std::map<std::string, std::shared_ptr<WorkerClient>> peers_;
};

TEST_F(EsDriverTest, APipelinedReplicaTrainsScoresAndSavesAsAWholeOne) {
  // Trained tensors on both stages: each stage updates its own layer's.
  wire::EsJob job = Job("blk\\.[01]\\.ffn_down\\.weight");
  const std::string whole_dir = TempPath("whole"), pipe_dir = TempPath("pipe");
  EsDriverOptions o = Options(job, 2);
  o.out_dir = whole_dir;
  std::vector<EsWorker> one = {{"w", Actor()}};
  EsDriver whole(o, WholeReplicas([&] { return one; }));
  ASSERT_TRUE(whole.Run(nullptr).ok());

  StageWorkers stages;
  std::vector<EsGroup> groups = {stages.Group({"s0", "s1"}, {stages.Actor(), stages.Actor()},
                                              Path())};
  o.out_dir = pipe_dir;
  EsDriver pipe(o, [&] { return groups; });
  std::vector<EsGenerationEvent> events;
  ASSERT_TRUE(pipe.Run([&](const EsGenerationEvent& e) { events.push_back(e); }).ok());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events.back().members_done, 8);
  EXPECT_EQ(pipe.checksum(), OneProcessChecksum(job, 2));
  EXPECT_EQ(pipe.checksum(), whole.checksum());
  EXPECT_EQ(pipe.num_values(), whole.num_values());
  // The stages' files, merged, are the whole replica's file byte for byte.
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string saved = read(whole_dir + "/tensors.gguf");
  ASSERT_FALSE(saved.empty());
  EXPECT_EQ(read(pipe_dir + "/tensors.gguf"), saved);
  // Scores through the pipeline equal the whole model's, teacher-forced and greedy.
  auto center = [](EsDriver& d) {
    auto f = d.EvaluateCenter(false);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.value_or(0.0f);
  };
  EXPECT_EQ(center(pipe), center(whole));
  job.set_job_id("greedy");
  job.mutable_reward()->set_kind("acc");
  job.mutable_reward()->set_max_tokens(3);
  EsDriver whole_acc(Options(job, 0), WholeReplicas([&] { return one; }));
  EsDriver pipe_acc(Options(job, 0), [&] { return groups; });
  ASSERT_TRUE(whole_acc.Run(nullptr).ok());
  ASSERT_TRUE(pipe_acc.Run(nullptr).ok());
  EXPECT_EQ(center(pipe_acc), center(whole_acc));
  std::filesystem::remove_all(whole_dir);
  std::filesystem::remove_all(pipe_dir);
}

TEST_F(EsDriverTest, AStageDyingMidGenerationDropsItsPipelineAndTheJobEndsTheSame) {
  const wire::EsJob job = Job("blk\\.[01]\\.ffn_down\\.weight");
  StageWorkers stages;
  // b1 scores two members of generation 1 and dies at its third; a0 starts once it has.
  auto b1 = std::make_shared<DyingClient>(stages.Actor(), 3);
  b1->DieOnForward();
  auto a0 = std::make_shared<DyingClient>(stages.Actor(), 1 << 30);
  a0->StartAfter(b1->death());
  std::vector<EsGroup> groups = {stages.Group({"a0", "a1"}, {a0, stages.Actor()}, Path()),
                                 stages.Group({"b0", "b1"}, {stages.Actor(), b1}, Path())};
  EsDriver driver(Options(job, 3), [&] { return groups; });
  int retried = 0;
  ASSERT_TRUE(driver.Run([&](const EsGenerationEvent& e) { retried += e.members_retried; }).ok());
  EXPECT_GE(retried, 1);
  EXPECT_EQ(driver.checksum(), OneProcessChecksum(job, 3));
  EXPECT_EQ(driver.replica_workers(), std::vector<std::string>{groups[0].id()});
}

TEST_F(EsDriverTest, TrafficPerGenerationDoesNotGrowWithTheParameters) {
  auto bytes_of = [&](const char* tensors, int64_t* values) {
    std::vector<EsWorker> workers = {{"a", Actor()}, {"b", Actor()}};
    EsDriver driver(Options(Job(tensors), 2), WholeReplicas([&] { return workers; }));
    std::vector<EsGenerationEvent> events;
    EXPECT_TRUE(driver.Run([&](const EsGenerationEvent& e) { events.push_back(e); }).ok());
    *values = driver.num_values();
    return events.back().bytes_sent + events.back().bytes_received;
  };
  int64_t small_values = 0, large_values = 0;
  const int64_t small = bytes_of(kSmallTensors, &small_values);
  const int64_t large = bytes_of(kLargeTensors, &large_values);
  ASSERT_GT(large_values, 10 * small_values);
  // Only replies' value counts (a varint) differ with the parameter count.
  EXPECT_LE(std::abs(large - small), 8);
  // O(population): ids out and a float back per member, the shaped floats to each replica.
  EXPECT_LT(small, 8 * 64 + 2 * 8 * 8 + 512);
  EXPECT_LT(small, small_values * 4 / 10);  // far below sending one copy of the values
}

// The train calls a test holds: each with the replica it went to, the thread it came from,
// and how to answer it.
struct HeldEsCalls {
  struct Call {
    int replica;
    std::string kind;  // "evaluate" or "update"
    std::thread::id from;
    std::function<void()> answer;  // null once answered
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Call> calls;

  void Add(Call call) {
    {
      std::lock_guard<std::mutex> lock(mu);
      calls.push_back(std::move(call));
    }
    cv.notify_all();
  }
  bool WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return calls.size() >= n; });
  }
  Call Get(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    return calls.at(i);
  }
  // Answers call i on this thread.
  void Answer(size_t i) {
    std::function<void()> answer;
    {
      std::lock_guard<std::mutex> lock(mu);
      answer = std::move(calls.at(i).answer);
      calls.at(i).answer = nullptr;
    }
    ASSERT_TRUE(answer != nullptr) << "call " << i << " was answered already";
    answer();
  }
};

// A replica whose evaluations and updates wait in `held` until the test answers them.
class HoldingEsClient : public FakeWorkerClient {
 public:
  HoldingEsClient(int replica, HeldEsCalls* held) : replica_(replica), held_(held) {}
  void EsLoadAsync(wire::EsJob, Callback<wire::EsState> done) override { done(State()); }
  void EsEvaluateAsync(wire::EsEvaluateRequest r,
                       Callback<wire::EsEvaluateResponse> done) override {
    held_->Add({replica_, "evaluate", std::this_thread::get_id(),
                [member = r.members(0), done = std::move(done)] {
                  wire::EsEvaluateResponse reply;
                  reply.add_fitness(static_cast<float>(member));
                  done(reply);
                }});
  }
  void EsUpdateAsync(wire::EsUpdateRequest, Callback<wire::EsState> done) override {
    held_->Add({replica_, "update", std::this_thread::get_id(),
                [done = std::move(done)] { done(State()); }});
  }
  void EsReleaseAsync(wire::EsReleaseRequest, Callback<wire::EsState> done) override {
    done(wire::EsState());
  }

 private:
  static wire::EsState State() {
    wire::EsState state;
    state.set_num_values(4);
    state.set_checksum(9);
    return state;
  }
  const int replica_;
  HeldEsCalls* held_;
};

TEST_F(EsDriverTest, MembersAndUpdatesFanOutThroughCallbacksWithNoThreadPerCall) {
  // Three replicas: each has a member in flight before any is answered, all started by the
  // driver's own thread; an answer starts that replica's next member from the answer's thread
  // (its callback), and the update reaches every replica at once.
  wire::EsJob job = Job();
  job.set_population(6);
  HeldEsCalls held;
  std::vector<EsWorker> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back({"r" + std::to_string(i), std::make_shared<HoldingEsClient>(i, &held)});
  }
  EsDriver driver(Options(job, 1), WholeReplicas([&] { return workers; }));
  absl::Status run_status;
  std::vector<EsGenerationEvent> events;
  std::thread run([&] {
    run_status = driver.Run([&](const EsGenerationEvent& e) { events.push_back(e); });
  });
  ASSERT_TRUE(held.WaitFor(3));
  const std::thread::id driver_thread = held.Get(0).from;
  std::set<int> replicas;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(held.Get(i).kind, "evaluate");
    EXPECT_EQ(held.Get(i).from, driver_thread);
    replicas.insert(held.Get(i).replica);
  }
  EXPECT_EQ(replicas.size(), 3u);
  EXPECT_NE(driver_thread, std::this_thread::get_id());
  for (size_t i = 0; i < 3; ++i) {
    held.Answer(i);
    ASSERT_TRUE(held.WaitFor(4 + i));
    const HeldEsCalls::Call next = held.Get(3 + i);
    EXPECT_EQ(next.kind, "evaluate");
    EXPECT_EQ(next.replica, held.Get(i).replica);  // the replica that was free
    EXPECT_EQ(next.from, std::this_thread::get_id());
  }
  for (size_t i = 3; i < 6; ++i) held.Answer(i);
  ASSERT_TRUE(held.WaitFor(9));
  for (size_t i = 6; i < 9; ++i) {
    EXPECT_EQ(held.Get(i).kind, "update");
    EXPECT_EQ(held.Get(i).from, driver_thread);
  }
  for (size_t i = 6; i < 9; ++i) held.Answer(i);
  run.join();
  ASSERT_TRUE(run_status.ok()) << run_status;
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].members_done, 6);
  EXPECT_EQ(events[0].reward_max, 5.0f);  // each member's fitness is its id
  EXPECT_EQ(driver.checksum(), 9u);
}

TEST_F(EsDriverTest, MembersLostWithADyingWorkerRunAgainElsewhere) {
  const wire::EsJob job = Job();
  // b evaluates two members of generation 1 and dies at its third; a starts once it has.
  auto dying = std::make_shared<DyingClient>(Actor(), 3);
  auto survivor = std::make_shared<DyingClient>(Actor(), 1 << 30);
  survivor->StartAfter(dying->death());
  std::vector<EsWorker> workers = {{"a", survivor}, {"b", dying}};
  EsDriver driver(Options(job, 3), WholeReplicas([&] { return workers; }));
  int retried = 0;
  ASSERT_TRUE(driver.Run([&](const EsGenerationEvent& e) { retried += e.members_retried; }).ok());
  EXPECT_GE(retried, 1);
  EXPECT_EQ(driver.checksum(), OneProcessChecksum(job, 3));
  EXPECT_EQ(driver.replica_workers(), std::vector<std::string>{"a"});
}

TEST_F(EsDriverTest, ALateWorkerReplaysTheLogAndJoins) {
  const wire::EsJob job = Job();
  std::vector<EsWorker> workers = {{"a", Actor()}};
  EsDriver driver(Options(job, 4), WholeReplicas([&] { return workers; }));
  int joined_at = -1;
  ASSERT_TRUE(driver
                  .Run([&](const EsGenerationEvent& e) {
                    if (e.generation == 2) workers.push_back({"b", Actor(2)});
                    if (e.workers == 2 && joined_at < 0) joined_at = e.generation;
                  })
                  .ok());
  EXPECT_EQ(joined_at, 3);
  EXPECT_EQ(driver.replica_workers().size(), 2u);
  EXPECT_EQ(driver.checksum(), OneProcessChecksum(job, 4));
}

TEST_F(EsDriverTest, ResumeFromACheckpointEndsLikeAnUninterruptedRun) {
  const wire::EsJob job = Job();
  const std::string dir = TempPath("ckpt");
  std::filesystem::remove_all(dir);
  {
    std::vector<EsWorker> workers = {{"a", Actor()}};
    EsDriverOptions o = Options(job, 2);
    o.out_dir = dir;
    EsDriver driver(o, WholeReplicas([&] { return workers; }));
    ASSERT_TRUE(driver.Run(nullptr).ok());
  }
  ASSERT_TRUE(std::filesystem::exists(dir + "/state.json"));
  ASSERT_TRUE(std::filesystem::exists(dir + "/tensors.gguf"));
  // The trained tensor file holds the f32 values.
  auto tensors = gguf::File::Open(dir + "/tensors.gguf");
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_NE((*tensors)->FindTensor("blk.1.ffn_down.weight"), nullptr);

  std::vector<EsWorker> workers = {{"b", Actor(2)}};
  EsDriverOptions o = Options(wire::EsJob(), 4);
  o.job.set_job_id("resumed");
  o.job.set_model_path(job.model_path());
  EsDriver resumed(o, WholeReplicas([&] { return workers; }));
  ASSERT_TRUE(resumed.Resume(dir).ok());
  EXPECT_EQ(resumed.generation(), 2);
  ASSERT_TRUE(resumed.Run(nullptr).ok());
  EXPECT_EQ(resumed.checksum(), OneProcessChecksum(job, 4));

  // A damaged state names the file and the field; nothing is resumed.
  {
    std::ofstream(dir + "/state.json") << "{\"version\": 1, \"job\": \"@@\"}";
  }
  EsDriver bad(o, WholeReplicas([&] { return workers; }));
  absl::Status s = bad.Resume(dir);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("state.json"), std::string::npos) << s;
  EXPECT_NE(s.message().find("\"job\""), std::string::npos) << s;
  std::filesystem::remove_all(dir);
}

TEST_F(EsDriverTest, WorkersWithoutRoomForAReplicaTakeNoPart) {
  WorkerOptions tiny;
  tiny.threads = 1;
  tiny.memory_budget = 4096;  // far below the fixture's weights
  auto cramped = std::make_shared<WorkerActor>(tiny);
  std::vector<EsWorker> workers = {{"cramped", cramped}};
  EsDriver alone(Options(Job(), 2), WholeReplicas([&] { return workers; }));
  absl::Status s = alone.Run(nullptr);  // at once, not after the wait for workers
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("memory budget"), std::string::npos) << s;

  workers.push_back({"roomy", Actor()});
  EsDriver driver(Options(Job(), 2), WholeReplicas([&] { return workers; }));
  ASSERT_TRUE(driver.Run(nullptr).ok());
  EXPECT_EQ(driver.replica_workers(), std::vector<std::string>{"roomy"});
  EXPECT_EQ(driver.checksum(), OneProcessChecksum(Job(), 2));
}

TEST_F(EsDriverTest, AStopBetweenGenerationsLeavesACheckpointOfTheLastOne) {
  const std::string dir = TempPath("stopped");
  std::filesystem::remove_all(dir);
  std::vector<EsWorker> workers = {{"a", Actor()}};
  EsDriverOptions o = Options(Job(), 10);
  o.out_dir = dir;
  EsDriver driver(o, WholeReplicas([&] { return workers; }));
  // Stopped once generation 1 is done and past its checkpoint decision (none due).
  absl::Status s = driver.Run([&](const EsGenerationEvent& e) {
    if (e.generation == 1) driver.Stop();
  });
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_EQ(driver.generation(), 1);
  std::ifstream in(dir + "/state.json");
  ASSERT_TRUE(in.good());
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("\"generation\": 1"), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

TEST_F(EsDriverTest, DivergingReplicasFailTheJob) {
  auto liar = std::make_shared<DyingClient>(Actor(), 1 << 30);
  liar->CorruptChecksums();
  std::vector<EsWorker> workers = {{"a", Actor()}, {"b", liar}};
  EsDriver driver(Options(Job(), 2), WholeReplicas([&] { return workers; }));
  absl::Status s = driver.Run(nullptr);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("diverged"), std::string::npos) << s;
}

TEST_F(EsDriverTest, ANonFiniteFitnessFailsTheJobNamingTheMember) {
  for (float f : {std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::infinity()}) {
    auto liar = std::make_shared<DyingClient>(Actor(), 1 << 30);
    liar->ReportFitness(f);
    std::vector<EsWorker> workers = {{"a", liar}};
    EsDriver driver(Options(Job(), 2), WholeReplicas([&] { return workers; }));
    // Not a worker failure: no retry on another replica, no reload, the job fails at once.
    absl::Status s = driver.Run(nullptr);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("member "), std::string::npos) << s;
    EXPECT_NE(s.message().find("non-finite fitness"), std::string::npos) << s;
    auto center = driver.EvaluateCenter(false);
    EXPECT_TRUE(absl::IsInvalidArgument(center.status())) << center.status();
    EXPECT_NE(center.status().message().find("the center"), std::string::npos);
  }
}

TEST_F(EsDriverTest, ASnapshotNamedOutsideTheCheckpointFolderIsRefused) {
  const std::string dir = TempPath("escape/ckpt");
  std::filesystem::remove_all(TempPath("escape"));
  for (const char* name : {"../escaped.gguf", "tensors.gguf/../../x", "adapters.gguf"}) {
    auto liar = std::make_shared<DyingClient>(Actor(), 1 << 30);
    liar->NameSnapshots(name);
    std::vector<EsWorker> workers = {{"a", liar}};
    EsDriverOptions o = Options(Job(), 1);  // a full-mode job: tensors.gguf
    o.out_dir = dir;
    EsDriver driver(o, WholeReplicas([&] { return workers; }));
    absl::Status s = driver.Run(nullptr);
    EXPECT_TRUE(absl::IsDataLoss(s)) << name << ": " << s;
    EXPECT_NE(s.message().find("tensors.gguf"), std::string::npos) << s;
  }
  EXPECT_FALSE(std::filesystem::exists(TempPath("escape/escaped.gguf")));
  EXPECT_FALSE(std::filesystem::exists(TempPath("x")));
  std::filesystem::remove_all(TempPath("escape"));
}

TEST_F(EsDriverTest, BadJobsNameTheField) {
  std::vector<EsWorker> workers = {{"a", Actor()}};
  wire::EsJob job = Job();
  job.set_population(5);
  EsDriver odd(Options(job, 1), WholeReplicas([&] { return workers; }));
  absl::Status s = odd.Run(nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("population"), std::string::npos) << s;

  job = Job();
  job.mutable_tasks(1)->add_answer(1 << 20);
  EsDriver vocab(Options(job, 1), WholeReplicas([&] { return workers; }));
  s = vocab.Run(nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("tasks[1]"), std::string::npos) << s;

  job = Job();
  job.mutable_tasks(2)->mutable_prompt()->Resize(40000, 30);  // an absurd task
  EsDriver huge(Options(job, 1), WholeReplicas([&] { return workers; }));
  s = huge.Run(nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("tasks[2] has 40001 tokens"), std::string::npos) << s;

  job = Job("no_such_tensor");
  EsDriver none(Options(job, 1), WholeReplicas([&] { return workers; }));
  s = none.Run(nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("tensors"), std::string::npos) << s;

  // No worker at all: UNAVAILABLE after the wait, not a hang.
  EsDriverOptions o = Options(Job(), 1);
  o.wait_for_workers_ms = 50;
  EsDriver alone(o, WholeReplicas([] { return std::vector<EsWorker>(); }));
  s = alone.Run(nullptr);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
}

}  // namespace
}  // namespace fucina
