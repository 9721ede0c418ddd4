#include "models/families/common.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/norm.h"

namespace fucina::families {

#define FUCINA_ASSIGN_OR_RETURN(lhs, expr) \
  auto lhs##_or = (expr);                  \
  if (!lhs##_or.ok()) return lhs##_or.status();

absl::StatusOr<ModelConfig> ReadCommonConfig(const gguf::Meta& meta) {
  ModelConfig c;
  c.arch = meta.arch();
  if (auto name = meta.StringOpt("general.name"); name.ok() && name->has_value()) c.name = **name;
  FUCINA_ASSIGN_OR_RETURN(hidden, meta.Int("embedding_length"));
  FUCINA_ASSIGN_OR_RETURN(layers, meta.Int("block_count"));
  FUCINA_ASSIGN_OR_RETURN(heads, meta.Int("attention.head_count"));
  FUCINA_ASSIGN_OR_RETURN(eps, meta.Float("attention.layer_norm_rms_epsilon"));
  FUCINA_ASSIGN_OR_RETURN(heads_kv, meta.IntOpt("attention.head_count_kv"));
  FUCINA_ASSIGN_OR_RETURN(base, meta.FloatOpt("rope.freq_base"));
  FUCINA_ASSIGN_OR_RETURN(ctx, meta.IntOpt("context_length"));
  FUCINA_ASSIGN_OR_RETURN(experts, meta.IntOpt("expert_count"));
  c.hidden = static_cast<int64_t>(*hidden_or);
  c.num_layers = static_cast<int64_t>(*layers_or);
  c.num_heads = static_cast<int64_t>(*heads_or);
  c.num_heads_kv = static_cast<int64_t>(heads_kv_or->value_or(c.num_heads));
  c.rms_eps = *eps_or;
  c.rope_base = base_or->value_or(10000.0f);
  c.context_length = static_cast<int64_t>(ctx_or->value_or(4096));
  c.num_experts = static_cast<int64_t>(experts_or->value_or(0));
  if (c.IsMoe()) {
    FUCINA_ASSIGN_OR_RETURN(used, meta.Int("expert_used_count"));
    FUCINA_ASSIGN_OR_RETURN(eff, meta.Int("expert_feed_forward_length"));
    c.num_experts_used = static_cast<int64_t>(*used_or);
    c.expert_ffn = static_cast<int64_t>(*eff_or);
    FUCINA_ASSIGN_OR_RETURN(ffn, meta.IntOpt("feed_forward_length"));
    c.ffn = static_cast<int64_t>(ffn_or->value_or(0));
  } else {
    FUCINA_ASSIGN_OR_RETURN(ffn, meta.Int("feed_forward_length"));
    c.ffn = static_cast<int64_t>(*ffn_or);
  }
  const gguf::TensorInfo* embd = meta.file().FindTensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2) {
    return absl::InvalidArgumentError("tensor token_embd.weight is missing or not 2-D");
  }
  if (embd->dims[0] != c.hidden) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_embd.weight rows have ", embd->dims[0], " values but ", meta.arch(),
                     ".embedding_length is ", c.hidden));
  }
  c.vocab_size = embd->dims[1];
  return c;
}

void WriteCommonConfig(const ModelConfig& c, gguf::Writer& w) {
  auto key = [&](const char* suffix) { return absl::StrCat(c.arch, ".", suffix); };
  w.SetValue(key("block_count"), gguf::Value::U32(c.num_layers));
  w.SetValue(key("context_length"), gguf::Value::U32(c.context_length));
  w.SetValue(key("embedding_length"), gguf::Value::U32(c.hidden));
  w.SetValue(key("feed_forward_length"), gguf::Value::U32(c.IsMoe() && c.ffn == 0 ? c.expert_ffn
                                                                                   : c.ffn));
  w.SetValue(key("attention.head_count"), gguf::Value::U32(c.num_heads));
  w.SetValue(key("attention.head_count_kv"), gguf::Value::U32(c.num_heads_kv));
  w.SetValue(key("rope.freq_base"), gguf::Value::F32(c.rope_base));
  w.SetValue(key("attention.layer_norm_rms_epsilon"), gguf::Value::F32(c.rms_eps));
  if (c.IsMoe()) {
    w.SetValue(key("expert_count"), gguf::Value::U32(c.num_experts));
    w.SetValue(key("expert_used_count"), gguf::Value::U32(c.num_experts_used));
    w.SetValue(key("expert_feed_forward_length"), gguf::Value::U32(c.expert_ffn));
  }
}

ModelConfig BaseFixtureConfig(const FixtureOptions& o, int64_t vocab) {
  ModelConfig c;
  c.arch = o.arch;
  c.vocab_size = vocab;
  c.hidden = o.hidden;
  c.ffn = o.ffn;
  c.num_layers = o.num_layers;
  c.num_heads = o.num_heads;
  c.num_heads_kv = o.num_heads_kv;
  c.head_dim = o.head_dim;
  c.rope_dims = o.head_dim;
  c.context_length = o.context_length;
  c.rms_eps = o.rms_eps;
  c.rope_base = o.rope_base;
  return c;
}

// ---- The pre-norm decoder ----

TensorTable PreNormDecoderTensors(const ModelConfig& c, const PreNormDecoderOptions& o) {
  TensorTable t;
  AddEmbeddingAndHead(t, c);
  if (o.rope_freqs) {
    t.push_back({"rope_freqs.weight", {c.rope_dims / 2}, TensorPart::kGlobal, -1,
                 TensorInit::kRopeFreqs, /*optional=*/true, /*quantize=*/false});
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    AddVector(t, LayerTensor(l, "attn_norm.weight"), c.hidden, TensorPart::kLayer, l);
    AddAttentionTensors(t, c, l, o.qk_norm);
    AddVector(t, LayerTensor(l, "ffn_norm.weight"), c.hidden, TensorPart::kLayer, l);
    if (c.layers[l].moe) {
      AddExpertTensors(t, c, l);
    } else {
      AddFfnTensors(t, c, l, c.layers[l].ffn);
    }
  }
  return t;
}

namespace {

class PreNormDecoder : public FamilyModel {
 public:
  PreNormDecoder(const ModelConfig& c, const PreNormDecoderOptions& o) : c_(c), o_(o) {}

  absl::Status Bind(TensorBinder& b, const LoadOptions& options) override {
    first_ = options.first_layer;
    layers_.resize(options.last_layer - first_);
    if (o_.rope_freqs && b.Has("rope_freqs.weight") && !options.experts_only) {
      auto f = b.Vector("rope_freqs.weight");
      if (!f.ok()) return f.status();
      rope_freqs_ = *f;
    }
    for (int64_t l = first_; l < options.last_layer; ++l) {
      Layer& L = layers_[l - first_];
      if (c_.layers[l].moe) {
        auto e = BindExperts(b, l);
        if (!e.ok()) return e.status();
        L.experts = *e;
      }
      if (options.experts_only) continue;
      auto norm = b.Vector(LayerTensor(l, "attn_norm.weight"));
      if (!norm.ok()) return norm.status();
      L.attn_norm = *norm;
      auto attn = BindAttention(b, c_, l, o_.qk_norm);
      if (!attn.ok()) return attn.status();
      L.attn = *attn;
      auto ffn_norm = b.Vector(LayerTensor(l, "ffn_norm.weight"));
      if (!ffn_norm.ok()) return ffn_norm.status();
      L.ffn_norm = *ffn_norm;
      if (c_.layers[l].moe) {
        auto router = b.Matrix(LayerTensor(l, "ffn_gate_inp.weight"));
        if (!router.ok()) return router.status();
        L.router = *router;
      } else {
        auto ffn = BindFfn(b, l);
        if (!ffn.ok()) return ffn.status();
        L.ffn = *ffn;
      }
    }
    return absl::OkStatus();
  }

  absl::Status ForwardLayer(ForwardContext& ctx, int64_t l) override {
    const Layer& L = layers_[l - first_];
    const LayerSpec& spec = c_.layers[l];
    ForwardScratch& s = ctx.scratch();
    const int64_t rows = ctx.rows(), n = rows * c_.hidden;
    float* x = ctx.x();
    float* h = ForwardScratch::Grow(s.h, n);
    float* out = ForwardScratch::Grow(s.out, n);

    RmsNorm(x, L.attn_norm, c_.rms_eps, rows, c_.hidden, h);
    AttentionOptions ao;
    ao.scale = 1.0f / std::sqrt(static_cast<float>(spec.head_dim));
    ao.rope_mode = o_.rope_mode;
    ao.rope_freqs = rope_freqs_;
    ao.eps = c_.rms_eps;
    Attention(ctx, l, L.attn, ao, h, out);
    AddInPlace(x, out, n);

    RmsNorm(x, L.ffn_norm, c_.rms_eps, rows, c_.hidden, h);
    if (!spec.moe) {
      GatedFfn(ctx, l, L.ffn, spec.ffn, Activation::kSilu, h, out);
    } else {
      const int k = static_cast<int>(c_.num_experts_used);
      float* logits = ForwardScratch::Grow(s.router, rows * c_.num_experts);
      MatMul(L.router, h, rows, logits, ctx.pool());
      s.expert_ids.resize(rows * k);
      float* weights = ForwardScratch::Grow(s.expert_w, rows * k);
      RouteTopK(logits, rows, c_.num_experts, k, o_.renormalize_experts, s.expert_ids.data(),
                weights);
      // h and out are buffers the expert FFN never touches otherwise.
      if (absl::Status st =
              ctx.experts().Forward(l, h, rows, s.expert_ids.data(), weights, k, out);
          !st.ok()) {
        return st;
      }
    }
    AddInPlace(x, out, n);
    return absl::OkStatus();
  }

  const ExpertStacks* Experts(int64_t l) const override {
    return c_.layers[l].moe ? &layers_[l - first_].experts : nullptr;
  }

 private:
  struct Layer {
    const float* attn_norm = nullptr;
    AttentionWeights attn;
    const float* ffn_norm = nullptr;
    FfnWeights ffn;
    WeightView router;
    ExpertStacks experts;
  };
  const ModelConfig& c_;
  PreNormDecoderOptions o_;
  int64_t first_ = 0;
  const float* rope_freqs_ = nullptr;
  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<FamilyModel> NewPreNormDecoder(const ModelConfig& c,
                                               const PreNormDecoderOptions& o) {
  return std::make_unique<PreNormDecoder>(c, o);
}

}  // namespace fucina::families
