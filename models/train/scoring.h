// What scoring a member asks of a model: passes of packed rows over streams that each keep
// their own KV cache, and the head's verdict (argmax, log-probability of a target) on some of
// those rows. Rewards (tasks.h) are written against this interface only, so a member scores
// the same way on a whole local model (LocalScoring) and through a pipeline of stage replicas
// on several workers (worker/es_replica.h), each stage running its layers with a StageScorer.
//
// Bits: a pass's shapes depend on the segments alone, the activations between stages are f32,
// and every kernel computes a row the same way whichever rows share its pass, so a pipeline
// gives the verdicts of the whole model bit for bit.
#ifndef FUCINA_MODELS_TRAIN_SCORING_H_
#define FUCINA_MODELS_TRAIN_SCORING_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "models/engine/model.h"

namespace fucina::train {

// Bounds a stage checks on a pass it is sent (a hostile caller must not size its memory):
// streams at once, positions of one stream, positions of all streams, rows of one pass.
inline constexpr int64_t kMaxScoringStreams = 1024;
inline constexpr int64_t kMaxStreamPositions = 40'000;
inline constexpr int64_t kMaxScoringPositions = 1 << 17;
inline constexpr int64_t kMaxPassRows = 4096;

// Rows of one scoring pass for `config`: about 8e9 multiply-adds of the layers (the dense and
// active expert matrices), 32 to 512 rows in steps of 16 (SmolLM2-135M: 64). Passes bound the
// activations and the time a pass holds a worker's executor (a forward step it serves waits
// for at most one pass: ~0.1 s on one core for a 135M model). A function of the model alone,
// so every replica and every stage cuts the same passes.
int64_t ScoringPassRows(const ModelConfig& config);

class ScoringForward {
 public:
  struct Segment {
    int32_t stream;                   // the stream whose cache these rows continue
    std::span<const int32_t> tokens;  // non-empty
  };
  struct Row {
    int64_t row;     // in the pass: the segments' tokens concatenated in order
    int32_t target;  // the token whose log-probability is wanted; -1: none
  };
  struct Verdict {
    int32_t argmax = 0;  // the first maximal logit (ties to the lowest id)
    double logprob = 0;  // log softmax(logits)[target], in double; 0 without a target
  };

  virtual ~ScoringForward() = default;
  virtual int64_t vocab_size() const = 0;
  // The most rows a caller puts in one pass (ScoringPassRows of the whole model).
  virtual int64_t pass_rows() const = 0;
  // Drops every stream and starts capacities.size() new ones, stream i with room for
  // capacities[i] positions.
  virtual absl::Status ResetStreams(std::span<const int64_t> capacities) = 0;
  // Feeds the segments (at most one per stream, each continuing its stream's cache) and
  // returns one verdict per entry of `rows`, in order.
  virtual absl::StatusOr<std::vector<Verdict>> Pass(std::span<const Segment> segments,
                                                    std::span<const Row> rows) = 0;
};

// One model's part of scoring passes: the whole model, or a pipeline stage's shard. It holds
// the streams' caches of its layers. Checks everything it is given (the bounds above, stream
// indexes, rows, targets, sizes): INVALID_ARGUMENT naming what is wrong, nothing changed.
class StageScorer {
 public:
  explicit StageScorer(Model& model) : model_(model) {}

  const ModelConfig& config() const { return model_.config(); }
  absl::Status ResetStreams(std::span<const int64_t> capacities);
  // Rows of the segments through this model's layers, in place on x[rows, hidden]. With the
  // embeddings, x is first filled from the segments' tokens (its input is ignored, and it is
  // resized); without them it must hold rows * hidden floats from the stage before.
  absl::Status Layers(std::span<const ScoringForward::Segment> segments, std::vector<float>& x);
  // The head's verdicts on rows of x[rows, hidden] (requires the head).
  absl::StatusOr<std::vector<ScoringForward::Verdict>> Verdicts(
      const float* x, int64_t rows, std::span<const ScoringForward::Row> wanted);

 private:
  Model& model_;
  std::vector<std::unique_ptr<KvCache>> streams_;
  std::vector<float> h_, logits_;  // scratch of Verdicts
};

// ScoringForward over a whole local model (Model::is_full()).
class LocalScoring : public ScoringForward {
 public:
  explicit LocalScoring(Model& model) : stage_(model) {}

  int64_t vocab_size() const override;
  int64_t pass_rows() const override { return ScoringPassRows(stage_.config()); }
  absl::Status ResetStreams(std::span<const int64_t> capacities) override {
    return stage_.ResetStreams(capacities);
  }
  absl::StatusOr<std::vector<Verdict>> Pass(std::span<const Segment> segments,
                                            std::span<const Row> rows) override;

 private:
  StageScorer stage_;
  std::vector<float> x_;
};

}  // namespace fucina::train

#endif  // FUCINA_MODELS_TRAIN_SCORING_H_
