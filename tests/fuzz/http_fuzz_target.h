// One fuzz input through everything the HTTP server does with client bytes before a handler
// needs the model: Beast's parser fed from memory with the server's limits and the framing
// checks (pipelined requests one after another), then each request body through the JSON body
// parser and every message/tool/content reader, and through the reply parser as model output.
// Shared by the libFuzzer harness and the replay test.
#ifndef FUCINA_TESTS_FUZZ_HTTP_FUZZ_TARGET_H_
#define FUCINA_TESTS_FUZZ_HTTP_FUZZ_TARGET_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace fucina {

// Empty when every invariant held; otherwise what broke (crashes are the sanitizers' to catch).
// `data` is the connection's input; it is read 1-32 bytes at a time (by its size), so requests
// are parsed incrementally as they would arrive in pieces.
std::string FuzzHttpRequest(const uint8_t* data, size_t size);

}  // namespace fucina

#endif  // FUCINA_TESTS_FUZZ_HTTP_FUZZ_TARGET_H_
