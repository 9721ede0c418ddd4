#include "coordinator/http/request_framing.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fucina {

namespace beast = boost::beast;
namespace http = beast::http;

std::string Echo(std::string_view s) {
  if (s.size() <= kEchoBytes) return std::string(s);
  size_t cut = kEchoBytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(std::string(s.substr(0, cut)), "... (", s.size(), " bytes, cut)");
}

absl::Status CheckFraming(const http::request_header<>& header) {
  // Every Transfer-Encoding field line, joined: "TE: gzip" + "TE: chunked" is "gzip, chunked".
  std::vector<std::string> codings;
  bool has_te = false;
  for (const auto& field : header) {
    if (field.name() != http::field::transfer_encoding) continue;
    has_te = true;
    for (absl::string_view c : absl::StrSplit(
             absl::string_view(field.value().data(), field.value().size()), ',')) {
      c = absl::StripAsciiWhitespace(c);
      if (!c.empty()) codings.push_back(absl::AsciiStrToLower(c));
    }
  }
  if (has_te) {
    if (header.version() < 11) {
      return absl::InvalidArgumentError(
          "Transfer-Encoding in an HTTP/1.0 request: the body's length is ambiguous");
    }
    if (codings.empty() || codings.back() != "chunked") {
      return absl::InvalidArgumentError(absl::StrCat(
          "Transfer-Encoding '", Echo(absl::StrJoin(codings, ", ")),
          "' does not end with chunked: the body's length cannot be determined (RFC 9112 6.3)"));
    }
    if (codings.size() > 1) {
      codings.pop_back();
      return absl::UnimplementedError(absl::StrCat("transfer coding '",
                                                   Echo(absl::StrJoin(codings, ", ")),
                                                   "' is not supported (only chunked)"));
    }
  }
  const size_t hosts = header.count(http::field::host);
  if (hosts > 1) return absl::InvalidArgumentError("more than one Host header");
  if (hosts == 0 && header.version() >= 11) {
    return absl::InvalidArgumentError("an HTTP/1.1 request must have a Host header");
  }
  return absl::OkStatus();
}

ReadError ReadErrorFor(const beast::error_code& ec, const RequestLimits& limits) {
  if (ec == http::error::end_of_stream || ec == boost::asio::error::eof ||
      ec == boost::asio::error::connection_reset || ec == boost::asio::error::operation_aborted ||
      ec == boost::asio::error::broken_pipe) {
    return {};
  }
  if (ec == beast::error::timeout) {
    return {408, "the request did not arrive in time"};
  }
  if (ec == http::error::body_limit) {
    return {413, absl::StrCat("request body exceeds ", limits.max_body_bytes, " bytes")};
  }
  if (ec == http::error::header_limit) {
    return {431, absl::StrCat("request header exceeds ", limits.max_header_bytes, " bytes")};
  }
  return {400, "malformed HTTP request: " + ec.message()};
}

}  // namespace fucina
