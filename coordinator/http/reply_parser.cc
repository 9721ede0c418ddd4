#include "coordinator/http/reply_parser.h"

#include <algorithm>

#include "coordinator/http/request_json.h"
#include "coordinator/text_hold.h"
#include "nlohmann/json.hpp"

namespace fucina {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";

bool IsBlank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; });
}

}  // namespace

ReplyParser::ReplyParser(bool parse_think, bool in_think, bool parse_tools)
    : state_(in_think ? kThink : parse_think ? kStart : kContent),
      parse_tools_(parse_tools),
      think_leading_(in_think) {}

void ReplyParser::Emit(ReplyEvent::Kind kind, std::string text, std::vector<ReplyEvent>* out) {
  if (text.empty()) return;
  // Whitespace between tool calls is not content.
  if (kind == ReplyEvent::kContent && tool_calls_ > 0 && IsBlank(text)) return;
  if (!out->empty() && out->back().kind == kind && kind != ReplyEvent::kToolCall) {
    out->back().text += text;
    return;
  }
  ReplyEvent e;
  e.kind = kind;
  e.text = std::move(text);
  out->push_back(std::move(e));
}

void ReplyParser::EmitUpToPartial(ReplyEvent::Kind kind, const std::string& tag,
                                  std::vector<ReplyEvent>* out) {
  const size_t keep = PartialPrefixAtEnd(pending_, tag);
  Emit(kind, pending_.substr(0, pending_.size() - keep), out);
  pending_.erase(0, pending_.size() - keep);
}

std::vector<ReplyEvent> ReplyParser::Push(std::string_view text) {
  pending_.append(text);
  std::vector<ReplyEvent> out;
  while (true) {
    switch (state_) {
      case kStart: {
        // Leading whitespace before the tag does not decide anything yet.
        const size_t first = pending_.find_first_not_of(" \n");
        if (first == std::string::npos) return out;
        const std::string_view rest = std::string_view(pending_).substr(first);
        if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
          pending_.erase(0, first + kThinkOpen.size());
          state_ = kThink;
          think_leading_ = true;
          continue;
        }
        if (kThinkOpen.substr(0, rest.size()) == rest) return out;  // may still become <think>
        state_ = kContent;
        continue;
      }
      case kThink: {
        // The block's own newlines around the reasoning are layout, not text: leading ones are
        // dropped, trailing ones held until more reasoning follows.
        if (think_leading_) {
          const size_t first = pending_.find_first_not_of('\n');
          pending_.erase(0, first == std::string::npos ? pending_.size() : first);
          if (pending_.empty()) return out;
          think_leading_ = false;
        }
        const size_t at = pending_.find(kThinkClose);
        if (at == std::string::npos) {
          size_t keep = PartialPrefixAtEnd(pending_, kThinkClose);
          while (keep < pending_.size() && pending_[pending_.size() - keep - 1] == '\n') ++keep;
          Emit(ReplyEvent::kReasoning, pending_.substr(0, pending_.size() - keep), &out);
          pending_.erase(0, pending_.size() - keep);
          return out;
        }
        std::string reasoning = pending_.substr(0, at);
        while (!reasoning.empty() && reasoning.back() == '\n') reasoning.pop_back();
        Emit(ReplyEvent::kReasoning, std::move(reasoning), &out);
        pending_.erase(0, at + kThinkClose.size());
        state_ = kAfterThink;
        continue;
      }
      case kAfterThink: {
        const size_t first = pending_.find_first_not_of(" \n");
        if (first == std::string::npos) {
          pending_.clear();
          return out;
        }
        pending_.erase(0, first);
        state_ = kContent;
        continue;
      }
      case kContent: {
        if (!parse_tools_) {
          Emit(ReplyEvent::kContent, std::move(pending_), &out);
          pending_.clear();
          return out;
        }
        const size_t at = pending_.find(kToolOpen);
        if (at == std::string::npos) {
          EmitUpToPartial(ReplyEvent::kContent, std::string(kToolOpen), &out);
          return out;
        }
        Emit(ReplyEvent::kContent, pending_.substr(0, at), &out);
        pending_.erase(0, at + kToolOpen.size());
        state_ = kTool;
        continue;
      }
      case kTool: {
        const size_t at = pending_.find(kToolClose);
        if (at == std::string::npos) return out;
        const std::string body = pending_.substr(0, at);
        pending_.erase(0, at + kToolClose.size());
        state_ = kContent;
        // The model's JSON is bounded like a client's: serializing the arguments recurses.
        nlohmann::json call =
            http_api::JsonNestingDepth(body, http_api::kMaxJsonDepth) > http_api::kMaxJsonDepth
                ? nlohmann::json(nlohmann::json::value_t::discarded)
                : nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
        if (call.is_object() && call.contains("name") && call["name"].is_string()) {
          ReplyEvent e;
          e.kind = ReplyEvent::kToolCall;
          e.call.name = call["name"].get<std::string>();
          const nlohmann::json args = call.contains("arguments") ? call["arguments"]
                                                                  : nlohmann::json::object();
          e.call.arguments = args.is_string() ? args.get<std::string>() : args.dump();
          out.push_back(std::move(e));
          ++tool_calls_;
        } else {
          // Not a well-formed call: the user sees what the model wrote.
          Emit(ReplyEvent::kContent, std::string(kToolOpen) + body + std::string(kToolClose),
               &out);
        }
        continue;
      }
    }
  }
}

std::vector<ReplyEvent> ReplyParser::Finish() {
  std::vector<ReplyEvent> out;
  switch (state_) {
    case kStart:
    case kContent:
      Emit(ReplyEvent::kContent, std::move(pending_), &out);
      break;
    case kThink:
      Emit(ReplyEvent::kReasoning, std::move(pending_), &out);
      break;
    case kAfterThink:
      break;
    case kTool:
      Emit(ReplyEvent::kContent, std::string(kToolOpen) + pending_, &out);
      break;
  }
  pending_.clear();
  state_ = kContent;
  return out;
}

}  // namespace fucina
