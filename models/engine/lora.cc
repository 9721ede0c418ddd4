#include "models/engine/lora.h"

#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace fucina {

std::string_view LoraTargetName(LoraTarget t) {
  switch (t) {
    case LoraTarget::kQ: return "attn_q";
    case LoraTarget::kK: return "attn_k";
    case LoraTarget::kV: return "attn_v";
    case LoraTarget::kO: return "attn_output";
    case LoraTarget::kGate: return "ffn_gate";
    case LoraTarget::kUp: return "ffn_up";
    case LoraTarget::kDown: return "ffn_down";
  }
  return "";
}

absl::StatusOr<std::vector<LoraTarget>> ParseLoraTargets(std::string_view list) {
  static constexpr std::pair<const char*, LoraTarget> kShort[] = {
      {"q", LoraTarget::kQ},       {"k", LoraTarget::kK},   {"v", LoraTarget::kV},
      {"o", LoraTarget::kO},       {"gate", LoraTarget::kGate}, {"up", LoraTarget::kUp},
      {"down", LoraTarget::kDown}};
  std::vector<LoraTarget> out;
  for (absl::string_view part : absl::StrSplit(absl::string_view(list.data(), list.size()), ',')) {
    const std::string name(part);
    bool found = false;
    for (const auto& [short_name, t] : kShort) {
      if (name == short_name || name == LoraTargetName(t)) {
        out.push_back(t);
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LoRA target '", name, "' is not one of q, k, v, o, gate, up, down (or attn_q, ...)"));
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("no LoRA targets");
  return out;
}

std::string LoraTensorName(int64_t layer, LoraTarget t) {
  return absl::StrCat("blk.", layer, ".", std::string(LoraTargetName(t)), ".weight");
}

absl::StatusOr<LoraSet> ReadLoraFile(const gguf::File& f, std::string_view arch) {
  auto err = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", why));
  };
  auto str = [&](const char* key) -> std::string {
    const gguf::Value* v = f.Find(key);
    return v != nullptr && v->AsString() != nullptr ? *v->AsString() : std::string();
  };
  if (str("general.type") != "adapter" || str("adapter.type") != "lora") {
    return err("not a LoRA adapter file (general.type \"adapter\", adapter.type \"lora\")");
  }
  if (str("general.architecture") != arch) {
    return err(absl::StrCat("adapters for '", str("general.architecture"), "', the model is '",
                            std::string(arch), "'"));
  }
  const gguf::Value* alpha_v = f.Find("adapter.lora.alpha");
  std::optional<double> alpha;
  if (alpha_v != nullptr) alpha = alpha_v->AsFloat();
  if (!alpha) return err("adapter.lora.alpha is missing or not a number");
  LoraSet loaded;
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (!t.name.ends_with(".weight.lora_a")) {
      if (!t.name.ends_with(".weight.lora_b")) return err("unexpected tensor " + t.name);
      if (f.FindTensor(t.name.substr(0, t.name.size() - 1) + "a") == nullptr) {
        return err(t.name + " has no lora_a");
      }
      continue;
    }
    const std::string base = t.name.substr(0, t.name.size() - 7);  // "...weight"
    const gguf::TensorInfo* b = f.FindTensor(base + ".lora_b");
    if (b == nullptr) return err(t.name + " has no " + base + ".lora_b");
    if (t.type != GgmlType::kF32 || b->type != GgmlType::kF32 || t.dims.size() != 2 ||
        b->dims.size() != 2 || t.dims[1] != b->dims[0]) {
      return err(t.name + " / lora_b: expected f32 [in, rank] and [rank, out]");
    }
    // "blk.<layer>.<target>.weight"
    const size_t dot = base.find('.', 4);
    int64_t layer = -1;
    if (!base.starts_with("blk.") || dot == std::string::npos ||
        !absl::SimpleAtoi(base.substr(4, dot - 4), &layer) || layer < 0) {
      return err(t.name + ": not a layer tensor");
    }
    const std::string target = base.substr(dot + 1, base.size() - dot - 1 - 7);
    std::optional<LoraTarget> which;
    for (int i = 0; i < kNumLoraTargets; ++i) {
      if (LoraTargetName(static_cast<LoraTarget>(i)) == target) which = static_cast<LoraTarget>(i);
    }
    if (!which) return err(t.name + ": no adapter target '" + target + "'");
    LoraAdapter& ad = loaded.Add(layer, *which);
    ad.in = t.dims[0];
    ad.rank = t.dims[1];
    ad.out = b->dims[1];
    ad.scale = static_cast<float>(*alpha) / static_cast<float>(ad.rank);
    const float* a_data = reinterpret_cast<const float*>(t.data);
    const float* b_data = reinterpret_cast<const float*>(b->data);
    ad.a.assign(a_data, a_data + ad.rank * ad.in);
    ad.b.assign(b_data, b_data + ad.out * ad.rank);
  }
  if (loaded.empty()) return err("no adapters in the file");
  return loaded;
}

absl::Status CheckLoraFits(const LoraSet& set, std::string_view adapter_path,
                           const gguf::File& model) {
  absl::Status status;
  set.ForEach([&](int64_t layer, LoraTarget t, const LoraAdapter& ad) {
    if (!status.ok()) return;
    const std::string name = LoraTensorName(layer, t);
    const gguf::TensorInfo* w = model.FindTensor(name);
    const std::vector<int64_t> dims = {ad.in, ad.out};
    if (w != nullptr && w->dims == dims) return;
    const std::string why =
        w == nullptr ? absl::StrCat(model.path(), " has no tensor ", name)
                     : absl::StrCat("[", ad.in, ", ", ad.out, "] but ", name, " is [",
                                    absl::StrJoin(w->dims, ", "), "] in ", model.path());
    status = absl::InvalidArgumentError(
        absl::StrCat(std::string(adapter_path), ": ", name, ".lora_a: ", why));
  });
  return status;
}

}  // namespace fucina
