// SPDX-License-Identifier: Apache-2.0
// src/redis/tls.hpp — a TLS handshake made: the backend's TLS settings, read once from
// redis_options, and what each connection's handshake sets and reports.
//
//   auto tls = detail::make_tls_settings(options);   // at start: files read, errors named
//   ... per connection, before its handshake (connection.cpp):
//   detail::prepare_tls_client(ssl_stream.native_handle(), **tls, "redis.example.com");
//   ... when the handshake fails:
//   spdlog::warn("{}", detail::tls_failure(ssl_stream.native_handle(), ec));
//
// Thread-safe: the settings are read-only once made; the functions touch only the SSL given.
#pragma once

#include <boost/system/error_code.hpp>
#include <memory>
#include <string>
#include <string_view>

#include "sluice/error.hpp"
#include "sluice/redis_options.hpp"

namespace boost::asio::ssl {
class context;
}
struct ssl_st;  // OpenSSL's SSL

namespace sluice::detail {

struct tls_settings {
  std::shared_ptr<boost::asio::ssl::context> context;  ///< TLS 1.2+, the CAs, the client certificate
  std::string server_name;                             ///< tls_server_name; empty: each address's host
  bool verify = true;                                  ///< tls_verify
};

/// The settings of `o` (nullptr when o.tls is false), with every file read now. Errors
/// (errc::invalid_argument): a TLS option set without tls, a file that cannot be read or used, a
/// certificate without its key or the other way round.
result<std::shared_ptr<const tls_settings>> make_tls_settings(const redis_options& o);

/// Sets on `ssl`, before its handshake, the name sent as SNI and the name (or IP address) its
/// certificate must carry: tls_server_name, else `host`.
void prepare_tls_client(ssl_st* ssl, const tls_settings& tls, std::string_view host);

/// Why the TLS handshake of `ssl` failed, in words: the certificate check's reason when that is
/// what failed ("certificate has expired", "hostname mismatch"...), else the TLS error.
std::string tls_failure(ssl_st* ssl, const boost::system::error_code& ec);

}  // namespace sluice::detail
