// Reading one HTTP/1.x request off a byte stream with the server's limits, and the framing
// rules of RFC 9112 that Boost.Beast's parser leaves to the server. A template over the stream,
// so the server reads a socket under a deadline and the fuzz harness reads a buffer, through
// the same code.
#ifndef FUCINA_COORDINATOR_HTTP_REQUEST_FRAMING_H_
#define FUCINA_COORDINATOR_HTTP_REQUEST_FRAMING_H_

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/status/status.h"

namespace fucina {

struct RequestLimits {
  size_t max_body_bytes = 8 << 20;
  size_t max_header_bytes = 64 << 10;
};

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;

// RFC 9112 checks on a parsed request header, before its body is read. Beast already refuses
// Transfer-Encoding chunked together with Content-Length, and differing Content-Length values.
// INVALID_ARGUMENT (answer 400 and close: the body's extent is unknown, so nothing after it on
// the connection can be trusted) for: a Transfer-Encoding whose last coding is not chunked
// (Beast would frame the body by Content-Length or as empty and read the rest as the next
// request), Transfer-Encoding on HTTP/1.0, no or several Host fields on HTTP/1.1 (several on
// 1.0). UNIMPLEMENTED (501 and close) for codings before chunked (gzip, ...): we decode none.
absl::Status CheckFraming(const boost::beast::http::request_header<>& header);

// Why no request came off the stream. status 0: the peer ended the connection (or a reset)
// before a request began, or the stream failed: nothing to answer.
struct ReadError {
  int status = 0;  // 400, 408, 413, 431, 501
  std::string message;
};

// What an error message may quote of a client's request (a path, a method, a Host, a field
// value): its first kEchoBytes (not splitting a UTF-8 sequence), then how long it was. A request
// line or field can be as long as the header limit, and an error must not mirror it back.
inline constexpr size_t kEchoBytes = 100;
std::string Echo(std::string_view s);

// Maps a Beast read error to what to answer.
ReadError ReadErrorFor(const boost::beast::error_code& ec, const RequestLimits& limits);

// Reads one request (header, framing checks, `Expect: 100-continue`, body) from `stream` into
// `parser`. `buffer` carries bytes read past this request (pipelining) to the next call.
// nullopt: a complete, well-framed request is in parser.get().
template <class SyncStream>
std::optional<ReadError> ReadRequest(
    SyncStream& stream, boost::beast::flat_buffer& buffer,
    boost::beast::http::request_parser<boost::beast::http::string_body>& parser,
    const RequestLimits& limits) {
  namespace http = boost::beast::http;
  parser.body_limit(limits.max_body_bytes);
  parser.header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
  boost::beast::error_code ec;
  http::read_header(stream, buffer, parser, ec);
  if (ec) return ReadErrorFor(ec, limits);
  if (absl::Status s = CheckFraming(parser.get()); !s.ok()) {
    return ReadError{absl::IsUnimplemented(s) ? 501 : 400, std::string(s.message())};
  }
  if (boost::beast::iequals(parser.get()[http::field::expect], "100-continue") &&
      parser.get().version() >= 11 && !parser.is_done()) {
    // Clients that wait for a go-ahead before sending the body (curl does above 1 KiB). An
    // HTTP/1.0 client has no 1xx responses: its expectation is ignored (RFC 9110 10.1.1).
    http::response<http::empty_body> go{http::status::continue_, parser.get().version()};
    http::write(stream, go, ec);
    if (ec) return ReadError{};
  }
  http::read(stream, buffer, parser, ec);
  if (ec) return ReadErrorFor(ec, limits);
  return std::nullopt;
}

// A SyncStream over bytes in memory (the fuzz harness, tests): reads return them in pieces of
// at most `chunk` bytes, then end of stream; writes are discarded.
class MemoryStream {
 public:
  MemoryStream(std::string_view data, size_t chunk)
      : data_(data), chunk_(std::max<size_t>(1, chunk)) {}

  template <class MutableBuffers>
  size_t read_some(const MutableBuffers& buffers, boost::beast::error_code& ec) {
    if (data_.empty()) {
      ec = boost::asio::error::eof;
      return 0;
    }
    ec = {};
    const size_t n = boost::asio::buffer_copy(
        buffers, boost::asio::buffer(data_.data(), std::min(chunk_, data_.size())));
    data_.remove_prefix(n);
    return n;
  }
  template <class MutableBuffers>
  size_t read_some(const MutableBuffers& buffers) {
    boost::beast::error_code ec;
    const size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }
  template <class ConstBuffers>
  size_t write_some(const ConstBuffers& buffers, boost::beast::error_code& ec) {
    ec = {};
    return boost::asio::buffer_size(buffers);
  }
  template <class ConstBuffers>
  size_t write_some(const ConstBuffers& buffers) {
    return boost::asio::buffer_size(buffers);
  }

 private:
  std::string_view data_;
  size_t chunk_;
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_HTTP_REQUEST_FRAMING_H_
