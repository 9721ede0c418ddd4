#include "models/chat/chat_template.h"

#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "models/chat/jinja_capi.h"

namespace fucina {

const char kChatMlTemplate[] =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

namespace {

// Takes ownership of a string returned by the engine.
std::string TakeEngineString(char* s) {
  if (s == nullptr) return {};
  std::string out(s);
  fucina_jinja_free(s);
  return out;
}

// Text of token `id` from tokenizer.ggml.tokens, or "" when the id key is absent.
absl::StatusOr<std::string> TokenText(const gguf::File& file, std::string_view id_key) {
  const gguf::Value* id_value = file.Find(id_key);
  if (id_value == nullptr) return std::string();
  std::optional<uint64_t> id = id_value->AsUint();
  if (!id) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": ", std::string(id_key), " is not a non-negative integer"));
  }
  const gguf::Value* tokens = file.Find("tokenizer.ggml.tokens");
  const gguf::Array* arr = tokens != nullptr ? tokens->AsArray() : nullptr;
  if (arr == nullptr || arr->elem_type != gguf::ValueType::kString) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": ", std::string(id_key), " is set but tokenizer.ggml.tokens is missing"));
  }
  if (*id >= arr->items.size()) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", std::string(id_key), " = ",
                                                   *id, " is outside the vocabulary of ",
                                                   arr->items.size(), " tokens"));
  }
  return *arr->items[*id].AsString();
}

}  // namespace

struct ChatTemplate::Compiled {
  FucinaJinjaTemplate* handle = nullptr;
  ~Compiled() { fucina_jinja_template_free(handle); }
};

ChatTemplate ChatTemplate::FromSource(std::string source) {
  ChatTemplate t;
  t.source_ = std::move(source);
  FucinaJinjaTemplate* handle = nullptr;
  char* err = nullptr;
  if (fucina_jinja_compile(t.source_.c_str(), &handle, &err) != 0) {
    t.status_ = absl::InvalidArgumentError(TakeEngineString(err));
    return t;
  }
  auto compiled = std::make_shared<Compiled>();
  compiled->handle = handle;
  t.compiled_ = std::move(compiled);
  return t;
}

ChatTemplate ChatTemplate::ChatMl() {
  ChatTemplate t = FromSource(kChatMlTemplate);
  t.builtin_chatml_ = true;
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromGguf(const gguf::File& file) {
  absl::StatusOr<std::string> bos = TokenText(file, "tokenizer.ggml.bos_token_id");
  if (!bos.ok()) return bos.status();
  absl::StatusOr<std::string> eos = TokenText(file, "tokenizer.ggml.eos_token_id");
  if (!eos.ok()) return eos.status();

  ChatTemplate t;
  const gguf::Value* value = file.Find(kGgufChatTemplateKey);
  if (value == nullptr) {
    t = ChatMl();
  } else {
    const std::string* source = value->AsString();
    if (source == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": ", kGgufChatTemplateKey, " is not a string"));
    }
    t = FromSource(*source);
    if (!t.status_.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": ", kGgufChatTemplateKey, ": ", t.status_.message()));
    }
  }
  t.bos_token_ = *std::move(bos);
  t.eos_token_ = *std::move(eos);
  return t;
}

nlohmann::ordered_json ChatTemplate::MakeContext(const std::vector<ChatMessage>& messages,
                                                 const ChatRenderOptions& options) const {
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    j["role"] = m.role;
    j["content"] = m.content;
    if (!m.reasoning_content.empty()) j["reasoning_content"] = m.reasoning_content;
    if (!m.tool_calls.is_null()) j["tool_calls"] = m.tool_calls;
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) j["name"] = m.name;
    msgs.push_back(std::move(j));
  }
  // HF passes messages, tools (None when absent), add_generation_prompt, then the special
  // tokens and the caller's extra keyword arguments.
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = std::move(msgs);
  ctx["tools"] = options.tools;
  ctx["add_generation_prompt"] = options.add_generation_prompt;
  ctx["bos_token"] = options.bos_token.empty() ? bos_token_ : options.bos_token;
  ctx["eos_token"] = options.eos_token.empty() ? eos_token_ : options.eos_token;
  if (options.enable_thinking.has_value()) ctx["enable_thinking"] = *options.enable_thinking;
  if (options.extra.is_object()) {
    for (const auto& [key, value] : options.extra.items()) ctx[key] = value;
  }
  return ctx;
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 const ChatRenderOptions& options) const {
  if (!status_.ok()) return status_;
  if (!options.tools.is_null() && !options.tools.is_array()) {
    return absl::InvalidArgumentError("chat template: tools must be null or an array");
  }
  if (!options.extra.is_null() && !options.extra.is_object()) {
    return absl::InvalidArgumentError("chat template: extra must be null or an object");
  }
  // Invalid UTF-8 in message text becomes U+FFFD rather than failing the whole request.
  const std::string context = MakeContext(messages, options)
                                  .dump(-1, ' ', /*ensure_ascii=*/false,
                                        nlohmann::ordered_json::error_handler_t::replace);
  char* out = nullptr;
  char* err = nullptr;
  if (fucina_jinja_render_compiled(compiled_->handle, context.c_str(), &out, &err) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", TakeEngineString(err)));
  }
  return TakeEngineString(out);
}

std::vector<std::pair<size_t, size_t>> UserContentRanges(
    std::string_view rendered, std::span<const ChatMessage> messages) {
  constexpr std::string_view kSpace = " \t\n\v\f\r";
  std::vector<std::pair<size_t, size_t>> ranges;
  size_t cursor = 0;
  for (const ChatMessage& m : messages) {
    std::string_view content = m.content;
    const size_t first = content.find_first_not_of(kSpace);
    if (first == std::string_view::npos) continue;
    content = content.substr(first, content.find_last_not_of(kSpace) - first + 1);
    const size_t at = rendered.find(content, cursor);
    if (at == std::string_view::npos) continue;
    cursor = at + content.size();
    if (m.role == "user" || m.role == "tool") ranges.emplace_back(at, cursor);
  }
  return ranges;
}

}  // namespace fucina
