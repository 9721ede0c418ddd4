// A decoder-only transformer on CPU, for all layers or a shard. What a layer computes is its
// family's code (models/families/<arch>.cc over the blocks of blocks.h, found by
// general.architecture); this class holds what every family shares: loading a part of a model,
// embeddings, the head, the KV contract of a forward pass, and routed experts.
//
// Weights stay in their GGUF dtype, borrowed from the file's mapping; q/k/v and gate/up are
// fused into one matrix each at load when their dtypes match (one wider matmul instead of
// three). A Model is read-only after load: every forward call takes its own KvCache (one per
// stream) and the thread pool given at load; calls on one Model must not run concurrently
// (they share scratch and the pool).
//
// Shards: a model can be loaded for layers [first, last) with or without the embeddings and
// the head, so a worker holds part of a model; Embed / ForwardLayers / Head are the pieces a
// pipeline stage runs, and ForwardStep composes them when one process holds everything. A MoE
// layer's expert FFN sits behind ExpertFfn so experts can be computed elsewhere.
#ifndef FUCINA_MODELS_ENGINE_MODEL_H_
#define FUCINA_MODELS_ENGINE_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/streamed_memory.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/matmul.h"
#include "models/engine/blocks.h"
#include "models/engine/config.h"
#include "models/engine/family.h"
#include "models/engine/kv_cache.h"
#include "models/gguf/gguf.h"

namespace fucina {

struct LoadOptions {
  int64_t first_layer = 0;
  int64_t last_layer = -1;  // -1: through the last layer.
  bool embeddings = true;   // token_embd (stage 0); also needed by a tied head.
  bool head = true;         // output_norm + output (last stage).
  // Binds only the MoE expert stacks of [first_layer, last_layer) (a worker that computes
  // experts for other stages); such a model has no forward surface but ExpertOutputs.
  bool experts_only = false;
  // Matrices to hold as owned f32 copies instead of borrowing the mapping in their GGUF type:
  // the trainable tensors of full-parameter training, which perturbs and updates them in place
  // (VisitParameters lists their copies as owned). Null: none.
  std::function<bool(std::string_view name)> f32_tensors;
};

// Names of the tensors a Model loaded with `options` reads, from its family's table: the
// layers' tensors in [first_layer, last_layer) (for experts_only only the expert stacks), the
// embedding part with the embeddings (token_embd also for a tied head), the head part with the
// head, and the global tensors (rope_freqs). The bytes of the others are never touched, so a
// worker that fetches its shard over the network fetches only these (worker/model_fetch.h).
// Errors: unknown architecture, bad config.
absl::StatusOr<std::vector<std::string>> ShardTensorNames(const gguf::File& file,
                                                          const LoadOptions& options);

// The tensor table of a file's family and config (names, shapes, parts).
absl::StatusOr<TensorTable> ModelTensorTable(const gguf::File& file);

class Model {
 public:
  // Loads `path` (GGUF; the first part of a split model). The family comes from
  // general.architecture (models/engine/registry.h); unknown ones are an error naming it.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path,
                                                     const LoadOptions& options,
                                                     ThreadPool& pool);
  // The same over an already opened file (the Model takes ownership).
  static absl::StatusOr<std::unique_ptr<Model>> FromFile(std::unique_ptr<gguf::File> file,
                                                         const LoadOptions& options,
                                                         ThreadPool& pool);
  ~Model();

  const ModelConfig& config() const { return config_; }
  const gguf::File& file() const { return *file_; }
  int64_t first_layer() const { return first_; }
  int64_t last_layer() const { return last_; }
  bool has_embeddings() const { return embed_.data != nullptr; }
  bool has_head() const { return head_.data != nullptr; }
  bool experts_only() const { return experts_only_; }
  bool is_full() const { return !experts_only_ && first_ == 0 && last_ == config_.num_layers && has_head() &&
                                has_embeddings(); }

  // Whether the family runs on caches of `type` (gemma4 refuses q8_0).
  absl::Status CheckKvType(GgmlType type) const { return forward_->CheckKvType(type); }
  // A cache for this model's layers. Errors as KvCache::Create, and CheckKvType.
  absl::StatusOr<std::unique_ptr<KvCache>> NewKvCache(int64_t capacity, GgmlType type) const;

  // ---- Whole-model forward surface (requires is_full()). ----
  // Cacheless forward of the whole sequence; the last position's logits [vocab].
  absl::StatusOr<std::vector<float>> ForwardLastLogits(std::span<const int32_t> tokens);
  // Appends tokens at positions pos0.. to `kv`; returns the last position's logits [vocab].
  // Contract: kv.len() == pos0, kv.len() + tokens.size() <= capacity, tokens non-empty.
  absl::StatusOr<std::vector<float>> ForwardStep(KvCache& kv, std::span<const int32_t> tokens,
                                                 int64_t pos0);
  // As ForwardStep, returning logits for every appended position: [tokens.size(), vocab].
  absl::StatusOr<std::vector<float>> ForwardStepAllLogits(KvCache& kv,
                                                          std::span<const int32_t> tokens,
                                                          int64_t pos0);
  // Lockstep decode: one token per stream, stream s at position caches[s]->len(). One weight
  // pass for all streams; returns [n, vocab]. Rows equal per-stream ForwardStep bit for bit.
  absl::StatusOr<std::vector<float>> ForwardStepBatch(std::span<KvCache* const> caches,
                                                      std::span<const int32_t> tokens);
  // The same into `logits` (resized to [n, vocab]): a decode loop passing the same vector
  // every step allocates and faults in those pages once, not per step.
  absl::Status ForwardStepBatch(std::span<KvCache* const> caches,
                                std::span<const int32_t> tokens, std::vector<float>& logits);

  // ---- Shard pieces. ----
  // Rows of the embedding table: out[n, hidden]. Requires has_embeddings(); ids must be in
  // [0, vocab) (error names the first bad one).
  absl::Status Embed(std::span<const int32_t> tokens, float* out) const;
  // A batch of rows through this model's layers, in place on x[rows, hidden]. Row r belongs to
  // segment s with begin <= r < begin + count, at position kv->len() + (r - begin); each
  // segment's cache advances by its count. Segments must not share a cache.
  // Families with per-layer embeddings need each segment's tokens (the model must then hold
  // every layer and the embeddings).
  using Segment = KvSegment;
  absl::Status ForwardLayers(float* x, int64_t rows, std::span<const Segment> segments);
  // Final norm + output projection of x[rows, hidden] -> logits[rows, vocab].
  absl::Status Head(const float* x, int64_t rows, float* logits);
  // Wall seconds this model has spent in attention over its caches (K/V stores included),
  // across every pass so far.
  double attention_seconds() const { return scratch_->attention_seconds; }

  // Expert FFN used by MoE layers (default: local experts from this model's file). The
  // model does not own `experts`.
  void SetExpertFfn(ExpertFfn* experts) { experts_ = experts; }
  // The local experts of an absolute MoE layer (for serving them to other processes).
  const ExpertStacks* LocalExperts(int64_t layer) const;
  // Every tensor this model bound, by table name, with where its values live (the mapping
  // and/or rows of fused copies), then every LoRA adapter's A and B ("<tensor>.lora_a",
  // "<tensor>.lora_b", owned f32): what training perturbs and updates.
  void VisitParameters(const ParameterVisitor& visit) const;

  // Adds rank-`rank` LoRA adapters (lora.h) on `targets` of every layer this model holds, with
  // scale alpha / rank: A ~ N(0, 1 / in) drawn from `seed`, B = 0, so the output is unchanged
  // until B moves. Layers without a target's projection (K/V of layers reading shared K/V, a
  // dense FFN in a MoE-only layer) get none. Error: rank < 1, or adapters already present.
  absl::Status AddLora(std::span<const LoraTarget> targets, int64_t rank, float alpha,
                       uint64_t seed);
  // Reads an adapter GGUF (ReadLoraFile in lora.h: general.type "adapter", adapter.type
  // "lora", f32 "blk.<L>.<target>.weight.lora_a" [in, rank] / ".lora_b" [rank, out] pairs, as
  // `fucina train es --mode lora` and llama.cpp write them) onto this model's layers. A shard
  // keeps the adapters of its own layers only (possibly none); those of other layers are
  // still checked against the file's tensors, so every stage refuses a wrong file alike.
  // Errors name the file and the tensor or key: another architecture, a tensor the model
  // lacks, a shape that does not fit, a tensor without its pair; FAILED_PRECONDITION: adapters already present, an experts-only shard.
  absl::Status LoadLora(const std::string& path);
  // Writes this model's adapters in that format (alpha = scale * rank, one per file).
  absl::Status SaveLora(const std::string& path) const;
  const LoraSet& lora() const { return lora_; }
  LoraSet& mutable_lora() { return lora_; }
  ExpertFfn& LocalExpertFfn();
  // Unweighted outputs of local experts: out[p, hidden] = FFN_{experts[p]}(x[rows[p]]) of the
  // absolute MoE `layer`. Errors: no local experts for the layer, ids out of range.
  absl::Status ExpertOutputs(int64_t layer, const float* x, std::span<const int32_t> rows,
                             std::span<const int32_t> experts, float* out);

 private:
  class LocalExpertsFfn;

  Model();
  absl::Status Bind(const LoadOptions& options);
  absl::Status ForwardPass(float* x, int64_t rows, std::span<const Segment> segments);
  absl::StatusOr<std::vector<float>> RunFull(std::span<KvCache* const> caches,
                                             std::span<const int32_t> tokens,
                                             std::span<const int64_t> counts, bool all_logits);
  absl::Status RunFull(std::span<KvCache* const> caches, std::span<const int32_t> tokens,
                       std::span<const int64_t> counts, bool all_logits,
                       std::vector<float>& logits);
  absl::StatusOr<std::vector<float>> RunOne(KvCache& kv, std::span<const int32_t> tokens,
                                            int64_t pos0, bool all_logits);

  std::unique_ptr<gguf::File> file_;
  ModelConfig config_;
  const ModelFamily* family_ = nullptr;
  TensorTable table_;
  std::unique_ptr<FamilyModel> forward_;
  ThreadPool* pool_ = nullptr;
  int64_t first_ = 0, last_ = 0;
  bool experts_only_ = false;
  WeightView embed_;                 // [vocab, hidden]
  WeightView head_;                  // [vocab, hidden] (token_embd when tied)
  const float* output_norm_ = nullptr;
  StreamedArena owned_;  // fused, repacked and trainable matrices
  std::vector<Parameter> parameters_;
  std::unique_ptr<LocalExpertsFfn> local_experts_;
  ExpertFfn* experts_ = nullptr;
  LoraSet lora_;
  std::unique_ptr<ForwardScratch> scratch_;
};

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_MODEL_H_
