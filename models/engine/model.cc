#include "models/engine/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/norm.h"
#include "kernels/type_traits.h"
#include "models/engine/registry.h"
#include "models/gguf/writer.h"
#include "models/sampler/rng.h"

namespace fucina {

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

absl::Status Model::ExpertOutputs(int64_t layer, const float* x, std::span<const int32_t> rows,
                                  std::span<const int32_t> experts, float* out) {
  const ExpertStacks* stacks = LocalExperts(layer);
  if (stacks == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("layer ", layer, " has no local experts"));
  }
  const ModelConfig& c = config_;
  return fucina::ExpertOutputs(*stacks, forward_->ExpertActivation(), c.num_experts, c.hidden,
                               c.expert_ffn, x, rows, experts, out, *scratch_, *pool_);
}

Model::Model() : scratch_(std::make_unique<ForwardScratch>()) {}
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
  auto family = FindModelFamily(config->arch);
  if (!family.ok()) return family.status();
  std::unique_ptr<Model> model(new Model());
  model->file_ = std::move(file);
  model->config_ = *std::move(config);
  model->family_ = *family;
  model->pool_ = &pool;
  if (absl::Status s = model->Bind(options); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(model->file_->path(), ": ", s.message()));
  }
  return model;
}

absl::StatusOr<TensorTable> ModelTensorTable(const gguf::File& file) {
  auto config = ReadModelConfig(file);
  if (!config.ok()) return config.status();
  auto family = FindModelFamily(config->arch);
  if (!family.ok()) return family.status();
  return (*family)->tensors(*config);
}

absl::StatusOr<std::vector<std::string>> ShardTensorNames(const gguf::File& file,
                                                          const LoadOptions& options) {
  auto table = ModelTensorTable(file);
  if (!table.ok()) return table.status();
  const bool tied = file.FindTensor("output.weight") == nullptr;
  const bool embeddings = options.embeddings && !options.experts_only;
  const bool head = options.head && !options.experts_only;
  std::vector<std::string> names;
  for (const TensorSpec& t : *table) {
    if (file.FindTensor(t.name) == nullptr) continue;  // optional and absent
    bool needed = false;
    switch (t.part) {
      case TensorPart::kEmbedding:
        needed = embeddings || (head && tied && t.name == "token_embd.weight");
        break;
      case TensorPart::kHead:
        needed = head;
        break;
      case TensorPart::kGlobal:
        needed = !options.experts_only;
        break;
      case TensorPart::kLayer:
      case TensorPart::kExperts:
        needed = t.layer >= options.first_layer &&
                 (options.last_layer < 0 || t.layer < options.last_layer) &&
                 (!options.experts_only || t.part == TensorPart::kExperts);
        break;
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
  if (options.experts_only && !c.IsMoe()) {
    return absl::InvalidArgumentError("an experts-only shard needs a MoE model");
  }
  if (!options.experts_only && (!c.CanSplitAt(first_) || !c.CanSplitAt(last_))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer range [", first_, ", ", last_, ") splits ", c.arch, " where it cannot be split: ",
        c.per_layer_input > 0 ? "a model with per-layer embeddings runs in one stage"
                              : "a layer would be apart from the layer whose K/V it reads"));
  }
  table_ = family_->tensors(c);
  forward_ = family_->create(c, f);
  TensorBinder binder(f, table_, *pool_, options.f32_tensors);
  const bool tied = f.FindTensor("output.weight") == nullptr;
  const bool embeddings = options.embeddings && !options.experts_only;
  const bool head = options.head && !options.experts_only;
#define FUCINA_BIND(lhs, expr)               \
  {                                          \
    auto bound = (expr);                     \
    if (!bound.ok()) return bound.status();  \
    lhs = *bound;                            \
  }
  if (embeddings || (head && tied)) {
    FUCINA_BIND(embed_, binder.Matrix("token_embd.weight"));
    if (!embeddings) embed_ = {};
  }
  if (head) {
    FUCINA_BIND(output_norm_, binder.Vector("output_norm.weight"));
    FUCINA_BIND(head_, binder.Matrix(tied ? "token_embd.weight" : "output.weight"));
    // Tied: the head gets its own copy; lookups keep reading the mapping's rows.
    head_ = binder.Streamed(head_);
  }
#undef FUCINA_BIND
  LoadOptions resolved = options;
  resolved.last_layer = last_;
  if (absl::Status s = forward_->Bind(binder, resolved); !s.ok()) return s;
  binder.Finish();
  owned_ = binder.TakeOwned();
  parameters_ = binder.TakeParameters();
  local_experts_ = std::make_unique<LocalExpertsFfn>(*this);
  experts_ = local_experts_.get();
  return absl::OkStatus();
}

const ExpertStacks* Model::LocalExperts(int64_t layer) const {
  if (!config_.IsMoe() || layer < first_ || layer >= last_) return nullptr;
  return forward_->Experts(layer);
}

void Model::VisitParameters(const ParameterVisitor& visit) const {
  for (const Parameter& p : parameters_) visit(p);
  lora_.ForEach([&](int64_t layer, LoraTarget t, const LoraAdapter& ad) {
    const std::string base = LoraTensorName(layer, t);
    // GGUF order: lora_a is [in, rank] (rows of `in` values), lora_b [rank, out].
    visit({base + ".lora_a", {ad.in, ad.rank},
           {{WeightView::Dense(ad.a.data(), GgmlType::kF32, ad.rank, ad.in), true}}});
    visit({base + ".lora_b", {ad.rank, ad.out},
           {{WeightView::Dense(ad.b.data(), GgmlType::kF32, ad.out, ad.rank), true}}});
  });
}

absl::Status Model::LoadLora(const std::string& path) {
  if (!lora_.empty()) return absl::FailedPreconditionError("the model has adapters already");
  if (experts_only_) return absl::FailedPreconditionError("an experts-only shard has no layers");
  auto file = gguf::File::Open(path);
  if (!file.ok()) return file.status();
  auto read = ReadLoraFile(**file, config_.arch);
  if (!read.ok()) return read.status();
  // Every adapter must fit the model, also those on another stage's layers, so each stage of a
  // pipeline refuses a wrong file alike; only this shard's layers keep theirs.
  if (absl::Status s = CheckLoraFits(*read, path, *file_); !s.ok()) return s;
  LoraSet loaded;
  absl::Status status;
  read->ForEach([&](int64_t layer, LoraTarget t, LoraAdapter& ad) {
    if (!status.ok() || layer < first_ || layer >= last_) return;
    const std::string name = LoraTensorName(layer, t);
    const bool bound = std::any_of(parameters_.begin(), parameters_.end(),
                                   [&](const Parameter& p) { return p.name == name; });
    if (!bound) {
      status = absl::InvalidArgumentError(
          absl::StrCat(path, ": ", name, ".lora_a: ", name, " is not a projection this model runs"));
      return;
    }
    loaded.Add(layer, t) = std::move(ad);
  });
  if (!status.ok()) return status;
  lora_ = std::move(loaded);
  return absl::OkStatus();
}

absl::Status Model::SaveLora(const std::string& path) const {
  if (lora_.empty()) return absl::FailedPreconditionError("the model has no adapters");
  auto writer = gguf::Writer::Create(path);
  if (!writer.ok()) return writer.status();
  float alpha = 0;
  lora_.ForEach([&](int64_t, LoraTarget, const LoraAdapter& ad) {
    alpha = ad.scale * static_cast<float>(ad.rank);
  });
  (*writer)->SetValue("general.architecture", gguf::Value::Str(config_.arch));
  (*writer)->SetValue("general.type", gguf::Value::Str("adapter"));
  (*writer)->SetValue("adapter.type", gguf::Value::Str("lora"));
  (*writer)->SetValue("adapter.lora.alpha", gguf::Value::F32(alpha));
  absl::Status status;
  VisitParameters([&](const Parameter& p) {
    if (!status.ok() || !(p.name.ends_with(".lora_a") || p.name.ends_with(".lora_b"))) return;
    const WeightView& v = p.locations.front().view;
    const size_t bytes = static_cast<size_t>(v.rows * v.cols) * sizeof(float);
    status = (*writer)->AddTensor(p.name, p.dims, GgmlType::kF32,
                                  [data = v.data, bytes](std::span<uint8_t> out) {
                                    std::memcpy(out.data(), data, bytes);
                                    return absl::OkStatus();
                                  });
  });
  if (!status.ok()) return status;
  return (*writer)->Finish();
}

absl::Status Model::AddLora(std::span<const LoraTarget> targets, int64_t rank, float alpha,
                            uint64_t seed) {
  if (rank < 1) return absl::InvalidArgumentError("LoRA rank must be at least 1");
  if (!lora_.empty()) return absl::FailedPreconditionError("the model has adapters already");
  if (experts_only_) return absl::FailedPreconditionError("an experts-only shard has no layers");
  const ModelConfig& c = config_;
  // The matrix [out, in] a target adapts in layer l; 0 x 0 where the layer has none.
  auto shape = [&](int64_t l, LoraTarget t) {
    const LayerSpec& s = c.layers[l];
    int64_t in = c.hidden, out = 0;
    switch (t) {
      case LoraTarget::kQ: out = s.q_dim(); break;
      case LoraTarget::kK:
      case LoraTarget::kV: out = s.kv_source < 0 ? s.kv_dim() : 0; break;
      case LoraTarget::kO: in = s.q_dim(); out = c.hidden; break;
      case LoraTarget::kGate:
      case LoraTarget::kUp: out = s.ffn; break;
      case LoraTarget::kDown: in = s.ffn; out = s.ffn > 0 ? c.hidden : 0; break;
    }
    return out > 0 && in > 0 ? std::pair<int64_t, int64_t>{out, in}
                             : std::pair<int64_t, int64_t>{0, 0};
  };
  // A rank above a matrix's smaller side adds nothing but memory (rank x (in + out) floats per
  // adapter, plus the trainer's copies): refused before anything is allocated.
  int64_t max_rank = 0;
  for (int64_t l = first_; l < last_; ++l) {
    for (LoraTarget t : targets) {
      const auto [out, in] = shape(l, t);
      if (out > 0) max_rank = max_rank == 0 ? std::min(out, in) : std::min({max_rank, out, in});
    }
  }
  if (max_rank > 0 && rank > max_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LoRA rank ", rank, " exceeds ", max_rank,
        ", the smallest side of the matrices it adapts (a higher rank adds nothing)"));
  }
  for (int64_t l = first_; l < last_; ++l) {
    for (LoraTarget t : targets) {
      const auto [out, in] = shape(l, t);
      if (out == 0) continue;
      LoraAdapter& ad = lora_.Add(l, t);
      ad.rank = rank;
      ad.in = in;
      ad.out = out;
      ad.scale = alpha / static_cast<float>(rank);
      ad.a.resize(rank * in);
      ad.b.assign(out * rank, 0.0f);
      // std 1 / sqrt(in) keeps A x at the scale of x. Each adapter draws from its own stream,
      // keyed by (layer, target): a shard holding some layers initializes them as the whole
      // model does, so pipeline stages train what one process trains.
      uint64_t key = seed ^ (static_cast<uint64_t>(l) << 8 | static_cast<uint64_t>(t));
      NormalStream normals(SplitMix64Next(&key));
      const double std = 1.0 / std::sqrt(static_cast<double>(in));
      for (float& v : ad.a) v = static_cast<float>(std * normals.Normal());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvCache>> Model::NewKvCache(int64_t capacity,
                                                           GgmlType type) const {
  if (experts_only_) return absl::FailedPreconditionError("an experts-only shard has no cache");
  if (absl::Status s = CheckKvType(type); !s.ok()) return s;
  return KvCache::Create(config_.KvGeometry(first_, last_), type, capacity);
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
  if (const float scale = forward_->EmbeddingScale(); scale != 1.0f) {
    for (size_t i = 0; i < tokens.size() * config_.hidden; ++i) out[i] *= scale;
  }
  return absl::OkStatus();
}

absl::Status Model::ForwardLayers(float* x, int64_t rows, std::span<const Segment> segments) {
  if (experts_only_) {
    return absl::FailedPreconditionError("an experts-only shard has no forward pass");
  }
  // Validate the KV contract for every segment before touching any cache.
  const std::vector<KvLayerGeometry> geometry = config_.KvGeometry(first_, last_);
  int64_t covered = 0;
  for (const Segment& seg : segments) {
    if (seg.kv == nullptr || seg.count <= 0 || seg.begin != covered) {
      return absl::InvalidArgumentError("segments must tile the rows in order, non-empty");
    }
    bool same = seg.kv->num_layers() == last_ - first_;
    for (int64_t l = 0; same && l < last_ - first_; ++l) {
      const KvLayerGeometry& a = seg.kv->geometry(l);
      const KvLayerGeometry& b = geometry[l];
      same = a.num_heads_kv == b.num_heads_kv && a.head_dim == b.head_dim &&
             a.window == b.window && a.source == b.source;
    }
    if (!same) {
      return absl::InvalidArgumentError("KV cache geometry does not match this model shard");
    }
    if (seg.kv->len() + seg.count > seg.kv->capacity()) {
      return absl::OutOfRangeError(absl::StrCat("KV cache overflow: ", seg.kv->len(), " + ",
                                                seg.count, " positions exceed capacity ",
                                                seg.kv->capacity()));
    }
    if (config_.per_layer_input > 0 && static_cast<int64_t>(seg.tokens.size()) != seg.count) {
      return absl::InvalidArgumentError(
          "a model with per-layer embeddings needs each segment's token ids");
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

  // A sliding-window ring holds window + slack positions, so one pass stores and attends at
  // most slack + 1 new positions of a stream (the oldest query must still see its window after
  // the newest rows are stored). Longer segments run in rounds of that many rows each.
  auto round_limit = [&](const KvCache& kv) {
    int64_t limit = kv.capacity();
    for (int64_t l = 0; l < kv.num_layers(); ++l) {
      const int64_t ring = kv.layout(l).capacity;
      if (kv.stores(l) && kv.window(l) > 0 && ring < kv.capacity()) {
        limit = std::min(limit, ring - kv.window(l) + 1);
      }
    }
    return limit;
  };
  std::vector<int64_t> limit(segments.size());
  bool rounds = false;
  for (size_t i = 0; i < segments.size(); ++i) {
    limit[i] = round_limit(*segments[i].kv);
    rounds |= segments[i].count > limit[i];
  }
  if (!rounds) return ForwardPass(x, rows, segments);

  // Each round gathers the next rows of every unfinished segment into `part`, runs them, and
  // scatters the results back; from[j] is the segment round segment j came from.
  const int64_t hidden = config_.hidden;
  std::vector<int64_t> done(segments.size(), 0);
  std::vector<float> part;
  for (;;) {
    std::vector<Segment> sub;
    std::vector<size_t> from;
    int64_t sub_rows = 0;
    for (size_t i = 0; i < segments.size(); ++i) {
      const Segment& seg = segments[i];
      const int64_t n = std::min(seg.count - done[i], limit[i]);
      if (n <= 0) continue;
      Segment s{seg.kv, sub_rows, n};
      if (!seg.tokens.empty()) s.tokens = seg.tokens.subspan(done[i], n);
      sub.push_back(s);
      from.push_back(i);
      sub_rows += n;
    }
    if (sub.empty()) break;
    part.resize(sub_rows * hidden);
    auto rows_of = [&](size_t j) { return x + (segments[from[j]].begin + done[from[j]]) * hidden; };
    for (size_t j = 0; j < sub.size(); ++j) {
      std::memcpy(&part[sub[j].begin * hidden], rows_of(j), sub[j].count * hidden * sizeof(float));
    }
    if (absl::Status s = ForwardPass(part.data(), sub_rows, sub); !s.ok()) return s;
    for (size_t j = 0; j < sub.size(); ++j) {
      std::memcpy(rows_of(j), &part[sub[j].begin * hidden], sub[j].count * hidden * sizeof(float));
      done[from[j]] += sub[j].count;
    }
  }
  return absl::OkStatus();
}

absl::Status Model::ForwardPass(float* x, int64_t rows, std::span<const Segment> segments) {
  ForwardContext ctx(config_, *pool_, *scratch_, experts_, first_, x, rows, segments, &lora_);
  if (config_.per_layer_input > 0) {
    std::vector<int32_t> tokens;
    for (const Segment& seg : segments) {
      tokens.insert(tokens.end(), seg.tokens.begin(), seg.tokens.end());
    }
    if (absl::Status s = forward_->PerLayerInputs(ctx, tokens); !s.ok()) return s;
  }
  for (int64_t l = first_; l < last_; ++l) {
    if (absl::Status s = forward_->ForwardLayer(ctx, l); !s.ok()) return s;
  }
  for (const Segment& seg : segments) seg.kv->Advance(seg.count);
  return absl::OkStatus();
}

absl::Status Model::Head(const float* x, int64_t rows, float* logits) {
  if (!has_head()) return absl::FailedPreconditionError("this shard has no output head");
  float* h = ForwardScratch::Grow(scratch_->h, rows * config_.hidden);
  RmsNorm(x, output_norm_, config_.rms_eps, rows, config_.hidden, h);
  MatMul(head_, h, rows, logits, *pool_);
  forward_->FinishLogits(logits, rows * config_.vocab_size);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Model::RunFull(std::span<KvCache* const> caches,
                                                  std::span<const int32_t> tokens,
                                                  std::span<const int64_t> counts,
                                                  bool all_logits) {
  std::vector<float> logits;
  if (absl::Status s = RunFull(caches, tokens, counts, all_logits, logits); !s.ok()) return s;
  return logits;
}

absl::Status Model::RunFull(std::span<KvCache* const> caches, std::span<const int32_t> tokens,
                            std::span<const int64_t> counts, bool all_logits,
                            std::vector<float>& logits) {
  if (!is_full()) return absl::FailedPreconditionError("model holds only a shard");
  if (tokens.empty()) return absl::InvalidArgumentError("empty token sequence");
  const int64_t rows = static_cast<int64_t>(tokens.size());
  std::vector<float> x(rows * config_.hidden);
  if (absl::Status s = Embed(tokens, x.data()); !s.ok()) return s;
  std::vector<Segment> segments;
  int64_t begin = 0;
  for (size_t i = 0; i < caches.size(); ++i) {
    segments.push_back({caches[i], begin, counts[i], tokens.subspan(begin, counts[i])});
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
  logits.resize(head_rows * config_.vocab_size);  // keeps its capacity: no page faults
  return Head(head_in, head_rows, logits.data());
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
  std::vector<float> logits;
  if (absl::Status s = ForwardStepBatch(caches, tokens, logits); !s.ok()) return s;
  return logits;
}

absl::Status Model::ForwardStepBatch(std::span<KvCache* const> caches,
                                     std::span<const int32_t> tokens,
                                     std::vector<float>& logits) {
  if (caches.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(caches.size(), " caches for ",
                                                   tokens.size(), " tokens"));
  }
  std::vector<int64_t> counts(caches.size(), 1);
  return RunFull(caches, tokens, counts, false, logits);
}

absl::StatusOr<std::vector<float>> Model::ForwardLastLogits(std::span<const int32_t> tokens) {
  if (tokens.empty()) return absl::InvalidArgumentError("empty token sequence");
  auto kv = NewKvCache(static_cast<int64_t>(tokens.size()), GgmlType::kF32);
  if (!kv.ok()) return kv.status();
  return ForwardStep(**kv, tokens, 0);
}

}  // namespace fucina
