// The coordinator's text front end: what turns a request's text into the token ids the
// workers compute on, before anything is queued. It holds the model's tokenizer and chat
// template (read from the GGUF's metadata; the weights stay on the workers), renders chat
// messages, refuses text that cannot fit the context before tokenizing it, and compiles a
// request's grammar once so a bad one is refused at the door.
//
// Thread-safe: every method is const; the grammar token table is built on first use.
#ifndef FUCINA_COORDINATOR_TEXT_FRONT_END_H_
#define FUCINA_COORDINATOR_TEXT_FRONT_END_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/chat/chat_template.h"
#include "models/gguf/gguf.h"
#include "models/grammar/grammar.h"
#include "models/tokenizer/tokenizer.h"

namespace fucina {

struct TextOptions {
  int64_t context = 4096;  // positions: longer prompts are refused
  // Chat requests without a system message get this one ('' keeps the template's default).
  std::string system_prompt;
  // Control-token text in user and tool content becomes the control token (llama-server's and
  // vLLM's default); off: it stays text (UserContentRanges).
  bool parse_special_in_content = false;
  // A request's grammar that takes longer to compile is refused (--grammar-timeout).
  std::chrono::milliseconds grammar_timeout = kDefaultGrammarCompileLimit;
};

class TextFrontEnd {
 public:
  // The tokenizer and chat template of `file` (ChatML when it has none).
  static absl::StatusOr<std::unique_ptr<TextFrontEnd>> Create(const gguf::File& file,
                                                              TextOptions options);

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ChatTemplate& chat_template() const { return chat_template_; }

  // Tokenizes a prompt (special tokens parsed). Text that cannot fit the context whatever its
  // tokens is refused before tokenization (INVALID_ARGUMENT), so a huge prompt costs no CPU: no
  // token covers more than max_token_bytes() bytes of text.
  // `plain`: byte ranges of `text` where control-token text stays text (UserContentRanges).
  absl::StatusOr<std::vector<int32_t>> Encode(
      std::string_view text, bool add_special,
      std::span<const std::pair<size_t, size_t>> plain = {}) const;
  // Renders chat messages with the model's template (adding the default system prompt when
  // they have none) and tokenizes them as Encode does; the rendered text goes to *rendered.
  absl::StatusOr<std::vector<int32_t>> EncodeChat(std::vector<ChatMessage> messages,
                                                  const ChatRenderOptions& options,
                                                  std::string* rendered = nullptr) const;
  size_t max_token_bytes() const { return max_token_bytes_; }
  // Compiles a request's grammar once, so a bad one is refused (INVALID_ARGUMENT with the
  // engine's own message, or naming --grammar-timeout) before the request is queued. The
  // model's token table for it is built on first use and kept.
  absl::Status CheckGrammar(const GrammarSpec& spec) const;

 private:
  TextFrontEnd() = default;

  TextOptions options_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ChatTemplate chat_template_ = ChatTemplate::ChatMl();
  size_t max_token_bytes_ = 1;  // the longest text one token stands for
  mutable std::mutex grammar_mu_;  // grammar_vocab_
  mutable std::shared_ptr<const GrammarVocab> grammar_vocab_;
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_TEXT_FRONT_END_H_
