#include "models/engine/merge.h"

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/engine/config.h"
#include "models/engine/lora.h"
#include "models/engine/model.h"
#include "models/engine/registry.h"
#include "models/gguf/gguf.h"
#include "models/gguf/writer.h"

namespace fucina {
namespace {

std::string StringKey(const gguf::File& f, std::string_view key) {
  const gguf::Value* v = f.Find(key);
  return v != nullptr && v->AsString() != nullptr ? *v->AsString() : std::string();
}

std::string Dims(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// What the trained files do to one base tensor.
struct TensorEdits {
  const gguf::TensorInfo* replacement = nullptr;  // f32, the base's dims
  std::string replaced_by;                         // its file
  std::vector<const LoraAdapter*> adapters;        // added in this order
};

// W[out, in] += scale * B[out, rank] A[rank, in], one row: values[in] of row `row`.
void AddLoraRow(const LoraAdapter& ad, int64_t row, float* values) {
  const float* b = ad.b.data() + row * ad.rank;
  for (int64_t r = 0; r < ad.rank; ++r) {
    const float c = ad.scale * b[r];
    if (c == 0.0f) continue;
    const float* a = ad.a.data() + r * ad.in;
    for (int64_t i = 0; i < ad.in; ++i) values[i] += c * a[i];
  }
}

}  // namespace

absl::StatusOr<std::vector<std::string>> TrainedFilesAt(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
  }
  if (!std::filesystem::is_directory(status)) return std::vector<std::string>{path};
  std::vector<std::string> found;
  for (std::string_view name : {kAdaptersFileName, kTensorsFileName}) {
    const std::string file = (std::filesystem::path(path) / name).string();
    if (std::filesystem::is_regular_file(file, ec)) found.push_back(file);
  }
  if (found.empty()) {
    return absl::NotFoundError(absl::StrCat(path, ": a directory with neither ",
                                            std::string(kAdaptersFileName), " nor ",
                                            std::string(kTensorsFileName)));
  }
  return found;
}

absl::StatusOr<std::string> AdapterFileAt(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return path;
  const std::string file = (std::filesystem::path(path) / kAdaptersFileName).string();
  if (std::filesystem::is_regular_file(file, ec)) return file;
  return absl::NotFoundError(absl::StrCat(
      path, ": a directory without ", std::string(kAdaptersFileName),
      std::filesystem::exists(std::filesystem::path(path) / kTensorsFileName, ec)
          ? " (its tensors.gguf is served once merged: fucina gguf export)"
          : ""));
}

absl::Status MergeModel(const std::string& base_path, std::span<const std::string> trained,
                        const std::string& out_path, const MergeOptions& options,
                        ThreadPool& pool) {
  auto base_or = gguf::File::Open(base_path);
  if (!base_or.ok()) return base_or.status();
  const gguf::File& base = **base_or;
  const std::string arch = StringKey(base, gguf::kKeyArchitecture);

  // Read and check every trained file before writing anything. The adapters' A and B are
  // owned by `lora_sets` (reserved: TensorEdits point into its elements).
  std::vector<std::unique_ptr<gguf::File>> files;
  std::vector<LoraSet> lora_sets;
  lora_sets.reserve(trained.size());
  std::map<std::string, TensorEdits> edits;
  for (const std::string& path : trained) {
    auto file = gguf::File::Open(path);
    if (!file.ok()) return file.status();
    const gguf::File& f = **file;
    auto err = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
    };
    const std::string type = StringKey(f, "general.type");
    if (type == "adapter") {
      auto set = ReadLoraFile(f, arch);
      if (!set.ok()) return set.status();
      if (absl::Status s = CheckLoraFits(*set, path, base); !s.ok()) return s;
      lora_sets.push_back(*std::move(set));
      lora_sets.back().ForEach([&](int64_t layer, LoraTarget t, const LoraAdapter& ad) {
        edits[LoraTensorName(layer, t)].adapters.push_back(&ad);
      });
    } else if (type == kTensorsFileType) {
      const std::string file_arch = StringKey(f, gguf::kKeyArchitecture);
      if (!file_arch.empty() && file_arch != arch) {
        return err(absl::StrCat("tensors for '", file_arch, "', the base is '", arch, "'"));
      }
      for (const gguf::TensorInfo& t : f.tensors()) {
        const gguf::TensorInfo* w = base.FindTensor(t.name);
        if (w == nullptr) return err(absl::StrCat(t.name, ": ", base_path, " has no tensor"));
        if (w->dims != t.dims) {
          return err(absl::StrCat(t.name, ": ", Dims(t.dims), " but ", Dims(w->dims), " in ",
                                  base_path));
        }
        if (t.type != GgmlType::kF32) {
          return err(absl::StrCat(t.name, ": type ", std::string(TypeName(t.type)),
                                  ", expected f32"));
        }
        TensorEdits& e = edits[t.name];
        if (e.replacement != nullptr) {
          return err(absl::StrCat(t.name, " is replaced by ", e.replaced_by, " already"));
        }
        e.replacement = &t;
        e.replaced_by = path;
      }
    } else {
      return err(absl::StrCat("general.type is ", type.empty() ? "missing" : "'" + type + "'",
                              "; expected \"adapter\" (LoRA) or \"",
                              std::string(kTensorsFileType), "\" (trained tensors)"));
    }
    files.push_back(*std::move(file));
  }

  // The quantizer's rules need the model's shape and its family's kept tensors (routers); a
  // family we do not know falls back to the name rules, as `gguf quantize` does.
  gguf::QuantizeOptions quantize;
  std::set<std::string> keep;
  int64_t num_layers = 0, num_experts = 0;
  if (options.type) {
    if (auto table = ModelTensorTable(base); table.ok()) {
      for (const TensorSpec& t : *table) {
        if (!t.quantize) keep.insert(t.name);
      }
      quantize.keep = [&keep](std::string_view name) { return keep.contains(std::string(name)); };
    }
    if (auto config = ReadModelConfig(base); config.ok()) {
      num_layers = config->num_layers;
      num_experts = config->num_experts;
    }
  }
  const bool has_output = base.FindTensor("output.weight") != nullptr;

  auto writer_or = gguf::Writer::Create(out_path, static_cast<uint32_t>(base.alignment()));
  if (!writer_or.ok()) return writer_or.status();
  gguf::Writer& writer = **writer_or;
  for (const auto& [key, value] : base.metadata()) {
    if (!key.starts_with("split.")) writer.SetValue(key, value);  // one output file
  }
  if (options.type) {
    writer.SetValue("general.file_type", gguf::Value::U32(options.type->llama_ftype));
    writer.SetValue("general.quantization_version", gguf::Value::U32(2));
  }
  for (const gguf::TensorInfo& t : base.tensors()) {
    const GgmlType dst_type =
        options.type ? gguf::ChooseTensorType(*options.type, quantize, t.name, t.dims, t.type,
                                              has_output, num_layers, num_experts)
                     : t.type;
    auto it = edits.find(t.name);
    if (it == edits.end()) {
      if (absl::Status s = gguf::AddConvertedTensor(writer, t, dst_type, pool, options.log);
          !s.ok()) {
        return s;
      }
      continue;
    }
    const TensorEdits& e = it->second;
    // A replacement is written under the base's name and type; its bytes go as they are when
    // that type is f32 and no adapter sits on it.
    const gguf::TensorInfo& src = e.replacement != nullptr ? *e.replacement : t;
    gguf::RowEdit edit;
    if (!e.adapters.empty()) {
      edit = [adapters = e.adapters](int64_t row, float* values) {
        for (const LoraAdapter* ad : adapters) AddLoraRow(*ad, row, values);
      };
    }
    if (absl::Status s = gguf::AddConvertedTensor(writer, src, dst_type, pool, options.log,
                                                  std::move(edit));
        !s.ok()) {
      return s;
    }
  }
  return writer.Finish();
}

}  // namespace fucina
