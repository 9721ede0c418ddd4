// Evolution-strategies train jobs of one coordinator (the fucina.v1.Train service's state):
// each job runs an EsDriver (coordinator/es_driver.h) on its own thread over the workers the
// source lists, and keeps its events for watchers. The embedded `fucina train es` runs the
// same jobs over in-process workers.
//
// Policy with serving: a job's replicas live on the serving workers beside their shards, and
// each worker runs one scoring pass at a time between its forward steps (time-sliced on the
// worker's executor): generate requests keep flowing while a job runs, each step waiting at
// most one pass of one stage. An ended job holds no replica; ended jobs are kept for GetJob
// and WatchJob up to a count, then forgotten.
//
// Placement: a job asks for whole replicas (every worker scores members alone) or for the
// pipeline (StartJobRequest.pipeline: one replica over the serving plan's stages, each worker
// holding its stage's layers); the source passed in knows which workers and cuts those are.
#ifndef FUCINA_COORDINATOR_TRAIN_JOBS_H_
#define FUCINA_COORDINATOR_TRAIN_JOBS_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/es_driver.h"
#include "coordinator/metrics.h"
#include "fucina/v1/train.pb.h"
#include "models/chat/chat_template.h"
#include "models/tokenizer/tokenizer.h"

namespace fucina {

// The worker-side job for a public request: defaults applied, tasks tokenized (rendered as a
// user turn with `chat` unless the request is raw; `chat` may be null: raw). Errors are
// INVALID_ARGUMENT naming the field (tasks[i].answer, population, ...).
absl::StatusOr<wire::EsJob> EsJobFromRequest(const ::fucina::v1::StartJobRequest& request,
                                             const std::string& model_path,
                                             const Tokenizer& tokenizer,
                                             const ChatTemplate* chat);

// Runs a driver to its end: scores the unperturbed parameters first (training tasks, and the
// holdout ones when the job has some), then the generations, then the scores again. Every
// event goes to `on_event`, the last with the final state. Returns the job's status.
absl::Status RunEsJob(EsDriver& driver,
                      const std::function<void(const ::fucina::v1::JobEvent&)>& on_event);

// The replicas a job may use now: whole ones, or (pipeline) the serving pipeline's stages.
using EsPlacement = std::function<std::vector<EsGroup>(bool pipeline)>;

class TrainJobs {
 public:
  // Borrows the tokenizer and template (they outlive this); `metrics` may be null. A request's
  // out_dir and resume_from name folders under `train_dir` (relative, no "..": a client of the
  // API writes and reads nothing else on this machine); with an empty train_dir they are
  // refused.
  // Ended jobs beyond the newest `retained_jobs` are forgotten.
  TrainJobs(std::string model_path, std::string train_dir, const Tokenizer& tokenizer,
            const ChatTemplate& chat, EsPlacement placement, EsMetrics* metrics,
            size_t retained_jobs = 64);
  ~TrainJobs();  // Shutdown with no deadline

  // Stops every job now (each ends after its generation in flight, checkpointed) and waits
  // until `deadline`; jobs still running then are aborted (EsDriver::Abort: their replicas are
  // freed and they end within one scoring pass). Returns when every job's thread has ended.
  // New jobs are refused from the first call on.
  void Shutdown(std::chrono::steady_clock::time_point deadline);

  absl::StatusOr<::fucina::v1::Job> Start(const ::fucina::v1::StartJobRequest& request);
  absl::StatusOr<::fucina::v1::Job> Get(const std::string& job_id) const;
  absl::StatusOr<::fucina::v1::Job> Stop(const std::string& job_id);
  std::vector<::fucina::v1::Job> List() const;
  // Passes the job's events to `write`, the past ones then each new one, until the job ends
  // (OK), `write` returns false or `cancelled` returns true (CANCELLED).
  absl::Status Watch(const std::string& job_id,
                     const std::function<bool(const ::fucina::v1::JobEvent&)>& write,
                     const std::function<bool()>& cancelled) const;

 private:
  struct Job {
    ::fucina::v1::Job info;
    std::vector<::fucina::v1::JobEvent> events;
    std::unique_ptr<EsJobMetrics> metrics;
    std::unique_ptr<EsDriver> driver;
    std::string out_dir;  // the folder it writes (one running job per folder); may be empty
    std::thread thread;
    bool ended() const { return info.state() != ::fucina::v1::JOB_STATE_RUNNING; }
  };
  absl::StatusOr<::fucina::v1::Job> Info(const std::string& job_id) const;  // under mu_
  // Takes the oldest ended jobs beyond retained_jobs_ out of jobs_ (under mu_); the caller
  // joins their threads outside the lock.
  std::vector<std::shared_ptr<Job>> ForgetEndedLocked();

  // `name` (a request's out_dir or resume_from, non-empty) as a folder under train_dir_;
  // INVALID_ARGUMENT / FAILED_PRECONDITION naming `field` otherwise.
  absl::StatusOr<std::string> JobDir(const std::string& name, const char* field) const;

  const std::string model_path_;
  const std::string train_dir_;
  const Tokenizer& tokenizer_;
  const ChatTemplate& chat_;
  EsPlacement placement_;
  EsMetrics* metrics_;
  const size_t retained_jobs_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;  // an event or a state change
  // Shared: a watcher keeps its job alive after it is forgotten.
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  std::vector<std::string> ended_;  // ids of ended jobs still in jobs_, oldest first
  bool shutting_down_ = false;
  int next_id_ = 1;
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_TRAIN_JOBS_H_
