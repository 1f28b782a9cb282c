// SPDX-License-Identifier: Apache-2.0
// notes_httplib — the notes example reduced to its limits, on cpp-httplib.
//
//   GET  /notes     per user (X-User: <id>, standing in for real authentication): r=5/s, b=60
//   GET  /export    quota: 10 per user per day ("quota_exceeded" when spent)
//   GET  /public    per client IP: r=5/s, b=60
//   GET  /healthz   exempt
//   GET  /stats     the per-rule counters (exempt)
//
//   notes_httplib [--listen 127.0.0.1:PORT] [--trusted-proxy CIDR]... [--no-limit]
// Port 0 lets the kernel choose; the first line on stdout is "listening on http://HOST:PORT".
#include <httplib.h>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "sluice/http/httplib.hpp"
#include "sluice/memory_backend.hpp"
#include "sluice/version.hpp"

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  std::string host = "127.0.0.1";
  int port = 8080;
  bool limit = true;
  std::vector<std::string> trusted;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--listen" && i + 1 < argc) {
      std::string hp = argv[++i];
      auto colon = hp.rfind(':');
      if (colon == std::string::npos) return std::cerr << "--listen needs HOST:PORT\n", 2;
      host = hp.substr(0, colon);
      port = std::atoi(hp.c_str() + colon + 1);
    } else if (arg == "--trusted-proxy" && i + 1 < argc) {
      trusted.emplace_back(argv[++i]);
    } else if (arg == "--no-limit") {
      limit = false;
    } else if (arg == "--version") {
      std::cout << "notes_httplib (sluice " << sluice::version << ")\n";
      return 0;
    } else {
      const bool help = arg == "--help";
      (help ? std::cout : std::cerr)
          << (help ? "notes_httplib: a notes service behind sluice's cpp-httplib middleware\n" : "")
          << "usage: notes_httplib [--listen HOST:PORT] [--trusted-proxy CIDR]... [--no-limit] [--help] [--version]\n";
      return help ? 0 : 2;
    }
  }

  using sluice::http::key_by;
  auto mw = sluice::http::middleware::create({
      .backend = sluice::make_memory_backend({}).value(),  // default options: cannot fail
      .rules = {{.name = "notes", .limit = sluice::token_bucket_policy(sluice::per_second(5), 60)},
                {.name = "export", .limit = sluice::fixed_window_policy(10, 24h)},
                {.name = "public", .limit = sluice::token_bucket_policy(sluice::per_second(5), 60)}},
      .routes = {{.method = "GET", .path = "/notes", .rule = "notes", .key = key_by::user},
                 {.method = "GET", .path = "/export", .rule = "export", .key = key_by::user},
                 {.method = "GET", .path = "/public", .rule = "public", .key = key_by::client_ip}},
      .exempt = {{.path = "/healthz"}, {.path = "/stats"}},
      .trusted_proxies = trusted,
  });
  if (!mw) return std::cerr << mw.error().message << "\n", 2;

  httplib::Server server;
  if (limit) {
    sluice::http::httplib::limiter limiter(*mw,
                                           [](const httplib::Request& req) -> std::optional<sluice::http::identity> {
                                             std::string user = req.get_header_value("X-User");
                                             if (user.empty()) return std::nullopt;
                                             return sluice::http::identity{.user = user};
                                           });
    limiter.install(server);
  }
  server.Get("/notes", [](const httplib::Request& req, httplib::Response& res) {
    if (!req.has_header("X-User")) {
      res.status = 401;
      res.set_content(R"({"code": "unauthorized"})", "application/json");
      return;
    }
    res.set_content(R"({"notes": []})", "application/json");
  });
  server.Get("/export", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"notes": []})", "application/json");
  });
  server.Get("/public", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"message": "hello"})", "application/json");
  });
  server.Get("/healthz",
             [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  server.Get("/stats", [m = *mw](const httplib::Request&, httplib::Response& res) {
    std::string body = "{\"rules\": [";
    for (const auto& c : m->counters()) {
      if (body.back() != '[') body += ", ";
      body += "{\"rule\": \"" + c.rule + "\", \"allowed\": " + std::to_string(c.admitted) +
              ", \"rejected\": " + std::to_string(c.refused) +
              ", \"backend_errors\": " + std::to_string(c.backend_errors) +
              ", \"invalid\": " + std::to_string(c.invalid) + "}";
    }
    res.set_content(body + "]}", "application/json");
  });

  if (port == 0) {
    port = server.bind_to_any_port(host);
    if (port < 0) return std::cerr << "cannot listen on " << host << "\n", 1;
  } else if (!server.bind_to_port(host, port)) {
    return std::cerr << "cannot listen on " << host << ":" << port << "\n", 1;
  }
  std::cout << "listening on http://" << host << ":" << port << std::endl;
  return server.listen_after_bind() ? 0 : 1;
}
