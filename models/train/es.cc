#include "models/train/es.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "models/gguf/writer.h"
#include "models/train/noise.h"

namespace fucina::train {

absl::Status EsOptions::Validate() const {
  if (population < 2 || population % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("population (", population, ") must be even and at least 2"));
  }
  // Finite too: an infinite step makes every member's fitness non-finite, a job that can only
  // fail after it has spent its workers' time.
  if (!(sigma > 0.0f) || !std::isfinite(sigma)) {
    return absl::InvalidArgumentError("sigma must be positive and finite");
  }
  if (!(lr > 0.0f) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError("lr must be positive and finite");
  }
  if (!(weight_decay >= 0.0f) || !std::isfinite(weight_decay)) {
    return absl::InvalidArgumentError("weight_decay must be finite and not negative");
  }
  if (!(sigma_decay > 0.0f && sigma_decay <= 1.0f)) {
    return absl::InvalidArgumentError("sigma_decay must be in (0, 1]");
  }
  if (!(lr_decay > 0.0f && lr_decay <= 1.0f)) {
    return absl::InvalidArgumentError("lr_decay must be in (0, 1]");
  }
  return absl::OkStatus();
}

std::string NonFiniteFitness(int member, int64_t generation, float fitness) {
  return absl::StrCat(member == EsTrainer::kCenter ? std::string("the center")
                                                   : absl::StrCat("member ", member),
                      " of generation ", generation + 1, " has a non-finite fitness (", fitness,
                      "): the job's sigma, lr or reward drove the model out of range");
}

namespace {

// value * decay^generation by repeated f32 multiplication: no libm, the same bits everywhere.
float Decayed(float value, float decay, int64_t generation) {
  if (decay == 1.0f) return value;
  for (int64_t g = 0; g < generation; ++g) value *= decay;
  return value;
}

}  // namespace

float EsOptions::SigmaAt(int64_t generation) const {
  return Decayed(sigma, sigma_decay, generation);
}

float EsOptions::LrAt(int64_t generation) const { return Decayed(lr, lr_decay, generation); }

absl::StatusOr<std::unique_ptr<EsTrainer>> EsTrainer::Create(Model& model,
                                                             const EsOptions& options,
                                                             ThreadPool& pool,
                                                             bool allow_none) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<EsTrainer> t(new EsTrainer(model, options, pool));
  model.VisitParameters([&](const Parameter& p) {
    Param param;
    for (const ParameterLocation& loc : p.locations) {
      if (!loc.owned || loc.view.type != GgmlType::kF32) continue;
      // Owned f32 rows: the trainable copy (LoadOptions::f32_tensors) and its fused rows.
      param.copies.push_back(const_cast<float*>(static_cast<const float*>(loc.view.data)));
    }
    const bool trainable =
        !param.copies.empty() && std::all_of(p.locations.begin(), p.locations.end(),
                                             [](const ParameterLocation& l) {
                                               return l.owned && l.view.type == GgmlType::kF32;
                                             });
    if (!trainable) return;
    const ParameterLocation& first = p.locations.front();
    const float* src = static_cast<const float*>(first.view.data);
    param.name = p.name;
    param.id = ParameterId(p.name);
    param.theta.assign(src, src + first.view.rows * first.view.cols);
    if (options.weight_decay > 0.0f) param.base = param.theta;
    t->params_.push_back(std::move(param));
  });
  if (t->params_.empty() && !allow_none) {
    return absl::InvalidArgumentError(
        "no trainable tensors: load the model with LoadOptions::f32_tensors selecting them");
  }
  return t;
}

int64_t EsTrainer::num_values() const {
  int64_t n = 0;
  for (const Param& p : params_) n += p.reported ? static_cast<int64_t>(p.theta.size()) : 0;
  return n;
}

std::vector<std::string> EsTrainer::tensor_names() const {
  std::vector<std::string> names;
  for (const Param& p : params_) {
    if (p.reported) names.push_back(p.name);
  }
  return names;
}

void EsTrainer::SetReported(const std::function<bool(std::string_view name)>& reported) {
  for (Param& p : params_) p.reported = reported(p.name);
}

void EsTrainer::FillNoise(int64_t generation, int64_t pair, size_t param) {
  const int64_t n = static_cast<int64_t>(params_[param].theta.size());
  noise_.resize(n);
  FillNormal({options_.seed, static_cast<uint64_t>(generation), static_cast<uint64_t>(pair),
              params_[param].id},
             0, n, noise_.data(), pool_);
}

void EsTrainer::WriteParam(size_t i, int64_t generation, int64_t pair, float sign) {
  Param& p = params_[i];
  const int64_t n = static_cast<int64_t>(p.theta.size());
  const float* src = p.theta.data();
  if (sign != 0.0f) {
    FillNoise(generation, pair, i);
    const float scale = sign * options_.SigmaAt(generation);
    for (int64_t j = 0; j < n; ++j) noise_[j] = p.theta[j] + scale * noise_[j];
    src = noise_.data();
  }
  for (float* copy : p.copies) std::memcpy(copy, src, n * sizeof(float));
}

absl::Status EsTrainer::Select(int64_t generation, int member) {
  for (;;) {
    absl::StatusOr<bool> done = SelectStep(generation, member);
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
  }
}

absl::StatusOr<bool> EsTrainer::SelectStep(int64_t generation, int member) {
  if (member < kCenter || member >= options_.population) {
    return absl::InvalidArgumentError(absl::StrCat("member ", member, " is outside [0, ",
                                                   options_.population, ")"));
  }
  if (member == selected_member_ && (member == kCenter || generation == selected_generation_)) {
    return true;
  }
  if (selected_member_ != kMixed || stepping_member_ != member ||
      stepping_generation_ != generation) {
    selected_member_ = kMixed;
    stepping_member_ = member;
    stepping_generation_ = generation;
    select_next_ = 0;
  }
  if (select_next_ < params_.size()) {
    WriteParam(select_next_++, generation, member == kCenter ? 0 : member / 2,
               member == kCenter ? 0.0f : (member % 2 == 0 ? 1.0f : -1.0f));
  }
  if (select_next_ < params_.size()) return false;
  selected_generation_ = generation;
  selected_member_ = member;
  stepping_member_ = kMixed;
  return true;
}

absl::StatusOr<float> EsTrainer::Evaluate(int64_t generation, int member,
                                          const FitnessFn& fitness) {
  if (absl::Status s = Select(generation, member); !s.ok()) return s;
  absl::StatusOr<float> f = fitness(model_);
  (void)Select(generation, kCenter);
  if (f.ok() && !std::isfinite(*f)) {
    // The job's fault (its step sizes or rule), not the worker's: INVALID_ARGUMENT, which no
    // caller takes for a failed worker to re-plan around.
    return absl::InvalidArgumentError(NonFiniteFitness(member, generation, *f));
  }
  return f;
}

std::vector<float> EsTrainer::ShapeFitness(std::span<const float> fitness) {
  const size_t n = fitness.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return fitness[a] < fitness[b]; });
  std::vector<float> shaped(n, 0.0f);
  if (n < 2) return shaped;
  // Centered ranks are symmetric, so their mean is 0 and their variance a function of n.
  double var = 0;
  for (size_t r = 0; r < n; ++r) {
    const double c = static_cast<double>(r) / static_cast<double>(n - 1) - 0.5;
    var += c * c;
  }
  const double inv_std = 1.0 / std::sqrt(var / static_cast<double>(n));
  for (size_t r = 0; r < n; ++r) {
    const double c = static_cast<double>(r) / static_cast<double>(n - 1) - 0.5;
    shaped[order[r]] = static_cast<float>(c * inv_std);
  }
  return shaped;
}

absl::Status EsTrainer::ApplyUpdate(int64_t generation, std::span<const float> shaped) {
  if (absl::Status s = BeginUpdate(generation, shaped); !s.ok()) return s;
  while (!UpdateStep()) {
  }
  return absl::OkStatus();
}

absl::Status EsTrainer::BeginUpdate(int64_t generation, std::span<const float> shaped) {
  if (static_cast<int>(shaped.size()) != options_.population) {
    return absl::InvalidArgumentError(absl::StrCat(shaped.size(), " shaped fitness values for a "
                                                   "population of ", options_.population));
  }
  update_generation_ = generation;
  update_shaped_.assign(shaped.begin(), shaped.end());
  update_next_ = 0;
  selected_member_ = kMixed;  // tensors already updated hold the new theta, the others a member
  stepping_member_ = kMixed;
  return absl::OkStatus();
}

bool EsTrainer::UpdateStep() {
  if (update_next_ < params_.size()) UpdateParam(update_next_++, update_generation_, update_shaped_);
  if (update_next_ < params_.size()) return false;
  selected_member_ = kCenter;
  return true;
}

void EsTrainer::UpdateParam(size_t i, int64_t generation, std::span<const float> shaped) {
  const int pairs = options_.population / 2;
  const float lr = options_.LrAt(generation);
  const float step = lr / static_cast<float>(options_.population);
  Param& p = params_[i];
  const int64_t n = static_cast<int64_t>(p.theta.size());
  update_delta_.assign(n, 0.0f);
  for (int pair = 0; pair < pairs; ++pair) {
    const float c = shaped[2 * pair] - shaped[2 * pair + 1];
    if (c == 0.0f) continue;
    FillNoise(generation, pair, i);
    for (int64_t j = 0; j < n; ++j) update_delta_[j] += c * noise_[j];
  }
  const float decay = lr * options_.weight_decay;
  for (int64_t j = 0; j < n; ++j) {
    float v = p.theta[j] + step * update_delta_[j];
    if (decay > 0.0f) v -= decay * (p.theta[j] - p.base[j]);
    p.theta[j] = v;
  }
  WriteParam(i, generation, 0, 0.0f);
}

absl::StatusOr<std::vector<float>> EsTrainer::Step(int64_t generation, const FitnessFn& fitness) {
  std::vector<float> values(options_.population);
  for (int m = 0; m < options_.population; ++m) {
    auto f = Evaluate(generation, m, fitness);
    if (!f.ok()) return f.status();
    values[m] = *f;
  }
  if (absl::Status s = ApplyUpdate(generation, ShapeFitness(values)); !s.ok()) return s;
  return values;
}

namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t Fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
  return h;
}

}  // namespace

uint64_t ParameterId(std::string_view name) { return Fnv1a(kFnvOffset, name.data(), name.size()); }

uint64_t EsTrainer::Checksum() const {
  uint64_t sum = 0;
  for (const Param& p : params_) {
    if (!p.reported) continue;
    // The values' bits as little-endian bytes, whatever the host.
    uint64_t h = Fnv1a(kFnvOffset, p.name.data(), p.name.size());
    for (float v : p.theta) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof(bits));
      const uint8_t le[4] = {static_cast<uint8_t>(bits), static_cast<uint8_t>(bits >> 8),
                             static_cast<uint8_t>(bits >> 16), static_cast<uint8_t>(bits >> 24)};
      h = Fnv1a(h, le, sizeof(le));
    }
    sum += h;  // wraps: a sum, so shards' checksums add up to the whole model's
  }
  return sum;
}

}  // namespace fucina::train

namespace fucina::train {

absl::Status EsTrainer::SaveTensors(const std::string& path) const {
  auto writer = gguf::Writer::Create(path);
  if (!writer.ok()) return writer.status();
  (*writer)->SetValue("general.type", gguf::Value::Str("tensors"));
  for (const Param& p : params_) {
    if (!p.reported) continue;
    const gguf::TensorInfo* info = model_.file().FindTensor(p.name);
    if (info == nullptr) {
      return absl::InternalError(absl::StrCat(p.name, " is not a tensor of the model's file"));
    }
    std::span<const float> v = p.theta;
    absl::Status s = (*writer)->AddTensor(p.name, info->dims, GgmlType::kF32,
                                          [v](std::span<uint8_t> out) {
                                            std::memcpy(out.data(), v.data(), v.size_bytes());
                                            return absl::OkStatus();
                                          });
    if (!s.ok()) return s;
  }
  return (*writer)->Finish();
}

}  // namespace fucina::train
