// SPDX-License-Identifier: Apache-2.0
#include "redis/tls.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>

namespace sluice::detail {
namespace {

namespace ssl = boost::asio::ssl;

// One file's step, its failure named after the option that gave the file.
template <class Step>
result<void> load(std::string_view option, const std::string& path, Step step) {
  boost::system::error_code ec;
  step(ec);
  if (ec) return {errc::invalid_argument, "redis " + std::string(option) + " '" + path + "': " + ec.message()};
  return {};
}

}  // namespace

result<std::shared_ptr<const tls_settings>> make_tls_settings(const redis_options& o) {
  if (!o.tls) {
    if (!o.tls_ca_file.empty() || !o.tls_ca_dir.empty() || !o.tls_cert_file.empty() || !o.tls_key_file.empty() ||
        !o.tls_server_name.empty() || !o.tls_verify) {
      return {errc::invalid_argument, "redis tls_* options are set but tls is false"};
    }
    return std::shared_ptr<const tls_settings>();
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return {errc::invalid_argument, "redis tls_cert_file and tls_key_file go together (a client certificate)"};
  }
  auto s = std::make_shared<tls_settings>();
  s->context = std::make_shared<ssl::context>(ssl::context::tls_client);
  ssl::context& ctx = *s->context;
  SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_2_VERSION);
  if (!o.tls_ca_file.empty()) {
    auto v = load("tls_ca_file", o.tls_ca_file, [&](auto& ec) { ctx.load_verify_file(o.tls_ca_file, ec); });
    if (!v) return v.error();
  }
  if (!o.tls_ca_dir.empty()) {
    auto v = load("tls_ca_dir", o.tls_ca_dir, [&](auto& ec) { ctx.add_verify_path(o.tls_ca_dir, ec); });
    if (!v) return v.error();
  }
  if (o.tls_ca_file.empty() && o.tls_ca_dir.empty()) {
    auto v = load("system CA store", "", [&](auto& ec) { ctx.set_default_verify_paths(ec); });
    if (!v) return v.error();
  }
  if (!o.tls_cert_file.empty()) {
    auto v =
        load("tls_cert_file", o.tls_cert_file, [&](auto& ec) { ctx.use_certificate_chain_file(o.tls_cert_file, ec); });
    if (!v) return v.error();
    // OpenSSL checks the key against the certificate as it loads it.
    boost::system::error_code ec;
    ctx.use_private_key_file(o.tls_key_file, ssl::context::pem, ec);
    if (ec && ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == X509_R_KEY_VALUES_MISMATCH) {
      return {errc::invalid_argument,
              "redis tls_key_file '" + o.tls_key_file + "' is not the key of tls_cert_file '" + o.tls_cert_file + "'"};
    }
    if (ec) return {errc::invalid_argument, "redis tls_key_file '" + o.tls_key_file + "': " + ec.message()};
  }
  ctx.set_verify_mode(o.tls_verify ? ssl::verify_peer : ssl::verify_none);
  s->server_name = o.tls_server_name;
  s->verify = o.tls_verify;
  return std::shared_ptr<const tls_settings>(std::move(s));
}

void prepare_tls_client(ssl_st* ssl, const tls_settings& tls, std::string_view host) {
  const std::string name(tls.server_name.empty() ? host : tls.server_name);
  boost::system::error_code ec;  // set: `name` is a host name, not an address
  boost::asio::ip::make_address(name, ec);
  if (ec) SSL_set_tlsext_host_name(ssl, name.c_str());  // SNI carries names, never addresses
  if (!tls.verify) return;
  // OpenSSL checks the name while it verifies the chain, so a mismatch fails the handshake with
  // its own reason ("hostname mismatch", "IP address mismatch").
  if (ec) {
    SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    SSL_set1_host(ssl, name.c_str());
  } else {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str());
  }
}

std::string tls_failure(ssl_st* ssl, const boost::system::error_code& ec) {
  if (ssl != nullptr) {
    if (long v = SSL_get_verify_result(ssl); v != X509_V_OK) {
      return std::string("certificate verify failed: ") + X509_verify_cert_error_string(v);
    }
  }
  if (ec == boost::asio::ssl::error::stream_truncated) return "the server closed the connection during the handshake";
  return ec.message();
}

}  // namespace sluice::detail
