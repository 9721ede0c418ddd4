// Gemma 4 (general.architecture "gemma4"), dense and MoE, as llama.cpp runs it:
//  - embeddings scaled by sqrt(hidden); per-layer geometry: sliding-window layers
//    (attention.sliding_window_pattern) with key_length_swa heads and rope.freq_base_swa,
//    global layers with key_length heads, rope.freq_base and the rope_freqs.weight divisors;
//    attention.head_count_kv per layer; the last attention.shared_kv_layers layers store no K/V
//    and read the last writer of their kind (layer n_kv - 2 for sliding, n_kv - 1 for global,
//    n_kv = block_count - shared_kv_layers);
//  - attention: per-head RMSNorm of q and k (weighted) and of v (unweighted), NeoX RoPE, query
//    scale 1; V is the K projection when attn_v is absent; post-attention norm;
//  - FFN: GeGLU (ggml's f16-table GELU), pre and post norms; MoE layers add routed GeGLU experts
//    beside the dense MLP (router on rms_norm(x) / sqrt(hidden) * ffn_gate_inp.scale, softmax,
//    top-k renormalised), each branch with its own norms, their sum post-normed;
//  - per-layer embeddings (PLE, embedding_length_per_layer_input > 0): per layer, a GELU gate of
//    the residual times the layer's slice of (norm(proj(x0) / sqrt(hidden)) +
//    per_layer_token_embd[token] * sqrt(ple)) / sqrt(2), projected back, normed and added;
//  - an optional per-layer output scale, and final logits softcapped:
//    cap * tanh(logits / cap) with cap = final_logit_softcapping.
// PLE models run in one stage (their per-layer inputs come from the token embeddings); every
// other feature shards, batches and serves like the other families.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/activations.h"
#include "kernels/norm.h"
#include "kernels/type_traits.h"
#include "models/families/common.h"

namespace fucina {
namespace {

constexpr char kArch[] = "gemma4";

// attention.sliding_window_pattern: one bool (or integer) per layer, or one for all.
absl::StatusOr<std::vector<bool>> SlidingPattern(const gguf::Meta& meta, int64_t n) {
  const std::string key = meta.Key("attention.sliding_window_pattern");
  const gguf::Value* v = meta.file().Find(key);
  if (v == nullptr) return std::vector<bool>(n, false);
  if (const gguf::Array* arr = v->AsArray()) {
    if (static_cast<int64_t>(arr->items.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(key, " has ", arr->items.size(),
                                                     " entries for ", n, " layers"));
    }
    std::vector<bool> out;
    for (const gguf::Value& item : arr->items) {
      if (auto b = item.AsBool()) {
        out.push_back(*b);
      } else if (auto u = item.AsUint()) {
        out.push_back(*u != 0);
      } else {
        return absl::InvalidArgumentError(absl::StrCat(key, " must hold booleans"));
      }
    }
    return out;
  }
  auto b = meta.Bool("attention.sliding_window_pattern");
  if (!b.ok()) return b.status();
  return std::vector<bool>(n, *b);
}

absl::StatusOr<ModelConfig> ReadGemma4Config(const gguf::File& file) {
  auto meta_or = gguf::Meta::ForFile(file, gguf::ZeroPolicy::kAcceptZero);
  if (!meta_or.ok()) return meta_or.status();
  const gguf::Meta& meta = *meta_or;
  ModelConfig c;
  c.arch = meta.arch();
  if (auto name = meta.StringOpt("general.name"); name.ok() && name->has_value()) c.name = **name;
#define FUCINA_READ(lhs, expr)             \
  {                                        \
    auto read = (expr);                    \
    if (!read.ok()) return read.status();  \
    lhs = *read;                           \
  }
  uint64_t u = 0;
  FUCINA_READ(u, meta.Int("embedding_length"));
  c.hidden = static_cast<int64_t>(u);
  FUCINA_READ(u, meta.Int("block_count"));
  c.num_layers = static_cast<int64_t>(u);
  FUCINA_READ(c.rms_eps, meta.Float("attention.layer_norm_rms_epsilon"));
  std::vector<uint64_t> heads, heads_kv, ffn;
  FUCINA_READ(heads, meta.IntPerLayer("attention.head_count", c.num_layers));
  FUCINA_READ(heads_kv, meta.IntPerLayer("attention.head_count_kv", c.num_layers));
  std::optional<uint64_t> opt;
  FUCINA_READ(opt, meta.IntOpt("expert_count"));
  c.num_experts = static_cast<int64_t>(opt.value_or(0));
  if (c.IsMoe()) {
    FUCINA_READ(u, meta.Int("expert_used_count"));
    c.num_experts_used = static_cast<int64_t>(u);
    FUCINA_READ(u, meta.Int("expert_feed_forward_length"));
    c.expert_ffn = static_cast<int64_t>(u);
  }
  FUCINA_READ(ffn, meta.IntPerLayer("feed_forward_length", c.num_layers));
  FUCINA_READ(u, meta.Int("attention.key_length"));
  const int64_t head_dim = static_cast<int64_t>(u);
  FUCINA_READ(opt, meta.IntOpt("attention.key_length_swa"));
  const int64_t head_dim_swa = static_cast<int64_t>(opt.value_or(head_dim));
  for (const char* k : {"attention.value_length", "attention.value_length_swa"}) {
    FUCINA_READ(opt, meta.IntOpt(k));
    const int64_t want = std::string_view(k).ends_with("_swa") ? head_dim_swa : head_dim;
    if (opt && static_cast<int64_t>(*opt) != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(meta.Key(k), " (", *opt, ") must equal the key length (", want, ")"));
    }
  }
  FUCINA_READ(opt, meta.IntOpt("rope.dimension_count"));
  const int64_t rope_dims = static_cast<int64_t>(opt.value_or(head_dim));
  FUCINA_READ(opt, meta.IntOpt("rope.dimension_count_swa"));
  const int64_t rope_dims_swa = static_cast<int64_t>(opt.value_or(head_dim_swa));
  std::optional<float> fopt;
  FUCINA_READ(fopt, meta.FloatOpt("rope.freq_base"));
  c.rope_base = fopt.value_or(10000.0f);
  FUCINA_READ(fopt, meta.FloatOpt("rope.freq_base_swa"));
  const float rope_base_swa = fopt.value_or(c.rope_base);
  FUCINA_READ(u, meta.Int("attention.sliding_window"));
  const int64_t window = static_cast<int64_t>(u);
  FUCINA_READ(opt, meta.IntOpt("attention.shared_kv_layers"));
  const int64_t shared = static_cast<int64_t>(opt.value_or(0));
  FUCINA_READ(opt, meta.IntOpt("embedding_length_per_layer_input"));
  c.per_layer_input = static_cast<int64_t>(opt.value_or(0));
  FUCINA_READ(fopt, meta.FloatOpt("final_logit_softcapping"));
  c.final_logit_softcap = fopt.value_or(0.0f);
  FUCINA_READ(opt, meta.IntOpt("context_length"));
  c.context_length = static_cast<int64_t>(opt.value_or(4096));
  std::vector<bool> sliding;
  FUCINA_READ(sliding, SlidingPattern(meta, c.num_layers));
#undef FUCINA_READ
  if (shared < 0 || shared >= c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(meta.Key("attention.shared_kv_layers"), " (",
                                                   shared, ") must be below block_count"));
  }
  const gguf::TensorInfo* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2 || embd->dims[0] != c.hidden) {
    return absl::InvalidArgumentError(
        "tensor token_embd.weight is missing or its rows are not embedding_length wide");
  }
  c.vocab_size = embd->dims[1];

  const int64_t n_kv = c.num_layers - shared;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerSpec s;
    const bool swa = sliding[l];
    s.attention = swa ? AttentionKind::kSliding : AttentionKind::kGlobal;
    s.window = swa ? window : 0;
    s.num_heads = static_cast<int64_t>(heads[l]);
    s.num_heads_kv = static_cast<int64_t>(heads_kv[l]);
    s.head_dim = swa ? head_dim_swa : head_dim;
    s.rope_base = swa ? rope_base_swa : c.rope_base;
    s.rope_dims = swa ? rope_dims_swa : rope_dims;
    s.ffn = static_cast<int64_t>(ffn[l]);
    s.moe = c.IsMoe();
    if (l >= n_kv) s.kv_source = n_kv - (swa ? 2 : 1);
    c.layers.push_back(s);
  }
  // The global fields describe layer 0 (what single-geometry code paths print).
  c.num_heads = c.layers[0].num_heads;
  c.num_heads_kv = c.layers[0].num_heads_kv;
  c.head_dim = c.layers[0].head_dim;
  c.rope_dims = c.layers[0].rope_dims;
  c.ffn = c.layers[0].ffn;
  return c;
}

int64_t GlobalHeadDim(const ModelConfig& c) {
  for (const LayerSpec& s : c.layers) {
    if (s.attention == AttentionKind::kGlobal) return s.head_dim;
  }
  return 0;
}

TensorTable Gemma4Tensors(const ModelConfig& c) {
  TensorTable t;
  AddEmbeddingAndHead(t, c);
  if (const int64_t hd = GlobalHeadDim(c); hd > 0) {
    t.push_back({"rope_freqs.weight", {hd / 2}, TensorPart::kGlobal, -1, TensorInit::kRopeFreqs,
                 false, /*quantize=*/false});
  }
  const int64_t ple = c.per_layer_input;
  if (ple > 0) {
    t.push_back({"per_layer_token_embd.weight", {ple * c.num_layers, c.vocab_size},
                 TensorPart::kEmbedding, -1, TensorInit::kPeaked});
    t.push_back({"per_layer_model_proj.weight", {c.hidden, ple * c.num_layers},
                 TensorPart::kEmbedding, -1});
    AddVector(t, "per_layer_proj_norm.weight", ple, TensorPart::kEmbedding, -1);
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerSpec& s = c.layers[l];
    auto vec = [&](const char* suffix, int64_t n) {
      AddVector(t, LayerTensor(l, suffix), n, TensorPart::kLayer, l);
    };
    vec("attn_norm.weight", c.hidden);
    AddAttentionTensors(t, c, l, /*qk_norm=*/true);
    if (s.kv_source < 0) {
      for (TensorSpec& spec : t) {
        if (spec.name == LayerTensor(l, "attn_v.weight")) spec.optional = true;
      }
    }
    vec("post_attention_norm.weight", c.hidden);
    vec("ffn_norm.weight", c.hidden);
    AddFfnTensors(t, c, l, s.ffn);
    vec("post_ffw_norm.weight", c.hidden);
    if (s.moe) {
      // The router reads rms_norm(x) / sqrt(hidden): unit-variance weights give fixtures clear
      // expert choices (near-ties flip under quantization noise).
      t.push_back({LayerTensor(l, "ffn_gate_inp.weight"), {c.hidden, c.num_experts},
                   TensorPart::kLayer, l, TensorInit::kUnit, false, /*quantize=*/false});
      vec("ffn_gate_inp.scale", c.hidden);
      vec("pre_ffw_norm_2.weight", c.hidden);
      vec("post_ffw_norm_1.weight", c.hidden);
      vec("post_ffw_norm_2.weight", c.hidden);
      const TensorSpec gate{LayerTensor(l, "ffn_gate_exps.weight"),
                            {c.hidden, c.expert_ffn, c.num_experts}, TensorPart::kExperts, l,
                            TensorInit::kNormal, /*optional=*/true};
      TensorSpec up = gate;
      up.name = LayerTensor(l, "ffn_up_exps.weight");
      TensorSpec gate_up = gate;
      gate_up.name = LayerTensor(l, "ffn_gate_up_exps.weight");
      gate_up.dims = {c.hidden, 2 * c.expert_ffn, c.num_experts};
      gate_up.fixture = false;
      t.push_back(gate);
      t.push_back(up);
      t.push_back(gate_up);
      t.push_back({LayerTensor(l, "ffn_down_exps.weight"), {c.expert_ffn, c.hidden, c.num_experts},
                   TensorPart::kExperts, l});
      t.push_back({LayerTensor(l, "ffn_down_exps.scale"), {c.num_experts}, TensorPart::kExperts, l,
                   TensorInit::kOnes, /*optional=*/true, /*quantize=*/false, /*fixture=*/false});
    }
    if (ple > 0) {
      t.push_back({LayerTensor(l, "inp_gate.weight"), {c.hidden, ple}, TensorPart::kLayer, l});
      t.push_back({LayerTensor(l, "proj.weight"), {ple, c.hidden}, TensorPart::kLayer, l});
      vec("post_norm.weight", c.hidden);
    }
    t.push_back({LayerTensor(l, "layer_output_scale.weight"), {1}, TensorPart::kLayer, l,
                 TensorInit::kScale, /*optional=*/true, /*quantize=*/false});
  }
  return t;
}

class Gemma4 : public FamilyModel {
 public:
  explicit Gemma4(const ModelConfig& c) : c_(c), softcap_(c.final_logit_softcap) {}

  absl::Status Bind(TensorBinder& b, const LoadOptions& options) override {
    first_ = options.first_layer;
    layers_.resize(options.last_layer - first_);
#define FUCINA_BIND(lhs, expr)               \
  {                                          \
    auto bound = (expr);                     \
    if (!bound.ok()) return bound.status();  \
    lhs = *bound;                            \
  }
    if (!options.experts_only) {
      if (GlobalHeadDim(c_) > 0) FUCINA_BIND(rope_freqs_, b.Vector("rope_freqs.weight"));
      if (c_.per_layer_input > 0 && options.embeddings) {
        FUCINA_BIND(ple_embd_, b.Matrix("per_layer_token_embd.weight"));
        FUCINA_BIND(ple_proj_, b.Matrix("per_layer_model_proj.weight"));
        FUCINA_BIND(ple_proj_norm_, b.Vector("per_layer_proj_norm.weight"));
      }
    }
    for (int64_t l = first_; l < options.last_layer; ++l) {
      Layer& L = layers_[l - first_];
      auto name = [l](const char* suffix) { return LayerTensor(l, suffix); };
      if (c_.layers[l].moe) {
        if (b.Has(name("ffn_gate_up_exps.weight"))) {
          FUCINA_BIND(L.experts.gate, b.Matrix(name("ffn_gate_up_exps.weight")));
          L.experts.fused_gate_up = true;
        } else {
          FUCINA_BIND(L.experts.gate, b.Matrix(name("ffn_gate_exps.weight")));
          FUCINA_BIND(L.experts.up, b.Matrix(name("ffn_up_exps.weight")));
        }
        FUCINA_BIND(L.experts.down, b.Matrix(name("ffn_down_exps.weight")));
        if (b.Has(name("ffn_down_exps.scale"))) {
          FUCINA_BIND(L.experts.down_scale, b.Vector(name("ffn_down_exps.scale")));
        }
      }
      if (options.experts_only) continue;
      FUCINA_BIND(L.attn_norm, b.Vector(name("attn_norm.weight")));
      FUCINA_BIND(L.attn, BindAttention(b, c_, l, /*qk_norm=*/true));
      FUCINA_BIND(L.post_attn_norm, b.Vector(name("post_attention_norm.weight")));
      FUCINA_BIND(L.ffn_norm, b.Vector(name("ffn_norm.weight")));
      FUCINA_BIND(L.ffn, BindFfn(b, l));
      FUCINA_BIND(L.post_ffn_norm, b.Vector(name("post_ffw_norm.weight")));
      if (c_.layers[l].moe) {
        FUCINA_BIND(L.router, b.Matrix(name("ffn_gate_inp.weight")));
        FUCINA_BIND(L.router_scale, b.Vector(name("ffn_gate_inp.scale")));
        FUCINA_BIND(L.pre_moe_norm, b.Vector(name("pre_ffw_norm_2.weight")));
        FUCINA_BIND(L.post_mlp_norm, b.Vector(name("post_ffw_norm_1.weight")));
        FUCINA_BIND(L.post_moe_norm, b.Vector(name("post_ffw_norm_2.weight")));
      }
      if (c_.per_layer_input > 0) {
        FUCINA_BIND(L.ple_gate, b.Matrix(name("inp_gate.weight")));
        FUCINA_BIND(L.ple_proj, b.Matrix(name("proj.weight")));
        FUCINA_BIND(L.ple_norm, b.Vector(name("post_norm.weight")));
      }
      if (b.Has(name("layer_output_scale.weight"))) {
        FUCINA_BIND(L.out_scale, b.Vector(name("layer_output_scale.weight")));
      }
    }
#undef FUCINA_BIND
    return absl::OkStatus();
  }

  // As the reference library, q8_0 K/V is refused: attention scores are q . k at scale 1 over
  // unit-RMS heads, so q8_0's rounding of k moves next-token log-probs by ~0.4 nats on the
  // fixtures (f16: ~0.02).
  absl::Status CheckKvType(GgmlType type) const override {
    if (type == GgmlType::kQ8_0) {
      return absl::InvalidArgumentError(
          "gemma4 runs on f16 or f32 K/V caches, not q8_0 (its unscaled attention scores "
          "magnify q8_0's rounding)");
    }
    return absl::OkStatus();
  }

  float EmbeddingScale() const override { return std::sqrt(static_cast<float>(c_.hidden)); }

  void FinishLogits(float* logits, int64_t n) const override {
    // Three rounded steps, as the reference takes them (kernels/activations.h).
    if (softcap_ != 0.0f) SoftCap(logits, n, softcap_);
  }

  const ExpertStacks* Experts(int64_t l) const override {
    return c_.layers[l].moe ? &layers_[l - first_].experts : nullptr;
  }
  Activation ExpertActivation() const override { return Activation::kGelu; }

  absl::Status PerLayerInputs(ForwardContext& ctx, std::span<const int32_t> tokens) override {
    if (ple_embd_.data == nullptr) {
      return absl::FailedPreconditionError(
          "per-layer embeddings need the embedding tables in this stage");
    }
    // ple[r, l, :] = (rms_norm(proj(x0[r]) / sqrt(hidden)) * norm_w
    //                 + per_layer_token_embd[token r][l, :] * sqrt(ple)) / sqrt(2)
    const int64_t rows = ctx.rows(), ple = c_.per_layer_input, width = ple * c_.num_layers;
    float* out = ForwardScratch::Grow(ctx.scratch().ple, rows * width);
    MatMul(ple_proj_, ctx.x(), rows, out, ctx.pool());
    const float proj_scale = 1.0f / std::sqrt(static_cast<float>(c_.hidden));
    for (int64_t i = 0; i < rows * width; ++i) out[i] *= proj_scale;
    RmsNorm(out, ple_proj_norm_, c_.rms_eps, rows * c_.num_layers, ple, out);
    const CpuTypeTraits* traits = GetCpuTraits(ple_embd_.type);
    std::vector<float> row(width);
    const float embd_scale = std::sqrt(static_cast<float>(ple));
    const float input_scale = 1.0f / std::sqrt(2.0f);
    for (int64_t r = 0; r < rows; ++r) {
      traits->to_float(
          static_cast<const uint8_t*>(ple_embd_.data) + tokens[r] * ple_embd_.row_stride,
          row.data(), width);
      float* o = out + r * width;
      for (int64_t i = 0; i < width; ++i) o[i] = (o[i] + row[i] * embd_scale) * input_scale;
    }
    return absl::OkStatus();
  }

  absl::Status ForwardLayer(ForwardContext& ctx, int64_t l) override {
    const Layer& L = layers_[l - first_];
    const LayerSpec& spec = c_.layers[l];
    ForwardScratch& s = ctx.scratch();
    const int64_t rows = ctx.rows(), hidden = c_.hidden, n = rows * hidden;
    const float eps = c_.rms_eps;
    float* x = ctx.x();
    float* h = ForwardScratch::Grow(s.h, n);
    float* out = ForwardScratch::Grow(s.out, n);

    // Attention: x = x + post_norm(attn(norm(x))).
    RmsNorm(x, L.attn_norm, eps, rows, hidden, h);
    AttentionOptions ao;
    ao.scale = 1.0f;
    ao.v_norm = true;
    ao.rope_mode = RopeMode::kNeox;
    ao.rope_freqs = spec.attention == AttentionKind::kGlobal ? rope_freqs_ : nullptr;
    ao.eps = eps;
    Attention(ctx, l, L.attn, ao, h, out);
    RmsNorm(out, L.post_attn_norm, eps, rows, hidden, out);
    AddInPlace(x, out, n);

    // Feed-forward: the dense MLP (and beside it the routed experts), post-normed, added.
    RmsNorm(x, L.ffn_norm, eps, rows, hidden, h);
    GatedFfn(ctx, l, L.ffn, spec.ffn, Activation::kGelu, h, out);
    if (spec.moe) {
      RmsNorm(out, L.post_mlp_norm, eps, rows, hidden, out);
      float* moe = ForwardScratch::Grow(s.out2, n);
      if (absl::Status st = RoutedExperts(ctx, l, L, x, h, moe); !st.ok()) return st;
      RmsNorm(moe, L.post_moe_norm, eps, rows, hidden, moe);
      AddInPlace(out, moe, n);
    }
    RmsNorm(out, L.post_ffn_norm, eps, rows, hidden, out);
    AddInPlace(x, out, n);

    if (c_.per_layer_input > 0) {
      // x += norm(proj(gelu(gate(x)) * ple[:, l, :])).
      const int64_t ple = c_.per_layer_input;
      float* g = ForwardScratch::Grow(s.act, rows * ple);
      MatMul(L.ple_gate, x, rows, g, ctx.pool());
      const float* inputs = s.ple.data();
      for (int64_t r = 0; r < rows; ++r) {
        GeGlu(g + r * ple, inputs + (r * c_.num_layers + l) * ple, g + r * ple, ple);
      }
      MatMul(L.ple_proj, g, rows, out, ctx.pool());
      RmsNorm(out, L.ple_norm, eps, rows, hidden, out);
      AddInPlace(x, out, n);
    }
    if (L.out_scale != nullptr) {
      const float scale = L.out_scale[0];
      for (int64_t i = 0; i < n; ++i) x[i] *= scale;
    }
    return absl::OkStatus();
  }

 private:
  struct Layer {
    const float* attn_norm = nullptr;
    AttentionWeights attn;
    const float* post_attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    FfnWeights ffn;
    const float* post_ffn_norm = nullptr;
    WeightView router;
    const float* router_scale = nullptr;
    const float* pre_moe_norm = nullptr;
    const float* post_mlp_norm = nullptr;
    const float* post_moe_norm = nullptr;
    ExpertStacks experts;
    WeightView ple_gate, ple_proj;
    const float* ple_norm = nullptr;
    const float* out_scale = nullptr;
  };

  // moe = sum_j w_j expert_j(norm2(x)), routed on rms_norm(x) / sqrt(hidden) * router_scale.
  // `h` is free scratch here (the dense branch is done with it).
  absl::Status RoutedExperts(ForwardContext& ctx, int64_t l, const Layer& L, const float* x,
                             float* h, float* moe) {
    ForwardScratch& s = ctx.scratch();
    const int64_t rows = ctx.rows(), hidden = c_.hidden;
    const int k = static_cast<int>(c_.num_experts_used);
    float* r_in = ForwardScratch::Grow(s.h2, rows * hidden);
    RmsNorm(x, nullptr, c_.rms_eps, rows, hidden, r_in);
    const float inv = 1.0f / std::sqrt(static_cast<float>(hidden));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t d = 0; d < hidden; ++d) {
        float& v = r_in[r * hidden + d];
        v = (v * inv) * L.router_scale[d];
      }
    }
    float* logits = ForwardScratch::Grow(s.router, rows * c_.num_experts);
    MatMul(L.router, r_in, rows, logits, ctx.pool());
    s.expert_ids.resize(rows * k);
    float* weights = ForwardScratch::Grow(s.expert_w, rows * k);
    RouteTopK(logits, rows, c_.num_experts, k, /*renormalize=*/true, s.expert_ids.data(),
              weights);
    RmsNorm(x, L.pre_moe_norm, c_.rms_eps, rows, hidden, h);
    return ctx.experts().Forward(l, h, rows, s.expert_ids.data(), weights, k, moe);
  }

  const ModelConfig& c_;
  float softcap_ = 0.0f;
  int64_t first_ = 0;
  const float* rope_freqs_ = nullptr;
  WeightView ple_embd_, ple_proj_;
  const float* ple_proj_norm_ = nullptr;
  std::vector<Layer> layers_;
};

void WriteGemma4Config(const ModelConfig& c, gguf::Writer& w) {
  auto key = [](const char* suffix) { return absl::StrCat(kArch, ".", suffix); };
  auto per_layer = [&](auto field) {
    std::vector<gguf::Value> items;
    for (const LayerSpec& s : c.layers) items.push_back(gguf::Value::U32(field(s)));
    return gguf::Value::Array(gguf::ValueType::kUint32, std::move(items));
  };
  int64_t head_dim = c.head_dim, head_dim_swa = c.head_dim, window = 0, shared = 0;
  int64_t rope_dims = c.rope_dims, rope_dims_swa = c.rope_dims;
  float base_swa = c.rope_base;
  std::vector<gguf::Value> pattern;
  for (const LayerSpec& s : c.layers) {
    const bool swa = s.attention == AttentionKind::kSliding;
    pattern.push_back(gguf::Value::Bool(swa));
    if (swa) {
      head_dim_swa = s.head_dim;
      rope_dims_swa = s.rope_dims;
      window = s.window;
      base_swa = s.rope_base;
    } else {
      head_dim = s.head_dim;
      rope_dims = s.rope_dims;
    }
    if (s.kv_source >= 0) ++shared;
  }
  w.SetValue(key("block_count"), gguf::Value::U32(c.num_layers));
  w.SetValue(key("context_length"), gguf::Value::U32(c.context_length));
  w.SetValue(key("embedding_length"), gguf::Value::U32(c.hidden));
  w.SetValue(key("feed_forward_length"), per_layer([](const LayerSpec& s) { return s.ffn; }));
  w.SetValue(key("attention.head_count"), gguf::Value::U32(c.layers[0].num_heads));
  w.SetValue(key("attention.head_count_kv"),
             per_layer([](const LayerSpec& s) { return s.num_heads_kv; }));
  w.SetValue(key("attention.key_length"), gguf::Value::U32(head_dim));
  w.SetValue(key("attention.value_length"), gguf::Value::U32(head_dim));
  w.SetValue(key("attention.key_length_swa"), gguf::Value::U32(head_dim_swa));
  w.SetValue(key("attention.value_length_swa"), gguf::Value::U32(head_dim_swa));
  w.SetValue(key("rope.dimension_count"), gguf::Value::U32(rope_dims));
  w.SetValue(key("rope.dimension_count_swa"), gguf::Value::U32(rope_dims_swa));
  w.SetValue(key("rope.freq_base"), gguf::Value::F32(c.rope_base));
  w.SetValue(key("rope.freq_base_swa"), gguf::Value::F32(base_swa));
  w.SetValue(key("attention.sliding_window"), gguf::Value::U32(window));
  w.SetValue(key("attention.sliding_window_pattern"),
             gguf::Value::Array(gguf::ValueType::kBool, std::move(pattern)));
  w.SetValue(key("attention.shared_kv_layers"), gguf::Value::U32(shared));
  w.SetValue(key("attention.layer_norm_rms_epsilon"), gguf::Value::F32(c.rms_eps));
  w.SetValue(key("embedding_length_per_layer_input"), gguf::Value::U32(c.per_layer_input));
  w.SetValue(key("final_logit_softcapping"), gguf::Value::F32(c.final_logit_softcap));
  if (c.IsMoe()) {
    w.SetValue(key("expert_count"), gguf::Value::U32(c.num_experts));
    w.SetValue(key("expert_used_count"), gguf::Value::U32(c.num_experts_used));
    w.SetValue(key("expert_feed_forward_length"), gguf::Value::U32(c.expert_ffn));
  }
}

absl::StatusOr<ModelConfig> Gemma4FixtureConfig(const FixtureOptions& o, int64_t vocab) {
  ModelConfig c = families::BaseFixtureConfig(o, vocab);
  c.per_layer_input = o.per_layer_input;
  c.final_logit_softcap = o.final_logit_softcap;
  if (o.moe) {
    c.num_experts = o.num_experts;
    c.num_experts_used = o.num_experts_used;
    c.expert_ffn = o.expert_ffn;
  }
  if (o.shared_kv_layers < 0 || o.shared_kv_layers >= o.num_layers) {
    return absl::InvalidArgumentError("--shared-kv-layers must be below --layers");
  }
  const int64_t n_kv = o.num_layers - o.shared_kv_layers;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    LayerSpec s;
    const bool swa = o.global_every <= 0 || (l + 1) % o.global_every != 0;
    s.attention = swa ? AttentionKind::kSliding : AttentionKind::kGlobal;
    s.window = swa ? o.sliding_window : 0;
    s.num_heads = o.num_heads;
    s.num_heads_kv = swa || o.kv_heads_global <= 0 ? o.num_heads_kv : o.kv_heads_global;
    s.head_dim = s.rope_dims = swa ? o.head_dim : o.head_dim_global;
    s.rope_base = swa ? o.rope_base_swa : o.rope_base;
    s.ffn = o.ffn;
    s.moe = o.moe;
    if (l >= n_kv) s.kv_source = n_kv - (swa ? 2 : 1);
    c.layers.push_back(s);
  }
  c.num_heads_kv = c.layers[0].num_heads_kv;
  c.head_dim = c.rope_dims = c.layers[0].head_dim;
  return c;
}

}  // namespace

extern const ModelFamily kGemma4Family = {
    .arch = kArch,
    .read_config = ReadGemma4Config,
    .tensors = Gemma4Tensors,
    .create = [](const ModelConfig& c, const gguf::File&) -> std::unique_ptr<FamilyModel> {
      return std::make_unique<Gemma4>(c);
    },
    .write_config = WriteGemma4Config,
    .fixture_config = Gemma4FixtureConfig,
};

}  // namespace fucina
