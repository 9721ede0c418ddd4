// Rotary position embedding (RoPE), in place, as ggml's GGML_OP_ROPE with ext_factor = 0,
// attn_factor = 1, freq_scale = 1 (no YaRN), forward direction.
//
// For a head vector x[head_dim] at position p, the first n_rot dims are rotated in n_rot / 2
// pairs; pair i (0 <= i < n_rot / 2) is rotated by the angle
//   theta_i = p * freq_base^(-2 i / n_rot) / freq_factors[i]      (freq_factors null => 1)
// as (a, b) -> (a cos - b sin, a sin + b cos), where the pair (a, b) is
//   kNormal: (x[2i], x[2i + 1])          (ggml GGML_ROPE_TYPE_NORMAL, llama/GPT-J layout)
//   kNeox:   (x[i], x[i + n_rot / 2])    (GGML_ROPE_TYPE_NEOX, GPT-NeoX/Qwen/Phi layout)
// Dims [n_rot, head_dim) are left unchanged (partial rotary). freq_factors is Llama 3's
// rope_freqs.weight. Invariants: n_rot even, 0 < n_rot <= head_dim.
//
// Precision: the angles are formed and their cos/sin taken in double, then stored as float, so
// large positions keep full float accuracy (ggml builds theta by repeated float products,
// which drifts by up to ~i ulp; results differ from ggml by that drift, not from the math).
#ifndef FUCINA_KERNELS_ROPE_H_
#define FUCINA_KERNELS_ROPE_H_

#include <cstdint>
#include <vector>

namespace fucina {

enum class RopeMode { kNormal, kNeox };

struct RopeParams {
  int head_dim = 0;
  int n_rot = 0;                        // rotated dims, even, <= head_dim.
  float freq_base = 10000.0f;
  RopeMode mode = RopeMode::kNormal;
  const float* freq_factors = nullptr;  // [n_rot / 2] or null; must outlive Build().
};

// cos/sin of every angle for a list of positions, built once per call (or once per forward
// pass and shared by all layers and by Q and K, which use the same positions). Storage is
// reused across Build() calls.
class RopeTable {
 public:
  // Rows t < n_pos hold position pos[t]. Precondition: params valid (see above).
  void Build(const RopeParams& params, const int64_t* pos, int64_t n_pos);

  const RopeParams& params() const { return params_; }
  int64_t num_positions() const { return n_pos_; }
  // [n_rot / 2] values for table row t.
  const float* Cos(int64_t t) const { return cos_.data() + t * (params_.n_rot / 2); }
  const float* Sin(int64_t t) const { return sin_.data() + t * (params_.n_rot / 2); }

 private:
  RopeParams params_;
  int64_t n_pos_ = 0;
  std::vector<float> cos_;  // [n_pos, n_rot / 2]
  std::vector<float> sin_;  // [n_pos, n_rot / 2]
};

// x: [n_tokens, num_heads, head_dim]; token t uses table row t (n_tokens <= rows in table).
// Every head of a token reuses that token's cos/sin row.
void ApplyRope(const RopeTable& table, float* x, int64_t n_tokens, int num_heads);

// Convenience forms that build a table internally.
// x: [num_heads, head_dim] at one position.
void Rope(float* x, int num_heads, const RopeParams& params, int64_t pos);
// x: [n_tokens, num_heads, head_dim]; token t at position pos[t].
void RopeBatch(float* x, int64_t n_tokens, int num_heads, const RopeParams& params,
               const int64_t* pos);

// Scalar reference for RopeBatch: each angle, cos, sin and rotation computed in double from
// the definition above, rounded to float once.
void RopeBatchRef(float* x, int64_t n_tokens, int num_heads, const RopeParams& params,
                  const int64_t* pos);

}  // namespace fucina

#endif  // FUCINA_KERNELS_ROPE_H_
