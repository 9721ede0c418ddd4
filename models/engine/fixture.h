// Random-weight model files for tests and benchmarks (`fucina gguf make-fixture`). The tensors
// and their order come from the family's table (family.h); the family writes its metadata.
//
// Initialisation (documented so other implementations can reproduce a fixture exactly):
//  - RNG: SplitMix64. Tensor i (in file order, 0-based) draws from the stream seeded with
//    seed ^ (0x9E3779B97F4A7C15 * (i + 1)); normals by Box-Muller in double from two uniforms
//    u = (next() >> 11) * 2^-53 (u1 replaced by 1 - u1 to avoid log 0), one normal per pair.
//  - Matrices ~ N(0, init_std) (default 0.02); norm weights (attn_norm, ffn_norm, q/k norm,
//    output_norm, gemma's post norms) = 1; the MoE router ~ N(0, init_std), gemma4's ~ N(0, 1)
//    (its input is scaled down by sqrt(hidden)); per-layer output scales ~ 1 + N(0, 0.2);
//    rope_freqs (llama when requested, gemma4 always) = 1 + i / n for i in [0, n).
//  - peaked: token_embd ~ N(0, 1) and output ~ N(0, 1), and the router ~ N(0, 1), so the
//    residual stream is dominated by the token embedding and next-token distributions (and
//    expert choices) have clear winners; greedy and top-1 tests need that.
//  - Weights are generated in f32 and converted to `type` with the same rules as
//    `fucina gguf quantize` (norms, router and rope_freqs stay f32).
#ifndef FUCINA_MODELS_ENGINE_FIXTURE_H_
#define FUCINA_MODELS_ENGINE_FIXTURE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/cpu/thread_pool.h"

namespace fucina {

struct FixtureOptions {
  std::string arch = "qwen3";   // qwen3 | qwen3moe | llama | gemma4
  std::string name;             // general.name; default "<arch>-fixture".
  int64_t num_layers = 2;
  int64_t hidden = 64;
  int64_t ffn = 128;            // dense feed-forward width
  int64_t num_heads = 4;
  int64_t num_heads_kv = 2;
  int64_t head_dim = 16;        // qwen3 writes attention.key_length; llama uses hidden/heads.
  int64_t vocab = 256;          // ignored (taken from the tokenizer) when tokenizer_dir is set.
  int64_t num_experts = 4;      // qwen3moe only
  int64_t num_experts_used = 2;
  int64_t expert_ffn = 64;
  int64_t context_length = 4096;
  float rope_base = 1000000.0f;
  float rms_eps = 1e-6f;
  bool tied = true;             // no output.weight: the head reuses token_embd.
  bool peaked = false;
  bool rope_freqs = false;      // llama: write rope_freqs.weight.
  double init_std = 0.02;
  uint64_t seed = 0;
  std::string type = "f32";     // a `gguf quantize` target name.
  std::string tokenizer_dir;    // HF tokenizer.json (+ tokenizer_config.json); empty = bytes.
  std::string pre = "qwen2";    // tokenizer.ggml.pre, or "gemma4" (see ImportHfTokenizer).

  // gemma4: layer i is a sliding-window layer unless (i + 1) % global_every == 0 (0: all
  // sliding); global layers have head_dim_global and kv_heads_global (0: as sliding);
  // the last shared_kv_layers layers read the K/V of the last earlier layer of their kind;
  // per_layer_input > 0 adds per-layer embeddings of that width; moe adds routed experts
  // (num_experts, num_experts_used, expert_ffn) beside the dense FFN in every layer.
  int64_t sliding_window = 16;
  int64_t global_every = 3;
  int64_t head_dim_global = 32;
  int64_t kv_heads_global = 0;
  int64_t shared_kv_layers = 0;
  int64_t per_layer_input = 0;
  float rope_base_swa = 10000.0f;
  float final_logit_softcap = 30.0f;
  bool moe = false;
};

// Writes the fixture to `path`. Errors name the offending option.
absl::Status MakeFixture(const FixtureOptions& options, const std::string& path,
                         ThreadPool& pool);

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_FIXTURE_H_
