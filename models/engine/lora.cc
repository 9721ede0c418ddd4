#include "models/engine/lora.h"

#include "absl/strings/str_cat.h"
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

}  // namespace fucina
