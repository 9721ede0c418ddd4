#include "models/train/pattern.h"

#include <re2/re2.h>

#include "absl/strings/str_cat.h"

namespace fucina::train {
namespace {

// RE2 reports lookaround as a bad "(?" operator and a backreference as a bad escape; name the
// ECMAScript construct the client wrote, since that is the syntax they probably meant.
std::string UnsupportedConstruct(const re2::RE2& re, std::string_view pattern) {
  const std::string& arg = re.error_arg();
  if (re.error_code() == re2::RE2::ErrorBadPerlOp) {
    const size_t at = pattern.find(arg);
    const std::string_view rest = at == std::string_view::npos ? "" : pattern.substr(at);
    if (rest.starts_with("(?=")) return "lookahead (?=...)";
    if (rest.starts_with("(?!")) return "negative lookahead (?!...)";
    if (rest.starts_with("(?<=")) return "lookbehind (?<=...)";
    if (rest.starts_with("(?<!")) return "negative lookbehind (?<!...)";
    if (rest.starts_with("(?<")) return "named group (?<name>...) (write (?P<name>...))";
  }
  if (re.error_code() == re2::RE2::ErrorBadEscape && arg.size() == 2 && arg[0] == '\\' &&
      arg[1] >= '1' && arg[1] <= '9') {
    return absl::StrCat("backreference ", arg);
  }
  return "";
}

}  // namespace

absl::StatusOr<Pattern> Pattern::Compile(std::string_view pattern, std::string_view name) {
  const std::string field(name);  // this absl's StrCat takes no std::string_view
  if (pattern.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty regex"));
  if (pattern.size() > kMaxPatternBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": the regex has ", pattern.size(),
                                                   " bytes, more than ", kMaxPatternBytes));
  }
  RE2::Options options;
  options.set_log_errors(false);
  options.set_max_mem(kMaxPatternMemory);
  auto re = std::make_shared<const re2::RE2>(re2::StringPiece(pattern.data(), pattern.size()),
                                             options);
  if (!re->ok()) {
    if (re->error_code() == re2::RE2::ErrorPatternTooLarge) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": the regex compiles to more than ", kMaxPatternMemory >> 20, " MiB"));
    }
    if (const std::string what = UnsupportedConstruct(*re, pattern); !what.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", what, " is not supported (regexes use RE2 syntax: no lookaround, no "
          "backreferences)"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": not a valid RE2 regex: ", re->error()));
  }
  return Pattern(std::move(re));
}

bool Pattern::FullMatch(std::string_view text) const {
  return RE2::FullMatch(re2::StringPiece(text.data(), text.size()), *re_);
}

bool Pattern::Search(std::string_view text) const {
  return RE2::PartialMatch(re2::StringPiece(text.data(), text.size()), *re_);
}

const std::string& Pattern::pattern() const { return re_->pattern(); }

}  // namespace fucina::train
