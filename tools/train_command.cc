// `fucina train es`: evolution-strategies fine-tuning (models/train/es.h), embedded — a driver
// (coordinator/es_driver.h) over --workers in-process worker actors, as `serve` runs its
// workers — or as a job of a running coordinator (--coordinator). And `fucina client train
// start|watch|stop|list`, the fucina.v1.Train client. Both print one line per generation and,
// on a terminal, a progress bar on stderr.
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/es_driver.h"
#include "coordinator/train_jobs.h"
#include "fucina/v1/train.grpc.pb.h"
#include "kernels/cpu/thread_pool.h"
#include "models/chat/chat_template.h"
#include "models/engine/registry.h"
#include "models/gguf/gguf.h"
#include "models/hub/pull.h"
#include "models/tokenizer/tokenizer.h"
#include "models/train/tasks.h"
#include "tools/command_status.h"
#include "tools/commands.h"
#include "tools/server_common.h"
#include "worker/worker_actor.h"

namespace fucina::cli {
namespace {

namespace api = ::fucina::v1;

struct JobArgs {
  std::string model, data, holdout, out, resume, job_id;
  std::string reward = "nll", rule, mode = "lora", tensors, targets = "q,v";
  int population = 16, iterations = 10, threads = 0, rank = 8, max_tokens = 0;
  int checkpoint_every = 0;
  float sigma = 1e-3f, lr = 5e-4f, weight_decay = 0.0f, alpha = 16.0f;
  float sigma_decay = 1.0f, lr_decay = 1.0f;
  uint64_t seed = 0;
  bool raw = false;
  bool pipeline = false;
};

struct ConnectArgs {
  std::string addr = "127.0.0.1:50051";
  std::string api_key, tls_ca;
};

struct TrainArgs {
  JobArgs job;
  int workers = 1;
  std::string coordinator;  // empty: embedded
  ConnectArgs connect;
};

// The public request the flags describe (tasks read from the files, not yet tokenized).
absl::StatusOr<api::StartJobRequest> RequestFromArgs(const JobArgs& a) {
  api::StartJobRequest r;
  r.set_job_id(a.job_id);
  auto add = [](const std::string& path,
                google::protobuf::RepeatedPtrField<api::TrainTask>* out) -> absl::Status {
    auto texts = train::ReadTaskTexts(path);
    if (!texts.ok()) return texts.status();
    for (const train::TaskText& t : *texts) {
      api::TrainTask* task = out->Add();
      task->set_prompt(t.prompt);
      task->set_answer(t.answer);
    }
    return absl::OkStatus();
  };
  if (a.resume.empty()) {
    if (a.data.empty()) return absl::InvalidArgumentError("--data is required (or --resume)");
    if (absl::Status s = add(a.data, r.mutable_tasks()); !s.ok()) return s;
    if (!a.holdout.empty()) {
      if (absl::Status s = add(a.holdout, r.mutable_holdout()); !s.ok()) return s;
    }
  }
  r.set_reward(a.reward);
  r.set_rule(a.rule);
  r.set_max_tokens(a.max_tokens);
  r.set_mode(a.mode);
  r.set_tensors(a.tensors);
  for (absl::string_view t : absl::StrSplit(a.targets, ',', absl::SkipEmpty())) {
    r.add_lora_targets(std::string(t.data(), t.size()));
  }
  r.set_lora_rank(a.rank);
  r.set_lora_alpha(a.alpha);
  r.set_population(a.population);
  r.set_sigma(a.sigma);
  r.set_lr(a.lr);
  r.set_weight_decay(a.weight_decay);
  r.set_sigma_decay(a.sigma_decay);
  r.set_lr_decay(a.lr_decay);
  r.set_seed(a.seed);
  r.set_iterations(a.iterations);
  r.set_raw(a.raw);
  r.set_out_dir(a.out);
  r.set_checkpoint_every(a.checkpoint_every);
  r.set_resume_from(a.resume);
  r.set_threads(a.threads);
  r.set_pipeline(a.pipeline);
  return r;
}

// One line per event on stdout; on a terminal, a progress bar on stderr.
class EventPrinter {
 public:
  explicit EventPrinter(int iterations)
      : iterations_(iterations), bar_(isatty(STDERR_FILENO) != 0) {}

  // False once the job has ended.
  bool Print(const api::JobEvent& e) {
    if (bar_) std::fprintf(stderr, "\r%*s\r", 60, "");
    if (e.has_train_reward()) {
      std::printf("%s %lld: reward %.5f", e.state() == api::JOB_STATE_RUNNING ? "generation"
                                                                              : "final, generation",
                  static_cast<long long>(e.generation()), e.train_reward());
      if (e.has_holdout_reward()) std::printf(", held-out reward %.5f", e.holdout_reward());
      std::printf("\n");
    } else if (e.state() == api::JOB_STATE_RUNNING) {
      std::printf(
          "generation %lld/%d: members mean %.5f (min %.5f, max %.5f), sigma %g; %d workers, "
          "%.2f s (evaluate %.2f, update %.3f, communicate %.3f); %lld B sent, %lld B received\n",
          static_cast<long long>(e.generation()), iterations_, e.reward_mean(), e.reward_min(),
          e.reward_max(), e.sigma(), e.workers(), e.seconds(), e.evaluate_seconds(),
          e.update_seconds(), e.communicate_seconds(), static_cast<long long>(e.bytes_sent()),
          static_cast<long long>(e.bytes_received()));
    }
    const bool done = e.state() != api::JOB_STATE_RUNNING;
    if (done) {
      std::printf("checksum %016llx\n", static_cast<unsigned long long>(e.checksum()));
      if (!e.error().empty()) std::fprintf(stderr, "error: %s\n", e.error().c_str());
    } else if (bar_ && iterations_ > 0) {
      const int width = 30;
      const int filled = static_cast<int>(width * std::min<int64_t>(e.generation(), iterations_) /
                                          iterations_);
      std::fprintf(stderr, "[%s%s] %lld/%d", std::string(filled, '#').c_str(),
                   std::string(width - filled, ' ').c_str(),
                   static_cast<long long>(e.generation()), iterations_);
    }
    std::fflush(stdout);
    std::fflush(stderr);
    return !done;
  }

 private:
  int iterations_;
  bool bar_;
};

int ExitCodeOf(const api::JobEvent& last) {
  return last.state() == api::JOB_STATE_SUCCEEDED || last.state() == api::JOB_STATE_STOPPED
             ? 0
             : 1;
}

// ---- the Train client ----

absl::StatusOr<std::unique_ptr<api::Train::Stub>> TrainStub(const ConnectArgs& c) {
  auto channel = DialCoordinator(c.addr, c.tls_ca);
  if (!channel.ok()) return channel.status();
  return api::Train::NewStub(*channel);
}

int FailRpc(const grpc::Status& status) {
  return Fail(absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                           status.error_message()));
}

// Runs `call` with a Train stub and a context carrying the API key; its exit code.
int CallTrain(const ConnectArgs& c,
              const std::function<int(api::Train::Stub&, grpc::ClientContext&)>& call) {
  auto stub = TrainStub(c);
  if (!stub.ok()) return FailUsage(stub.status());
  grpc::ClientContext ctx;
  AddApiKey(&ctx, c.api_key);
  return call(**stub, ctx);
}

int Watch(api::Train::Stub& stub, const ConnectArgs& c, const std::string& job_id,
          int iterations) {
  grpc::ClientContext ctx;
  AddApiKey(&ctx, c.api_key);
  api::WatchJobRequest req;
  req.set_job_id(job_id);
  auto reader = stub.WatchJob(&ctx, req);
  EventPrinter printer(iterations);
  api::JobEvent event, last;
  while (reader->Read(&event)) {
    printer.Print(event);
    last = event;
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return FailRpc(status);
  return ExitCodeOf(last);
}

int RunStart(const JobArgs& a, const ConnectArgs& c, bool watch) {
  auto request = RequestFromArgs(a);
  if (!request.ok()) return Fail(request.status());
  request->set_model(a.model);
  return CallTrain(c, [&](api::Train::Stub& stub, grpc::ClientContext& ctx) {
    api::Job job;
    grpc::Status status = stub.StartJob(&ctx, *request, &job);
    if (!status.ok()) return FailRpc(status);
    std::printf("job %s started\n", job.job_id().c_str());
    std::fflush(stdout);
    return watch ? Watch(stub, c, job.job_id(), job.iterations()) : 0;
  });
}

void PrintJob(const api::Job& j) {
  static const char* kStates[] = {"unspecified", "running", "succeeded", "failed", "stopped"};
  std::printf("%s %s generation %lld/%d checksum %016llx workers %d%s%s\n", j.job_id().c_str(),
              kStates[std::clamp<int>(j.state(), 0, 4)], static_cast<long long>(j.generation()),
              j.iterations(), static_cast<unsigned long long>(j.checksum()), j.workers_size(),
              j.error().empty() ? "" : " error: ", j.error().c_str());
}

// ---- embedded ----

int RunTrain(const TrainArgs& a) {
  if (!a.coordinator.empty()) {
    ConnectArgs c = a.connect;
    c.addr = a.coordinator;
    JobArgs job = a.job;
    job.model.clear();  // the coordinator trains its served model
    return RunStart(job, c, /*watch=*/true);
  }
  if (a.workers < 1 || a.workers > 64) {
    return FailUsage(absl::InvalidArgumentError("--workers must be in [1, 64]"));
  }
  auto path = ResolveModel(a.job.model, isatty(STDERR_FILENO));
  if (!path.ok()) return Fail(path.status());
  auto request = RequestFromArgs(a.job);
  if (!request.ok()) return Fail(request.status());
  auto file = gguf::File::Open(*path);
  if (!file.ok()) return Fail(file.status());
  auto tokenizer = Tokenizer::FromGguf(**file);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  std::optional<ChatTemplate> chat;
  if (!a.job.raw) {
    auto t = ChatTemplate::FromGguf(**file);
    if (!t.ok()) return Fail(t.status());
    chat = *std::move(t);
  }
  EsDriverOptions options;
  options.iterations = a.job.iterations;
  options.out_dir = a.job.out;
  options.checkpoint_every = a.job.checkpoint_every;
  if (a.job.resume.empty()) {
    request->set_job_id(a.job.job_id.empty() ? "train" : a.job.job_id);
    auto job = EsJobFromRequest(*request, *path, **tokenizer, chat ? &*chat : nullptr);
    if (!job.ok()) return Fail(job.status());
    options.job = *std::move(job);
  } else {
    options.job.set_job_id("train");
    options.job.set_model_path(*path);  // the checkpoint's own path is never used
  }
  // In-process workers, each with its share of the threads (the serve command's split).
  const int total = a.job.threads > 0 ? a.job.threads : ThreadPool::Default().num_threads();
  std::vector<EsWorker> workers;
  // A stage reaches the next by its worker id.
  auto by_id = [&workers](const wire::Peer& peer) -> std::shared_ptr<WorkerClient> {
    for (const EsWorker& w : workers) {
      if (w.id == peer.worker_id()) return w.client;
    }
    return nullptr;
  };
  for (int i = 0; i < a.workers; ++i) {
    WorkerOptions wo;
    wo.threads = std::max(1, total / a.workers);
    workers.push_back({absl::StrCat("local-", i), std::make_shared<WorkerActor>(wo, by_id)});
  }
  EsGroupSource groups = WholeReplicas([&workers] { return workers; });
  if (a.job.pipeline) {
    auto config = ReadModelConfig(**file);
    if (!config.ok()) return Fail(config.status());
    auto stages = EvenStages(*config, a.workers);
    if (!stages.ok()) return Fail(stages.status());
    groups = [&workers, stages = *stages] {
      return std::vector<EsGroup>{{workers, stages}};
    };
  }
  EsDriver driver(options, groups);
  if (!a.job.resume.empty()) {
    if (absl::Status s = driver.Resume(a.job.resume); !s.ok()) return Fail(s);
  }
  std::printf("training on %d worker%s%s: population %d, sigma %g, lr %g, %lld generations\n",
              a.workers, a.workers == 1 ? "" : "s", a.job.pipeline ? " as pipeline stages" : "",
              driver.job().population(),
              driver.job().sigma(), driver.job().lr(), static_cast<long long>(options.iterations));
  EventPrinter printer(a.job.iterations);
  api::JobEvent last;
  absl::Status status = RunEsJob(driver, [&](const api::JobEvent& e) {
    if (e.generation() == driver.generation() && e.has_train_reward() &&
        e.state() == api::JOB_STATE_RUNNING) {
      std::printf("trainable values: %lld\n", static_cast<long long>(driver.num_values()));
    }
    printer.Print(e);
    last = e;
  });
  if (!status.ok()) return Fail(status);
  if (!a.job.out.empty()) std::printf("wrote %s\n", a.job.out.c_str());
  return 0;
}

void AddJobFlags(CLI::App* cmd, JobArgs* a) {
  cmd->add_option("--data", a->data, "JSONL tasks: {\"prompt\": ..., \"answer\": ...} per line");
  cmd->add_option("--holdout", a->holdout, "JSONL tasks only scored, before and after training");
  cmd->add_option("--reward", a->reward,
                  "nll: mean log-probability of the answer tokens; acc: exact match of the "
                  "greedy completion; rule: --rule found in the greedy completion")
      ->check(CLI::IsMember({"nll", "acc", "rule"}))
      ->capture_default_str();
  cmd->add_option("--rule", a->rule, "rule: RE2 regex searched in each completion (no lookaround or backreferences)");
  cmd->add_option("--max-tokens", a->max_tokens,
                  "acc / rule: completion length bound (0: the reward's default)");
  cmd->add_option("--mode", a->mode,
                  "lora: adapters on --targets; full: the --tensors matrices, held as f32")
      ->check(CLI::IsMember({"full", "lora"}))
      ->capture_default_str();
  cmd->add_option("--targets", a->targets, "lora: projections (q,k,v,o,gate,up,down)")
      ->capture_default_str();
  cmd->add_option("--rank", a->rank, "lora: adapter rank")->capture_default_str();
  cmd->add_option("--alpha", a->alpha, "lora: scale alpha / rank")->capture_default_str();
  cmd->add_option("--tensors", a->tensors,
                  "full: regex over tensor names (default: attn_q, attn_v, ffn_down)");
  cmd->add_option("--population", a->population, "Members per generation (even)")
      ->capture_default_str();
  cmd->add_option("--sigma", a->sigma, "Noise scale")->capture_default_str();
  cmd->add_option("--lr", a->lr, "Step size")->capture_default_str();
  cmd->add_option("--sigma-decay", a->sigma_decay, "sigma *= this each generation")
      ->capture_default_str();
  cmd->add_option("--lr-decay", a->lr_decay, "lr *= this each generation")
      ->capture_default_str();
  cmd->add_option("--weight-decay", a->weight_decay, "Pull toward the base weights")
      ->capture_default_str();
  cmd->add_option("--iterations", a->iterations, "Generations to reach")->capture_default_str();
  cmd->add_option("--seed", a->seed, "Noise seed")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Threads per job (split across workers; default: all)")
      ->check(CLI::Range(0, kMaxThreads));
  cmd->add_flag("--raw", a->raw, "Use prompts as they are, without the chat template");
  cmd->add_option("--out", a->out,
                  "Checkpoint folder: state.json and adapters.gguf (lora) or tensors.gguf "
                  "(full), for `serve --adapter` and `gguf export`");
  cmd->add_option("--checkpoint-every", a->checkpoint_every,
                  "Generations between checkpoints (0: only at the end)")
      ->capture_default_str();
  cmd->add_option("--resume", a->resume,
                  "Continue the job checkpointed in this folder (its state.json)");
  cmd->add_option("--job-id", a->job_id, "The job's name");
  cmd->add_flag("--pipeline", a->pipeline,
                "Score members through pipeline stages, each worker holding its stage's "
                "layers (a coordinator's serving plan; embedded: one stage per --workers), "
                "instead of a whole model per worker");
}

void AddConnectFlags(CLI::App* cmd, ConnectArgs* c, bool addr) {
  if (addr) cmd->add_option("--addr", c->addr, "Coordinator address")->capture_default_str();
  cmd->add_option("--api-key", c->api_key,
                  "Sent as authorization: Bearer KEY; default $FUCINA_API_KEY");
  cmd->add_option("--tls-ca", c->tls_ca,
                  "PEM CA that signed the server's certificate: connect over TLS");
}

}  // namespace

void RegisterTrainCommands(CLI::App& app, int* exit_code) {
  CLI::App* train = app.add_subcommand("train", "Fine-tune a model");
  train->require_subcommand(1);
  auto a = std::make_shared<TrainArgs>();
  CLI::App* es = train->add_subcommand(
      "es", "Evolution-strategies fine-tuning: embedded workers, or a coordinator's job");
  es->add_option("MODEL", a->job.model,
                 "GGUF model file, or a reference to pull (with --coordinator: its served "
                 "model is trained)");
  AddJobFlags(es, &a->job);
  es->add_option("--workers", a->workers, "In-process workers evaluating members")
      ->capture_default_str();
  es->add_option("--coordinator", a->coordinator,
                 "Run as a job of the coordinator at this address instead");
  AddConnectFlags(es, &a->connect, /*addr=*/false);
  es->callback([a, exit_code] {
    if (a->coordinator.empty() && a->job.model.empty()) {
      *exit_code = FailUsage(absl::InvalidArgumentError("MODEL is required without "
                                                        "--coordinator"));
      return;
    }
    *exit_code = RunTrain(*a);
  });

  // `fucina client train ...`, beside `client generate`.
  CLI::App* client = app.get_subcommand("client");
  CLI::App* ct = client->add_subcommand("train", "Train jobs of a coordinator (fucina.v1.Train)");
  ct->require_subcommand(1);
  auto conn = std::make_shared<ConnectArgs>();
  auto job = std::make_shared<JobArgs>();
  auto watch = std::make_shared<bool>(false);
  CLI::App* start = ct->add_subcommand("start", "Start a job (--watch: then follow it)");
  AddJobFlags(start, job.get());
  start->add_option("--model", job->model, "Model name (default: the served one)");
  start->add_flag("--watch", *watch, "Print the job's events until it ends");
  AddConnectFlags(start, conn.get(), true);
  start->callback([=] { *exit_code = RunStart(*job, *conn, *watch); });

  auto id = std::make_shared<std::string>();
  CLI::App* w = ct->add_subcommand("watch", "Print a job's events until it ends");
  w->add_option("JOB", *id, "Job id")->required();
  AddConnectFlags(w, conn.get(), true);
  w->callback([=] {
    *exit_code = CallTrain(*conn, [&](api::Train::Stub& stub, grpc::ClientContext& ctx) {
      api::GetJobRequest req;
      req.set_job_id(*id);
      api::Job j;
      grpc::Status s = stub.GetJob(&ctx, req, &j);
      return s.ok() ? Watch(stub, *conn, *id, j.iterations()) : FailRpc(s);
    });
  });

  CLI::App* stop = ct->add_subcommand("stop", "Stop a job after its generation in flight");
  stop->add_option("JOB", *id, "Job id")->required();
  AddConnectFlags(stop, conn.get(), true);
  stop->callback([=] {
    *exit_code = CallTrain(*conn, [&](api::Train::Stub& stub, grpc::ClientContext& ctx) {
      api::StopJobRequest req;
      req.set_job_id(*id);
      api::Job j;
      grpc::Status s = stub.StopJob(&ctx, req, &j);
      if (!s.ok()) return FailRpc(s);
      PrintJob(j);
      return 0;
    });
  });

  CLI::App* list = ct->add_subcommand("list", "List the coordinator's jobs");
  AddConnectFlags(list, conn.get(), true);
  list->callback([=] {
    *exit_code = CallTrain(*conn, [&](api::Train::Stub& stub, grpc::ClientContext& ctx) {
      api::ListJobsResponse jobs;
      grpc::Status s = stub.ListJobs(&ctx, api::ListJobsRequest(), &jobs);
      if (!s.ok()) return FailRpc(s);
      for (const api::Job& j : jobs.jobs()) PrintJob(j);
      return 0;
    });
  });
}

}  // namespace fucina::cli
