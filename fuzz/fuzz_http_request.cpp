// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: raw bytes off a connection through Beast's request parser, set up and fed the
// way sluiced's sessions do (request_limits.hpp: bounded buffer, header, body and chunk-framing
// limits), request after request as on a kept-alive connection. Any input must end in parsed
// requests or an error code: no exception (Beast throws length_error for a field over 64 KiB when
// unbounded), no crash, no UB, and never more buffered than the limits allow.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>

#include "server/request_limits.hpp"

namespace {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;

// The fuzz input as a socket that hands out at most `step` bytes a read, as TCP segments do.
struct input_stream {
  std::string_view data;
  std::size_t step;

  template <class Buffers>
  std::size_t read_some(const Buffers& buffers, boost::system::error_code& ec) {
    if (data.empty()) {
      ec = asio::error::eof;
      return 0;
    }
    const std::size_t n = asio::buffer_copy(buffers, asio::buffer(data.data(), std::min(step, data.size())));
    data.remove_prefix(n);
    ec = {};
    return n;
  }
  template <class Buffers>
  std::size_t read_some(const Buffers& buffers) {
    boost::system::error_code ec;
    std::size_t n = read_some(buffers, ec);
    if (ec) std::abort();  // never called by the error-code overload of bhttp::read
    return n;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  // The first byte picks the segment size, so one input is read in many ways.
  input_stream stream{{reinterpret_cast<const char*>(data) + 1, size - 1}, std::size_t{1} + data[0] * 64};
  boost::beast::flat_buffer buffer{sluice::server::max_buffered_bytes};
  sluice::server::chunk_framing_budget budget;
  for (int requests = 0; requests < 64; ++requests) {
    bhttp::request_parser<bhttp::string_body> parser;
    sluice::server::apply_request_limits(parser, budget);
    boost::system::error_code ec;
    bhttp::read(stream, buffer, parser, ec);
    if (buffer.size() > sluice::server::max_buffered_bytes) std::abort();
    if (ec) break;
    const auto& req = parser.get();
    if (req.body().size() > sluice::server::max_body_bytes) std::abort();
    if (!req.keep_alive()) break;
  }
  return 0;
}
