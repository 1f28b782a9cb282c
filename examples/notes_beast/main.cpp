// SPDX-License-Identifier: Apache-2.0
// notes_beast — a small notes API on Boost.Beast, rate limited by sluice's middleware.
//
//   POST /login          {"tenant": "acme", "user": "alice"} -> {"token": "..."}   limited per client IP
//   GET  /notes          the caller's notes                                         per user: r=5/s, b=60
//   POST /notes          add a note (body = text)                                   per user: r=5/s, b=60
//   GET  /export         the caller's notes, as a download                          quota: 10 per user per day
//   GET|POST /tenant/... tenant-wide notes                                          dual layer: tenant r=1/s b=100,
//                                                                                   user r=5/s b=60
//   GET  /public         a greeting                                                 per client IP: r=5/s, b=60
//   GET  /healthz        "ok"                                                       exempt
//   GET  /stats          the middleware's per-rule counters (JSON)                  exempt
//   GET  /metrics        the same counters in Prometheus text (sluiced's format)    exempt
//
// Authenticated routes take "Authorization: Bearer <token>".
//
//   notes_beast [--listen 127.0.0.1:8080] [--threads N] [--trusted-proxy CIDR]...
//               [--client-ip-header x-forwarded-for|forwarded] [--redis HOST:PORT] [--no-limit] [--shadow]
// With --listen HOST:0 the kernel picks the port; the first line on stdout names it:
//   listening on http://127.0.0.1:PORT
#include <utility>  // before Asio (Boost 1.74's awaitable.hpp needs std::exchange)

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "sluice/http/beast.hpp"
#include "sluice/memory_backend.hpp"
#include "sluice/version.hpp"
#ifdef SLUICE_EXAMPLE_WITH_REDIS
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "sluice/redis_backend.hpp"
#endif

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using sluice::http::beast::request;
using sluice::http::beast::response;
using json = nlohmann::json;

namespace {

struct settings {
  std::string host = "127.0.0.1";
  unsigned short port = 8080;
  int threads = 1;
  std::vector<std::string> trusted_proxies;
  sluice::http::forwarding_header client_ip_header = sluice::http::forwarding_header::x_forwarded_for;
  std::string redis;
  bool limit = true;
  bool shadow = false;
};

constexpr const char* usage_line =
    "usage: notes_beast [--listen HOST:PORT] [--threads N] [--trusted-proxy CIDR]... "
    "[--client-ip-header x-forwarded-for|forwarded] [--redis HOST:PORT] [--no-limit] [--shadow] [--help] [--version]\n";

int usage(const char* why) {
  std::cerr << "notes_beast: " << why << "\n" << usage_line;
  return 2;
}

// The service's own state: sessions and notes. Not part of the middleware.
class notes_store {
 public:
  std::string login(const std::string& tenant, const std::string& user) {
    std::lock_guard lock(m_);
    std::uniform_int_distribution<std::uint64_t> dist;
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(dist(rng_)),
                  static_cast<unsigned long long>(dist(rng_)));
    sessions_[buf] = {.user = user, .tenant = tenant};
    return buf;
  }
  std::optional<sluice::http::identity> who(std::string_view token) {
    std::lock_guard lock(m_);
    auto it = sessions_.find(std::string(token));
    if (it == sessions_.end()) return std::nullopt;
    return it->second;
  }
  void add(const sluice::http::identity& id, std::string text) {
    std::lock_guard lock(m_);
    auto& v = notes_[id.tenant][id.user];
    if (v.size() < 1000) v.push_back(std::move(text));  // bounded: this is an example
  }
  json of_user(const sluice::http::identity& id) {
    std::lock_guard lock(m_);
    return notes_[id.tenant][id.user];
  }
  json of_tenant(const std::string& tenant) {
    std::lock_guard lock(m_);
    return notes_[tenant];
  }

 private:
  std::mutex m_;
  std::mt19937_64 rng_{std::random_device{}()};
  std::unordered_map<std::string, sluice::http::identity> sessions_;
  std::map<std::string, std::map<std::string, std::vector<std::string>>> notes_;
};

std::optional<sluice::http::identity> authenticate(notes_store& store, const request& req) {
  auto it = req.find(bhttp::field::authorization);
  if (it == req.end()) return std::nullopt;
  std::string_view v(it->value().data(), it->value().size());
  if (!v.starts_with("Bearer ")) return std::nullopt;
  return store.who(v.substr(7));
}

response reply(const request& req, bhttp::status status, std::string body,
               std::string_view content_type = "application/json") {
  response res{status, req.version()};
  res.set(bhttp::field::content_type, boost::beast::string_view(content_type.data(), content_type.size()));
  res.keep_alive(req.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

response error_reply(const request& req, bhttp::status status, std::string_view code, std::string_view message) {
  return reply(req, status, json{{"code", code}, {"message", message}}.dump());
}

struct app {
  notes_store store;
  std::shared_ptr<sluice::http::middleware> mw;  // null with --no-limit

  response handle(const request& req) {
    std::string_view target(req.target().data(), req.target().size());
    std::string_view path = target.substr(0, target.find('?'));
    auto method = req.method();

    if (path == "/healthz") return reply(req, bhttp::status::ok, "ok\n", "text/plain");
    if (path == "/public" && method == bhttp::verb::get) {
      return reply(req, bhttp::status::ok, R"({"message": "hello"})");
    }
    if (path == "/metrics" && method == bhttp::verb::get) {
      std::string text = mw ? sluice::http::render_prometheus(mw->counters()) : std::string();
      return reply(req, bhttp::status::ok, std::move(text), "text/plain; version=0.0.4");
    }
    if (path == "/stats" && method == bhttp::verb::get) {
      json rules = json::array();
      if (mw) {
        for (const auto& c : mw->counters()) {
          rules.push_back({{"rule", c.rule},
                           {"allowed", c.admitted},
                           {"rejected", c.refused},
                           {"backend_errors", c.backend_errors},
                           {"invalid", c.invalid}});
        }
      }
      return reply(req, bhttp::status::ok, json{{"rules", rules}}.dump());
    }
    if (path == "/login" && method == bhttp::verb::post) {
      json body = json::parse(req.body(), nullptr, false);
      if (!body.is_object() || !body.contains("tenant") || !body.contains("user") || !body["tenant"].is_string() ||
          !body["user"].is_string() || body["tenant"].get_ref<const std::string&>().empty() ||
          body["user"].get_ref<const std::string&>().empty() ||
          body["tenant"].get_ref<const std::string&>().size() > 128 ||
          body["user"].get_ref<const std::string&>().size() > 128) {
        return error_reply(req, bhttp::status::bad_request, "bad_request",
                           "expected {\"tenant\": \"...\", \"user\": \"...\"} (1 to 128 bytes each)");
      }
      std::string token = store.login(body["tenant"], body["user"]);
      return reply(req, bhttp::status::ok, json{{"token", token}}.dump());
    }

    bool is_notes = path == "/notes";
    bool is_export = path == "/export";
    bool is_tenant = path == "/tenant" || path.starts_with("/tenant/");
    if (!is_notes && !is_export && !is_tenant)
      return error_reply(req, bhttp::status::not_found, "not_found", "no such route");

    auto who = authenticate(store, req);
    if (!who) return error_reply(req, bhttp::status::unauthorized, "unauthorized", "log in first: POST /login");
    if (is_notes && method == bhttp::verb::get)
      return reply(req, bhttp::status::ok, json{{"notes", store.of_user(*who)}}.dump());
    if (is_notes && method == bhttp::verb::post) {
      store.add(*who, req.body());
      return reply(req, bhttp::status::created, R"({"stored": true})");
    }
    if (is_export && method == bhttp::verb::get) {
      return reply(req, bhttp::status::ok, json{{"user", who->user}, {"notes", store.of_user(*who)}}.dump());
    }
    if (is_tenant && method == bhttp::verb::get) {
      return reply(req, bhttp::status::ok,
                   json{{"tenant", who->tenant}, {"notes", store.of_tenant(who->tenant)}}.dump());
    }
    if (is_tenant && method == bhttp::verb::post) {
      store.add(*who, req.body());
      return reply(req, bhttp::status::created, R"({"stored": true})");
    }
    return error_reply(req, bhttp::status::method_not_allowed, "method_not_allowed", "method not allowed");
  }
};

// The limits of this service (the seed's numbers: r=5/s, b=60 per user).
sluice::http::middleware_options limits(std::shared_ptr<sluice::backend> backend, const settings& s) {
  using namespace std::chrono_literals;
  using sluice::http::key_by;
  return {
      .backend = std::move(backend),
      .rules =
          {
              {.name = "login", .limit = sluice::token_bucket_policy(sluice::per_second(1), 30)},
              {.name = "notes", .limit = sluice::token_bucket_policy(sluice::per_second(5), 60)},
              {.name = "export", .limit = sluice::fixed_window_policy(10, 24h)},
              {.name = "tenant",
               .limit = sluice::token_bucket_policy(sluice::per_second(5), 60),
               .tenant = sluice::token_bucket_policy(sluice::per_second(1), 100)},
              {.name = "public", .limit = sluice::token_bucket_policy(sluice::per_second(5), 60)},
          },
      .routes =
          {
              {.method = "POST", .path = "/login", .rule = "login", .key = key_by::client_ip},
              {.path = "/notes", .rule = "notes", .key = key_by::user},
              {.method = "GET", .path = "/export", .rule = "export", .key = key_by::user},
              {.path = "/tenant/*", .rule = "tenant", .key = key_by::user},
              {.method = "GET", .path = "/public", .rule = "public", .key = key_by::client_ip},
          },
      .exempt = {{.path = "/healthz"}, {.path = "/stats"}, {.path = "/metrics"}},
      .trusted_proxies = s.trusted_proxies,
      .client_ip_header = s.client_ip_header,
      .enforcement = s.shadow ? sluice::http::enforcement::shadow : sluice::http::enforcement::enforce,
  };
}

asio::awaitable<void> session(tcp::socket socket, app& a, const sluice::http::beast::limiter* limiter) {
  boost::system::error_code ec;
  auto peer = socket.remote_endpoint(ec).address();
  if (ec) co_return;
  boost::beast::tcp_stream stream(std::move(socket));
  // The buffer holds only what the parser has not consumed: its maximum bounds every framing element
  // Beast would buffer whole (request line, headers, a chunk line with extensions, trailers).
  boost::beast::flat_buffer buffer(32 * 1024);
  const sluice::http::beast::handler_function handler = [&a](const request& req) { return a.handle(req); };
  for (;;) {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.body_limit(64 * 1024);
    parser.header_limit(16 * 1024);
    stream.expires_after(std::chrono::seconds(30));
    co_await bhttp::async_read(stream, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) break;
    request req = parser.release();
    // (GCC 12 miscompiles co_await inside a conditional expression: keep it a statement.)
    response res;
    if (limiter) {
      res = co_await limiter->serve(req, peer, handler);
    } else {
      res = handler(req);
    }
    bool keep_alive = res.keep_alive();
    co_await bhttp::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
    if (ec || !keep_alive) break;
  }
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
}

asio::awaitable<void> accept_loop(tcp::acceptor& acceptor, app& a, const sluice::http::beast::limiter* limiter) {
  for (;;) {
    boost::system::error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) continue;  // e.g. EMFILE: keep serving the connections we have
    asio::co_spawn(acceptor.get_executor(), session(std::move(socket), a, limiter), [](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        std::cerr << "notes_beast: session ended: " << x.what() << "\n";  // e.g. bad_alloc; the server goes on
      }
    });
  }
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--help") {
      std::cout << "notes_beast: a notes service behind sluice's Boost.Beast middleware\n" << usage_line;
      return 0;
    }
    if (arg == "--version") {
      std::cout << "notes_beast (sluice " << sluice::version << ")\n";
      return 0;
    }
    if (arg == "--listen") {
      const char* v = value();
      if (!v) return usage("--listen needs HOST:PORT");
      std::string hp = v;
      auto colon = hp.rfind(':');
      if (colon == std::string::npos) return usage("--listen needs HOST:PORT");
      s.host = hp.substr(0, colon);
      if (s.host.size() > 2 && s.host.front() == '[' && s.host.back() == ']')
        s.host = s.host.substr(1, s.host.size() - 2);
      try {
        int p = std::stoi(hp.substr(colon + 1));
        if (p < 0 || p > 65535) return usage("port out of range");
        s.port = static_cast<unsigned short>(p);
      } catch (...) {
        return usage("bad port");
      }
    } else if (arg == "--threads") {
      const char* v = value();
      s.threads = v ? std::atoi(v) : 0;
      if (s.threads < 1 || s.threads > 256) return usage("--threads needs 1..256");
    } else if (arg == "--trusted-proxy") {
      const char* v = value();
      if (!v) return usage("--trusted-proxy needs a CIDR");
      s.trusted_proxies.emplace_back(v);
    } else if (arg == "--client-ip-header") {
      const char* v = value();
      std::string_view h = v ? v : "";
      if (h == "x-forwarded-for") {
        s.client_ip_header = sluice::http::forwarding_header::x_forwarded_for;
      } else if (h == "forwarded") {
        s.client_ip_header = sluice::http::forwarding_header::forwarded;
      } else {
        return usage("--client-ip-header needs x-forwarded-for or forwarded");
      }
    } else if (arg == "--redis") {
      const char* v = value();
      if (!v) return usage("--redis needs HOST:PORT");
      s.redis = v;
    } else if (arg == "--no-limit") {
      s.limit = false;
    } else if (arg == "--shadow") {
      s.shadow = true;
    } else {
      return usage(("unknown argument: " + std::string(arg)).c_str());
    }
  }

  std::shared_ptr<sluice::backend> backend;
  if (s.redis.empty()) {
    auto m = sluice::make_memory_backend({});
    if (!m) return usage(m.error().message.c_str());
    backend = std::move(*m);
  } else {
#ifdef SLUICE_EXAMPLE_WITH_REDIS
    spdlog::set_default_logger(spdlog::stderr_color_mt("notes_beast"));  // the backend's logs; stdout is for the port
    auto b = sluice::make_redis_backend({.addresses = {s.redis}, .on_error = sluice::failure_policy::allow});
    if (!b) return usage(b.error().message.c_str());
    backend = std::move(*b);
#else
    return usage("built without the Redis backend");
#endif
  }

  app a;
  std::optional<sluice::http::beast::limiter> limiter;
  if (s.limit) {
    auto mw = sluice::http::middleware::create(limits(backend, s));
    if (!mw) return usage(mw.error().message.c_str());
    a.mw = *mw;
    limiter.emplace(*mw, [&a](const request& req) { return authenticate(a.store, req); });
  }

  asio::io_context io(s.threads);
  boost::system::error_code ec;
  auto address = asio::ip::make_address(s.host, ec);
  if (ec) return usage("--listen host must be an IP address");
  tcp::acceptor acceptor(io);
  tcp::endpoint endpoint(address, s.port);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::cerr << "notes_beast: cannot listen on " << s.host << ":" << s.port << ": " << ec.message() << "\n";
    return 1;
  }
  auto bound = acceptor.local_endpoint();
  std::cout << "listening on http://"
            << (bound.address().is_v6() ? "[" + bound.address().to_string() + "]" : bound.address().to_string()) << ":"
            << bound.port() << std::endl;

  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code&, int) { io.stop(); });
  asio::co_spawn(io, accept_loop(acceptor, a, limiter ? &*limiter : nullptr), asio::detached);

  // An exception thrown inside Asio or Beast on behalf of one connection (std::bad_alloc, a
  // length_error from a field) must not end the process: log it, close that connection (its handler
  // is destroyed) and go on serving.
  auto run = [&io] {
    for (;;) {
      try {
        io.run();
        return;
      } catch (const std::exception& x) {
        std::cerr << "notes_beast: handler failed: " << x.what() << "\n";
      }
    }
  };
  std::vector<std::thread> workers;
  for (int i = 1; i < s.threads; ++i) workers.emplace_back(run);
  run();
  for (auto& t : workers) t.join();
  return 0;
}
