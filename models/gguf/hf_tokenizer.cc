#include "models/gguf/hf_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <sstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
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
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" ||
         wrapped("<|", "|>") || wrapped("<\xef\xbd\x9c", "\xef\xbd\x9c>") ||  // U+FF5C, DeepSeek.
         wrapped("<unused", ">");                                           // Gemma.
}

bool IsByteToken(const std::string& t) {
  return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && std::isxdigit(static_cast<uint8_t>(t[3])) &&
         std::isxdigit(static_cast<uint8_t>(t[4])) && t[5] == '>';
}

// Whether a SentencePiece tokenizer.json prepends U+2581 to the text (Llama 2: a Prepend
// normalizer; newer files: a Metaspace pre-tokenizer); Gemma's does not.
bool PrependsSpace(const json& tok) {
  bool found = false;
  std::function<void(const json&)> visit = [&](const json& j) {
    if (!j.is_object()) return;
    const std::string type = j.value("type", "");
    if (type == "Prepend" && j.value("prepend", "") == "\xe2\x96\x81") found = true;
    if (type == "Metaspace" && j.value("prepend_scheme", "always") != "never" &&
        j.value("add_prefix_space", true)) {
      found = true;
    }
    for (const char* list : {"normalizers", "pretokenizers"}) {
      if (auto it = j.find(list); it != j.end() && it->is_array()) {
        for (const json& child : *it) visit(child);
      }
    }
  };
  visit(tok.value("normalizer", json()));
  visit(tok.value("pre_tokenizer", json()));
  return found;
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
  // SentencePiece BPE converted by transformers: byte fallback to <0xNN> pieces.
  const bool byte_fallback = model.value("byte_fallback", false);
  // Gemma 4's converter keeps such a vocabulary as BPE with its merges; otherwise it becomes
  // SentencePiece scores.
  const bool gemma4 = pre == "gemma4";
  if (gemma4 && !byte_fallback) {
    return absl::InvalidArgumentError(absl::StrCat(
        tok_path, ": a \"gemma4\" vocabulary needs a SentencePiece BPE model (byte_fallback)"));
  }
  const bool spm = byte_fallback && !gemma4;

  HfTokenizer out;
  out.model = gemma4 ? "gemma4" : spm ? "llama" : "gpt2";
  // The converter records "default" for every SPM vocabulary and nothing for Gemma 4's, whose
  // pre-tokenizer llama.cpp ties to the model name.
  out.pre = gemma4 ? "" : spm ? "default" : pre;
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

  // Merges: ["a b", ...] (older files) or [["a", "b"], ...] (newer files).
  std::vector<std::string> merges;
  for (const json& m : model.value("merges", json::array())) {
    if (m.is_string()) {
      merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.push_back(absl::StrCat(m[0].get<std::string>(), " ", m[1].get<std::string>()));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(tok_path, ": malformed merges entry"));
    }
  }

  out.tokens.assign(size, "");
  out.token_types.assign(size, static_cast<int32_t>(TokenType::kUnused));
  const std::string unk_token = model.value("unk_token", json()).is_string()
                                    ? model["unk_token"].get<std::string>()
                                    : std::string();
  std::vector<bool> in_model_vocab(size, false);
  for (const auto& [text, id] : model["vocab"].items()) {
    out.tokens[id.get<int64_t>()] = text;
    in_model_vocab[id.get<int64_t>()] = true;
    TokenType type = TokenType::kNormal;
    if (byte_fallback && IsByteToken(text)) type = TokenType::kByte;
    if (spm && text == unk_token) type = TokenType::kUnknown;
    out.token_types[id.get<int64_t>()] = static_cast<int32_t>(type);
  }
  if (spm) {
    // tokenizer.model's scores are gone from tokenizer.json, but its merges are ordered by them:
    // a piece scores minus the rank of the first merge forming it, so llama.cpp's SPM, which
    // merges the highest-scoring bigram first, merges in BPE's order. Pieces no merge forms
    // score below all others (BPE never forms them); unset ids get the converter's -10000.
    out.scores.assign(size, -10000.0f);
    absl::flat_hash_map<std::string, int64_t> id_of_text;
    id_of_text.reserve(model["vocab"].size());
    for (const auto& [text, id] : model["vocab"].items()) {
      id_of_text.emplace(text, id.get<int64_t>());
      out.scores[id.get<int64_t>()] = -static_cast<float>(merges.size());
    }
    std::vector<bool> scored(size, false);
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const std::string& m = merges[rank];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) continue;
      const auto it = id_of_text.find(absl::StrCat(m.substr(0, sp), m.substr(sp + 1)));
      if (it != id_of_text.end() && !scored[it->second]) {
        out.scores[it->second] = -static_cast<float>(rank);
        scored[it->second] = true;
      }
    }
  } else {
    out.merges = std::move(merges);
    // Gemma 4's converter writes a placeholder score for every token; BPE does not read them.
    if (gemma4) out.scores.assign(size, -1000.0f);
  }
  for (const json& a : added) {
    const int64_t id = a.value("id", int64_t{-1});
    if (id < 0 || !a.contains("content") || !a["content"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(tok_path, ": malformed added_tokens entry"));
    }
    std::string text = a["content"].get<std::string>();
    if (gemma4) {
      // As Gemma 4's converter types them: special tokens are control; other added tokens
      // keep their model-vocabulary type (normal: llama.cpp then merges e.g. "\n\n" and HTML
      // tags like any text), and ones outside it are user-defined. transformers' list of
      // special ids, which the converter reads, is approximated by the JSON's special flag.
      TokenType type = TokenType::kUserDefined;
      if (a.value("special", false)) {
        type = TokenType::kControl;
      } else if (in_model_vocab[id]) {
        type = static_cast<TokenType>(out.token_types[id]);
      }
      // Rendered as text so chat-format parsers can read tool calls and channels.
      for (std::string_view visible : {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
                                       "<|tool_response>", "<tool_response|>", "<|\"|>"}) {
        if (text == visible) type = TokenType::kUserDefined;
      }
      out.tokens[id] = std::move(text);
      out.token_types[id] = static_cast<int32_t>(type);
      continue;
    }
    const bool control = a.value("special", false) || LooksSpecial(text);
    // SentencePiece vocabularies store user-defined tokens with their spaces as text, since
    // llama.cpp matches them in the raw text before escaping spaces.
    if (spm && !control) text = absl::StrReplaceAll(text, {{"\xe2\x96\x81", " "}});
    out.tokens[id] = std::move(text);
    out.token_types[id] =
        static_cast<int32_t>(control ? TokenType::kControl : TokenType::kUserDefined);
    if (spm) out.scores[id] = -1000.0f;
  }
  for (int64_t id = 0; id < size; ++id) {
    if (out.tokens[id].empty()) out.tokens[id] = absl::StrCat("[PAD", id, "]");
  }

  absl::flat_hash_map<std::string_view, int32_t> ids;
  ids.reserve(size);
  for (int64_t id = size - 1; id >= 0; --id) ids[out.tokens[id]] = static_cast<int32_t>(id);
  auto id_of = [&](const std::optional<std::string>& text) -> std::optional<int32_t> {
    if (!text) return std::nullopt;
    const auto it = ids.find(*text);
    return it == ids.end() ? std::nullopt : std::optional<int32_t>(it->second);
  };
  const std::string config_path = dir + "/tokenizer_config.json";
  if (auto config = ReadJson(config_path); config.ok()) {
    out.bos_id = id_of(TokenText(*config, "bos_token"));
    out.eos_id = id_of(TokenText(*config, "eos_token"));
    out.pad_id = id_of(TokenText(*config, "pad_token"));
    out.unk_id = id_of(TokenText(*config, "unk_token"));
    out.add_bos = config->value("add_bos_token", false);
    if (auto it = config->find("add_eos_token"); it != config->end() && it->is_boolean()) {
      out.add_eos = it->get<bool>();
    }
    if (auto it = config->find("chat_template"); it != config->end() && it->is_string()) {
      out.chat_template = it->get<std::string>();
    }
  }
  if (gemma4) {
    out.add_bos = true;
    out.add_space_prefix = false;
  } else if (spm) {
    out.add_space_prefix = PrependsSpace(*tok);
  } else if (!out.bos_id) {
    // llama.cpp's converter falls back to the padding token as BOS for Qwen-style vocabularies.
    out.bos_id = out.pad_id;
  }
  return out;
}

void HfTokenizer::WriteTo(Writer& writer) const {
  writer.SetValue("tokenizer.ggml.model", Value::Str(model));
  if (!pre.empty()) writer.SetValue("tokenizer.ggml.pre", Value::Str(pre));
  writer.SetValue("tokenizer.ggml.tokens", Value::StrArray(tokens));
  if (!scores.empty()) writer.SetValue("tokenizer.ggml.scores", Value::F32Array(scores));
  writer.SetValue("tokenizer.ggml.token_type", Value::I32Array(token_types));
  if (model != "llama") writer.SetValue("tokenizer.ggml.merges", Value::StrArray(merges));
  if (eos_id) writer.SetValue("tokenizer.ggml.eos_token_id", Value::U32(*eos_id));
  if (pad_id) writer.SetValue("tokenizer.ggml.padding_token_id", Value::U32(*pad_id));
  if (bos_id) writer.SetValue("tokenizer.ggml.bos_token_id", Value::U32(*bos_id));
  if (unk_id) writer.SetValue("tokenizer.ggml.unknown_token_id", Value::U32(*unk_id));
  writer.SetValue("tokenizer.ggml.add_bos_token", Value::Bool(add_bos));
  if (add_eos) writer.SetValue("tokenizer.ggml.add_eos_token", Value::Bool(*add_eos));
  if (add_space_prefix) {
    writer.SetValue("tokenizer.ggml.add_space_prefix", Value::Bool(*add_space_prefix));
  }
  if (!chat_template.empty()) writer.SetValue("tokenizer.chat_template", Value::Str(chat_template));
}

}  // namespace fucina::gguf
