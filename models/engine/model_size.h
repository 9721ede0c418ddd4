// Bytes of a model's parts, from its family's tensor table (family.h) and the file's tensors:
// what a placement planner needs to split layers and experts across workers' memory budgets.
#ifndef FUCINA_MODELS_ENGINE_MODEL_SIZE_H_
#define FUCINA_MODELS_ENGINE_MODEL_SIZE_H_

#include <cstdint>
#include <vector>

#include "models/engine/config.h"
#include "models/gguf/gguf.h"

namespace fucina {

struct ModelSize {
  std::vector<int64_t> layer_bytes;   // [num_layers]: a layer without its routed experts
  std::vector<int64_t> expert_bytes;  // [num_layers]: one expert's gate + up + down (0: dense)
  int64_t embedding_bytes = 0;        // token_embd
  int64_t head_bytes = 0;             // output_norm + output (token_embd again when tied)
  // Work per token, in weight elements (multiply-adds): each layer's with the experts a token
  // uses, and the head's. What a stage costs in time, whatever its weights' types; empty (0)
  // when unknown, and then bytes stand in for it.
  std::vector<int64_t> layer_work;    // [num_layers]
  int64_t head_work = 0;

  // Weights of layers [first, last) with `experts` of each layer's experts local.
  int64_t LayersBytes(int64_t first, int64_t last, int64_t experts) const;
  // A pipeline stage's weights: LayersBytes plus the embeddings and/or head it holds. The
  // planner and the worker both size shards with this, so they agree on what fits.
  int64_t StageBytes(int64_t first, int64_t last, int64_t experts, bool embeddings,
                     bool head) const;
  // An expert worker's weights: `experts` experts of every layer in [first, last).
  int64_t ExpertBytes(int64_t first, int64_t last, int64_t experts) const;
};

ModelSize MeasureModel(const gguf::File& file, const ModelConfig& config);

// KV bytes one session of `capacity` positions needs for layers [first, last): each layer's
// own geometry, rings for sliding-window layers, nothing for layers reading shared K/V.
int64_t KvBytesPerSession(const ModelConfig& config, int64_t first, int64_t last,
                          int64_t capacity, GgmlType type);

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_MODEL_SIZE_H_
