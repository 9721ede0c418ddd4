#include "coordinator/text_front_end.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fucina {

absl::StatusOr<std::unique_ptr<TextFrontEnd>> TextFrontEnd::Create(const gguf::File& file,
                                                                   TextOptions options) {
  std::unique_ptr<TextFrontEnd> t(new TextFrontEnd());
  t->options_ = std::move(options);
  auto tokenizer = Tokenizer::FromGguf(file);
  if (!tokenizer.ok()) return tokenizer.status();
  t->tokenizer_ = *std::move(tokenizer);
  if (auto tmpl = ChatTemplate::FromGguf(file); tmpl.ok()) t->chat_template_ = *std::move(tmpl);
  for (int32_t id = 0; id < t->tokenizer_->vocab_size(); ++id) {
    t->max_token_bytes_ = std::max(t->max_token_bytes_, t->tokenizer_->TokenToPiece(id).size());
  }
  return t;
}

absl::StatusOr<std::vector<int32_t>> TextFrontEnd::Encode(
    std::string_view text, bool add_special,
    std::span<const std::pair<size_t, size_t>> plain) const {
  // Each token stands for at most max_token_bytes_ bytes of text (+1: a prefix space SPM may
  // add), so longer text has more tokens than the context holds.
  const uint64_t limit =
      static_cast<uint64_t>(options_.context) * (max_token_bytes_ + 1) + max_token_bytes_;
  if (text.size() > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt's ", text.size(), " bytes cannot fit the context of ",
                     options_.context, " tokens (--ctx; at most ", limit, " bytes)"));
  }
  return tokenizer_->EncodeWithPlainRanges(text, add_special, plain);
}

absl::StatusOr<std::vector<int32_t>> TextFrontEnd::EncodeChat(std::vector<ChatMessage> messages,
                                                             const ChatRenderOptions& options,
                                                             std::string* rendered) const {
  const bool has_system = std::any_of(messages.begin(), messages.end(),
                                      [](const ChatMessage& m) { return m.role == "system"; });
  if (!has_system && !options_.system_prompt.empty()) {
    ChatMessage system;
    system.role = "system";
    system.content = options_.system_prompt;
    messages.insert(messages.begin(), std::move(system));
  }
  auto text = chat_template_.Render(messages, options);
  if (!text.ok()) return text.status();
  auto ids = Encode(*text, true,
                    options_.parse_special_in_content
                        ? std::vector<std::pair<size_t, size_t>>()
                        : UserContentRanges(*text, messages));
  if (rendered != nullptr) *rendered = *std::move(text);
  return ids;
}

absl::Status TextFrontEnd::CheckGrammar(const GrammarSpec& spec) const {
  if (spec.empty()) return absl::OkStatus();
  std::shared_ptr<const GrammarVocab> vocab;
  {
    std::lock_guard<std::mutex> lock(grammar_mu_);
    if (grammar_vocab_ == nullptr) {
      auto made = GrammarVocab::Create(*tokenizer_);
      if (!made.ok()) return made.status();
      grammar_vocab_ = *std::move(made);
    }
    vocab = grammar_vocab_;
  }
  auto matcher = vocab->Compile(spec, options_.grammar_timeout);
  if (matcher.status().code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::InvalidArgumentError(
        absl::StrCat(matcher.status().message(), "; --grammar-timeout sets the limit"));
  }
  return matcher.status();
}

}  // namespace fucina
