// Elementwise activations of transformer feed-forward blocks. All arrays f32, length n;
// y may alias x. "Ref" functions are the scalar references (the formulas of ggml's ggml_silu_f32,
// ggml_gelu_f32 and its erf variant; SiLU in float as ggml, the GELUs in double so the reference
// does not lose digits where 1 + tanh cancels); the others dispatch by ActiveIsa().
#ifndef FUCINA_KERNELS_ACTIVATIONS_H_
#define FUCINA_KERNELS_ACTIVATIONS_H_

#include <cstdint>

namespace fucina {

// y = x * sigmoid(x) = x / (1 + exp(-x)). SIMD: polynomial exp, within ~4e-7 relative of Ref.
void Silu(const float* x, float* y, int64_t n);
void SiluRef(const float* x, float* y, int64_t n);

// GELU, tanh approximation (ggml_gelu): 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))).
// The SIMD paths use the identity 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)); within 1e-6
// relative + 1e-11 absolute of Ref (for large negative x, exp(-2u) turns the rounding of u
// into a relative error of ~|2u| ulp on a result that is already below ~1e-6).
void GeluTanh(const float* x, float* y, int64_t n);
void GeluTanhRef(const float* x, float* y, int64_t n);

// GELU, exact erf form: 0.5 x (1 + erf(x / sqrt(2))). Scalar only (std::erf); rarely hot.
void GeluErf(const float* x, float* y, int64_t n);
void GeluErfRef(const float* x, float* y, int64_t n);

// Logit soft-capping in place (Gemma): x = cap * tanh(x / cap), as three rounded float steps
// (ggml_scale, ggml_tanh, ggml_scale). Over a whole vocabulary per token, so the SIMD path
// matters: tanh(t) = (1 - e) / (1 + e), e = exp(-2|t|), sign restored, except below |t| = 1/4
// (where 1 - e cancels) its odd Taylor polynomial to t^11; within 1e-6 relative + 1e-30
// absolute of Ref (whose std::tanh is within an ulp).
void SoftCap(float* x, int64_t n, float cap);
void SoftCapRef(float* x, int64_t n, float cap);

// SwiGLU with separate arrays: out[i] = silu(gate[i]) * up[i]. out may alias gate or up.
void SwiGlu(const float* gate, const float* up, float* out, int64_t n);
void SwiGluRef(const float* gate, const float* up, float* out, int64_t n);

// SwiGLU over rows of a fused gate/up projection: gate_up [rows, 2 * ff] holds the gate in the
// first ff columns and up in the last ff (ggml_swiglu's unswapped split, as used for fused
// ffn_up tensors); out [rows, ff]. out may equal gate_up: rows are processed in order and
// out row r only overwrites gate_up elements that rows <= r have already read.
void SwiGluFused(const float* gate_up, float* out, int64_t rows, int64_t ff);
void SwiGluFusedRef(const float* gate_up, float* out, int64_t rows, int64_t ff);

// GeGLU as llama.cpp's CPU backend computes it (ggml_vec_geglu_f32 under GGML_GELU_FP16):
// out[i] = g(gate[i]) * up[i] with g(x) = 0 for x <= -10, x for x >= 10, and otherwise the
// tanh-form GELU of x rounded to f16, evaluated in float by ggml_gelu_f32's formula and rounded
// to f16 again. Gemma's feed-forward blocks use it; matching the reference's rounding keeps
// parity tests tight (the f16 steps are ~5e-4 relative, larger than any other difference).
// The dispatched form reads a 64K-entry table built once; Ref evaluates the formula.
void GeGlu(const float* gate, const float* up, float* out, int64_t n);
void GeGluRef(const float* gate, const float* up, float* out, int64_t n);
// Fused rows as SwiGluFused: gate_up [rows, 2 * ff] -> out [rows, ff]; out may equal gate_up.
void GeGluFused(const float* gate_up, float* out, int64_t rows, int64_t ff);

}  // namespace fucina

#endif  // FUCINA_KERNELS_ACTIVATIONS_H_
