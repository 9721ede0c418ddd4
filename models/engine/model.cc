#include "models/engine/model.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/activations.h"
#include "kernels/attention.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/softmax.h"
#include "kernels/type_traits.h"
#include "models/engine/registry.h"

namespace fucina {

// One transformer block's weights. Matrices are [rows = out features, cols = in features].
struct Model::Layer {
  const float* attn_norm = nullptr;  // [hidden]
  WeightView wqkv;                   // [q_dim + 2 kv_dim, hidden] (fused or q only)
  WeightView wk, wv;                 // set when q/k/v could not be fused (mixed dtypes)
  WeightView wo;                     // [hidden, q_dim]
  const float* q_norm = nullptr;     // [head_dim] (qwen3)
  const float* k_norm = nullptr;     // [head_dim]
  const float* ffn_norm = nullptr;   // [hidden]
  WeightView w_gate_up;              // [2 ffn, hidden] (fused or gate only)
  WeightView w_up;                   // set when gate/up could not be fused
  WeightView w_down;                 // [hidden, ffn]
  WeightView router;                 // [num_experts, hidden] (MoE)
  ExpertStacks experts;              // (MoE)
};

// Per-forward scratch, grown on demand and reused (decode runs it every token).
struct Model::Scratch {
  std::vector<float> h, qkv, q, k, v, attn, tmp, gate_up, act, router, expert_w;
  std::vector<float> expert_x, expert_gate, expert_up, expert_y;  // ExpertOutputs
  std::vector<int32_t> expert_ids;
  std::vector<int64_t> positions;
  RopeTable rope;

  static float* Grow(std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    return v.data();
  }
};

// Experts computed in this process from the stacks borrowed from the file.
class Model::LocalExpertsFfn : public ExpertFfn {
 public:
  explicit LocalExpertsFfn(Model& model) : model_(model) {}

  absl::Status Forward(int64_t layer, const float* x, int64_t n, const int32_t* experts,
                       const float* weights, int k, float* out) override {
    // Each (token, slot) result lands in its own row so the weighted sum runs in slot order
    // whatever order the experts are computed in: decode and prefill, local and remote
    // experts all add the same numbers in the same order.
    const int64_t hidden = model_.config_.hidden;
    rows_.resize(n * k);
    for (int64_t i = 0; i < n * k; ++i) rows_[i] = static_cast<int32_t>(i / k);
    slots_.resize(n * k * hidden);
    absl::Status s = model_.ExpertOutputs(layer, x, rows_, {experts, static_cast<size_t>(n * k)},
                                          slots_.data());
    if (!s.ok()) return s;
    WeightedExpertSum(slots_.data(), weights, n, k, hidden, out);
    return absl::OkStatus();
  }

 private:
  Model& model_;
  std::vector<int32_t> rows_;
  std::vector<float> slots_;
};

namespace {

// Expert e's matrix: rows [e * rows, (e + 1) * rows) of the stack.
WeightView ExpertSlice(const WeightView& stack, int64_t e, int64_t rows) {
  WeightView w = stack;
  w.data = static_cast<const uint8_t*>(stack.data) + e * rows * stack.row_stride;
  w.rows = rows;
  return w;
}

}  // namespace

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

absl::Status Model::ExpertOutputs(int64_t layer, const float* x, std::span<const int32_t> rows,
                                  std::span<const int32_t> experts, float* out) {
  const ExpertStacks* stacks = LocalExperts(layer);
  if (stacks == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("layer ", layer, " has no local experts"));
  }
  if (rows.size() != experts.size()) {
    return absl::InvalidArgumentError(absl::StrCat(rows.size(), " pair rows for ",
                                                   experts.size(), " pair experts"));
  }
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden, eff = c.expert_ffn;
  // Pairs grouped by expert: each expert's weights are read once per call.
  std::vector<std::vector<int64_t>> by_expert(c.num_experts);
  for (size_t p = 0; p < experts.size(); ++p) {
    const int32_t e = experts[p];
    if (e < 0 || e >= c.num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("expert id ", e, " out of range [0, ",
                                                     c.num_experts, ")"));
    }
    if (rows[p] < 0) return absl::InvalidArgumentError("negative pair row");
    by_expert[e].push_back(static_cast<int64_t>(p));
  }
  Scratch& s = *scratch_;
  for (int64_t e = 0; e < c.num_experts; ++e) {
    const std::vector<int64_t>& pairs = by_expert[e];
    if (pairs.empty()) continue;
    const int64_t m = static_cast<int64_t>(pairs.size());
    float* xs = Scratch::Grow(s.expert_x, m * hidden);
    float* gate = Scratch::Grow(s.expert_gate, m * eff);
    float* up = Scratch::Grow(s.expert_up, m * eff);
    float* ys = Scratch::Grow(s.expert_y, m * hidden);
    for (int64_t r = 0; r < m; ++r) {
      std::memcpy(xs + r * hidden, x + rows[pairs[r]] * hidden, hidden * sizeof(float));
    }
    MatMul(ExpertSlice(stacks->gate, e, eff), xs, m, gate, *pool_);
    MatMul(ExpertSlice(stacks->up, e, eff), xs, m, up, *pool_);
    SwiGlu(gate, up, gate, m * eff);
    MatMul(ExpertSlice(stacks->down, e, hidden), gate, m, ys, *pool_);
    for (int64_t r = 0; r < m; ++r) {
      std::memcpy(out + pairs[r] * hidden, ys + r * hidden, hidden * sizeof(float));
    }
  }
  return absl::OkStatus();
}

Model::Model() : scratch_(std::make_unique<Scratch>()) {}
Model::~Model() = default;

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path,
                                                   const LoadOptions& options, ThreadPool& pool) {
  auto file = gguf::File::Open(path);
  if (!file.ok()) return file.status();
  return FromFile(*std::move(file), options, pool);
}

absl::StatusOr<std::unique_ptr<Model>> Model::FromFile(std::unique_ptr<gguf::File> file,
                                                       const LoadOptions& options,
                                                       ThreadPool& pool) {
  auto config = ReadModelConfig(*file);
  if (!config.ok()) return config.status();
  std::unique_ptr<Model> model(new Model());
  model->file_ = std::move(file);
  model->config_ = *std::move(config);
  model->pool_ = &pool;
  if (absl::Status s = model->Bind(options); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(model->file_->path(), ": ", s.message()));
  }
  return model;
}

namespace {

// A tensor as a matrix [rows = dims[1..] product, cols = dims[0]], checked against the
// expected shape; errors name the tensor.
absl::StatusOr<WeightView> Matrix(const gguf::File& f, const std::string& name, int64_t rows,
                                  int64_t cols) {
  const gguf::TensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor ", name, " is missing"));
  if (t->dims[0] != cols || t->num_elements() != rows * cols) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has shape [", t->dims[0],
                                                   " x ", t->num_elements() / t->dims[0],
                                                   "], expected [", cols, " x ", rows, "]"));
  }
  if (!HasMatVec(t->type)) {
    return absl::UnimplementedError(absl::StrCat("tensor ", name, ": no CPU kernel for type ",
                                                 std::string(TypeName(t->type))));
  }
  return WeightView::Dense(t->data, t->type, rows, cols);
}

// Runs the load-time copies on the pool; on a terminal, a progress bar on stderr.
template <typename Copy>
void CopyWithProgress(const std::vector<Copy>& copies, ThreadPool& pool) {
  const bool tty = isatty(STDERR_FILENO);
  size_t total = 0;
  for (const Copy& c : copies) total += c.bytes;
  std::atomic<size_t> done{0};
  std::atomic<int> shown{-1};
  pool.ParallelFor(static_cast<int64_t>(copies.size()), 1, [&](int64_t b, int64_t e, int thread) {
    for (int64_t i = b; i < e; ++i) {
      std::memcpy(copies[i].dst, copies[i].src, copies[i].bytes);
      const size_t now = done.fetch_add(copies[i].bytes) + copies[i].bytes;
      const int percent = total == 0 ? 100 : static_cast<int>(100 * now / total);
      if (tty && thread == 0 && percent != shown.exchange(percent)) {
        std::fprintf(stderr, "\rloading [%-40.*s] %3d%%", percent * 40 / 100,
                     "########################################", percent);
      }
    }
  });
  if (tty && !copies.empty()) std::fprintf(stderr, "\r%*s\r", 60, "");
}

absl::StatusOr<const float*> Vector(const gguf::File& f, const std::string& name, int64_t n) {
  const gguf::TensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor ", name, " is missing"));
  if (t->type != GgmlType::kF32 || t->num_elements() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " must be f32 with ", n, " values"));
  }
  return reinterpret_cast<const float*>(t->data);
}

absl::StatusOr<ExpertStacks> ExpertStacksOf(const gguf::File& f, const std::string& b,
                                            const ModelConfig& c) {
  ExpertStacks e;
  auto gate = Matrix(f, b + "ffn_gate_exps.weight", c.num_experts * c.expert_ffn, c.hidden);
  if (!gate.ok()) return gate.status();
  auto up = Matrix(f, b + "ffn_up_exps.weight", c.num_experts * c.expert_ffn, c.hidden);
  if (!up.ok()) return up.status();
  auto down = Matrix(f, b + "ffn_down_exps.weight", c.num_experts * c.hidden, c.expert_ffn);
  if (!down.ok()) return down.status();
  return ExpertStacks{*gate, *up, *down};
}

}  // namespace

std::vector<std::string> ShardTensorNames(const gguf::File& file, const LoadOptions& options) {
  const bool tied = file.FindTensor("output.weight") == nullptr;
  const bool embeddings = options.embeddings && !options.experts_only;
  const bool head = options.head && !options.experts_only;
  std::vector<std::string> names;
  for (const gguf::TensorInfo& t : file.tensors()) {
    const std::string_view name = t.name;
    bool needed = true;
    if (name.starts_with("blk.")) {
      // "blk.<layer>.<rest>"
      const size_t dot = name.find('.', 4);
      int64_t layer = -1;
      if (dot != std::string_view::npos &&
          !absl::SimpleAtoi(absl::string_view(name.data() + 4, dot - 4), &layer)) {
        layer = -1;
      }
      needed = layer >= options.first_layer &&
               (options.last_layer < 0 || layer < options.last_layer) &&
               (!options.experts_only || name.find("_exps.") != std::string_view::npos);
    } else if (name == "token_embd.weight") {
      needed = embeddings || (head && tied);
    } else if (name == "output.weight" || name == "output_norm.weight") {
      needed = head;
    }
    if (needed) names.push_back(t.name);
  }
  return names;
}

absl::Status Model::Bind(const LoadOptions& options) {
  const ModelConfig& c = config_;
  const gguf::File& f = *file_;
  first_ = options.first_layer;
  experts_only_ = options.experts_only;
  last_ = options.last_layer < 0 ? c.num_layers : options.last_layer;
  if (first_ < 0 || first_ > last_ || last_ > c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", first_, ", ", last_,
                                                   ") is outside [0, ", c.num_layers, ")"));
  }
#define FUCINA_BIND(lhs, expr)               \
  {                                          \
    auto bound = (expr);                     \
    if (!bound.ok()) return bound.status();  \
    lhs = *bound;                            \
  }
  if (options.experts_only && !c.IsMoe()) {
    return absl::InvalidArgumentError("an experts-only shard needs a MoE model");
  }
  const bool tied = f.FindTensor("output.weight") == nullptr;
  const bool embeddings = options.embeddings && !options.experts_only;
  const bool head = options.head && !options.experts_only;
  if (embeddings || (head && tied)) {
    FUCINA_BIND(embed_, Matrix(f, "token_embd.weight", c.vocab_size, c.hidden));
    if (!embeddings) embed_ = {};
  }
  if (head) {
    FUCINA_BIND(output_norm_, Vector(f, "output_norm.weight", c.hidden));
    FUCINA_BIND(head_, Matrix(f, tied ? "token_embd.weight" : "output.weight", c.vocab_size,
                              c.hidden));
  }
  if (f.FindTensor("rope_freqs.weight") != nullptr) {
    FUCINA_BIND(rope_freqs_, Vector(f, "rope_freqs.weight", c.rope_dims / 2));
  }

  // Fuses row blocks of same-typed matrices into one owned matrix (rows concatenated).
  // Fuses row blocks of same-typed matrices into one owned matrix (rows concatenated). The
  // copies (which also fault the mapping in) run afterwards, in parallel.
  struct Copy {
    uint8_t* dst;
    const void* src;
    size_t bytes;
  };
  std::vector<Copy> copies;
  auto fuse = [&](std::initializer_list<WeightView> parts) -> std::optional<WeightView> {
    const WeightView& p0 = *parts.begin();
    int64_t rows = 0;
    for (const WeightView& p : parts) {
      if (p.type != p0.type || p.cols != p0.cols) return std::nullopt;
      rows += p.rows;
    }
    std::unique_ptr<uint8_t[]> buf(new uint8_t[rows * p0.row_stride]);
    size_t offset = 0;
    for (const WeightView& p : parts) {
      copies.push_back({buf.get() + offset, p.data, p.rows * p.row_stride});
      offset += p.rows * p.row_stride;
    }
    WeightView fused = WeightView::Dense(buf.get(), p0.type, rows, p0.cols);
    fused_.push_back(std::move(buf));
    return fused;
  };

  layers_.resize(last_ - first_);
  for (int64_t l = first_; l < last_; ++l) {
    Layer& L = layers_[l - first_];
    const std::string b = absl::StrCat("blk.", l, ".");
    if (options.experts_only) {
      FUCINA_BIND(L.experts, ExpertStacksOf(f, b, c));
      continue;
    }
    WeightView wq;
    FUCINA_BIND(L.attn_norm, Vector(f, b + "attn_norm.weight", c.hidden));
    FUCINA_BIND(wq, Matrix(f, b + "attn_q.weight", c.q_dim(), c.hidden));
    FUCINA_BIND(L.wk, Matrix(f, b + "attn_k.weight", c.kv_dim(), c.hidden));
    FUCINA_BIND(L.wv, Matrix(f, b + "attn_v.weight", c.kv_dim(), c.hidden));
    if (auto fused = fuse({wq, L.wk, L.wv})) {
      L.wqkv = *fused;
      L.wk = L.wv = {};
    } else {
      L.wqkv = wq;
    }
    FUCINA_BIND(L.wo, Matrix(f, b + "attn_output.weight", c.hidden, c.q_dim()));
    if (c.qk_norm) {
      FUCINA_BIND(L.q_norm, Vector(f, b + "attn_q_norm.weight", c.head_dim));
      FUCINA_BIND(L.k_norm, Vector(f, b + "attn_k_norm.weight", c.head_dim));
    }
    FUCINA_BIND(L.ffn_norm, Vector(f, b + "ffn_norm.weight", c.hidden));
    if (c.IsMoe()) {
      FUCINA_BIND(L.router, Matrix(f, b + "ffn_gate_inp.weight", c.num_experts, c.hidden));
      FUCINA_BIND(L.experts, ExpertStacksOf(f, b, c));
    } else {
      WeightView gate;
      FUCINA_BIND(gate, Matrix(f, b + "ffn_gate.weight", c.ffn, c.hidden));
      FUCINA_BIND(L.w_up, Matrix(f, b + "ffn_up.weight", c.ffn, c.hidden));
      FUCINA_BIND(L.w_down, Matrix(f, b + "ffn_down.weight", c.hidden, c.ffn));
      if (auto fused = fuse({gate, L.w_up})) {
        L.w_gate_up = *fused;
        L.w_up = {};
      } else {
        L.w_gate_up = gate;
      }
    }
  }
#undef FUCINA_BIND
  CopyWithProgress(copies, *pool_);
  local_experts_ = std::make_unique<LocalExpertsFfn>(*this);
  experts_ = local_experts_.get();
  return absl::OkStatus();
}

const ExpertStacks* Model::LocalExperts(int64_t layer) const {
  if (!config_.IsMoe() || layer < first_ || layer >= last_) return nullptr;
  return &layers_[layer - first_].experts;
}

ExpertFfn& Model::LocalExpertFfn() { return *local_experts_; }

absl::StatusOr<std::unique_ptr<KvCache>> Model::NewKvCache(int64_t capacity,
                                                           GgmlType type) const {
  return KvCache::Create(last_ - first_, static_cast<int>(config_.num_heads_kv),
                         static_cast<int>(config_.head_dim), type, capacity);
}

absl::Status Model::Embed(std::span<const int32_t> tokens, float* out) const {
  if (!has_embeddings()) return absl::FailedPreconditionError("this shard has no embeddings");
  const CpuTypeTraits* traits = GetCpuTraits(embed_.type);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[i], " at index ", i,
                                                     " is outside the vocabulary [0, ",
                                                     config_.vocab_size, ")"));
    }
    traits->to_float(static_cast<const uint8_t*>(embed_.data) + tokens[i] * embed_.row_stride,
                     out + i * config_.hidden, config_.hidden);
  }
  return absl::OkStatus();
}

void Model::AttentionBlock(const Layer& L, int64_t li, float* x, int64_t rows,
                           std::span<const Segment> segments) {
  const ModelConfig& c = config_;
  Scratch& s = *scratch_;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  float* h = Scratch::Grow(s.h, rows * c.hidden);
  RmsNorm(x, L.attn_norm, c.rms_eps, rows, c.hidden, h);

  float* q = Scratch::Grow(s.q, rows * qd);
  float* k = Scratch::Grow(s.k, rows * kvd);
  float* v = Scratch::Grow(s.v, rows * kvd);
  if (L.wk.data == nullptr) {  // fused: one matmul, then split the columns.
    float* qkv = Scratch::Grow(s.qkv, rows * (qd + 2 * kvd));
    MatMul(L.wqkv, h, rows, qkv, *pool_);
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = qkv + r * (qd + 2 * kvd);
      std::memcpy(q + r * qd, src, qd * sizeof(float));
      std::memcpy(k + r * kvd, src + qd, kvd * sizeof(float));
      std::memcpy(v + r * kvd, src + qd + kvd, kvd * sizeof(float));
    }
  } else {
    MatMul(L.wqkv, h, rows, q, *pool_);
    MatMul(L.wk, h, rows, k, *pool_);
    MatMul(L.wv, h, rows, v, *pool_);
  }
  if (c.qk_norm) {
    RmsNorm(q, L.q_norm, c.rms_eps, rows * c.num_heads, c.head_dim, q);
    RmsNorm(k, L.k_norm, c.rms_eps, rows * c.num_heads_kv, c.head_dim, k);
  }
  ApplyRope(s.rope, q, rows, static_cast<int>(c.num_heads));
  ApplyRope(s.rope, k, rows, static_cast<int>(c.num_heads_kv));

  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  float* attn = Scratch::Grow(s.attn, rows * qd);
  for (const Segment& seg : segments) {
    KvCache& kv = *seg.kv;
    StoreKvRows(kv.layout(), kv.k(li), kv.len(), seg.count, k + seg.begin * kvd);
    StoreKvRows(kv.layout(), kv.v(li), kv.len(), seg.count, v + seg.begin * kvd);
  }
  // (segment, kv head) pairs spread over the pool: the query heads sharing a kv head run
  // together, so each K/V tile is read once for all of them.
  const int64_t heads = c.num_heads;
  const int64_t kv_heads = c.num_heads_kv;
  const int group = static_cast<int>(heads / kv_heads);
  pool_->ParallelFor(static_cast<int64_t>(segments.size()) * kv_heads, 1,
                     [&](int64_t b, int64_t e, int) {
                       for (int64_t i = b; i < e; ++i) {
                         const Segment& seg = segments[i / kv_heads];
                         const int hd = static_cast<int>(i % kv_heads) * group;
                         AttentionArgs args;
                         args.q = q + seg.begin * qd;
                         args.n_q = seg.count;
                         args.pos0 = seg.kv->len();
                         args.num_heads = static_cast<int>(heads);
                         args.scale = scale;
                         args.layout = seg.kv->layout();
                         args.k_cache = seg.kv->k(li);
                         args.v_cache = seg.kv->v(li);
                         AttentionHeads(args, hd, hd + group, attn + seg.begin * qd);
                       }
                     });
  float* o = Scratch::Grow(s.tmp, rows * c.hidden);
  MatMul(L.wo, attn, rows, o, *pool_);
  for (int64_t i = 0; i < rows * c.hidden; ++i) x[i] += o[i];
}

absl::Status Model::FfnBlock(const Layer& L, int64_t li, float* x, int64_t rows) {
  const ModelConfig& c = config_;
  Scratch& s = *scratch_;
  float* h = Scratch::Grow(s.h, rows * c.hidden);
  RmsNorm(x, L.ffn_norm, c.rms_eps, rows, c.hidden, h);
  float* out = Scratch::Grow(s.tmp, rows * c.hidden);
  if (!c.IsMoe()) {
    float* act = Scratch::Grow(s.act, rows * c.ffn);
    if (L.w_up.data == nullptr) {
      float* gu = Scratch::Grow(s.gate_up, rows * 2 * c.ffn);
      MatMul(L.w_gate_up, h, rows, gu, *pool_);
      SwiGluFused(gu, act, rows, c.ffn);
    } else {
      float* gate = Scratch::Grow(s.gate_up, rows * 2 * c.ffn);
      float* up = gate + rows * c.ffn;
      MatMul(L.w_gate_up, h, rows, gate, *pool_);
      MatMul(L.w_up, h, rows, up, *pool_);
      SwiGlu(gate, up, act, rows * c.ffn);
    }
    MatMul(L.w_down, act, rows, out, *pool_);
  } else {
    // Router: softmax over all experts, keep the top k (ties -> lower id), renormalise.
    const int k = static_cast<int>(c.num_experts_used);
    float* probs = Scratch::Grow(s.router, rows * c.num_experts);
    MatMul(L.router, h, rows, probs, *pool_);
    Softmax(probs, rows, c.num_experts, 1.0f, nullptr, 0);
    s.expert_ids.resize(rows * k);
    float* weights = Scratch::Grow(s.expert_w, rows * k);
    std::vector<int32_t> order(c.num_experts);
    for (int64_t r = 0; r < rows; ++r) {
      const float* p = probs + r * c.num_experts;
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
      float sum = 0;
      for (int j = 0; j < k; ++j) sum += p[order[j]];
      for (int j = 0; j < k; ++j) {
        s.expert_ids[r * k + j] = order[j];
        weights[r * k + j] = c.norm_topk_prob ? p[order[j]] / sum : p[order[j]];
      }
    }
    // h (scratch h) and out (scratch tmp) are distinct buffers the expert FFN never touches
    // otherwise, so the normalised rows are passed as they are.
    absl::Status st = experts_->Forward(li + first_, h, rows, s.expert_ids.data(),
                                        weights, k, out);
    if (!st.ok()) return st;
  }
  for (int64_t i = 0; i < rows * c.hidden; ++i) x[i] += out[i];
  return absl::OkStatus();
}

absl::Status Model::ForwardLayers(float* x, int64_t rows, std::span<const Segment> segments) {
  if (experts_only_) {
    return absl::FailedPreconditionError("an experts-only shard has no forward pass");
  }
  // Validate the KV contract for every segment before touching any cache.
  int64_t covered = 0;
  for (const Segment& seg : segments) {
    if (seg.kv == nullptr || seg.count <= 0 || seg.begin != covered) {
      return absl::InvalidArgumentError("segments must tile the rows in order, non-empty");
    }
    if (seg.kv->num_layers() != last_ - first_ ||
        seg.kv->layout().num_heads_kv != config_.num_heads_kv ||
        seg.kv->layout().head_dim != config_.head_dim) {
      return absl::InvalidArgumentError("KV cache geometry does not match this model shard");
    }
    if (seg.kv->len() + seg.count > seg.kv->capacity()) {
      return absl::OutOfRangeError(absl::StrCat("KV cache overflow: ", seg.kv->len(), " + ",
                                                seg.count, " positions exceed capacity ",
                                                seg.kv->capacity()));
    }
    covered += seg.count;
  }
  if (covered != rows) return absl::InvalidArgumentError("segments do not cover every row");
  for (size_t i = 0; i < segments.size(); ++i) {
    for (size_t j = i + 1; j < segments.size(); ++j) {
      if (segments[i].kv == segments[j].kv) {
        return absl::InvalidArgumentError("two segments share one KV cache");
      }
    }
  }

  // Positions of every row, shared by all layers (one RoPE table per forward).
  Scratch& s = *scratch_;
  s.positions.resize(rows);
  for (const Segment& seg : segments) {
    for (int64_t r = 0; r < seg.count; ++r) s.positions[seg.begin + r] = seg.kv->len() + r;
  }
  RopeParams rope;
  rope.head_dim = static_cast<int>(config_.head_dim);
  rope.n_rot = static_cast<int>(config_.rope_dims);
  rope.freq_base = config_.rope_base;
  rope.mode = config_.rope_mode;
  rope.freq_factors = rope_freqs_;
  s.rope.Build(rope, s.positions.data(), rows);

  for (int64_t l = first_; l < last_; ++l) {
    const Layer& L = layers_[l - first_];
    AttentionBlock(L, l - first_, x, rows, segments);
    if (absl::Status st = FfnBlock(L, l - first_, x, rows); !st.ok()) return st;
  }
  for (const Segment& seg : segments) seg.kv->Advance(seg.count);
  return absl::OkStatus();
}

absl::Status Model::Head(const float* x, int64_t rows, float* logits) {
  if (!has_head()) return absl::FailedPreconditionError("this shard has no output head");
  float* h = Scratch::Grow(scratch_->h, rows * config_.hidden);
  RmsNorm(x, output_norm_, config_.rms_eps, rows, config_.hidden, h);
  MatMul(head_, h, rows, logits, *pool_);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Model::RunFull(std::span<KvCache* const> caches,
                                                  std::span<const int32_t> tokens,
                                                  std::span<const int64_t> counts,
                                                  bool all_logits) {
  if (!is_full()) return absl::FailedPreconditionError("model holds only a shard");
  if (tokens.empty()) return absl::InvalidArgumentError("empty token sequence");
  const int64_t rows = static_cast<int64_t>(tokens.size());
  std::vector<float> x(rows * config_.hidden);
  if (absl::Status s = Embed(tokens, x.data()); !s.ok()) return s;
  std::vector<Segment> segments;
  int64_t begin = 0;
  for (size_t i = 0; i < caches.size(); ++i) {
    segments.push_back({caches[i], begin, counts[i]});
    begin += counts[i];
  }
  if (absl::Status s = ForwardLayers(x.data(), rows, segments); !s.ok()) return s;
  // Logits of every row, or of each segment's last row.
  std::vector<float> h;
  const float* head_in = x.data();
  int64_t head_rows = rows;
  if (!all_logits) {
    h.resize(segments.size() * config_.hidden);
    for (size_t i = 0; i < segments.size(); ++i) {
      const int64_t last = segments[i].begin + segments[i].count - 1;
      std::memcpy(&h[i * config_.hidden], &x[last * config_.hidden],
                  config_.hidden * sizeof(float));
    }
    head_in = h.data();
    head_rows = static_cast<int64_t>(segments.size());
  }
  std::vector<float> logits(head_rows * config_.vocab_size);
  if (absl::Status s = Head(head_in, head_rows, logits.data()); !s.ok()) return s;
  return logits;
}

absl::StatusOr<std::vector<float>> Model::RunOne(KvCache& kv, std::span<const int32_t> tokens,
                                                 int64_t pos0, bool all_logits) {
  if (pos0 != kv.len()) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward step at position ", pos0, " but the KV cache holds ", kv.len()));
  }
  KvCache* caches[] = {&kv};
  const int64_t counts[] = {static_cast<int64_t>(tokens.size())};
  return RunFull(caches, tokens, counts, all_logits);
}

absl::StatusOr<std::vector<float>> Model::ForwardStep(KvCache& kv,
                                                      std::span<const int32_t> tokens,
                                                      int64_t pos0) {
  return RunOne(kv, tokens, pos0, /*all_logits=*/false);
}

absl::StatusOr<std::vector<float>> Model::ForwardStepAllLogits(KvCache& kv,
                                                               std::span<const int32_t> tokens,
                                                               int64_t pos0) {
  return RunOne(kv, tokens, pos0, /*all_logits=*/true);
}

absl::StatusOr<std::vector<float>> Model::ForwardStepBatch(std::span<KvCache* const> caches,
                                                           std::span<const int32_t> tokens) {
  if (caches.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(caches.size(), " caches for ",
                                                   tokens.size(), " tokens"));
  }
  std::vector<int64_t> counts(caches.size(), 1);
  return RunFull(caches, tokens, counts, false);
}

absl::StatusOr<std::vector<float>> Model::ForwardLastLogits(std::span<const int32_t> tokens) {
  if (tokens.empty()) return absl::InvalidArgumentError("empty token sequence");
  auto kv = NewKvCache(static_cast<int64_t>(tokens.size()), GgmlType::kF32);
  if (!kv.ok()) return kv.status();
  return ForwardStep(**kv, tokens, 0);
}

absl::StatusOr<std::vector<int32_t>> Model::Generate(KvCache& kv,
                                                     std::span<const int32_t> prompt,
                                                     int64_t max_new_tokens,
                                                     std::optional<int32_t> stop_token) {
  kv.Clear();
  std::vector<int32_t> out;
  auto logits = ForwardStep(kv, prompt, 0);
  while (logits.ok() && static_cast<int64_t>(out.size()) < max_new_tokens) {
    const int32_t next = static_cast<int32_t>(
        std::max_element(logits->begin(), logits->end()) - logits->begin());
    out.push_back(next);
    if (stop_token && next == *stop_token) break;
    if (static_cast<int64_t>(out.size()) == max_new_tokens) break;
    const int32_t step[] = {next};
    logits = ForwardStep(kv, step, kv.len());
  }
  if (!logits.ok()) return logits.status();
  return out;
}

}  // namespace fucina
