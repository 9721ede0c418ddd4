// Merging what training produced into a dense model that any loader reads without adapters:
// a base GGUF plus LoRA adapter files and/or tensors files -> one GGUF (`fucina gguf export`).
//
// Trained files, told apart by general.type:
//  - "adapter": LoRA adapters (ReadLoraFile in lora.h; `fucina train es --mode lora`). Each
//    sits on a base matrix W [out, in] (GGUF dims [in, out]), which becomes
//    W' = W + scale * B A, computed row by row in f32 from W dequantized.
//  - "tensors": trained tensors replacing the base's (full-mode training): each named and
//    shaped as in the base, f32; no other key is needed.
// Replacements come first, then every adapter on the tensor in file order (adapters from
// several files add up). Then each touched tensor is written as the target type (re-quantized
// to its own type when there is none); the others are copied byte for byte unless the target
// type converts them too.
#ifndef FUCINA_MODELS_ENGINE_MERGE_H_
#define FUCINA_MODELS_ENGINE_MERGE_H_

#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/thread_pool.h"
#include "models/gguf/quantize.h"

namespace fucina {

// general.type of a tensors file.
inline constexpr std::string_view kTensorsFileType = "tensors";
// What a training run's output directory holds (either or both).
inline constexpr std::string_view kAdaptersFileName = "adapters.gguf";
inline constexpr std::string_view kTensorsFileName = "tensors.gguf";

struct MergeOptions {
  // Every tensor's type by `gguf quantize --type`'s rules (gguf::ChooseTensorType; the model
  // family's table keeps its routers); general.file_type follows. Absent: each tensor keeps
  // its type and the metadata its file type.
  std::optional<gguf::QuantTarget> type;
  std::FILE* log = nullptr;  // a line per converted tensor
};

// The trained files `path` names: itself when it is a file; in a directory, adapters.gguf
// and/or tensors.gguf. NOT_FOUND naming the path: nothing there, or a directory with neither.
absl::StatusOr<std::vector<std::string>> TrainedFilesAt(const std::string& path);
// The adapter file `path` names, for serving without a merge: itself when it is a file; in a
// directory (a train run's --out), its adapters.gguf. NOT_FOUND naming the path otherwise (a
// full-mode run's tensors.gguf is not an adapter: `fucina gguf export` merges it).
absl::StatusOr<std::string> AdapterFileAt(const std::string& path);

// Writes `base_path` with every file of `trained` merged into `out_path` (through
// "<out_path>.tmp", so a failure leaves no output). Metadata is the base's, without split.*
// keys. Every trained file is checked before anything is written; INVALID_ARGUMENT naming the
// file and the tensor or key: a general.type other than "adapter" or "tensors", adapters for
// another architecture, a tensor the base lacks, dims that differ from the base's, a
// replacement that is not f32, a tensor replaced by two files. Other errors: those of opening
// the files and of writing.
absl::Status MergeModel(const std::string& base_path, std::span<const std::string> trained,
                        const std::string& out_path, const MergeOptions& options,
                        ThreadPool& pool);

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_MERGE_H_
