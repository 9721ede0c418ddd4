// Evolution strategies over a model's trainable tensors (full-parameter mode), the update
// rule every worker of a distributed job applies identically.
//
// Population: `population` members in antithetic pairs; member m perturbs the parameters by
// s * sigma * eps_p with p = m / 2 and s = +1 for even m, -1 for odd m, where eps_p is the
// noise of NoiseKey{seed, generation, p, ParameterId(tensor name)} (noise.h): keyed by name, so
// a tensor gets the same noise in a whole model and in any shard holding it; regenerated wherever it is
// needed, never stored or sent. Fitness is shaped by centered ranks scaled to unit variance
// (ShapeFitness: robust to outliers, on the scale of the z-scores of Qiu et al. 2025, whose
// sigma 1e-3 / lr 5e-4 are the defaults), and, as in that paper (1/sigma folded into lr),
//   theta += lr / population * sum_p (w_{2p} - w_{2p+1}) eps_p
//            - lr * weight_decay * (theta - theta_base)
// accumulated in f32 over pairs in ascending order, so two processes given the same fitness
// values end with bit-identical parameters (Checksum).
//
// The trainable tensors are the ones the model was loaded with as owned f32 copies
// (LoadOptions::f32_tensors); every copy of each (its own and rows of fused q/k/v or gate/up)
// is written. A trainer is used by one thread at a time, like its model.
#ifndef FUCINA_MODELS_TRAIN_ES_H_
#define FUCINA_MODELS_TRAIN_ES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/thread_pool.h"
#include "models/engine/model.h"

namespace fucina::train {

struct EsOptions {
  int population = 16;        // even, >= 2
  float sigma = 1e-3f;        // noise scale
  float lr = 5e-4f;           // step size
  float weight_decay = 0.0f;  // anchored: pulls the parameters toward the base model's
  uint64_t seed = 0;          // the job's noise seed
  // Schedules: generation g uses sigma * sigma_decay^g and lr * lr_decay^g (in (0, 1]; 1:
  // constant), the power taken by repeated f32 multiplication so every replica agrees.
  float sigma_decay = 1.0f;
  float lr_decay = 1.0f;

  // Errors name the field.
  absl::Status Validate() const;
  // The scheduled values of `generation`.
  float SigmaAt(int64_t generation) const;
  float LrAt(int64_t generation) const;
};

// "member 3 of generation 2 has a non-finite fitness (nan): ..." (kCenter: "the center"), the
// message every scorer and the driver give for a fitness that is NaN or infinite.
std::string NonFiniteFitness(int member, int64_t generation, float fitness);

// A member's fitness (higher is better) given the model holding its perturbed parameters.
using FitnessFn = std::function<absl::StatusOr<float>(Model& model)>;

// The noise key's parameter of a tensor: FNV-1a 64 of its name (a LoRA factor's name is
// "<tensor>.lora_a" / ".lora_b").
uint64_t ParameterId(std::string_view name);

class EsTrainer {
 public:
  // Trains the owned f32 tensors of `model` (at least one, unless `allow_none`: a pipeline
  // stage may hold none of a job's tensors). `model` and `pool` must outlive it.
  static absl::StatusOr<std::unique_ptr<EsTrainer>> Create(Model& model, const EsOptions& options,
                                                           ThreadPool& pool,
                                                           bool allow_none = false);

  static constexpr int kCenter = -1;

  const EsOptions& options() const { return options_; }
  // Trainable values and tensors, in VisitParameters order (the reported ones only: below).
  int64_t num_values() const;
  std::vector<std::string> tensor_names() const;
  // Leaves the tensors `reported` rejects out of num_values, tensor_names, Checksum and
  // SaveTensors, though they are still perturbed and updated: a pipeline's last stage holds
  // the token embeddings as its tied head, and the first stage reports them.
  void SetReported(const std::function<bool(std::string_view name)>& reported);

  // Member `member` of `generation`: the model holds theta + s * sigma * eps while `fitness`
  // runs, and theta again afterwards (also when it fails). Member kCenter scores theta itself.
  absl::StatusOr<float> Evaluate(int64_t generation, int member, const FitnessFn& fitness);
  // Leaves the model holding member `member` of `generation` (kCenter: theta) until the next
  // Select, Evaluate or ApplyUpdate: what a pipeline stage does, as one member's evaluation
  // spans many calls there. Writes nothing when that member is selected already.
  absl::Status Select(int64_t generation, int member);
  // Select one trainable tensor at a time, for a caller that must not hold its thread for all
  // of them (a worker's executor, between the forward steps it serves): true once the model
  // holds the member. The same bits as Select; a call for another member starts over.
  absl::StatusOr<bool> SelectStep(int64_t generation, int member);
  // Centered ranks r / (n - 1) - 1/2 divided by their standard deviation, so they sum to 0 and
  // have unit variance (ties: the lower member index ranks lower).
  static std::vector<float> ShapeFitness(std::span<const float> fitness);
  // The update of `generation` from its shaped fitness (population values), written into the
  // model. Error if the count is wrong.
  absl::Status ApplyUpdate(int64_t generation, std::span<const float> shaped);
  // ApplyUpdate one trainable tensor at a time: BeginUpdate checks and keeps `shaped`, each
  // UpdateStep updates the next tensor (true when all are done). The same bits as ApplyUpdate;
  // nothing else may run on the trainer until the last step.
  absl::Status BeginUpdate(int64_t generation, std::span<const float> shaped);
  bool UpdateStep();
  // Every member of a generation, then the update; returns the raw fitness values.
  absl::StatusOr<std::vector<float>> Step(int64_t generation, const FitnessFn& fitness);

  // The sum (mod 2^64) over trainable tensors of FNV-1a over the tensor's name and its values'
  // bits: replicas agree iff this does (up to hash collisions), and the checksums of shards
  // holding disjoint tensors add up to the whole model's.
  uint64_t Checksum() const;
  // The current values of trainable tensor `i` (VisitParameters order), row-major f32.
  std::span<const float> values(size_t i) const { return params_[i].theta; }
  // Writes the trained tensors as a GGUF holding just them (f32, their names and dims in the
  // model's file; general.type "tensors"): what `fucina gguf export` merges into the base.
  absl::Status SaveTensors(const std::string& path) const;

 private:
  struct Param {
    std::string name;
    uint64_t id = 0;  // ParameterId(name): the noise key's parameter
    std::vector<float> theta, base;  // base: only with weight decay
    std::vector<float*> copies;      // the model's owned f32 locations, [rows * cols] each
    bool reported = true;            // SetReported
  };
  EsTrainer(Model& model, const EsOptions& options, ThreadPool& pool)
      : model_(model), options_(options), pool_(pool) {}
  // noise_ = eps of (generation, pair) for parameter `param` (an index into params_).
  void FillNoise(int64_t generation, int64_t pair, size_t param);
  // Writes theta (+ s * sigma * eps_pair when sign != 0) into every copy of parameter `i`.
  void WriteParam(size_t i, int64_t generation, int64_t pair, float sign);
  // Adds generation's update to parameter `i`'s theta and writes it into its copies.
  void UpdateParam(size_t i, int64_t generation, std::span<const float> shaped);
  // The model's copies hold a mix (a sliced Select or update under way).
  static constexpr int kMixed = -2;

  Model& model_;
  EsOptions options_;
  ThreadPool& pool_;
  std::vector<Param> params_;
  std::vector<float> noise_;  // scratch for one tensor's noise
  std::vector<float> update_delta_;  // scratch for one tensor's update
  // The member the model's copies hold (kCenter: theta; kMixed: see above).
  int64_t selected_generation_ = 0;
  int selected_member_ = kCenter;
  // A sliced Select under way: its target and the next parameter to write.
  int64_t stepping_generation_ = 0;
  int stepping_member_ = kMixed;
  size_t select_next_ = 0;
  // A sliced update under way: its generation, shaped fitness and next parameter.
  int64_t update_generation_ = 0;
  std::vector<float> update_shaped_;
  size_t update_next_ = 0;
};

}  // namespace fucina::train

#endif  // FUCINA_MODELS_TRAIN_ES_H_
