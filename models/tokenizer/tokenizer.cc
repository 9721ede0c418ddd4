#include "models/tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "models/tokenizer/spm.h"
#include "models/tokenizer/unicode.h"

namespace fucina {
namespace {

constexpr char kSpmSpace[] = "\xe2\x96\x81";  // U+2581, SentencePiece's space.

// GGUF token types (tokenizer.ggml.token_type) -> attribute bits, as llama_vocab::impl::load.
uint32_t AttrOfType(int64_t type) {
  switch (type) {
    case 1: return kTokenAttrNormal;
    case 2: return kTokenAttrUnknown;
    case 3: return kTokenAttrControl;
    case 4: return kTokenAttrUserDefined;
    case 5: return kTokenAttrUnused;
    case 6: return kTokenAttrByte;
    default: return 0;  // Undefined.
  }
}

// "<0xNN>", the text of byte fallback tokens (upper-case hex, as llama.cpp looks them up).
std::string ByteTokenText(char c) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  const auto b = static_cast<uint8_t>(c);
  return {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
}

// C isspace in the "C" locale, which llama.cpp's lstrip / rstrip use.
bool IsCSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

const gguf::Array* GetArray(const gguf::File& f, std::string_view key) {
  const gguf::Value* v = f.Find(key);
  return v ? v->AsArray() : nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const gguf::File& file) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  if (absl::Status s = t->Load(file); !s.ok()) return s;
  return t;
}

absl::Status Tokenizer::Load(const gguf::File& file) {
  auto error = [&](std::string_view key, std::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", std::string(key), " ",
                                                   std::string(what)));
  };
  const gguf::Value* model_v = file.Find("tokenizer.ggml.model");
  if (model_v == nullptr || model_v->AsString() == nullptr) {
    return error("tokenizer.ggml.model", "is missing or not a string");
  }
  const std::string& model = *model_v->AsString();
  if (model == "gpt2" || model == "gemma4") {
    model_ = Model::kBpe;
    std::string pre;
    if (const gguf::Value* v = file.Find("tokenizer.ggml.pre")) {
      if (v->AsString() == nullptr) return error("tokenizer.ggml.pre", "is not a string");
      pre = *v->AsString();
    }
    // A "gemma4" vocabulary is BPE whose pre-tokenizer is always Gemma 4's, whatever the file
    // says (the converter writes no tokenizer.ggml.pre for it).
    if (model == "gemma4") pre = "gemma4";
    const std::optional<PreTokenizerSpec> spec = FindPreTokenizer(pre);
    if (!spec) return error("tokenizer.ggml.pre", absl::StrCat("'", pre, "' is not supported"));
    pre_ = *spec;
    const gguf::Array* merges = GetArray(file, "tokenizer.ggml.merges");
    if (merges == nullptr || merges->elem_type != gguf::ValueType::kString) {
      return error("tokenizer.ggml.merges", "is missing or not an array of strings");
    }
    for (size_t i = 0; i < merges->items.size(); ++i) {
      merges_.Add(*merges->items[i].AsString(), static_cast<int32_t>(i));
    }
    // llama.cpp's defaults for BPE vocabularies; "gemma4" ones name their ids in the file.
    bos_ = pre_.no_bos || model == "gemma4" ? -1 : 11;
    eos_ = model == "gemma4" ? -1 : 11;
    add_bos_ = pre_.add_bos;
    add_space_prefix_ = false;
  } else if (model == "llama") {
    model_ = Model::kSpm;
    bos_ = 1;
    eos_ = 2;
    add_bos_ = true;
    add_space_prefix_ = true;
  } else {
    return error("tokenizer.ggml.model", absl::StrCat("'", model, "' is not supported"));
  }
  if (const gguf::Value* v = file.Find("tokenizer.ggml.add_space_prefix"); v && v->AsBool()) {
    add_space_prefix_ = *v->AsBool();
  }

  const gguf::Array* tokens = GetArray(file, "tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->elem_type != gguf::ValueType::kString) {
    return error("tokenizer.ggml.tokens", "is missing or not an array of strings");
  }
  const size_t n = tokens->items.size();
  if (n == 0 || n > (size_t{1} << 30)) return error("tokenizer.ggml.tokens", "has no tokens");
  const gguf::Array* scores = GetArray(file, "tokenizer.ggml.scores");
  if (scores != nullptr) {
    if (scores->elem_type != gguf::ValueType::kFloat32 &&
        scores->elem_type != gguf::ValueType::kInt32) {
      return error("tokenizer.ggml.scores", "must be an array of float32 or int32");
    }
    if (scores->items.size() < n) return error("tokenizer.ggml.scores", "is shorter than tokens");
  }
  const gguf::Array* types = GetArray(file, "tokenizer.ggml.token_type");
  if (types != nullptr) {
    if (types->elem_type != gguf::ValueType::kInt32) {
      return error("tokenizer.ggml.token_type", "must be an array of int32");
    }
    if (types->items.size() < n) {
      return error("tokenizer.ggml.token_type", "is shorter than tokens");
    }
  }

  tokens_.resize(n);
  attrs_.resize(n);
  scores_.resize(n);
  token_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    std::string word = *tokens->items[i].AsString();
    if (word.empty()) word = absl::StrCat("[EMPTY_", i, "]");
    token_to_id_[word] = static_cast<int32_t>(i);  // A repeated text maps to its last id.
    tokens_[i] = std::move(word);
    scores_[i] = scores ? static_cast<float>(scores->items[i].AsFloat().value_or(0)) : 0.0f;
    attrs_[i] = types ? AttrOfType(types->items[i].AsInt().value_or(0)) : kTokenAttrNormal;
  }
  byte_tokens_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    int32_t id = Find(ByteTokenText(static_cast<char>(b)));
    if (id < 0) id = Find(std::string(1, static_cast<char>(b)));
    byte_tokens_[b] = id;
  }

  // Defaults outside the vocabulary are disabled; keys override them when in range.
  if (bos_ >= static_cast<int32_t>(n)) bos_ = -1;
  if (eos_ >= static_cast<int32_t>(n)) eos_ = -1;
  auto read_id = [&](std::string_view key, int32_t* id) {
    const gguf::Value* v = file.Find(key);
    if (v == nullptr) return false;
    const std::optional<uint64_t> u = v->AsUint();
    if (u && *u < n) *id = static_cast<int32_t>(*u);
    return true;
  };
  read_id("tokenizer.ggml.bos_token_id", &bos_);
  read_id("tokenizer.ggml.eos_token_id", &eos_);
  if (const gguf::Value* v = file.Find("tokenizer.ggml.add_bos_token"); v && v->AsBool()) {
    add_bos_ = *v->AsBool();
  }
  if (const gguf::Value* v = file.Find("tokenizer.ggml.add_eos_token"); v && v->AsBool()) {
    add_eos_ = *v->AsBool();
  }
  if (pre_.force_add_bos) add_bos_ = true;

  DetectSpecialTokens(file);

  pieces_.resize(n);
  for (size_t i = 0; i < n; ++i) pieces_[i] = ComputePiece(static_cast<int32_t>(i));
  return absl::OkStatus();
}

void Tokenizer::DetectSpecialTokens(const gguf::File& file) {
  const int32_t n = vocab_size();
  auto key_id = [&](std::initializer_list<std::string_view> keys) {
    int32_t id = -1;
    for (std::string_view key : keys) {
      if (const gguf::Value* v = file.Find(key)) {
        if (const auto u = v->AsUint(); u && *u < static_cast<uint64_t>(n)) {
          id = static_cast<int32_t>(*u);
        }
      }
    }
    return id;
  };
  // llama.cpp finds ids the file does not give by token text, marking the token as control.
  // It takes the first candidate in hash-map order; the lowest id is taken here (the same
  // whenever a vocabulary has one candidate, as real ones do).
  auto by_text = [&](int32_t id, std::initializer_list<std::string_view> texts) {
    if (id >= 0) return id;
    for (std::string_view text : texts) {
      const int32_t found = Find(text);
      if (found >= 0 && (id < 0 || found < id)) id = found;
    }
    if (id >= 0) attrs_[id] |= kTokenAttrControl;
    return id;
  };
  const int32_t eot = by_text(key_id({"tokenizer.ggml.eot_token_id"}),
                              {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                               "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                               "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                               "<end_of_utterance>"});
  const int32_t eom = by_text(key_id({"tokenizer.ggml.eom_token_id"}), {"<|eom_id|>"});
  by_text(key_id({"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"}),
          {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81"
           "begin\xef\xbd\x9c>", "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"});
  by_text(key_id({"tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"}),
          {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81"
           "hole\xef\xbd\x9c>", "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"});
  by_text(key_id({"tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"}),
          {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81"
           "end\xef\xbd\x9c>", "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"});
  const int32_t fim_pad = by_text(key_id({"tokenizer.ggml.fim_pad_token_id"}),
                                  {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  const int32_t fim_rep = by_text(key_id({"tokenizer.ggml.fim_rep_token_id"}),
                                  {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                   "<reponame>"});
  const int32_t fim_sep = by_text(key_id({"tokenizer.ggml.fim_sep_token_id"}), {"<|file_sep|>"});
  // Control tokens named "unused" (Gemma's <unusedN>) are flagged unused, as llama.cpp does
  // at this point (before end-of-generation tokens get their control bit).
  for (int32_t id = 0; id < n; ++id) {
    if ((attrs_[id] & kTokenAttrControl) && tokens_[id].find("unused") != std::string::npos) {
      attrs_[id] |= kTokenAttrUnused;
    }
  }

  std::vector<int32_t> eog;
  for (int32_t id : {fim_pad, fim_rep, fim_sep}) {
    if (id >= 0) eog.push_back(id);
  }
  for (std::string_view text :
       {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]",
        "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~["}) {
    if (const int32_t id = Find(text); id >= 0) {
      eog.push_back(id);
      attrs_[id] |= kTokenAttrControl;
    }
  }
  // gpt-oss: rendered as text, so matched like user-defined tokens.
  for (std::string_view text : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    if (const int32_t id = Find(text); id >= 0) attrs_[id] = kTokenAttrUserDefined;
  }
  for (int32_t id : {eos_, eot, eom}) {
    if (id >= 0) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  auto eog_has = [&](std::string_view text) {
    return std::any_of(eog.begin(), eog.end(), [&](int32_t id) { return tokens_[id] == text; });
  };
  auto eog_remove = [&](std::string_view text, uint32_t new_attr) {
    for (size_t i = 0; i < eog.size(); ++i) {
      if (tokens_[eog[i]] == text) {
        attrs_[eog[i]] = new_attr;
        eog.erase(eog.begin() + i);
        return;
      }
    }
  };
  // Harmony-style formats continue after <|end|>; Gemma 4 after </s>.
  const bool has_call = eog_has("<|call|>") || eog_has("<|calls|>");
  if (eog_has("<|end|>") && has_call && (eog_has("<|return|>") || eog_has("<|flush|>"))) {
    eog_remove("<|end|>", kTokenAttrUserDefined);
  }
  if (eog_has("<|tool_response>") && eog_has("</s>")) eog_remove("</s>", kTokenAttrNormal);
  eog_ = std::move(eog);

  for (int32_t id = 0; id < n; ++id) {
    if (attrs_[id] & (kTokenAttrControl | kTokenAttrUserDefined | kTokenAttrUnknown)) {
      special_tokens_.push_back(id);
    }
  }
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(), [&](int32_t a, int32_t b) {
    return tokens_[a].size() > tokens_[b].size();
  });

  // Strip attributes llama.cpp sets by model name (GGUF has no per-token attributes).
  auto string_key = [&](std::string_view key) {
    const gguf::Value* v = file.Find(key);
    return v && v->AsString() ? *v->AsString() : std::string();
  };
  std::string name = string_key("general.name");
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string pre = string_key("tokenizer.ggml.pre");
  const std::string arch = string_key("general.architecture");
  auto contains = [](const std::string& s, std::initializer_list<std::string_view> subs) {
    return std::any_of(subs.begin(), subs.end(),
                       [&](std::string_view sub) { return s.find(sub) != std::string::npos; });
  };
  auto set_attr = [&](std::string_view text, uint32_t bit, bool on) {
    if (const int32_t id = Find(text); id >= 0) attrs_[id] = on ? attrs_[id] | bit : attrs_[id] & ~bit;
  };
  if (contains(pre, {"jina-v2-de", "jina-v2-es", "jina-v2-code"}) ||
      contains(arch, {"nomic-bert-moe", "jina-bert-v3"})) {
    set_attr("<mask>", kTokenAttrLstrip, true);
  } else if (contains(name, {"phi-3", "phi3"})) {
    for (int32_t id : special_tokens_) attrs_[id] |= kTokenAttrRstrip;
    set_attr("</s>", kTokenAttrRstrip, true);
    for (std::string_view text : {"<unk>", "<s>", "<|endoftext|>"}) {
      set_attr(text, kTokenAttrRstrip, false);
    }
  } else if (contains(name, {"modern-bert"})) {
    set_attr("[MASK]", kTokenAttrLstrip, true);
  }
}

int32_t Tokenizer::Find(std::string_view text) const {
  const auto it = token_to_id_.find(absl::string_view(text.data(), text.size()));
  return it == token_to_id_.end() ? -1 : it->second;
}

std::string Tokenizer::ComputePiece(int32_t id) const {
  const uint32_t attr = attrs_[id];
  const std::string& text = tokens_[id];
  if (attr & (kTokenAttrUnknown | kTokenAttrControl | kTokenAttrUserDefined)) return text;
  if (attr & kTokenAttrNormal) {
    if (model_ == Model::kSpm || pre_.escape_whitespaces) {
      return absl::StrReplaceAll(text, {{kSpmSpace, " "}});
    }
    // Byte-level: each code point stands for one byte; others are flagged as llama.cpp does.
    std::string out;
    for (uint32_t cp : DecodeUtf8Lenient(text)) {
      if (const int b = UnicodeToByte(cp); b >= 0) {
        out.push_back(static_cast<char>(b));
        continue;
      }
      std::string utf8;
      AppendUtf8(cp, &utf8);
      out += "[UNK_BYTE_0x";
      for (unsigned char c : utf8) {
        static constexpr char kHex[] = "0123456789abcdef";
        out.push_back(kHex[c >> 4]);
        out.push_back(kHex[c & 15]);
      }
      out += text + "]";
    }
    return out;
  }
  if (attr & kTokenAttrByte) {
    // "<0xNN>": the two hex digits after "<0x".
    const std::string hex = text.size() >= 5 ? text.substr(3, 2) : std::string();
    return std::string(1, static_cast<char>(std::strtol(hex.c_str(), nullptr, 16)));
  }
  return std::string();
}

void Tokenizer::EncodeBpe(std::string_view text, std::vector<int32_t>* out) const {
  std::vector<std::string_view> pieces;
  std::string encoded;
  const std::string escaped =
      pre_.escape_whitespaces ? absl::StrReplaceAll(std::string(text), {{" ", kSpmSpace}}) : "";
  if (pre_.escape_whitespaces) text = escaped;
  for (const std::string& word : PreTokenize(pre_.kind, text)) {
    if (pre_.escape_whitespaces) {
      encoded = word;
    } else {
      encoded.clear();
      for (char c : word) encoded += ByteToUnicodeUtf8(static_cast<uint8_t>(c));
    }
    const bool whole = pre_.ignore_merges ||
                       (pre_.newline_words_whole &&
                        encoded.find_first_not_of('\n') == std::string::npos);
    if (whole) {
      if (const int32_t id = Find(encoded); id >= 0) {
        out->push_back(id);
        continue;
      }
    }
    pieces.clear();
    BpeMergeWord(encoded, merges_, &pieces);
    for (std::string_view piece : pieces) {
      if (const int32_t id = Find(piece); id >= 0) {
        out->push_back(id);
        continue;
      }
      // Not a token: llama.cpp looks each byte up on its own, as a <0xNN> token for raw UTF-8
      // words and as the one-character text for byte-level ones (so there only ASCII survives).
      // Bytes without a token are dropped.
      for (char c : piece) {
        const int32_t id =
            pre_.escape_whitespaces ? Find(ByteTokenText(c)) : Find(std::string_view(&c, 1));
        if (id >= 0) out->push_back(id);
      }
    }
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  return EncodeImpl(text, add_special, parse_special, {});
}

std::vector<int32_t> Tokenizer::EncodeWithPlainRanges(
    std::string_view text, bool add_special,
    std::span<const std::pair<size_t, size_t>> plain) const {
  return EncodeImpl(text, add_special, /*parse_special=*/true, plain);
}

std::vector<int32_t> Tokenizer::EncodeImpl(
    std::string_view text, bool add_special, bool parse_special,
    std::span<const std::pair<size_t, size_t>> plain) const {
  auto in_plain = [&](size_t at) {
    return std::any_of(plain.begin(), plain.end(),
                       [at](const auto& r) { return at >= r.first && at < r.second; });
  };
  // Fragments of the text: a special token (id >= 0) or raw bytes [offset, offset + length).
  struct Fragment {
    int32_t id;
    size_t offset;
    size_t length;
  };
  std::vector<Fragment> frags;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  // Each special token, longest first, splits every raw fragment at all its occurrences
  // (llama.cpp's tokenizer_st_partition).
  for (int32_t sid : special_tokens_) {
    const uint32_t attr = attrs_[sid];
    if (!parse_special && (attr & (kTokenAttrControl | kTokenAttrUnknown))) continue;
    const std::string& tok = tokens_[sid];
    next.clear();
    for (const Fragment& f : frags) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      size_t off = f.offset;
      size_t len = f.length;
      const bool control = (attr & (kTokenAttrControl | kTokenAttrUnknown)) != 0;
      for (size_t from = off;;) {
        const size_t match = text.substr(0, off + len).find(tok, from);
        if (match == std::string_view::npos) {
          if (len > 0) next.push_back({-1, off, len});
          break;
        }
        if (control && in_plain(match)) {  // text, not a token: look further, same fragment
          from = match + 1;
          continue;
        }
        size_t left_len = match - off;
        if (attr & kTokenAttrLstrip) {
          while (left_len > 0 && IsCSpace(text[off + left_len - 1])) --left_len;
        }
        if (left_len > 0) next.push_back({-1, off, left_len});
        next.push_back({sid, 0, 0});
        const size_t end = match + tok.size();
        if (end >= off + len) break;
        size_t right_off = end;
        size_t right_len = off + len - end;
        if (attr & kTokenAttrRstrip) {
          while (right_len > 0 && IsCSpace(text[right_off])) {
            ++right_off;
            --right_len;
          }
        }
        off = right_off;
        len = right_len;
        from = off;
      }
    }
    frags.swap(next);
  }

  std::vector<int32_t> out;
  const bool bos = add_special && add_bos_ && bos_ >= 0;
  if (bos) out.push_back(bos_);
  if (model_ == Model::kSpm) {
    const SpmVocab vocab{&token_to_id_, &scores_, &byte_tokens_};
    bool prev_special = true;  // The text start counts as after a special token.
    for (const Fragment& f : frags) {
      if (f.id >= 0) {
        out.push_back(f.id);
        prev_special = true;
        continue;
      }
      std::string raw;
      if (add_space_prefix_ && prev_special) raw = " ";
      raw.append(text.substr(f.offset, f.length));
      SpmEncode(absl::StrReplaceAll(raw, {{" ", kSpmSpace}}), vocab, &out);
      prev_special = false;
    }
  } else {
    for (const Fragment& f : frags) {
      if (f.id >= 0) {
        out.push_back(f.id);
      } else {
        EncodeBpe(text.substr(f.offset, f.length), &out);
      }
    }
  }
  if (add_special && add_eos_ && eos_ >= 0) out.push_back(eos_);
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  bool remove_space = add_space_prefix_;
  if (skip_special && add_bos_ && !ids.empty() && ids.front() == bos_) {
    remove_space = false;
    ids = ids.subspan(1);
  }
  if (skip_special && add_eos_ && !ids.empty() && ids.back() == eos_) {
    ids = ids.first(ids.size() - 1);
  }
  std::string out;
  for (int32_t id : ids) {
    const bool strip = remove_space;
    remove_space = false;
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && (attrs_[id] & (kTokenAttrControl | kTokenAttrUnknown))) continue;
    std::string_view piece = pieces_[id];
    if (strip && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
    out.append(piece);
  }
  return out;
}

std::string Tokenizer::TokenToPiece(int32_t id) const {
  return id >= 0 && id < vocab_size() ? pieces_[id] : std::string();
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  return std::binary_search(eog_.begin(), eog_.end(), id);
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view piece) const {
  return OptionalId(Find(piece));
}

uint32_t Tokenizer::TokenAttributes(int32_t id) const {
  return id >= 0 && id < vocab_size() ? attrs_[id] : 0;
}

namespace {

// Bytes of the well-formed UTF-8 sequence starting at s[0] (RFC 3629: no overlongs, surrogates
// or code points above U+10FFFF): > 0 complete, 0 a valid but truncated prefix, < 0 invalid.
int Utf8Complete(std::string_view s) {
  const auto b0 = static_cast<uint8_t>(s[0]);
  if (b0 < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // Allowed range of the second byte.
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int i = 1; i < need; ++i) {
    if (static_cast<size_t>(i) >= s.size()) return 0;
    const auto b = static_cast<uint8_t>(s[i]);
    if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -1;
  }
  return need;
}

}  // namespace

std::string Utf8Stream::Push(std::string_view bytes) {
  pending_.append(bytes);
  size_t i = 0;
  while (i < pending_.size()) {
    const int n = Utf8Complete(std::string_view(pending_).substr(i));
    if (n == 0) break;  // Wait for the rest of this character.
    i += n > 0 ? static_cast<size_t>(n) : 1;  // An invalid byte passes through on its own.
  }
  std::string out = pending_.substr(0, i);
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::Flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

std::string ValidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const int n = Utf8Complete(bytes.substr(i));
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += static_cast<size_t>(n);
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      ++i;
    }
  }
  return out;
}

}  // namespace fucina
