#include "models/engine/blocks.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/activations.h"
#include "kernels/attention.h"
#include "kernels/norm.h"
#include "kernels/softmax.h"
#include "kernels/tile_layout.h"
#include "kernels/type_traits.h"
#include "models/log/log.h"

namespace fucina {

// ---- Table ----

const TensorSpec* FindTensorSpec(const TensorTable& table, std::string_view name) {
  for (const TensorSpec& t : table) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::string LayerTensor(int64_t layer, std::string_view suffix) {
  return absl::StrCat("blk.", layer, ".", std::string(suffix));
}

void AddVector(TensorTable& table, std::string name, int64_t n, TensorPart part, int64_t layer,
               bool optional) {
  table.push_back({std::move(name), {n}, part, layer, TensorInit::kOnes, optional, false});
}

void AddEmbeddingAndHead(TensorTable& table, const ModelConfig& c) {
  table.push_back({"token_embd.weight", {c.hidden, c.vocab_size}, TensorPart::kEmbedding, -1,
                   TensorInit::kPeaked});
  AddVector(table, "output_norm.weight", c.hidden, TensorPart::kHead, -1);
  table.push_back({"output.weight", {c.hidden, c.vocab_size}, TensorPart::kHead, -1,
                   TensorInit::kPeaked, /*optional=*/true});
}

void AddAttentionTensors(TensorTable& table, const ModelConfig& c, int64_t l, bool qk_norm,
                         bool with_v) {
  const LayerSpec& s = c.layers[l];
  const bool stores = s.kv_source < 0;
  table.push_back({LayerTensor(l, "attn_q.weight"), {c.hidden, s.q_dim()}, TensorPart::kLayer, l});
  if (stores) {
    table.push_back(
        {LayerTensor(l, "attn_k.weight"), {c.hidden, s.kv_dim()}, TensorPart::kLayer, l});
    if (with_v) {
      table.push_back(
          {LayerTensor(l, "attn_v.weight"), {c.hidden, s.kv_dim()}, TensorPart::kLayer, l});
    }
  }
  table.push_back(
      {LayerTensor(l, "attn_output.weight"), {s.q_dim(), c.hidden}, TensorPart::kLayer, l});
  if (qk_norm) {
    AddVector(table, LayerTensor(l, "attn_q_norm.weight"), s.head_dim, TensorPart::kLayer, l);
    if (stores) {
      AddVector(table, LayerTensor(l, "attn_k_norm.weight"), s.head_dim, TensorPart::kLayer, l);
    }
  }
}

void AddFfnTensors(TensorTable& table, const ModelConfig& c, int64_t l, int64_t ffn) {
  table.push_back({LayerTensor(l, "ffn_gate.weight"), {c.hidden, ffn}, TensorPart::kLayer, l});
  table.push_back({LayerTensor(l, "ffn_up.weight"), {c.hidden, ffn}, TensorPart::kLayer, l});
  table.push_back({LayerTensor(l, "ffn_down.weight"), {ffn, c.hidden}, TensorPart::kLayer, l});
}

void AddExpertTensors(TensorTable& table, const ModelConfig& c, int64_t l) {
  table.push_back({LayerTensor(l, "ffn_gate_inp.weight"), {c.hidden, c.num_experts},
                   TensorPart::kLayer, l, TensorInit::kPeaked, false, /*quantize=*/false});
  table.push_back({LayerTensor(l, "ffn_gate_exps.weight"),
                   {c.hidden, c.expert_ffn, c.num_experts}, TensorPart::kExperts, l});
  table.push_back({LayerTensor(l, "ffn_up_exps.weight"), {c.hidden, c.expert_ffn, c.num_experts},
                   TensorPart::kExperts, l});
  table.push_back({LayerTensor(l, "ffn_down_exps.weight"),
                   {c.expert_ffn, c.hidden, c.num_experts}, TensorPart::kExperts, l});
}

// ---- Binder ----

TensorBinder::TensorBinder(const gguf::File& file, const TensorTable& table, ThreadPool& pool,
                           std::function<bool(std::string_view)> f32)
    : file_(file), table_(table), pool_(pool), f32_(std::move(f32)) {}

absl::StatusOr<const gguf::TensorInfo*> TensorBinder::Find(const std::string& name,
                                                           const TensorSpec** spec) {
  *spec = FindTensorSpec(table_, name);
  if (*spec == nullptr) {
    return absl::InternalError(absl::StrCat("tensor ", name, " is not in the family's table"));
  }
  const gguf::TensorInfo* t = file_.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor ", name, " is missing"));
  int64_t expected = 1;
  for (int64_t d : (*spec)->dims) expected *= d;
  if (t->dims.empty() || t->dims[0] != (*spec)->dims[0] || t->num_elements() != expected) {
    std::string want, have;
    for (int64_t d : (*spec)->dims) absl::StrAppend(&want, want.empty() ? "" : " x ", d);
    for (int64_t d : t->dims) absl::StrAppend(&have, have.empty() ? "" : " x ", d);
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " has shape [", have, "], expected [", want, "]"));
  }
  return t;
}

Parameter& TensorBinder::Record(const std::string& name, const TensorSpec& spec) {
  for (Parameter& p : parameters_) {
    if (p.name == name) return p;
  }
  parameters_.push_back({name, spec.dims, {}});
  return parameters_.back();
}

bool TensorBinder::Optional(const std::string& name) const {
  const TensorSpec* spec = FindTensorSpec(table_, name);
  return spec == nullptr || spec->optional;
}

absl::StatusOr<WeightView> TensorBinder::Matrix(const std::string& name) {
  const TensorSpec* spec;
  auto t = Find(name, &spec);
  if (!t.ok()) return t.status();
  if (!HasMatVec((*t)->type)) {
    return absl::UnimplementedError(absl::StrCat("tensor ", name, ": no CPU kernel for type ",
                                                 std::string(TypeName((*t)->type))));
  }
  const int64_t cols = spec->dims[0];
  const int64_t rows = (*t)->num_elements() / cols;
  Parameter& p = Record(name, *spec);
  if (f32_ && f32_(name)) {
    // A trainable copy: f32, owned, written by training (converted row by row, exactly).
    if (!p.locations.empty()) return p.locations.front().view;
    const CpuTypeTraits* traits = GetCpuTraits((*t)->type);
    const size_t row_bytes = static_cast<size_t>(RowBytes((*t)->type, cols));
    float* dst = reinterpret_cast<float*>(owned_.Allocate(rows * cols * sizeof(float)));
    for (int64_t r = 0; r < rows; ++r) {
      traits->to_float(static_cast<const uint8_t*>((*t)->data) + r * row_bytes, dst + r * cols,
                       cols);
    }
    const WeightView w = WeightView::Dense(dst, GgmlType::kF32, rows, cols);
    p.locations.push_back({w, true});
    return w;
  }
  const WeightView w = WeightView::Dense((*t)->data, (*t)->type, rows, cols);
  if (p.locations.empty()) p.locations.push_back({w, false});
  return w;
}

absl::StatusOr<const float*> TensorBinder::Vector(const std::string& name) {
  const TensorSpec* spec;
  auto t = Find(name, &spec);
  if (!t.ok()) return t.status();
  if ((*t)->type != GgmlType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " must be f32"));
  }
  const float* data = reinterpret_cast<const float*>((*t)->data);
  Parameter& p = Record(name, *spec);
  if (p.locations.empty()) {
    p.locations.push_back({WeightView::Dense(data, GgmlType::kF32, 1, (*t)->num_elements()),
                           false});
  }
  return data;
}

std::optional<WeightView> TensorBinder::Fuse(
    std::initializer_list<std::pair<std::string, WeightView>> parts) {
  const WeightView& p0 = parts.begin()->second;
  int64_t rows = 0;
  for (const auto& [name, p] : parts) {
    if (p.data == nullptr || p.type != p0.type || p.cols != p0.cols) return std::nullopt;
    rows += p.rows;
  }
  uint8_t* const buf = owned_.Allocate(rows * p0.row_stride);
  size_t offset = 0;
  for (const auto& [name, p] : parts) {
    copies_.push_back({buf + offset, p.data, p.rows * p.row_stride});
    // The fused rows of this tensor: a second, writable copy of the parameter.
    for (Parameter& param : parameters_) {
      if (param.name == name) {
        param.locations.push_back({WeightView::Dense(buf + offset, p.type, p.rows, p.cols), true});
      }
    }
    offset += p.rows * p.row_stride;
  }
  fused_.push_back({buf, offset});
  return WeightView::Dense(buf, p0.type, rows, p0.cols);
}

WeightView TensorBinder::Streamed(const WeightView& w) {
  if (w.data == nullptr) return w;
  const bool tiles = TileLayoutApplies(w);
  const size_t bytes = w.rows * w.row_stride;
  WeightView packed = w;
  packed.layout = WeightLayout::kTiles16;
  for (const auto& [base, size] : fused_) {
    if (base != w.data) continue;
    // Owned already; packing in place needs whole tiles (a ragged one is padded).
    if (!tiles || w.rows % kTileRows != 0) return w;
    // In place: the parameter locations in this buffer then describe packed rows, which holds
    // only where each starts and ends on a tile boundary.
    std::vector<ParameterLocation*> inside;
    for (Parameter& param : parameters_) {
      for (ParameterLocation& loc : param.locations) {
        const auto* p = static_cast<const uint8_t*>(loc.view.data);
        if (p >= base && p < base + size) inside.push_back(&loc);
      }
    }
    for (const ParameterLocation* loc : inside) {
      const size_t first = (static_cast<const uint8_t*>(loc->view.data) - base) / w.row_stride;
      if (first % kTileRows != 0 || loc->view.rows % kTileRows != 0) return w;
    }
    for (ParameterLocation* loc : inside) loc->view.layout = WeightLayout::kTiles16;
    repacks_.push_back({w, const_cast<uint8_t*>(base)});
    return packed;
  }
  // A trainable copy stays where training writes it.
  for (const Parameter& param : parameters_) {
    for (const ParameterLocation& loc : param.locations) {
      if (loc.owned && loc.view.data == w.data) return w;
    }
  }
  uint8_t* const dst = owned_.Allocate(tiles ? PackedBytes(w) : bytes);
  if (!tiles) {
    copies_.push_back({dst, w.data, bytes});
    WeightView copy = w;
    copy.data = dst;
    return copy;
  }
  repacks_.push_back({w, dst});
  packed.data = dst;
  return packed;
}

void TensorBinder::Finish() {
  // Work items: the copies, then (once every copy is done: a fused buffer is repacked in place)
  // runs of 64 tiles of the repacks.
  struct Item {
    const Copy* copy = nullptr;
    const Repack* repack = nullptr;
    int64_t tile_begin = 0, tile_end = 0;
    size_t bytes = 0;
  };
  std::vector<Item> copies, repacks;
  size_t total = 0;
  for (const Copy& c : copies_) {
    copies.push_back({&c, nullptr, 0, 0, c.bytes});
    total += c.bytes;
  }
  constexpr int64_t kTilesPerItem = 64;
  for (const Repack& r : repacks_) {
    const int64_t tiles = TileCount(r.src);
    for (int64_t t = 0; t < tiles; t += kTilesPerItem) {
      const int64_t end = std::min(tiles, t + kTilesPerItem);
      // The source bytes of those tiles (a ragged last tile has fewer rows).
      const int64_t rows = std::min(end * kTileRows, r.src.rows) - t * kTileRows;
      repacks.push_back({nullptr, &r, t, end, rows * r.src.row_stride});
      total += repacks.back().bytes;
    }
  }
  std::atomic<size_t> done{0};
  std::atomic<int> shown{-1};
  for (const std::vector<Item>* items : {&copies, &repacks}) {
    pool_.ParallelFor(static_cast<int64_t>(items->size()), 1, [&](int64_t b, int64_t e, int thread) {
      for (int64_t i = b; i < e; ++i) {
        const Item& it = (*items)[i];
        // Each source leaves the resident set once copied, so a load peaks at about one model
        // in memory, not two (the page cache keeps the file; other readers, such as embedding
        // lookups in a tied head's rows, map their pages in again).
        if (it.copy != nullptr) {
          std::memcpy(it.copy->dst, it.copy->src, it.copy->bytes);
          file_.ReleasePages(it.copy->src, it.copy->bytes);
        } else {
          const WeightView& src = it.repack->src;
          PackTiles16(src, it.tile_begin, it.tile_end, it.repack->dst);
          file_.ReleasePages(static_cast<const uint8_t*>(src.data) +
                                 it.tile_begin * kTileRows * src.row_stride,
                             it.bytes);
        }
        const size_t now = done.fetch_add(it.bytes) + it.bytes;
        const int percent = total == 0 ? 100 : static_cast<int>(100 * now / total);
        if (thread == 0 && percent != shown.exchange(percent)) {
          ReportProgress({.task = "loading", .done = static_cast<int64_t>(now),
                          .total = static_cast<int64_t>(total)});
        }
      }
    });
  }
  if (total > 0) ReportProgress({.task = "loading", .finished = true});
  copies_.clear();
  repacks_.clear();
}

absl::StatusOr<AttentionWeights> BindAttention(TensorBinder& b, const ModelConfig& c,
                                               int64_t l, bool qk_norm) {
  const LayerSpec& s = c.layers[l];
  AttentionWeights w;
  auto q = b.Matrix(LayerTensor(l, "attn_q.weight"));
  if (!q.ok()) return q.status();
  w.wqkv = *q;
  if (s.kv_source < 0) {
    auto k = b.Matrix(LayerTensor(l, "attn_k.weight"));
    if (!k.ok()) return k.status();
    w.wk = *k;
    const std::string v_name = LayerTensor(l, "attn_v.weight");
    // V may be absent where the table allows it (gemma4: V is the K projection).
    if (b.Has(v_name) || !b.Optional(v_name)) {
      auto v = b.Matrix(v_name);
      if (!v.ok()) return v.status();
      w.wv = *v;
    }
    std::optional<WeightView> fused;
    if (w.wv.data != nullptr) {
      fused = b.Fuse({{LayerTensor(l, "attn_q.weight"), w.wqkv},
                      {LayerTensor(l, "attn_k.weight"), w.wk},
                      {v_name, w.wv}});
    }
    if (fused) {
      w.wqkv = *fused;
      w.wk = w.wv = {};
    }
    w.wk = b.Streamed(w.wk);
    w.wv = b.Streamed(w.wv);
  }
  w.wqkv = b.Streamed(w.wqkv);
  auto o = b.Matrix(LayerTensor(l, "attn_output.weight"));
  if (!o.ok()) return o.status();
  w.wo = b.Streamed(*o);
  if (qk_norm) {
    auto qn = b.Vector(LayerTensor(l, "attn_q_norm.weight"));
    if (!qn.ok()) return qn.status();
    w.q_norm = *qn;
    if (s.kv_source < 0) {
      auto kn = b.Vector(LayerTensor(l, "attn_k_norm.weight"));
      if (!kn.ok()) return kn.status();
      w.k_norm = *kn;
    }
  }
  return w;
}

absl::StatusOr<FfnWeights> BindFfn(TensorBinder& b, int64_t l) {
  FfnWeights w;
  auto gate = b.Matrix(LayerTensor(l, "ffn_gate.weight"));
  if (!gate.ok()) return gate.status();
  auto up = b.Matrix(LayerTensor(l, "ffn_up.weight"));
  if (!up.ok()) return up.status();
  auto down = b.Matrix(LayerTensor(l, "ffn_down.weight"));
  if (!down.ok()) return down.status();
  w.down = b.Streamed(*down);
  if (auto fused = b.Fuse({{LayerTensor(l, "ffn_gate.weight"), *gate},
                           {LayerTensor(l, "ffn_up.weight"), *up}})) {
    w.gate_up = b.Streamed(*fused);
  } else {
    w.gate_up = b.Streamed(*gate);
    w.up = b.Streamed(*up);
  }
  return w;
}

absl::StatusOr<ExpertStacks> BindExperts(TensorBinder& b, int64_t l) {
  ExpertStacks e;
  auto gate = b.Matrix(LayerTensor(l, "ffn_gate_exps.weight"));
  if (!gate.ok()) return gate.status();
  auto up = b.Matrix(LayerTensor(l, "ffn_up_exps.weight"));
  if (!up.ok()) return up.status();
  auto down = b.Matrix(LayerTensor(l, "ffn_down_exps.weight"));
  if (!down.ok()) return down.status();
  e.gate = *gate;
  e.up = *up;
  e.down = *down;
  return e;
}

// ---- Forward ----

ForwardContext::ForwardContext(const ModelConfig& config, ThreadPool& pool,
                               ForwardScratch& scratch, ExpertFfn* experts, int64_t first_layer,
                               float* x, int64_t rows, std::span<const KvSegment> segments,
                               const LoraSet* lora)
    : config_(config),
      pool_(pool),
      scratch_(scratch),
      experts_(experts),
      first_(first_layer),
      x_(x),
      rows_(rows),
      segments_(segments),
      lora_(lora != nullptr && !lora->empty() ? lora : nullptr) {
  scratch.positions.resize(rows);
  for (const KvSegment& seg : segments) {
    for (int64_t r = 0; r < seg.count; ++r) scratch.positions[seg.begin + r] = seg.kv->len() + r;
  }
  ++scratch.pass;
}

const RopeTable& ForwardContext::Rope(const RopeParams& p) {
  auto key = std::make_tuple(p.head_dim, p.n_rot, p.freq_base, static_cast<int>(p.mode),
                             p.freq_factors);
  ForwardScratch::Rope& rope = scratch_.ropes[key];
  if (rope.built != scratch_.pass) {
    rope.table.Build(p, scratch_.positions.data(), rows_);
    rope.built = scratch_.pass;
  }
  return rope.table;
}

void AddInPlace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void Attention(ForwardContext& ctx, int64_t layer, const AttentionWeights& w,
               const AttentionOptions& o, const float* h, float* out) {
  const LayerSpec& s = ctx.config().layers[layer];
  ForwardScratch& sc = ctx.scratch();
  ThreadPool& pool = ctx.pool();
  const int64_t rows = ctx.rows();
  const int64_t qd = s.q_dim(), kvd = s.kv_dim(), hd = s.head_dim;
  const bool stores = s.kv_source < 0;
  float* q = ForwardScratch::Grow(sc.q, rows * qd);
  float* k = ForwardScratch::Grow(sc.k, rows * kvd);
  float* v = ForwardScratch::Grow(sc.v, rows * kvd);
  if (!stores) {
    MatMul(w.wqkv, h, rows, q, pool);
  } else if (w.wk.data == nullptr) {  // fused: one matmul, then split the columns.
    float* qkv = ForwardScratch::Grow(sc.qkv, rows * (qd + 2 * kvd));
    MatMul(w.wqkv, h, rows, qkv, pool);
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = qkv + r * (qd + 2 * kvd);
      std::memcpy(q + r * qd, src, qd * sizeof(float));
      std::memcpy(k + r * kvd, src + qd, kvd * sizeof(float));
      std::memcpy(v + r * kvd, src + qd + kvd, kvd * sizeof(float));
    }
  } else {
    MatMul(w.wqkv, h, rows, q, pool);
    MatMul(w.wk, h, rows, k, pool);
    if (w.wv.data != nullptr) {
      MatMul(w.wv, h, rows, v, pool);
    } else {
      std::memcpy(v, k, rows * kvd * sizeof(float));
    }
  }
  if (ctx.lora() != nullptr) {
    ApplyLora(ctx, layer, LoraTarget::kQ, h, q, qd);
    if (stores) {
      ApplyLora(ctx, layer, LoraTarget::kK, h, k, kvd);
      if (w.wk.data == nullptr || w.wv.data != nullptr) {
        ApplyLora(ctx, layer, LoraTarget::kV, h, v, kvd);
      } else {
        std::memcpy(v, k, rows * kvd * sizeof(float));  // V is the (adapted) K projection
      }
    }
  }
  if (w.q_norm != nullptr) RmsNorm(q, w.q_norm, o.eps, rows * s.num_heads, hd, q);
  RopeParams rope;
  rope.head_dim = static_cast<int>(hd);
  rope.n_rot = static_cast<int>(s.rope_dims);
  rope.freq_base = s.rope_base;
  rope.mode = o.rope_mode;
  rope.freq_factors = o.rope_freqs;
  const RopeTable& table = ctx.Rope(rope);
  ApplyRope(table, q, rows, static_cast<int>(s.num_heads));
  if (stores) {
    if (w.k_norm != nullptr) RmsNorm(k, w.k_norm, o.eps, rows * s.num_heads_kv, hd, k);
    if (o.v_norm) RmsNorm(v, nullptr, o.eps, rows * s.num_heads_kv, hd, v);
    ApplyRope(table, k, rows, static_cast<int>(s.num_heads_kv));
  }

  const auto attention_start = std::chrono::steady_clock::now();
  const int64_t cl = ctx.CacheLayer(layer);
  std::span<const KvSegment> segments = ctx.segments();
  if (stores) {
    for (const KvSegment& seg : segments) {
      KvCache& kv = *seg.kv;
      StoreKvRows(kv.key_layout(cl), kv.k(cl), kv.len(), seg.count, k + seg.begin * kvd);
      StoreKvRows(kv.layout(cl), kv.v(cl), kv.len(), seg.count, v + seg.begin * kvd);
    }
  }
  // (segment, kv head) pairs spread over the pool: the query heads sharing a kv head run
  // together, so each K/V tile is read once for all of them.
  float* attn = ForwardScratch::Grow(sc.attn, rows * qd);
  const int64_t kv_heads = s.num_heads_kv;
  const int group = static_cast<int>(s.num_heads / kv_heads);
  pool.ParallelFor(static_cast<int64_t>(segments.size()) * kv_heads, 1,
                   [&](int64_t b, int64_t e, int) {
                     for (int64_t i = b; i < e; ++i) {
                       const KvSegment& seg = segments[i / kv_heads];
                       const int hh = static_cast<int>(i % kv_heads) * group;
                       AttentionArgs args;
                       args.q = q + seg.begin * qd;
                       args.n_q = seg.count;
                       args.pos0 = seg.kv->len();
                       args.window = seg.kv->window(cl);
                       args.num_heads = static_cast<int>(s.num_heads);
                       args.scale = o.scale;
                       args.layout = seg.kv->layout(cl);
                       args.k_tiles16 = seg.kv->key_layout(cl).tiles16;
                       args.k_cache = seg.kv->k(cl);
                       args.v_cache = seg.kv->v(cl);
                       AttentionHeads(args, hh, hh + group, attn + seg.begin * qd);
                     }
                   });
  sc.attention_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - attention_start).count();
  MatMul(w.wo, attn, rows, out, pool);
  ApplyLora(ctx, layer, LoraTarget::kO, attn, out, ctx.config().hidden);
}

void ApplyLora(ForwardContext& ctx, int64_t layer, LoraTarget target, const float* x, float* y,
               int64_t y_stride) {
  if (ctx.lora() == nullptr) return;
  const LoraAdapter* ad = ctx.lora()->Find(layer, target);
  if (ad == nullptr) return;
  ForwardScratch& sc = ctx.scratch();
  const int64_t rows = ctx.rows();
  float* t = ForwardScratch::Grow(sc.lora_t, rows * ad->rank);
  float* d = ForwardScratch::Grow(sc.lora_y, rows * ad->out);
  MatMul(WeightView::Dense(ad->a.data(), GgmlType::kF32, ad->rank, ad->in), x, rows, t,
         ctx.pool());
  MatMul(WeightView::Dense(ad->b.data(), GgmlType::kF32, ad->out, ad->rank), t, rows, d,
         ctx.pool());
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * y_stride;
    const float* dr = d + r * ad->out;
    for (int64_t j = 0; j < ad->out; ++j) yr[j] += ad->scale * dr[j];
  }
}

void GatedFfn(ForwardContext& ctx, int64_t layer, const FfnWeights& w, int64_t ffn,
              Activation act, const float* h, float* out) {
  ForwardScratch& sc = ctx.scratch();
  const int64_t rows = ctx.rows();
  float* a = ForwardScratch::Grow(sc.act, rows * ffn);
  float* gu = ForwardScratch::Grow(sc.gate_up, rows * 2 * ffn);
  if (w.up.data == nullptr) {
    MatMul(w.gate_up, h, rows, gu, ctx.pool());
    ApplyLora(ctx, layer, LoraTarget::kGate, h, gu, 2 * ffn);
    ApplyLora(ctx, layer, LoraTarget::kUp, h, gu + ffn, 2 * ffn);
    if (act == Activation::kSilu) {
      SwiGluFused(gu, a, rows, ffn);
    } else {
      GeGluFused(gu, a, rows, ffn);
    }
  } else {
    float* up = gu + rows * ffn;
    MatMul(w.gate_up, h, rows, gu, ctx.pool());
    MatMul(w.up, h, rows, up, ctx.pool());
    ApplyLora(ctx, layer, LoraTarget::kGate, h, gu, ffn);
    ApplyLora(ctx, layer, LoraTarget::kUp, h, up, ffn);
    if (act == Activation::kSilu) {
      SwiGlu(gu, up, a, rows * ffn);
    } else {
      GeGlu(gu, up, a, rows * ffn);
    }
  }
  MatMul(w.down, a, rows, out, ctx.pool());
  ApplyLora(ctx, layer, LoraTarget::kDown, a, out, ctx.config().hidden);
}

void RouteTopK(float* logits, int64_t rows, int64_t experts, int k, bool renormalize,
               int32_t* ids, float* weights) {
  Softmax(logits, rows, experts, 1.0f, nullptr, 0);
  std::vector<int32_t> order(experts);
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = logits + r * experts;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [p](int32_t a, int32_t b) {
      return p[a] > p[b] || (p[a] == p[b] && a < b);
    });
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += p[order[j]];
    for (int j = 0; j < k; ++j) {
      ids[r * k + j] = order[j];
      weights[r * k + j] = renormalize ? p[order[j]] / sum : p[order[j]];
    }
  }
}

namespace {

// Rows [first, first + rows) of a stack's expert-major matrix.
WeightView RowSlice(const WeightView& stack, int64_t first, int64_t rows) {
  WeightView w = stack;
  w.data = static_cast<const uint8_t*>(stack.data) + first * stack.row_stride;
  w.rows = rows;
  return w;
}

}  // namespace

absl::Status ExpertOutputs(const ExpertStacks& stacks, Activation act, int64_t num_experts,
                           int64_t hidden, int64_t eff, const float* x,
                           std::span<const int32_t> rows, std::span<const int32_t> experts,
                           float* out, ForwardScratch& s, ThreadPool& pool) {
  if (rows.size() != experts.size()) {
    return absl::InvalidArgumentError(absl::StrCat(rows.size(), " pair rows for ",
                                                   experts.size(), " pair experts"));
  }
  // Pairs grouped by expert: each expert's weights are read once per call.
  std::vector<std::vector<int64_t>> by_expert(num_experts);
  for (size_t p = 0; p < experts.size(); ++p) {
    const int32_t e = experts[p];
    if (e < 0 || e >= num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("expert id ", e, " out of range [0, ",
                                                     num_experts, ")"));
    }
    if (rows[p] < 0) return absl::InvalidArgumentError("negative pair row");
    by_expert[e].push_back(static_cast<int64_t>(p));
  }
  const int64_t stride = stacks.fused_gate_up ? 2 * eff : eff;
  for (int64_t e = 0; e < num_experts; ++e) {
    const std::vector<int64_t>& pairs = by_expert[e];
    if (pairs.empty()) continue;
    const int64_t m = static_cast<int64_t>(pairs.size());
    float* xs = ForwardScratch::Grow(s.expert_x, m * hidden);
    float* gate = ForwardScratch::Grow(s.expert_gate, m * eff);
    float* up = ForwardScratch::Grow(s.expert_up, m * eff);
    float* ys = ForwardScratch::Grow(s.expert_y, m * hidden);
    for (int64_t r = 0; r < m; ++r) {
      std::memcpy(xs + r * hidden, x + rows[pairs[r]] * hidden, hidden * sizeof(float));
    }
    MatMul(RowSlice(stacks.gate, e * stride, eff), xs, m, gate, pool);
    if (stacks.fused_gate_up) {
      MatMul(RowSlice(stacks.gate, e * stride + eff, eff), xs, m, up, pool);
    } else {
      MatMul(RowSlice(stacks.up, e * eff, eff), xs, m, up, pool);
    }
    if (act == Activation::kSilu) {
      SwiGlu(gate, up, gate, m * eff);
    } else {
      GeGlu(gate, up, gate, m * eff);
    }
    MatMul(RowSlice(stacks.down, e * hidden, hidden), gate, m, ys, pool);
    const float scale = stacks.down_scale != nullptr ? stacks.down_scale[e] : 1.0f;
    for (int64_t r = 0; r < m; ++r) {
      float* o = out + pairs[r] * hidden;
      std::memcpy(o, ys + r * hidden, hidden * sizeof(float));
      if (scale != 1.0f) {
        for (int64_t d = 0; d < hidden; ++d) o[d] *= scale;
      }
    }
  }
  return absl::OkStatus();
}

void WeightedExpertSum(const float* slots, const float* weights, int64_t n, int k,
                       int64_t hidden, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    float* o = out + i * hidden;
    std::fill(o, o + hidden, 0.0f);
    for (int j = 0; j < k; ++j) {
      const float w = weights[i * k + j];
      const float* s = slots + (i * k + j) * hidden;
      for (int64_t d = 0; d < hidden; ++d) o[d] += w * s[d];
    }
  }
}

}  // namespace fucina
