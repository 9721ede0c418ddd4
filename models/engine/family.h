// What a model family is: one file, models/families/<arch>.cc, that reads its config from GGUF
// metadata, names its tensors (one table, used by the model, ModelSize, the quantizer and the
// fixture writer) and runs its layers by composing the shared blocks of blocks.h. A new family
// adds one such file and its tests; it never edits another family's code. Families are found
// by general.architecture in the registry (registry.h).
#ifndef FUCINA_MODELS_ENGINE_FAMILY_H_
#define FUCINA_MODELS_ENGINE_FAMILY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/streamed_memory.h"
#include "kernels/matmul.h"
#include "models/engine/config.h"
#include "models/gguf/gguf.h"

namespace fucina {

namespace gguf {
class Writer;
}  // namespace gguf

class ForwardContext;
struct FixtureOptions;
struct LoadOptions;

// ---- The tensor name table. ----

// Which part of a model a tensor belongs to: what a shard loads and what ModelSize counts.
enum class TensorPart {
  kEmbedding,  // token_embd and what the first stage needs with it (per-layer embeddings)
  kHead,       // output_norm, output
  kGlobal,     // needed by every stage (rope_freqs)
  kLayer,      // blk.<layer>.*: attention, norms, router, dense FFN
  kExperts,    // blk.<layer>.*_exps: routed expert stacks
};

// How a fixture initialises a tensor (models/engine/fixture.h documents the values).
enum class TensorInit {
  kNormal,     // N(0, init_std)
  kPeaked,     // N(0, 1) in a peaked fixture, else N(0, init_std): embeddings, output, router
  kUnit,       // N(0, 1): routers whose input is scaled down (gemma4), so routing has winners
  kOnes,       // norm weights
  kScale,      // 1 + N(0, 0.2): per-layer output scales (not 1, so tests see them applied)
  kRopeFreqs,  // 1 + i / n
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the row length
  TensorPart part = TensorPart::kLayer;
  int64_t layer = -1;         // kLayer / kExperts: the layer
  TensorInit init = TensorInit::kNormal;
  bool optional = false;      // may be absent from a file (output when tied, scales)
  bool quantize = true;       // a weight matrix a quantizer converts (false: keep f32)
  bool fixture = true;        // written by the fixture writer (false: an alternative form)
};

using TensorTable = std::vector<TensorSpec>;

// Finds `name` in `table` (nullptr if absent).
const TensorSpec* FindTensorSpec(const TensorTable& table, std::string_view name);

// ---- Binding tensors, and the named-parameter view of a loaded model. ----

// Where a named tensor's values live once loaded: the file's mapping and/or rows of a fused
// copy (q/k/v, gate/up). Training perturbs every copy of a parameter.
struct ParameterLocation {
  WeightView view;     // the rows of this tensor only (row_offset applied)
  bool owned = false;  // a fused copy the model owns (writable); false: the mapping
};
struct Parameter {
  std::string name;
  std::vector<int64_t> dims;
  std::vector<ParameterLocation> locations;
};
using ParameterVisitor = std::function<void(const Parameter&)>;

// Binds table tensors of a file for a family, checking each against its table shape; errors
// name the tensor. Records every bound tensor for Model::VisitParameters.
class TensorBinder {
 public:
  // `f32` (may be null) selects matrices bound as owned f32 copies (LoadOptions::f32_tensors).
  TensorBinder(const gguf::File& file, const TensorTable& table, ThreadPool& pool,
               std::function<bool(std::string_view)> f32 = nullptr);

  const gguf::File& file() const { return file_; }
  bool Has(const std::string& name) const { return file_.FindTensor(name) != nullptr; }
  // Whether the table lets `name` be absent.
  bool Optional(const std::string& name) const;
  // A table matrix [rows = dims[1..] product, cols = dims[0]] with a CPU kernel.
  absl::StatusOr<WeightView> Matrix(const std::string& name);
  // A table f32 vector (norm weights, scales).
  absl::StatusOr<const float*> Vector(const std::string& name);
  // Concatenates the rows of same-typed matrices into one owned matrix (q/k/v, gate/up); the
  // copies run in Finish(). nullopt when types or widths differ (callers keep them apart).
  std::optional<WeightView> Fuse(std::initializer_list<std::pair<std::string, WeightView>> parts);
  // `w` where and how decode reads it fastest: in owned huge-page memory
  // (kernels/cpu/streamed_memory.h), in WeightLayout::kTiles16 where that applies at the active
  // ISA (kernels/tile_layout.h). Fused matrices are repacked in place, trainable copies stay as
  // they are, others are copied (repacked or as they are); all in Finish(), which releases the
  // mapping's pages of each source once copied. For the matrices of dense layers and the head,
  // which every decode step streams whole.
  WeightView Streamed(const WeightView& w);
  // Runs the fuse copies, then the repacks, on the pool (a progress bar on a terminal).
  void Finish();

  StreamedArena TakeOwned() { return std::move(owned_); }
  std::vector<Parameter> TakeParameters() { return std::move(parameters_); }

 private:
  absl::StatusOr<const gguf::TensorInfo*> Find(const std::string& name, const TensorSpec** spec);
  Parameter& Record(const std::string& name, const TensorSpec& spec);

  struct Copy {
    uint8_t* dst;
    const void* src;
    size_t bytes;
  };
  struct Repack {
    WeightView src;  // row-major
    uint8_t* dst;    // may be src.data (a fused buffer)
  };
  const gguf::File& file_;
  const TensorTable& table_;
  ThreadPool& pool_;
  std::function<bool(std::string_view)> f32_;
  std::vector<Copy> copies_;
  std::vector<Repack> repacks_;
  std::vector<std::pair<const uint8_t*, size_t>> fused_;  // fused buffers: base, bytes
  // Fused, repacked and trainable copies: decode streams them every token (huge pages).
  StreamedArena owned_;
  std::vector<Parameter> parameters_;
};

// A MoE layer's expert weights, borrowed from the mapping. Expert e's gate rows are
// [e * stride, e * stride + expert_ffn) of `gate`, its up rows the same of `up` (or, with a
// fused gate_up stack, [e * stride + expert_ffn, e * stride + 2 expert_ffn) of `gate`).
struct ExpertStacks {
  WeightView gate, up, down;  // gate/up: [E * stride, hidden], down: [E * hidden, expert_ffn]
  bool fused_gate_up = false;
  const float* down_scale = nullptr;  // [E] per-expert output scale, or null
};

enum class Activation { kSilu, kGelu };

// ---- The family's runtime half: one per loaded model. ----
class FamilyModel {
 public:
  virtual ~FamilyModel() = default;
  // Binds this model's part (options: layer range, embeddings, head, experts only).
  virtual absl::Status Bind(TensorBinder& binder, const LoadOptions& options) = 0;
  // Runs absolute layer `layer` on ctx.x() in place.
  virtual absl::Status ForwardLayer(ForwardContext& ctx, int64_t layer) = 0;
  // Whether this family runs on K/V caches of `type` (an error says why not).
  virtual absl::Status CheckKvType(GgmlType type) const { return absl::OkStatus(); }
  // Scales token embeddings (gemma: sqrt(hidden)); 1 for most families.
  virtual float EmbeddingScale() const { return 1.0f; }
  // Final transformation of logits rows (gemma: softcapping); default none.
  virtual void FinishLogits(float* logits, int64_t rows) const {}
  // Routed experts of an absolute layer bound here (nullptr: none) and their activation.
  virtual const ExpertStacks* Experts(int64_t layer) const { return nullptr; }
  virtual Activation ExpertActivation() const { return Activation::kSilu; }
  // Per-layer embeddings (PLE): computes inputs [rows, num_layers, per_layer_input] of the
  // given tokens from the scaled embeddings `x` (rows of ctx). Only families with PLE.
  virtual absl::Status PerLayerInputs(ForwardContext& ctx, std::span<const int32_t> tokens) {
    return absl::UnimplementedError("this family has no per-layer embeddings");
  }
};

// The static half, registered by general.architecture.
struct ModelFamily {
  std::string_view arch;
  // GGUF metadata -> config (LayerSpecs filled); validated by the registry.
  absl::StatusOr<ModelConfig> (*read_config)(const gguf::File& file);
  // The tensor table of a config.
  TensorTable (*tensors)(const ModelConfig& config);
  // A model instance to bind.
  std::unique_ptr<FamilyModel> (*create)(const ModelConfig& config, const gguf::File& file);
  // Writes the family's GGUF metadata keys for `config` (the fixture writer); the tokenizer
  // and general.* keys are written by the caller.
  void (*write_config)(const ModelConfig& config, gguf::Writer& writer);
  // The config of a random-weight fixture (fixture.h) with `vocab` tokens; null: none.
  absl::StatusOr<ModelConfig> (*fixture_config)(const FixtureOptions& options,
                                                int64_t vocab) = nullptr;
};

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_FAMILY_H_
