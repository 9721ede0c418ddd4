// Chat templates: turns a conversation into the prompt text a model was trained on, by rendering
// the Jinja template the GGUF carries (`tokenizer.chat_template`).
//
// Rendering matches Hugging Face transformers' apply_chat_template byte for byte on the
// templates real models ship: jinja2 semantics with trim_blocks and lstrip_blocks, lenient
// undefined values, Python string/dict methods, `raise_exception`, `strftime_now`, and `tojson`
// as Python's json.dumps(ensure_ascii=False). The engine is minijinja (Rust), reached through
// the C ABI in jinja_capi.h.
//
// JSON members use nlohmann::ordered_json: key order is preserved from what the caller built
// (e.g. a request's "tools"), as Python dicts preserve it, and templates that print JSON
// (`tool | tojson`) must reproduce the order. A nlohmann::json converts implicitly (its keys
// come out sorted, as std::map keeps them).
#ifndef FUCINA_MODELS_CHAT_CHAT_TEMPLATE_H_
#define FUCINA_MODELS_CHAT_CHAT_TEMPLATE_H_

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "models/gguf/gguf.h"
#include "nlohmann/json.hpp"

namespace fucina {

// One turn. In the template each message is a dict with "role" and "content" always, and
// "reasoning_content", "tool_calls", "tool_call_id", "name" only when set (non-empty / non-null),
// so templates testing `message.tool_calls is defined` behave as with OpenAI-style requests.
struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool".
  std::string content;
  std::string reasoning_content;
  // Null, or an array of {"type": "function", "function": {"name", "arguments"}} (arguments a
  // JSON string or an object; passed through as given).
  nlohmann::ordered_json tool_calls;
  std::string tool_call_id;
  std::string name;
};

// A chat message's role as the templates know it: system, user, assistant or tool; OpenAI's
// "developer" is the system role. Anything else is INVALID_ARGUMENT naming `where` (e.g.
// "messages[2]"). The one rule for every front end, HTTP and gRPC alike.
inline absl::StatusOr<std::string> NormalizeChatRole(const std::string& role,
                                                     const std::string& where) {
  if (role == "developer") return std::string("system");
  if (role == "system" || role == "user" || role == "assistant" || role == "tool") return role;
  return absl::InvalidArgumentError(absl::StrCat(
      where, ".role '", role, "' is not one of system, developer, user, assistant, tool"));
}

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // Passed as the template variable `enable_thinking` when set (Qwen3's switch); absent
  // otherwise, so the template's own default applies.
  std::optional<bool> enable_thinking;
  nlohmann::ordered_json tools;  // Null (the variable is None) or an array of tool schemas.
  // Empty: the template's defaults (from the GGUF vocabulary for FromGguf).
  std::string bos_token, eos_token;
  // Null or an object whose members are added to the context last (overriding the above).
  nlohmann::ordered_json extra;
};

class ChatTemplate {
 public:
  // The file's `tokenizer.chat_template`, or the built-in ChatML when it has none. The default
  // bos/eos token texts come from tokenizer.ggml.{bos,eos}_token_id and tokenizer.ggml.tokens.
  // Errors: a template that does not compile (message names the line), a malformed key.
  static absl::StatusOr<ChatTemplate> FromGguf(const gguf::File& file);
  // The ChatML layout ("<|im_start|>role\ncontent<|im_end|>\n" per message).
  static ChatTemplate ChatMl();
  // Compiles `source` now; a syntax error is reported by status() and by every Render.
  static ChatTemplate FromSource(std::string source);

  // Errors carry the engine's message and the template line (InvalidArgument), e.g. a
  // raise_exception("...") from the template.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     const ChatRenderOptions& options) const;

  // The variables Render passes to the template (exposed so tests can hand the identical
  // context to an independent renderer).
  nlohmann::ordered_json MakeContext(const std::vector<ChatMessage>& messages,
                                     const ChatRenderOptions& options) const;

  // OK, or why the source did not compile.
  const absl::Status& status() const { return status_; }
  bool is_builtin_chatml() const { return builtin_chatml_; }
  const std::string& source() const { return source_; }
  const std::string& default_bos_token() const { return bos_token_; }
  const std::string& default_eos_token() const { return eos_token_; }

 private:
  struct Compiled;  // Owns the engine's template handle.

  ChatTemplate() = default;

  std::string source_;
  bool builtin_chatml_ = false;
  std::string bos_token_, eos_token_;
  absl::Status status_;
  std::shared_ptr<const Compiled> compiled_;  // Null when status_ is not OK; shared by copies.
};

// The built-in ChatML template's source (HF's former default template).
extern const char kChatMlTemplate[];

// Key of the template in GGUF metadata.
inline constexpr char kGgufChatTemplateKey[] = "tokenizer.chat_template";

// Where the user and tool messages' contents stand in `rendered` (what Render made of
// `messages`): byte ranges [first, second), found in message order. A content is looked for
// without the whitespace at its ends (templates trim); one the template did not copy verbatim
// is left out. The tokenizer keeps control-token text inside these ranges as text
// (Tokenizer::EncodeWithPlainRanges): a user cannot write a turn boundary.
std::vector<std::pair<size_t, size_t>> UserContentRanges(std::string_view rendered,
                                                         std::span<const ChatMessage> messages);

}  // namespace fucina

#endif  // FUCINA_MODELS_CHAT_CHAT_TEMPLATE_H_
