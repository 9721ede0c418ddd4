#include "models/gguf/hf_tokenizer.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "models/gguf/writer.h"

namespace fucina::gguf {
namespace {

using nlohmann::json;

absl::StatusOr<json> ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buf;
  buf << in.rdbuf();
  json j = json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON"));
  return j;
}

// A special token in tokenizer_config.json is either a string or {"content": "..."}.
std::optional<std::string> TokenText(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

// llama.cpp's converter treats some added tokens as control tokens even when the JSON does
// not mark them special (does_token_look_special).
bool LooksSpecial(const std::string& t) {
  auto wrapped = [&](std::string_view open, std::string_view close) {
    return t.size() >= open.size() + close.size() && t.compare(0, open.size(), open) == 0 &&
           t.compare(t.size() - close.size(), close.size(), close) == 0;
  };
  return t == "<pad>" || t == "<mask>" || wrapped("<|", "|>") ||
         wrapped("<\xef\xbd\x9c", "\xef\xbd\x9c>");  // U+FF5C, DeepSeek style.
}

}  // namespace

absl::StatusOr<HfTokenizer> ImportHfTokenizer(const std::string& dir, const std::string& pre,
                                              int64_t min_vocab) {
  const std::string tok_path = dir + "/tokenizer.json";
  auto tok = ReadJson(tok_path);
  if (!tok.ok()) return tok.status();
  const json& model = (*tok)["model"];
  if (!model.is_object() || model.value("type", "") != "BPE" || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(tok_path, ": model.type must be \"BPE\" with a vocab object"));
  }

  HfTokenizer out;
  out.pre = pre;
  // Ids may have holes between the BPE vocab and the added tokens.
  int64_t size = min_vocab;
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(tok_path, ": bad id for token ", text));
    }
    size = std::max<int64_t>(size, id.get<int64_t>() + 1);
  }
  const json added = tok->value("added_tokens", json::array());
  for (const json& a : added) size = std::max<int64_t>(size, a.value("id", int64_t{-1}) + 1);
  if (size > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(tok_path, ": vocabulary of ", size, " ids"));
  }

  out.tokens.assign(size, "");
  out.token_types.assign(size, static_cast<int32_t>(TokenType::kUnused));
  for (const auto& [text, id] : model["vocab"].items()) {
    out.tokens[id.get<int64_t>()] = text;
    out.token_types[id.get<int64_t>()] = static_cast<int32_t>(TokenType::kNormal);
  }
  for (const json& a : added) {
    const int64_t id = a.value("id", int64_t{-1});
    if (id < 0 || !a.contains("content")) {
      return absl::InvalidArgumentError(absl::StrCat(tok_path, ": malformed added_tokens entry"));
    }
    out.tokens[id] = a["content"].get<std::string>();
    const bool control = a.value("special", false) || LooksSpecial(out.tokens[id]);
    out.token_types[id] =
        static_cast<int32_t>(control ? TokenType::kControl : TokenType::kUserDefined);
  }
  for (int64_t id = 0; id < size; ++id) {
    if (out.tokens[id].empty()) out.tokens[id] = absl::StrCat("[PAD", id, "]");
  }

  // Merges: ["a b", ...] (older files) or [["a", "b"], ...] (newer files).
  for (const json& m : model.value("merges", json::array())) {
    if (m.is_string()) {
      out.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out.merges.push_back(absl::StrCat(m[0].get<std::string>(), " ", m[1].get<std::string>()));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(tok_path, ": malformed merges entry"));
    }
  }

  auto id_of = [&](const std::optional<std::string>& text) -> std::optional<int32_t> {
    if (!text) return std::nullopt;
    for (int64_t id = 0; id < size; ++id) {
      if (out.tokens[id] == *text) return static_cast<int32_t>(id);
    }
    return std::nullopt;
  };
  const std::string config_path = dir + "/tokenizer_config.json";
  if (auto config = ReadJson(config_path); config.ok()) {
    out.bos_id = id_of(TokenText(*config, "bos_token"));
    out.eos_id = id_of(TokenText(*config, "eos_token"));
    out.pad_id = id_of(TokenText(*config, "pad_token"));
    out.add_bos = config->value("add_bos_token", false);
    if (auto it = config->find("chat_template"); it != config->end() && it->is_string()) {
      out.chat_template = it->get<std::string>();
    }
  }
  // llama.cpp's converter falls back to the padding token as BOS for Qwen-style vocabularies.
  if (!out.bos_id) out.bos_id = out.pad_id;
  return out;
}

void HfTokenizer::WriteTo(Writer& writer) const {
  writer.SetValue("tokenizer.ggml.model", Value::Str("gpt2"));
  writer.SetValue("tokenizer.ggml.pre", Value::Str(pre));
  writer.SetValue("tokenizer.ggml.tokens", Value::StrArray(tokens));
  writer.SetValue("tokenizer.ggml.token_type", Value::I32Array(token_types));
  writer.SetValue("tokenizer.ggml.merges", Value::StrArray(merges));
  if (eos_id) writer.SetValue("tokenizer.ggml.eos_token_id", Value::U32(*eos_id));
  if (pad_id) writer.SetValue("tokenizer.ggml.padding_token_id", Value::U32(*pad_id));
  if (bos_id) writer.SetValue("tokenizer.ggml.bos_token_id", Value::U32(*bos_id));
  writer.SetValue("tokenizer.ggml.add_bos_token", Value::Bool(add_bos));
  if (!chat_template.empty()) writer.SetValue("tokenizer.chat_template", Value::Str(chat_template));
}

}  // namespace fucina::gguf
