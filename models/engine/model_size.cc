#include "models/engine/model_size.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "kernels/attention.h"
#include "models/engine/family.h"
#include "models/engine/kv_cache.h"
#include "models/engine/registry.h"

namespace fucina {

int64_t ModelSize::LayersBytes(int64_t first, int64_t last, int64_t experts) const {
  int64_t total = 0;
  for (int64_t l = first; l < last && l < static_cast<int64_t>(layer_bytes.size()); ++l) {
    total += layer_bytes[l];
    total += expert_bytes[l] * experts;
  }
  return total;
}

int64_t ModelSize::StageBytes(int64_t first, int64_t last, int64_t experts, bool embeddings,
                              bool head) const {
  return LayersBytes(first, last, experts) + (embeddings ? embedding_bytes : 0) +
         (head ? head_bytes : 0);
}

int64_t ModelSize::ExpertBytes(int64_t first, int64_t last, int64_t experts) const {
  int64_t total = 0;
  for (int64_t l = first; l < last && l < static_cast<int64_t>(expert_bytes.size()); ++l) {
    total += expert_bytes[l] * experts;
  }
  return total;
}

ModelSize MeasureModel(const gguf::File& file, const ModelConfig& config) {
  ModelSize size;
  size.layer_bytes.assign(config.num_layers, 0);
  size.expert_bytes.assign(config.num_layers, 0);
  size.layer_work.assign(config.num_layers, 0);
  auto family = FindModelFamily(config.arch);
  if (!family.ok()) return size;
  const bool tied = file.FindTensor("output.weight") == nullptr;
  for (const TensorSpec& spec : (*family)->tensors(config)) {
    const gguf::TensorInfo* t = file.FindTensor(spec.name);
    if (t == nullptr) continue;
    const int64_t bytes = static_cast<int64_t>(t->nbytes);
    const int64_t elements = t->num_elements();
    const bool in_layers = spec.layer >= 0 && spec.layer < config.num_layers;
    switch (spec.part) {
      case TensorPart::kEmbedding:
        size.embedding_bytes += bytes;
        if (tied && spec.name == "token_embd.weight") {
          size.head_bytes += bytes;
          size.head_work += elements;
        }
        break;
      case TensorPart::kHead:
        size.head_bytes += bytes;
        size.head_work += elements;
        break;
      case TensorPart::kGlobal:
        break;
      case TensorPart::kLayer:
        if (!in_layers) break;
        size.layer_bytes[spec.layer] += bytes;
        size.layer_work[spec.layer] += elements;
        break;
      case TensorPart::kExperts:
        if (!in_layers || config.num_experts <= 0) break;
        size.expert_bytes[spec.layer] += bytes / config.num_experts;
        size.layer_work[spec.layer] += elements / config.num_experts * config.num_experts_used;
        break;
    }
  }
  return size;
}

int64_t KvBytesPerSession(const ModelConfig& config, int64_t first, int64_t last,
                          int64_t capacity, GgmlType type) {
  return KvCache::Bytes(config.KvGeometry(first, last), type, capacity);
}

}  // namespace fucina
