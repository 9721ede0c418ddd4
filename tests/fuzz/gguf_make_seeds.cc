// Writes the fuzz seeds in tests/data/gguf/ (committed; rerun only to change them):
//   gguf_make_seeds <out_dir> [SmolLM2-135M-Instruct.Q4_1.gguf]
// tiny_llama.gguf: a small llama-like file (tokenizer arrays, 5 tensors of 4 types).
// all_values.gguf: every value type incl. nested arrays, alignment 64, 2 tensors.
// smollm2_header.gguf: the real file's header, metadata (arrays cut to their first 256 items
//   to stay small) and all tensor infos, cut at the data offset: the data itself is absent.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "models/gguf/gguf.h"
#include "models/gguf/writer.h"

namespace fucina::gguf {
namespace {

Writer::FillFn RandomFill(uint32_t seed) {
  return [seed](std::span<uint8_t> out) {
    std::mt19937 rng(seed);
    for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
    return absl::OkStatus();
  };
}

absl::Status TinyLlama(const std::string& path) {
  auto w = Writer::Create(path);
  if (!w.ok()) return w.status();
  Writer& wr = **w;
  wr.SetValue("general.architecture", Value::Str("llama"));
  wr.SetValue("general.name", Value::Str("tiny"));
  wr.SetValue("llama.block_count", Value::U32(1));
  wr.SetValue("llama.context_length", Value::U32(128));
  wr.SetValue("llama.embedding_length", Value::U32(64));
  wr.SetValue("llama.feed_forward_length", Value::U32(256));
  wr.SetValue("llama.attention.head_count", Value::U32(4));
  wr.SetValue("llama.attention.head_count_kv", Value::U32(2));
  wr.SetValue("llama.rope.freq_base", Value::F32(10000.0f));
  wr.SetValue("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5f));
  wr.SetValue("tokenizer.ggml.model", Value::Str("gpt2"));
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (int i = 0; i < 32; ++i) {
    tokens.push_back(i < 3 ? std::vector<std::string>{"<unk>", "<s>", "</s>"}[i]
                           : std::string(1 + i % 3, static_cast<char>('a' + i % 26)));
    scores.push_back(-static_cast<float>(i));
    types.push_back(i < 3 ? 3 : 1);
  }
  wr.SetValue("tokenizer.ggml.tokens", Value::StrArray(tokens));
  wr.SetValue("tokenizer.ggml.scores", Value::F32Array(scores));
  wr.SetValue("tokenizer.ggml.token_type", Value::I32Array(types));
  wr.SetValue("tokenizer.ggml.merges", Value::StrArray({"a b", "ab c"}));
  wr.SetValue("tokenizer.ggml.bos_token_id", Value::U32(1));
  wr.SetValue("tokenizer.ggml.add_bos_token", Value::Bool(true));
  const struct {
    const char* name;
    std::vector<int64_t> dims;
    GgmlType type;
  } kTensors[] = {
      {"token_embd.weight", {64, 32}, GgmlType::kQ4_0},
      {"blk.0.attn_norm.weight", {64}, GgmlType::kF32},
      {"blk.0.attn_q.weight", {64, 64}, GgmlType::kQ8_0},
      {"blk.0.ffn_down.weight", {256, 8}, GgmlType::kQ4_K},
      {"output_norm.weight", {64}, GgmlType::kF16},
  };
  uint32_t seed = 1;
  for (const auto& t : kTensors) {
    if (absl::Status s = wr.AddTensor(t.name, t.dims, t.type, RandomFill(seed++)); !s.ok()) {
      return s;
    }
  }
  return wr.Finish();
}

absl::Status AllValues(const std::string& path) {
  auto w = Writer::Create(path, 64);
  if (!w.ok()) return w.status();
  Writer& wr = **w;
  wr.SetValue("general.architecture", Value::Str("test"));
  wr.SetValue("v.u8", Value::U8(1));
  wr.SetValue("v.i8", Value::I8(-1));
  wr.SetValue("v.u16", Value::U16(2));
  wr.SetValue("v.i16", Value::I16(-2));
  wr.SetValue("v.u32", Value::U32(3));
  wr.SetValue("v.i32", Value::I32(-3));
  wr.SetValue("v.f32", Value::F32(0.5f));
  wr.SetValue("v.bool", Value::Bool(false));
  wr.SetValue("v.str", Value::Str("text"));
  wr.SetValue("v.u64", Value::U64(4));
  wr.SetValue("v.i64", Value::I64(-4));
  wr.SetValue("v.f64", Value::F64(0.25));
  wr.SetValue("v.u16s", Value::Array(ValueType::kUint16, {Value::U16(1), Value::U16(2)}));
  wr.SetValue("v.nested", Value::Array(ValueType::kArray,
                                       {Value::StrArray({"p", "q"}), Value::I32Array({7}),
                                        Value::Array(ValueType::kArray, {Value::F32Array({1})})}));
  if (absl::Status s = wr.AddTensor("a", {32, 2}, GgmlType::kQ5_1, RandomFill(9)); !s.ok()) {
    return s;
  }
  if (absl::Status s = wr.AddTensor("b", {3, 2, 2}, GgmlType::kI16, RandomFill(10)); !s.ok()) {
    return s;
  }
  return wr.Finish();
}

Value CutArrays(const Value& v, size_t keep) {
  const Array* arr = v.AsArray();
  if (arr == nullptr || arr->items.size() <= keep) return v;
  return Value::Array(arr->elem_type,
                      std::vector<Value>(arr->items.begin(), arr->items.begin() + keep));
}

absl::Status SmolLm2Header(const std::string& model, const std::string& path) {
  auto f = File::Open(model);
  if (!f.ok()) return f.status();
  const std::string full = path + ".full";
  {
    auto w = Writer::Create(full, static_cast<uint32_t>((*f)->alignment()));
    if (!w.ok()) return w.status();
    for (const auto& [key, value] : (*f)->metadata()) (*w)->SetValue(key, CutArrays(value, 256));
    for (const TensorInfo& t : (*f)->tensors()) {
      // Zero bytes: only the layout up to the data offset is kept.
      absl::Status s = (*w)->AddTensor(t.name, t.dims, t.type,
                                       [](std::span<uint8_t>) { return absl::OkStatus(); });
      if (!s.ok()) return s;
    }
    if (absl::Status s = (*w)->Finish(); !s.ok()) return s;
  }
  auto written = File::Open(full);
  if (!written.ok()) return written.status();
  const uint64_t keep = (*written)->data_offset();
  written->reset();
  std::filesystem::resize_file(full, keep);
  std::filesystem::rename(full, path);
  return absl::OkStatus();
}

}  // namespace
}  // namespace fucina::gguf

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: gguf_make_seeds <out_dir> [SmolLM2 gguf]\n";
    return 2;
  }
  const std::string dir = argv[1];
  absl::Status s = fucina::gguf::TinyLlama(dir + "/tiny_llama.gguf");
  if (s.ok()) s = fucina::gguf::AllValues(dir + "/all_values.gguf");
  if (s.ok() && argc > 2) s = fucina::gguf::SmolLm2Header(argv[2], dir + "/smollm2_header.gguf");
  if (!s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  return 0;
}
