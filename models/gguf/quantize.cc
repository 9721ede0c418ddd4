#include "models/gguf/quantize.h"

#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/quant/blocks.h"
#include "kernels/type_traits.h"
#include "models/gguf/writer.h"

namespace fucina::gguf {
namespace {

using Mix = QuantTarget::Mix;

struct TargetRow {
  std::string_view name;
  GgmlType base;
  Mix mix;
  uint32_t ftype;  // llama_ftype enum values.
};

constexpr TargetRow kTargets[] = {
    {"f32", GgmlType::kF32, Mix::kNone, 0},      {"f16", GgmlType::kF16, Mix::kNone, 1},
    {"q4_0", GgmlType::kQ4_0, Mix::kNone, 2},    {"q4_1", GgmlType::kQ4_1, Mix::kNone, 3},
    {"q8_0", GgmlType::kQ8_0, Mix::kNone, 7},    {"q5_0", GgmlType::kQ5_0, Mix::kNone, 8},
    {"q5_1", GgmlType::kQ5_1, Mix::kNone, 9},    {"q4_k", GgmlType::kQ4_K, Mix::kSmall, 14},
    {"q4_k_m", GgmlType::kQ4_K, Mix::kMedium, 15}, {"q5_k", GgmlType::kQ5_K, Mix::kNone, 16},
    {"q6_k", GgmlType::kQ6_K, Mix::kNone, 18},   {"bf16", GgmlType::kBF16, Mix::kNone, 32},
};

bool IsQuantized(GgmlType t) {
  return t != GgmlType::kF32 && t != GgmlType::kF16 && t != GgmlType::kBF16;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between.
bool UseMoreBits(int64_t i_layer, int64_t n_layers) {
  return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 ||
         (i_layer - n_layers / 8) % 3 == 2;
}

// "blk.12.ffn_down.weight" -> 12; -1 when the name has no block index.
int64_t LayerIndex(std::string_view name) {
  if (!name.starts_with("blk.")) return -1;
  int64_t index = 0;
  size_t i = 4;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) index = index * 10 + (name[i] - '0');
  return i > 4 && i < name.size() && name[i] == '.' ? index : -1;
}

bool Contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

GgmlType KQuantFallback(GgmlType t, int64_t row) {
  if (row % kQK_K == 0) return t;
  switch (t) {
    case GgmlType::kQ4_K: return GgmlType::kQ5_0;
    case GgmlType::kQ5_K: return GgmlType::kQ5_1;
    case GgmlType::kQ6_K: return GgmlType::kQ8_0;
    default: return t;
  }
}

}  // namespace

absl::StatusOr<QuantTarget> ParseQuantTarget(std::string_view name) {
  for (const TargetRow& row : kTargets) {
    if (row.name == name) return QuantTarget{std::string(name), row.base, row.mix, row.ftype};
  }
  std::string known;
  for (const TargetRow& row : kTargets) absl::StrAppend(&known, known.empty() ? "" : ", ", std::string(row.name));
  return absl::InvalidArgumentError(
      absl::StrCat("unknown quantization type '", std::string(name), "' (expected one of: ", known, ")"));
}

GgmlType ChooseTensorType(const QuantTarget& target, const QuantizeOptions& options,
                          std::string_view name, const std::vector<int64_t>& dims,
                          GgmlType current, bool has_output, int64_t num_layers,
                          int64_t num_experts) {
  if (!name.ends_with("weight") || dims.size() < 2) return current;
  if (options.keep && options.keep(name)) return current;
  if (Contains(name, "ffn_gate_inp") || Contains(name, "rope_freqs") ||
      Contains(name, "_norm")) {
    return current;
  }
  GgmlType type = target.base;
  if (!options.pure && IsQuantized(target.base)) {
    const bool is_output =
        name == "output.weight" || (!has_output && name == "token_embd.weight");
    if (is_output) {
      if (dims[0] % kQK_K != 0) {
        type = GgmlType::kQ8_0;
      } else if (type != GgmlType::kQ8_0) {
        type = GgmlType::kQ6_K;
      }
    } else if (Contains(name, "attn_v.weight")) {
      const int64_t layer = LayerIndex(name);
      if (target.mix == Mix::kMedium && UseMoreBits(layer, num_layers)) type = GgmlType::kQ6_K;
      if (target.mix == Mix::kSmall && layer < 4) type = GgmlType::kQ5_K;
      if (num_experts == 8) type = GgmlType::kQ8_0;
    } else if (Contains(name, "attn_k.weight")) {
      if (num_experts == 8) type = GgmlType::kQ8_0;
    } else if (Contains(name, "ffn_down")) {
      const int64_t layer = LayerIndex(name);
      if (target.mix == Mix::kMedium && UseMoreBits(layer, num_layers)) type = GgmlType::kQ6_K;
      if (target.mix == Mix::kSmall && layer < num_layers / 8) type = GgmlType::kQ5_K;
    }
  }
  const GgmlTypeInfo& info = TypeInfo(type);
  if (dims[0] % info.block_size != 0) {
    type = KQuantFallback(type, dims[0]);
    if (dims[0] % TypeInfo(type).block_size != 0) type = GgmlType::kF16;
  }
  return type;
}

absl::Status ConvertRow(GgmlType src_type, const void* src, GgmlType dst_type, void* dst,
                        int64_t n, float* scratch) {
  const CpuTypeTraits* from = GetCpuTraits(src_type);
  const CpuTypeTraits* to = GetCpuTraits(dst_type);
  if (from == nullptr || from->to_float == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("no dequantizer for type ", std::string(TypeName(src_type))));
  }
  if (to == nullptr || to->from_float == nullptr) {
    return absl::UnimplementedError(absl::StrCat("no quantizer for type ", std::string(TypeName(dst_type))));
  }
  from->to_float(src, scratch, n);
  to->from_float(scratch, dst, n);
  return absl::OkStatus();
}

absl::Status AddConvertedTensor(Writer& writer, const TensorInfo& src, GgmlType dst_type,
                                ThreadPool& pool, std::FILE* log, RowEdit edit) {
  if (dst_type == src.type && !edit) {
    return writer.AddTensorBytes(src.name, src.dims, src.type, {src.data, src.nbytes});
  }
  const int64_t row = src.dims[0];
  const int64_t rows = src.num_elements() / row;
  return writer.AddTensor(
      src.name, src.dims, dst_type,
      [&src, dst_type, row, rows, &pool, log, edit = std::move(edit)](std::span<uint8_t> out) {
        const CpuTypeTraits* from = GetCpuTraits(src.type);
        const CpuTypeTraits* to = GetCpuTraits(dst_type);
        if (from == nullptr || from->to_float == nullptr) {
          return absl::UnimplementedError(absl::StrCat(
              src.name, ": no dequantizer for type ", std::string(TypeName(src.type))));
        }
        if (to == nullptr || to->from_float == nullptr) {
          return absl::UnimplementedError(absl::StrCat(
              src.name, ": no quantizer for type ", std::string(TypeName(dst_type))));
        }
        const size_t src_row_bytes = static_cast<size_t>(RowBytes(src.type, row));
        const size_t dst_row_bytes = static_cast<size_t>(RowBytes(dst_type, row));
        std::vector<std::vector<float>> scratch(pool.num_threads(), std::vector<float>(row));
        pool.ParallelFor(rows, 16, [&](int64_t r0, int64_t r1, int thread) {
          float* values = scratch[thread].data();
          for (int64_t r = r0; r < r1; ++r) {
            from->to_float(src.data + r * src_row_bytes, values, row);
            if (edit) edit(r, values);
            to->from_float(values, out.data() + r * dst_row_bytes, row);
          }
        });
        if (log != nullptr) {
          std::fprintf(log, "%-40s %-6s -> %-6s %lld x %lld%s\n", src.name.c_str(),
                       std::string(TypeName(src.type)).c_str(),
                       std::string(TypeName(dst_type)).c_str(), static_cast<long long>(rows),
                       static_cast<long long>(row), edit ? " (merged)" : "");
        }
        return absl::OkStatus();
      });
}

absl::Status QuantizeModel(const File& in, const std::string& out_path, const QuantTarget& target,
                           const QuantizeOptions& options, ThreadPool& pool, std::FILE* log) {
  auto writer_or = Writer::Create(out_path, static_cast<uint32_t>(in.alignment()));
  if (!writer_or.ok()) return writer_or.status();
  Writer& writer = **writer_or;

  // Metadata: copied in order; split keys dropped (the output is one file).
  for (const auto& [key, value] : in.metadata()) {
    if (key.starts_with("split.")) continue;
    writer.SetValue(key, value);
  }
  writer.SetValue("general.file_type", Value::U32(target.llama_ftype));
  writer.SetValue("general.quantization_version", Value::U32(2));

  std::string arch;
  if (const Value* v = in.Find("general.architecture"); v != nullptr && v->AsString()) {
    arch = *v->AsString();
  }
  auto meta_int = [&](const char* suffix) -> int64_t {
    const Value* v = in.Find(absl::StrCat(arch, ".", suffix));
    return v != nullptr && v->AsUint() ? static_cast<int64_t>(*v->AsUint()) : 0;
  };
  const int64_t num_layers = meta_int("block_count");
  const int64_t num_experts = meta_int("expert_count");
  const bool has_output = in.FindTensor("output.weight") != nullptr;

  for (const TensorInfo& t : in.tensors()) {
    const GgmlType dst_type = ChooseTensorType(target, options, t.name, t.dims, t.type,
                                               has_output, num_layers, num_experts);
    if (absl::Status s = AddConvertedTensor(writer, t, dst_type, pool, log); !s.ok()) return s;
  }
  return writer.Finish();
}

}  // namespace fucina::gguf
