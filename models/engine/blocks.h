// The shared blocks families compose their layers from: GQA attention with its options
// (q/k norms, an unweighted v norm, sliding windows, shared K/V), gated feed-forward (SwiGLU,
// GeGLU), top-k routing and routed experts — plus the ForwardContext one forward pass runs in,
// and the table/bind helpers for the tensors these blocks read.
//
// Shapes: x, h and out are [rows, hidden] f32, rows in segment order (ForwardContext).
#ifndef FUCINA_MODELS_ENGINE_BLOCKS_H_
#define FUCINA_MODELS_ENGINE_BLOCKS_H_

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/rope.h"
#include "models/engine/config.h"
#include "models/engine/family.h"
#include "models/engine/kv_cache.h"
#include "models/engine/lora.h"

namespace fucina {

// Computes a MoE layer's routed expert mixture for n tokens.
class ExpertFfn {
 public:
  virtual ~ExpertFfn() = default;
  // x: [n, hidden]; experts/weights: [n, k] (expert ids and their router weights, in routing
  // order). out: [n, hidden] = sum_j weights[i, j] * FFN_{experts[i, j]}(x[i]), summed over j
  // in order. `layer` is the absolute layer index.
  virtual absl::Status Forward(int64_t layer, const float* x, int64_t n, const int32_t* experts,
                               const float* weights, int k, float* out) = 0;
};

// Rows [begin, begin + count) of a forward pass belong to one stream whose cache is `kv`; the
// first row is at position kv->len(). `tokens` (count ids) is needed by families with
// per-layer embeddings only.
struct KvSegment {
  KvCache* kv;
  int64_t begin;
  int64_t count;
  std::span<const int32_t> tokens = {};
};

// Scratch buffers one model reuses across passes (decode runs every token).
struct ForwardScratch {
  std::vector<float> h, h2, qkv, q, k, v, attn, out, out2, gate_up, act, router, expert_w;
  std::vector<float> expert_x, expert_gate, expert_up, expert_y, ple, lora_t, lora_y;
  std::vector<int32_t> expert_ids;
  std::vector<int64_t> positions;
  // One RoPE table per distinct RoPE of the model, kept across passes so decode rebuilds them
  // in place instead of allocating; `built` is the pass a table holds positions for.
  struct Rope {
    uint64_t built = 0;
    RopeTable table;
  };
  std::map<std::tuple<int, int, float, int, const float*>, Rope> ropes;
  uint64_t pass = 0;
  // Wall seconds spent storing K/V rows and attending over the caches, summed over every pass
  // (a server's per-step breakdown splits attention from the layers' other kernels with it).
  double attention_seconds = 0;

  static float* Grow(std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    return v.data();
  }
};

// One forward pass over a model's layers [first, last): the activations, the streams, the
// positions' RoPE tables, the expert FFN and the scratch.
class ForwardContext {
 public:
  ForwardContext(const ModelConfig& config, ThreadPool& pool, ForwardScratch& scratch,
                 ExpertFfn* experts, int64_t first_layer, float* x, int64_t rows,
                 std::span<const KvSegment> segments, const LoraSet* lora = nullptr);

  const ModelConfig& config() const { return config_; }
  ThreadPool& pool() { return pool_; }
  ForwardScratch& scratch() { return scratch_; }
  ExpertFfn& experts() { return *experts_; }
  const LoraSet* lora() const { return lora_; }
  float* x() { return x_; }
  int64_t rows() const { return rows_; }
  std::span<const KvSegment> segments() const { return segments_; }
  // The cache layer of absolute layer `layer`.
  int64_t CacheLayer(int64_t layer) const { return layer - first_; }
  // The RoPE table of this pass's positions for `params` (built once per pass and params).
  const RopeTable& Rope(const RopeParams& params);

 private:
  const ModelConfig& config_;
  ThreadPool& pool_;
  ForwardScratch& scratch_;
  ExpertFfn* experts_;
  int64_t first_;
  float* x_;
  int64_t rows_;
  std::span<const KvSegment> segments_;
  const LoraSet* lora_;
};

// y[r * y_stride + j] += scale * (B (A x[r]))[j] for the adapter of (layer, target), if any;
// x is [rows, in] contiguous.
void ApplyLora(ForwardContext& ctx, int64_t layer, LoraTarget target, const float* x, float* y,
               int64_t y_stride);

// ---- Attention ----
struct AttentionWeights {
  WeightView wqkv;                 // [q_dim + 2 kv_dim, hidden] fused, or q only
  WeightView wk, wv;               // when not fused; wv empty: V is the K projection (gemma4)
  WeightView wo;                   // [hidden, q_dim]
  const float* q_norm = nullptr;   // [head_dim] per-head RMSNorm weights of q (qwen3, gemma4)
  const float* k_norm = nullptr;
};
struct AttentionOptions {
  float scale = 0.0f;              // query scale (1 / sqrt(head_dim) usually; 1 for gemma4)
  bool v_norm = false;             // unweighted per-head RMSNorm of v (gemma4)
  RopeMode rope_mode = RopeMode::kNeox;
  const float* rope_freqs = nullptr;  // [rope_dims / 2] frequency divisors, or null
  float eps = 1e-6f;
};
// out = o_proj(attention(h)) of absolute layer `layer` (its LayerSpec: heads, window, shared
// K/V), with the layer's LoRA adapters on q, k, v and o. Stores the layer's K/V in each
// segment's cache unless it reads another layer's.
void Attention(ForwardContext& ctx, int64_t layer, const AttentionWeights& w,
               const AttentionOptions& o, const float* h, float* out);

// ---- Feed-forward ----
struct FfnWeights {
  WeightView gate_up;  // [2 ffn, hidden] fused, or the gate only
  WeightView up;       // set when gate/up are not fused
  WeightView down;     // [hidden, ffn]
};
// out = down(act(gate(h)) * up(h)) of absolute layer `layer`, widths from `ffn`, with the
// layer's LoRA adapters on gate, up and down.
void GatedFfn(ForwardContext& ctx, int64_t layer, const FfnWeights& w, int64_t ffn,
              Activation act, const float* h, float* out);

// Softmax over `experts` router logits per row, then the top k (ties: lower id first), their
// probabilities renormalised to sum 1 when `renormalize`.
void RouteTopK(float* logits, int64_t rows, int64_t experts, int k, bool renormalize,
               int32_t* ids, float* weights);

// Unweighted outputs of experts: out[p] = FFN_{experts[p]}(x[rows[p]]) for each pair p, one
// matmul per expert over all its rows. Errors: ids out of range.
absl::Status ExpertOutputs(const ExpertStacks& stacks, Activation act, int64_t num_experts,
                           int64_t hidden, int64_t expert_ffn, const float* x,
                           std::span<const int32_t> rows, std::span<const int32_t> experts,
                           float* out, ForwardScratch& scratch, ThreadPool& pool);

// out[i] = sum_j weights[i, j] * slots[i, j] for i < n, j < k, summed in slot order (j
// ascending) so local and remote experts give the same bits. slots: [n, k, hidden].
void WeightedExpertSum(const float* slots, const float* weights, int64_t n, int k,
                       int64_t hidden, float* out);

// x += y over n values.
void AddInPlace(float* x, const float* y, int64_t n);

// ---- Table and bind helpers for the tensors above (GGUF names of llama.cpp). ----
// token_embd (+ output_norm, output optional when tied).
void AddEmbeddingAndHead(TensorTable& table, const ModelConfig& c);
// blk.L.attn_{q,k,v,output}[, attn_{q,k}_norm]; K/V only when the layer stores its own, V only
// when `with_v`.
void AddAttentionTensors(TensorTable& table, const ModelConfig& c, int64_t layer, bool qk_norm,
                         bool with_v = true);
// blk.L.ffn_{gate,up,down}.
void AddFfnTensors(TensorTable& table, const ModelConfig& c, int64_t layer, int64_t ffn);
// blk.L.ffn_gate_inp (router, f32) and the expert stacks ffn_{gate,up,down}_exps.
void AddExpertTensors(TensorTable& table, const ModelConfig& c, int64_t layer);
// A table norm/scale vector.
void AddVector(TensorTable& table, std::string name, int64_t n, TensorPart part, int64_t layer,
               bool optional = false);

absl::StatusOr<AttentionWeights> BindAttention(TensorBinder& b, const ModelConfig& c,
                                               int64_t layer, bool qk_norm);
absl::StatusOr<FfnWeights> BindFfn(TensorBinder& b, int64_t layer);
absl::StatusOr<ExpertStacks> BindExperts(TensorBinder& b, int64_t layer);

// "blk.<layer>.<suffix>"
std::string LayerTensor(int64_t layer, std::string_view suffix);

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_BLOCKS_H_
