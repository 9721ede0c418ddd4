#include "coordinator/http/request_json.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fucina::http_api {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// A tool_choice that names a tool: it must be one of `tools` (OpenAI's shape).
absl::Status CheckToolDeclared(const json& tools, const std::string& name) {
  const bool declared = std::any_of(tools.begin(), tools.end(), [&](const json& t) {
    return t["function"]["name"] == name;
  });
  if (declared) return absl::OkStatus();
  return Invalid("field 'tool_choice' names '" + name + "', which is not in 'tools'");
}

ChatMessage Message(std::string role, std::string content) {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

// The JSON type name a client would recognise, for "must be X, got Y" messages.
const char* TypeName(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "a number";
    default: return "an unsupported value";
  }
}

// Text parts of a content array: every part an object whose `type` is one of `types` (a
// string) with a string `text`; `skip` names a type whose parts are dropped (may be empty).
absl::StatusOr<std::string> JoinTextParts(const json& parts, const std::string& where,
                                          std::initializer_list<std::string_view> types,
                                          std::string_view skip) {
  std::string text;
  for (size_t k = 0; k < parts.size(); ++k) {
    const json& part = parts[k];
    const std::string at = absl::StrCat(where, "[", k, "]");
    if (!part.is_object()) {
      return Invalid(absl::StrCat(at, " must be an object, got ", TypeName(part)));
    }
    auto type = StringMember(part, "type", at);
    if (!type.ok()) return type.status();
    if (!*type) return Invalid(at + ".type is required");
    if (!skip.empty() && **type == skip) continue;
    bool known = false;
    for (std::string_view t : types) known = known || **type == t;
    if (!known) {
      std::string list;
      for (std::string_view t : types) (list += list.empty() ? "" : " or ") += t;
      return Invalid(at + ".type '" + **type + "' is not supported (only " + list + " parts)");
    }
    auto piece = StringMember(part, "text", at);
    if (!piece.ok()) return piece.status();
    if (!*piece) return Invalid(at + ".text must be a string");
    text += **piece;
  }
  return text;
}

}  // namespace

int JsonNestingDepth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > deepest) {
        deepest = depth;
        if (deepest > limit) return deepest;
      }
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

absl::StatusOr<json> ParseJsonObject(std::string_view body) {
  if (JsonNestingDepth(body, kMaxJsonDepth) > kMaxJsonDepth) {
    return Invalid(absl::StrCat("the body nests arrays/objects deeper than ", kMaxJsonDepth,
                                " levels"));
  }
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Invalid("the body is not valid JSON");
  if (!j.is_object()) return Invalid("the body must be a JSON object");
  return j;
}

std::string Dump(const json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

absl::StatusOr<std::optional<std::string>> StringMember(const json& obj, const char* name,
                                                        const std::string& where) {
  if (!obj.is_object()) return std::optional<std::string>();
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) {
    return Invalid(absl::StrCat(where, where.empty() ? "" : ".", name, " must be a string, got ",
                                TypeName(*it)));
  }
  return std::optional<std::string>(it->get<std::string>());
}

absl::StatusOr<std::vector<ChatMessage>> ReadChatMessages(const json& body) {
  const auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array()) {
    return Invalid("field 'messages' must be an array");
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Invalid(where + " must be an object");
    auto role = StringMember(m, "role", where);
    if (!role.ok()) return role.status();
    if (!*role) return Invalid(where + ".role must be a string");
    ChatMessage msg;
    auto normal = NormalizeChatRole(**role, where);
    if (!normal.ok()) return normal.status();
    msg.role = *std::move(normal);
    const auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      // No content: an assistant turn with only tool calls.
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      auto text = JoinTextParts(*content, where + ".content", {"text"}, "");
      if (!text.ok()) return text.status();
      msg.content = *std::move(text);
    } else {
      return Invalid(where + ".content must be a string or an array of parts");
    }
    if (const auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (!calls->is_array()) return Invalid(where + ".tool_calls must be an array");
      for (size_t k = 0; k < calls->size(); ++k) {
        if (!(*calls)[k].is_object()) {
          return Invalid(absl::StrCat(where, ".tool_calls[", k, "] must be an object"));
        }
      }
      msg.tool_calls = *calls;
    }
    for (auto [name, target] : {std::pair{"reasoning_content", &msg.reasoning_content},
                                std::pair{"tool_call_id", &msg.tool_call_id},
                                std::pair{"name", &msg.name}}) {
      auto v = StringMember(m, name, where);
      if (!v.ok()) return v.status();
      if (*v) *target = **v;
    }
    out.push_back(std::move(msg));
  }
  if (out.empty()) return Invalid("field 'messages' must not be empty");
  return out;
}

absl::StatusOr<json> ReadTools(const json& body, bool* parse_tools,
                               std::optional<std::string>* forced_tool) {
  *parse_tools = false;
  forced_tool->reset();
  json tools = nullptr;
  if (const auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) return Invalid("field 'tools' must be an array");
    for (size_t i = 0; i < t->size(); ++i) {
      const json& tool = (*t)[i];
      const auto type = tool.is_object() ? tool.find("type") : tool.end();
      const auto fn = tool.is_object() ? tool.find("function") : tool.end();
      if (!tool.is_object() || type == tool.end() || *type != "function" || fn == tool.end() ||
          !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
        return Invalid(absl::StrCat(
            "field 'tools': tools[", i,
            "] must be {\"type\": \"function\", \"function\": {\"name\": ...}}"));
      }
    }
    if (!t->empty()) tools = *t;
  }
  std::string choice = "auto";
  if (const auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (c->is_string()) {
      choice = c->get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required") {
        return Invalid("field 'tool_choice' must be none, auto, required or a named function");
      }
    } else if (c->is_object()) {
      const auto fn = c->find("function");
      if (c->value("type", json()) != "function" || fn == c->end() || !fn->is_object() ||
          !fn->contains("name") || !(*fn)["name"].is_string()) {
        return Invalid(
            "field 'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      choice = "named";
      *forced_tool = (*fn)["name"].get<std::string>();
    } else {
      return Invalid("field 'tool_choice' must be a string or an object");
    }
  }
  if (choice == "none") return json(nullptr);
  if (choice == "required" || choice == "named") {
    if (tools.is_null()) return Invalid("field 'tool_choice': '" + choice + "' needs 'tools'");
    if (choice == "required") *forced_tool = "";
    if (choice == "named") {
      if (absl::Status s = CheckToolDeclared(tools, **forced_tool); !s.ok()) return s;
    }
  }
  *parse_tools = !tools.is_null();
  return tools;
}

absl::StatusOr<json> ReadAnthropicTools(const json& body, bool* parse_tools,
                                        std::optional<std::string>* forced_tool) {
  *parse_tools = false;
  forced_tool->reset();
  json tools = json::array();
  if (const auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) return Invalid("field 'tools' must be an array");
    for (size_t i = 0; i < t->size(); ++i) {
      const json& tool = (*t)[i];
      if (!tool.is_object() || !tool.contains("name") || !tool["name"].is_string() ||
          !tool.contains("input_schema") || !tool["input_schema"].is_object() ||
          (tool.contains("description") && !tool["description"].is_string())) {
        return Invalid(absl::StrCat("field 'tools': tools[", i,
                                    "] must be {\"name\": ..., \"input_schema\": {...}}"));
      }
      json fn = {{"name", tool["name"]}, {"parameters", tool["input_schema"]}};
      if (tool.contains("description")) fn["description"] = tool["description"];
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
  }
  std::string type = "auto";
  if (const auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (!c->is_object() || !c->contains("type") || !(*c)["type"].is_string()) {
      return Invalid("field 'tool_choice' must be an object with a 'type'");
    }
    type = (*c)["type"].get<std::string>();
    if (type != "auto" && type != "any" && type != "tool" && type != "none") {
      return Invalid("field 'tool_choice': type '" + type + "' is not auto, any, tool or none");
    }
    if (type == "tool") {
      if (!c->contains("name") || !(*c)["name"].is_string()) {
        return Invalid("field 'tool_choice': type 'tool' needs the tool's 'name'");
      }
      *forced_tool = (*c)["name"].get<std::string>();
      if (absl::Status s = CheckToolDeclared(tools, **forced_tool); !s.ok()) return s;
    }
    if (type == "any") *forced_tool = "";
  }
  if (type == "none" || tools.empty()) {
    if (forced_tool->has_value()) return Invalid("field 'tool_choice': '" + type + "' needs 'tools'");
    return json(nullptr);
  }
  *parse_tools = true;
  return tools;
}

absl::StatusOr<std::vector<ChatMessage>> ReadResponsesInput(const json& body) {
  std::vector<ChatMessage> out;
  auto instructions = StringMember(body, "instructions", "");
  if (!instructions.ok()) return instructions.status();
  if (*instructions) out.push_back(Message("system", **instructions));
  const auto input = body.find("input");
  if (input == body.end()) return Invalid("field 'input' is required");
  if (input->is_string()) {
    out.push_back(Message("user", input->get<std::string>()));
    return out;
  }
  if (!input->is_array()) return Invalid("field 'input' must be a string or an array of items");
  for (size_t i = 0; i < input->size(); ++i) {
    const json& item = (*input)[i];
    const std::string where = absl::StrCat("input[", i, "]");
    if (!item.is_object()) return Invalid(where + " must be a message with a role");
    auto role = StringMember(item, "role", where);
    if (!role.ok()) return role.status();
    if (!*role) return Invalid(where + " must be a message with a role");
    ChatMessage m;
    m.role = **role == "developer" ? "system" : **role;
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return Invalid(where + ".role '" + m.role + "' is not supported");
    }
    const auto content = item.find("content");
    if (content != item.end() && content->is_string()) {
      m.content = content->get<std::string>();
    } else if (content != item.end() && content->is_array()) {
      auto text = JoinTextParts(*content, where + ".content", {"input_text", "output_text"}, "");
      if (!text.ok()) return text.status();
      m.content = *std::move(text);
    } else {
      return Invalid(where + ".content must be a string or an array of parts");
    }
    out.push_back(std::move(m));
  }
  if (out.empty()) return Invalid("field 'input' must not be empty");
  return out;
}

namespace {

// An Anthropic content field: a string, or blocks of which text is read and earlier turns'
// thinking dropped (it is not re-sent to the model).
absl::StatusOr<std::string> AnthropicText(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return Invalid(where + " must be a string or an array of content blocks");
  }
  return JoinTextParts(content, where, {"text"}, "thinking");
}

}  // namespace

absl::StatusOr<std::vector<ChatMessage>> ReadAnthropicMessages(const json& body) {
  std::vector<ChatMessage> out;
  if (const auto system = body.find("system"); system != body.end() && !system->is_null()) {
    auto text = AnthropicText(*system, "system");
    if (!text.ok()) return text.status();
    out.push_back(Message("system", *std::move(text)));
  }
  const auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array() || messages->empty()) {
    return Invalid("field 'messages' must be a non-empty array");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    auto role = StringMember(m, "role", where);
    if (!m.is_object() || !role.ok() || !*role || (**role != "user" && **role != "assistant")) {
      return Invalid(where + ".role must be user or assistant");
    }
    const auto content = m.find("content");
    auto text = AnthropicText(content == m.end() ? json(nullptr) : *content, where + ".content");
    if (!text.ok()) return text.status();
    out.push_back(Message(**role, *std::move(text)));
  }
  return out;
}

absl::StatusOr<std::optional<bool>> ReadAnthropicThinking(const json& body) {
  const auto thinking = body.find("thinking");
  if (thinking == body.end() || thinking->is_null()) return std::optional<bool>();
  if (!thinking->is_object()) return Invalid("field 'thinking' must be an object");
  auto type = StringMember(*thinking, "type", "thinking");
  if (!type.ok()) return type.status();
  if (!*type || (**type != "enabled" && **type != "disabled")) {
    return Invalid("thinking.type must be enabled or disabled");
  }
  return std::optional<bool>(**type == "enabled");
}

absl::StatusOr<std::optional<bool>> ReadEnableThinking(const json& body) {
  const auto kwargs = body.find("chat_template_kwargs");
  if (kwargs == body.end() || kwargs->is_null()) return std::optional<bool>();
  if (!kwargs->is_object()) return Invalid("field 'chat_template_kwargs' must be an object");
  const auto v = kwargs->find("enable_thinking");
  if (v == kwargs->end() || v->is_null()) return std::optional<bool>();
  if (!v->is_boolean()) return Invalid("chat_template_kwargs.enable_thinking must be a boolean");
  return std::optional<bool>(v->get<bool>());
}

}  // namespace fucina::http_api
