#include "models/engine/fixture.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/type_traits.h"
#include "models/engine/blocks.h"
#include "models/engine/registry.h"
#include "models/gguf/gguf.h"
#include "models/gguf/hf_tokenizer.h"
#include "models/gguf/quantize.h"
#include "models/gguf/writer.h"
#include "models/sampler/rng.h"

namespace fucina {
namespace {

using gguf::HfTokenizer;
using gguf::TokenType;
using gguf::Value;
using gguf::Writer;

// How a tensor's values are produced.
struct Init {
  enum Kind { kNormal, kOnes, kScale, kRopeFreqs } kind = kNormal;
  double std = 0.0;
};

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the row length.
  Init init;
  bool quantize = true;
};

// GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to U+0100 + i.
std::vector<std::string> ByteLevelTokens() {
  std::vector<std::string> tokens(256);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cp = printable ? b : 0x100 + extra++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    tokens[b] = s;
  }
  return tokens;
}

// A tokenizer for fixtures made without a real one: the 256 byte tokens, no merges, and the
// ChatML control tokens, padded to `vocab`.
HfTokenizer ByteTokenizer(int64_t vocab) {
  HfTokenizer t;
  t.pre = "gpt-2";  // llama.cpp's name for the GPT-2 pre-tokenizer
  t.tokens = ByteLevelTokens();
  t.token_types.assign(256, static_cast<int32_t>(TokenType::kNormal));
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    t.tokens.push_back(special);
    t.token_types.push_back(static_cast<int32_t>(TokenType::kControl));
  }
  t.pad_id = t.bos_id = 256;
  t.eos_id = 258;
  while (static_cast<int64_t>(t.tokens.size()) < vocab) {
    t.tokens.push_back(absl::StrCat("[PAD", t.tokens.size(), "]"));
    t.token_types.push_back(static_cast<int32_t>(TokenType::kUnused));
  }
  return t;
}

absl::Status Validate(const FixtureOptions& o) {
  auto positive = [](const char* flag, int64_t v) {
    return v > 0 ? absl::OkStatus()
                 : absl::InvalidArgumentError(absl::StrCat(flag, " must be positive"));
  };
  for (auto [flag, v] : {std::pair{"--layers", o.num_layers}, {"--hidden", o.hidden},
                         {"--ffn", o.ffn}, {"--heads", o.num_heads}, {"--kv-heads", o.num_heads_kv},
                         {"--head-dim", o.head_dim}}) {
    if (auto s = positive(flag, v); !s.ok()) return s;
  }
  if (o.num_heads % o.num_heads_kv != 0) {
    return absl::InvalidArgumentError("--heads must be a multiple of --kv-heads");
  }
  if (o.head_dim % 2 != 0) return absl::InvalidArgumentError("--head-dim must be even");
  if (o.arch == "llama" && o.hidden % o.num_heads != 0) {
    return absl::InvalidArgumentError("llama: --hidden must be a multiple of --heads");
  }
  if ((o.arch == "qwen3moe" || (o.arch == "gemma4" && o.moe)) &&
      (o.num_experts < 1 || o.num_experts_used < 1 || o.num_experts_used > o.num_experts ||
       o.expert_ffn < 1)) {
    return absl::InvalidArgumentError(
        "MoE: need --experts >= --experts-used >= 1 and --expert-ffn >= 1");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MakeFixture(const FixtureOptions& o, const std::string& path, ThreadPool& pool) {
  if (auto s = Validate(o); !s.ok()) return s;
  auto target = gguf::ParseQuantTarget(o.type);
  if (!target.ok()) return target.status();

  HfTokenizer tokenizer;
  if (!o.tokenizer_dir.empty()) {
    auto imported = gguf::ImportHfTokenizer(o.tokenizer_dir, o.pre, o.vocab);
    if (!imported.ok()) return imported.status();
    tokenizer = *std::move(imported);
  } else {
    tokenizer = ByteTokenizer(o.vocab);
  }
  const int64_t vocab = static_cast<int64_t>(tokenizer.tokens.size());
  auto family = FindModelFamily(o.arch);
  if (!family.ok()) return absl::InvalidArgumentError(absl::StrCat("--arch: ", family.status().message()));
  if ((*family)->fixture_config == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--arch: ", o.arch, " has no fixture"));
  }
  auto config = (*family)->fixture_config(o, vocab);
  if (!config.ok()) return config.status();
  if (absl::Status s = config->Validate(); !s.ok()) return s;
  const ModelConfig& c = *config;

  auto writer_or = Writer::Create(path);
  if (!writer_or.ok()) return writer_or.status();
  Writer& w = **writer_or;
  w.SetValue("general.architecture", Value::Str(o.arch));
  w.SetValue("general.name",
             Value::Str(o.name.empty() ? absl::StrCat(o.arch, "-fixture") : o.name));
  w.SetValue("general.file_type", Value::U32(target->llama_ftype));
  (*family)->write_config(c, w);
  tokenizer.WriteTo(w);

  // The family's table, in its order (the order seeds the per-tensor RNG streams).
  const double big = o.peaked ? 1.0 : o.init_std;
  std::vector<PlannedTensor> plan;
  for (const TensorSpec& t : (*family)->tensors(c)) {
    if (!t.fixture || (t.name == "output.weight" && o.tied)) continue;
    if (t.name == "rope_freqs.weight" && o.arch == "llama" && !o.rope_freqs) continue;
    Init init{Init::kNormal, o.init_std};
    switch (t.init) {
      case TensorInit::kNormal: break;
      case TensorInit::kPeaked: init.std = big; break;
      case TensorInit::kUnit: init.std = 1.0; break;
      case TensorInit::kOnes: init.kind = Init::kOnes; break;
      case TensorInit::kScale: init.kind = Init::kScale; break;
      case TensorInit::kRopeFreqs: init.kind = Init::kRopeFreqs; break;
    }
    plan.push_back({t.name, t.dims, init, t.quantize});
  }

  const gguf::QuantizeOptions qopts;
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedTensor* t = &plan[i];
    const GgmlType type =
        t->quantize ? gguf::ChooseTensorType(*target, qopts, t->name, t->dims, GgmlType::kF32,
                                             !o.tied, c.num_layers, c.num_experts)
                    : GgmlType::kF32;
    const uint64_t stream = o.seed ^ (0x9E3779B97F4A7C15ull * (i + 1));
    absl::Status s = w.AddTensor(
        t->name, t->dims, type, [t, type, stream, &pool](std::span<uint8_t> out) {
          int64_t count = 1;
          for (int64_t d : t->dims) count *= d;
          std::vector<float> values(count);
          NormalStream rng(stream);
          for (int64_t j = 0; j < count; ++j) {
            switch (t->init.kind) {
              case Init::kNormal: values[j] = static_cast<float>(rng.Normal() * t->init.std); break;
              case Init::kOnes: values[j] = 1.0f; break;
              case Init::kScale: values[j] = static_cast<float>(1.0 + 0.2 * rng.Normal()); break;
              case Init::kRopeFreqs:
                values[j] = 1.0f + static_cast<float>(j) / static_cast<float>(count);
                break;
            }
          }
          const int64_t row = t->dims[0];
          const size_t row_bytes = static_cast<size_t>(RowBytes(type, row));
          const CpuTypeTraits* traits = GetCpuTraits(type);
          if (traits == nullptr || traits->from_float == nullptr) {
            return absl::InternalError(absl::StrCat("no quantizer for ", std::string(TypeName(type))));
          }
          pool.ParallelFor(count / row, 16, [&](int64_t r0, int64_t r1, int) {
            for (int64_t r = r0; r < r1; ++r) {
              traits->from_float(values.data() + r * row, out.data() + r * row_bytes, row);
            }
          });
          return absl::OkStatus();
        });
    if (!s.ok()) return s;
  }
  return w.Finish();
}

}  // namespace fucina
