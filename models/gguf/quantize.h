// Model quantization: GGUF in, GGUF out, with llama.cpp's choice of type per tensor.
//
// Targets: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k, and q4_k_m (llama.cpp's
// Q4_K_M mix). Rules (llama.cpp's llama_tensor_get_type, no importance matrix):
//  - only tensors named "*weight" with 2+ dims are converted; norms, biases, the MoE router
//    (ffn_gate_inp) and rope_freqs stay as they are;
//  - for quantized targets, the output matrix (token_embd when embeddings are tied) becomes
//    q6_k (q8_0 if its rows are not a multiple of 256, unchanged when the target is q8_0);
//  - q4_k_m: attn_v and ffn_down of the layers use_more_bits() picks become q6_k;
//  - q4_k (Q4_K_S): attn_v of the first 4 layers and ffn_down of the first eighth become q5_k;
//  - models with 8 experts keep attn_v and attn_k at q8_0;
//  - rows not a multiple of a k-quant's 256 fall back: q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0;
//  - `pure` skips every rule but the fallback.
// Metadata is copied, general.file_type updated to llama.cpp's ftype id.
#ifndef FUCINA_MODELS_GGUF_QUANTIZE_H_
#define FUCINA_MODELS_GGUF_QUANTIZE_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ggml_type.h"
#include "models/gguf/gguf.h"
#include "models/gguf/writer.h"

namespace fucina::gguf {

// A quantization target as named on the command line ("q4_k_m", "q8_0", ...).
struct QuantTarget {
  std::string name;
  GgmlType base;           // the type most tensors get.
  // llama.cpp's per-tensor mixes: q4_k is its Q4_K_S, q4_k_m its Q4_K_M.
  enum class Mix { kNone, kSmall, kMedium } mix = Mix::kNone;
  uint32_t llama_ftype;    // general.file_type value llama.cpp writes.
};

absl::StatusOr<QuantTarget> ParseQuantTarget(std::string_view name);

struct QuantizeOptions {
  bool pure = false;
  // Tensors to leave in their type whatever the rules say: the model family's table marks
  // them (e.g. routers); null: the name rules alone.
  std::function<bool(std::string_view name)> keep;
};

// The type tensor `name` with `dims` gets under `target` in a model with `num_layers` blocks
// and `num_experts` experts (0 = dense). Exposed for tests.
GgmlType ChooseTensorType(const QuantTarget& target, const QuantizeOptions& options,
                          std::string_view name, const std::vector<int64_t>& dims,
                          GgmlType current, bool has_output, int64_t num_layers,
                          int64_t num_experts);

// Converts any row of `src_type` (with a dequantizer) to `dst_type` (with a quantizer).
// `n` elements, a multiple of both block sizes.
absl::Status ConvertRow(GgmlType src_type, const void* src, GgmlType dst_type, void* dst,
                        int64_t n, float* scratch);

// Edits one dequantized row in place: values[row length] of row `row` (concurrent calls get
// distinct rows).
using RowEdit = std::function<void(int64_t row, float* values)>;

// Declares `src` (named src.name, with its dims) on `writer` as `dst_type`: the bytes as they
// are when the type is kept and there is no edit; otherwise, during Finish, each row
// dequantized, passed through `edit` (if set) and quantized, rows spread over `pool`. `src` (the
// TensorInfo and its data) must stay valid until Finish. Errors: those of AddTensor now; during Finish,
// a type without a (de)quantizer, naming the tensor. A line per converted tensor goes to `log`.
absl::Status AddConvertedTensor(Writer& writer, const TensorInfo& src, GgmlType dst_type,
                                ThreadPool& pool, std::FILE* log = nullptr,
                                RowEdit edit = nullptr);

// Reads `in`, writes the quantized model to `out_path`. Progress lines go to `log` if set.
absl::Status QuantizeModel(const File& in, const std::string& out_path, const QuantTarget& target,
                           const QuantizeOptions& options, ThreadPool& pool,
                           std::FILE* log = nullptr);

}  // namespace fucina::gguf

#endif  // FUCINA_MODELS_GGUF_QUANTIZE_H_
