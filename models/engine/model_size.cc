#include "models/engine/model_size.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "kernels/attention.h"

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
  bool tied = true;
  int64_t embedding_elements = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    const int64_t bytes = static_cast<int64_t>(t.nbytes);
    const int64_t elements = t.num_elements();
    const std::string& name = t.name;
    if (name == "token_embd.weight") {
      size.embedding_bytes += bytes;
      embedding_elements = elements;
    } else if (name == "output.weight" || name == "output_norm.weight") {
      size.head_bytes += bytes;
      size.head_work += elements;
      if (name == "output.weight") tied = false;
    } else if (absl::StartsWith(name, "blk.")) {
      const size_t dot = name.find('.', 4);
      int64_t layer;
      if (dot == std::string::npos || !absl::SimpleAtoi(name.substr(4, dot - 4), &layer) ||
          layer < 0 || layer >= config.num_layers) {
        continue;
      }
      if (absl::StrContains(name, "_exps.") && config.num_experts > 0) {
        size.expert_bytes[layer] += bytes / config.num_experts;
        size.layer_work[layer] += elements / config.num_experts * config.num_experts_used;
      } else {
        size.layer_bytes[layer] += bytes;
        size.layer_work[layer] += elements;
      }
    }
  }
  if (tied) {
    size.head_bytes += size.embedding_bytes;
    size.head_work += embedding_elements;
  }
  return size;
}

int64_t KvBytesPerSession(const ModelConfig& config, int64_t num_layers, int64_t capacity,
                          GgmlType type) {
  KvLayout layout;
  layout.type = type;
  layout.capacity = capacity;
  layout.num_heads_kv = static_cast<int>(config.num_heads_kv);
  layout.head_dim = static_cast<int>(config.head_dim);
  return layout.TotalBytes() * 2 * num_layers;
}

}  // namespace fucina
