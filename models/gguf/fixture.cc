#include "models/gguf/fixture.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/type_traits.h"
#include "models/gguf/gguf.h"
#include "models/gguf/hf_tokenizer.h"
#include "models/gguf/quantize.h"
#include "models/gguf/writer.h"
#include "models/sampler/rng.h"

namespace fucina::gguf {
namespace {

// Normals from the project's SplitMix64 (models/sampler/rng.h) by Box-Muller, as fixture.h
// documents.
class NormalStream {
 public:
  explicit NormalStream(uint64_t seed) : state_(seed) {}
  double Uniform() { return static_cast<double>(SplitMix64Next(&state_) >> 11) * 0x1.0p-53; }
  double Normal() {
    const double u1 = 1.0 - Uniform();
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  uint64_t state_;
};

// How a tensor's values are produced.
struct Init {
  enum Kind { kNormal, kOnes, kRopeFreqs } kind = kNormal;
  double std = 0.0;
};

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the row length.
  Init init;
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
  if (o.arch != "qwen3" && o.arch != "qwen3moe" && o.arch != "llama") {
    return absl::InvalidArgumentError(
        absl::StrCat("--arch: '", o.arch, "' is not one of qwen3, qwen3moe, llama"));
  }
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
  if (o.arch == "qwen3moe" &&
      (o.num_experts < 1 || o.num_experts_used < 1 || o.num_experts_used > o.num_experts ||
       o.expert_ffn < 1)) {
    return absl::InvalidArgumentError(
        "qwen3moe: need --experts >= --experts-used >= 1 and --expert-ffn >= 1");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MakeFixture(const FixtureOptions& o, const std::string& path, ThreadPool& pool) {
  if (auto s = Validate(o); !s.ok()) return s;
  auto target = ParseQuantTarget(o.type);
  if (!target.ok()) return target.status();

  HfTokenizer tokenizer;
  if (!o.tokenizer_dir.empty()) {
    auto imported = ImportHfTokenizer(o.tokenizer_dir, o.pre, o.vocab);
    if (!imported.ok()) return imported.status();
    tokenizer = *std::move(imported);
  } else {
    tokenizer = ByteTokenizer(o.vocab);
  }
  const int64_t vocab = static_cast<int64_t>(tokenizer.tokens.size());
  const bool llama = o.arch == "llama";
  const bool moe = o.arch == "qwen3moe";
  const int64_t head_dim = llama ? o.hidden / o.num_heads : o.head_dim;
  const int64_t q_dim = o.num_heads * head_dim;
  const int64_t kv_dim = o.num_heads_kv * head_dim;

  auto writer_or = Writer::Create(path);
  if (!writer_or.ok()) return writer_or.status();
  Writer& w = **writer_or;
  const std::string& a = o.arch;
  auto key = [&](const char* suffix) { return absl::StrCat(a, ".", suffix); };
  w.SetValue("general.architecture", Value::Str(a));
  w.SetValue("general.name", Value::Str(o.name.empty() ? absl::StrCat(a, "-fixture") : o.name));
  w.SetValue("general.file_type", Value::U32(target->llama_ftype));
  w.SetValue(key("block_count"), Value::U32(o.num_layers));
  w.SetValue(key("context_length"), Value::U32(o.context_length));
  w.SetValue(key("embedding_length"), Value::U32(o.hidden));
  w.SetValue(key("feed_forward_length"), Value::U32(moe ? o.expert_ffn : o.ffn));
  w.SetValue(key("attention.head_count"), Value::U32(o.num_heads));
  w.SetValue(key("attention.head_count_kv"), Value::U32(o.num_heads_kv));
  if (!llama) {
    w.SetValue(key("attention.key_length"), Value::U32(head_dim));
    w.SetValue(key("attention.value_length"), Value::U32(head_dim));
  } else {
    w.SetValue(key("rope.dimension_count"), Value::U32(head_dim));
    w.SetValue(key("vocab_size"), Value::U32(vocab));
  }
  w.SetValue(key("rope.freq_base"), Value::F32(o.rope_base));
  w.SetValue(key("attention.layer_norm_rms_epsilon"), Value::F32(o.rms_eps));
  if (moe) {
    w.SetValue(key("expert_count"), Value::U32(o.num_experts));
    w.SetValue(key("expert_used_count"), Value::U32(o.num_experts_used));
    w.SetValue(key("expert_feed_forward_length"), Value::U32(o.expert_ffn));
  }
  tokenizer.WriteTo(w);

  // The tensor plan, in file order (the order seeds the per-tensor RNG streams).
  const double big = o.peaked ? 1.0 : o.init_std;
  std::vector<PlannedTensor> plan;
  auto add = [&](std::string name, std::vector<int64_t> dims, Init init) {
    plan.push_back({std::move(name), std::move(dims), init});
  };
  const Init normal{Init::kNormal, o.init_std};
  const Init ones{Init::kOnes};
  add("token_embd.weight", {o.hidden, vocab}, {Init::kNormal, big});
  add("output_norm.weight", {o.hidden}, ones);
  if (!o.tied) add("output.weight", {o.hidden, vocab}, {Init::kNormal, big});
  if (llama && o.rope_freqs) add("rope_freqs.weight", {head_dim / 2}, {Init::kRopeFreqs});
  for (int64_t l = 0; l < o.num_layers; ++l) {
    const std::string b = absl::StrCat("blk.", l, ".");
    add(b + "attn_norm.weight", {o.hidden}, ones);
    add(b + "attn_q.weight", {o.hidden, q_dim}, normal);
    add(b + "attn_k.weight", {o.hidden, kv_dim}, normal);
    add(b + "attn_v.weight", {o.hidden, kv_dim}, normal);
    add(b + "attn_output.weight", {q_dim, o.hidden}, normal);
    if (!llama) {
      add(b + "attn_q_norm.weight", {head_dim}, ones);
      add(b + "attn_k_norm.weight", {head_dim}, ones);
    }
    add(b + "ffn_norm.weight", {o.hidden}, ones);
    if (moe) {
      add(b + "ffn_gate_inp.weight", {o.hidden, o.num_experts},
          {Init::kNormal, o.peaked ? 1.0 : o.init_std});
      add(b + "ffn_gate_exps.weight", {o.hidden, o.expert_ffn, o.num_experts}, normal);
      add(b + "ffn_up_exps.weight", {o.hidden, o.expert_ffn, o.num_experts}, normal);
      add(b + "ffn_down_exps.weight", {o.expert_ffn, o.hidden, o.num_experts}, normal);
    } else {
      add(b + "ffn_gate.weight", {o.hidden, o.ffn}, normal);
      add(b + "ffn_up.weight", {o.hidden, o.ffn}, normal);
      add(b + "ffn_down.weight", {o.ffn, o.hidden}, normal);
    }
  }

  const QuantizeOptions qopts;
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedTensor* t = &plan[i];
    const GgmlType type = ChooseTensorType(*target, qopts, t->name, t->dims, GgmlType::kF32,
                                           !o.tied, o.num_layers, moe ? o.num_experts : 0);
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

}  // namespace fucina::gguf
