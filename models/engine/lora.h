// Low-rank adapters (LoRA) on a model's projections, applied inside the shared blocks
// (blocks.h), so every family that composes its layers from them takes adapters with no code
// of its own:
//   y = W x + scale * B (A x),  A: [rank, in], B: [out, rank], scale = alpha / rank.
// A layer projection without an adapter costs one null check. Adapter values are f32, owned
// here, and listed by Model::VisitParameters as "<tensor>.lora_a" / "<tensor>.lora_b" (the
// names llama.cpp's adapter files use), which is how training finds and updates them.
#ifndef FUCINA_MODELS_ENGINE_LORA_H_
#define FUCINA_MODELS_ENGINE_LORA_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gguf/gguf.h"

namespace fucina {

// The projections adapters attach to, by their GGUF tensor suffix.
enum class LoraTarget { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumLoraTargets = 7;

// "attn_q" | "attn_k" | "attn_v" | "attn_output" | "ffn_gate" | "ffn_up" | "ffn_down".
std::string_view LoraTargetName(LoraTarget t);
// Parses a comma-separated list of those names, or the short forms q,k,v,o,gate,up,down.
absl::StatusOr<std::vector<LoraTarget>> ParseLoraTargets(std::string_view list);

struct LoraAdapter {
  int64_t rank = 0, in = 0, out = 0;
  float scale = 1.0f;   // alpha / rank
  std::vector<float> a;  // [rank, in]
  std::vector<float> b;  // [out, rank]
};

// The base tensor an adapter sits on: "blk.<layer>.<target>.weight".
std::string LoraTensorName(int64_t layer, LoraTarget t);

// Adapters by (absolute layer, target).
class LoraSet {
 public:
  const LoraAdapter* Find(int64_t layer, LoraTarget t) const {
    auto it = adapters_.find({layer, static_cast<int>(t)});
    return it == adapters_.end() ? nullptr : &it->second;
  }
  LoraAdapter& Add(int64_t layer, LoraTarget t) { return adapters_[{layer, static_cast<int>(t)}]; }
  bool empty() const { return adapters_.empty(); }
  // (layer, target, adapter) in (layer, target) order.
  template <typename F>
  void ForEach(F f) {
    for (auto& [key, adapter] : adapters_) f(key.first, static_cast<LoraTarget>(key.second), adapter);
  }
  template <typename F>
  void ForEach(F f) const {
    for (const auto& [key, adapter] : adapters_) {
      f(key.first, static_cast<LoraTarget>(key.second), adapter);
    }
  }

 private:
  std::map<std::pair<int64_t, int>, LoraAdapter> adapters_;
};

// Reads the adapters of a LoRA GGUF (general.type "adapter", adapter.type "lora",
// adapter.lora.alpha; f32 "<base>.lora_a" [in, rank] / "<base>.lora_b" [rank, out] pairs, as
// Model::SaveLora and llama.cpp write them; scale = alpha / rank), for `arch`. The adapters
// own copies of A and B. Checks the file alone, not a model: whether each base tensor exists
// with dims [in, out] is the caller's (Model::LoadLora, MergeModel). INVALID_ARGUMENT naming
// the file and the key or tensor: another type or architecture, no alpha, a tensor without its
// pair, not f32 2-D, a name that is not "blk.<L>.<target>.weight.lora_*",
// no adapters at all.
absl::StatusOr<LoraSet> ReadLoraFile(const gguf::File& f, std::string_view arch);

// Whether every adapter of `set` (read from `adapter_path`) sits on a 2-D tensor of `model`
// with dims [in, out]. INVALID_ARGUMENT naming the adapter file, the tensor and, when it
// exists, both shapes.
absl::Status CheckLoraFits(const LoraSet& set, std::string_view adapter_path,
                           const gguf::File& model);

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_LORA_H_
