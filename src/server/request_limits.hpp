// SPDX-License-Identifier: Apache-2.0
// src/server/request_limits.hpp (private) — the bounds on a request as sluiced reads it, in one
// place: the server and the HTTP fuzz target set Beast's parser up with the same function.
//
// The read buffer holds only what the parser has not consumed yet (the body goes into the request),
// so a buffer of at most max_buffered_bytes bounds every framing element Beast would otherwise
// buffer whole: the request line and headers, a chunk-size line with its extensions, the trailer
// section. Chunk lines, which come one after another, also count against one budget per request.
//
//   beast::flat_buffer buffer{sluice::server::max_buffered_bytes};
//   sluice::server::chunk_framing_budget budget;
//   bhttp::request_parser<bhttp::string_body> parser;
//   sluice::server::apply_request_limits(parser, budget);   // budget must outlive parser
#pragma once

#include <cstddef>
#include <cstdint>

#include <boost/beast/core/error.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>

#include "server/api.hpp"

namespace sluice::server {

/// The request line and headers.
inline constexpr std::size_t max_header_bytes = 8 * 1024;
/// The read buffer: the largest single framing element (a trailer section, a chunk line).
inline constexpr std::size_t max_buffered_bytes = 16 * 1024;
/// All chunk lines of one request, extensions included.
inline constexpr std::size_t max_chunk_framing_bytes = 16 * 1024;

/// Counts each chunk line against max_chunk_framing_bytes: its extensions plus a fixed overhead, so
/// that a body of many tiny chunks is bounded too. Fails the parse with body_limit when exceeded.
struct chunk_framing_budget {
  static constexpr std::size_t line_overhead = 8;

  std::size_t used = 0;
  bool exceeded = false;

  void reset() noexcept { used = 0, exceeded = false; }
  void operator()(std::uint64_t /*size*/, boost::beast::string_view extensions, boost::beast::error_code& ec) {
    used += extensions.size() + line_overhead;
    if (used > max_chunk_framing_bytes) {
      exceeded = true;
      ec = boost::beast::http::error::body_limit;
    }
  }
};

/// Sets the header and body limits on a fresh parser and attaches `budget` (reset here), which must
/// outlive the parser: Beast keeps a reference to it.
template <class Parser>
void apply_request_limits(Parser& parser, chunk_framing_budget& budget) {
  budget.reset();
  parser.header_limit(max_header_bytes);
  parser.body_limit(max_body_bytes);
  parser.on_chunk_header(budget);
}

}  // namespace sluice::server
