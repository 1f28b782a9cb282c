// SPDX-License-Identifier: Apache-2.0
#include "server/session.hpp"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/write.hpp>
#include <spdlog/spdlog.h>

#include "server/log_fields.hpp"
#include "sluice/http/headers.hpp"
#include "server/metrics.hpp"

namespace sluice::server {

namespace {

// "application/json", any case, with or without parameters ("; charset=utf-8").
bool is_json_media_type(std::string_view content_type) {
  std::string_view type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.remove_suffix(1);
  while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.remove_prefix(1);
  return beast::iequals(beast::string_view(type.data(), type.size()), "application/json");
}

// POST bodies are JSON: a browser may send a cross-origin text/plain or form POST without asking
// first; requiring JSON makes it ask (CORS preflight), so no page can spend or reset a key's budget.
std::optional<api_error> non_json_body(std::string_view content_type, std::string_view endpoint) {
  if (is_json_media_type(content_type)) return std::nullopt;
  return api_error{415, "unsupported_media_type",
                   "POST " + std::string(endpoint) + " needs Content-Type: application/json"};
}

}  // namespace

session::~session() {
  --worker_.open;
  if (counted_) svc_.request_end();  // ended by an exception mid-request
}

bool session::close_longest_waiting(worker& w) {
  std::shared_ptr<session> oldest;
  for (const auto& weak : w.sessions) {
    auto s = weak.lock();
    if (s && s->waiting() && (!oldest || s->waiting_since() < oldest->waiting_since())) oldest = std::move(s);
  }
  if (!oldest) return false;
  oldest->shed();
  return true;
}

// A connection waiting between requests may have been promised keep-alive by the last response:
// its client may be sending the next request right now. It gets drain_grace to do so (answered,
// with Connection: close); silent, it is closed. A connection mid-request is answered with
// Connection: close and closed after.
void session::drain() {
  if (!waiting_) return;
  count_in_flight();
  deadline_ns_ = std::min(deadline_ns_, coarse_now_ns() + std::chrono::nanoseconds(drain_grace).count());
}

void session::count_in_flight() {
  if (counted_) return;
  svc_.request_begin();
  counted_ = true;
}

void session::do_read() {
  parser_.emplace();
  apply_request_limits(*parser_, chunk_framing_);
  waiting_ = true;
  waiting_since_ns_ = coarse_now_ns();
  set_deadline(idle_timeout);
  if (svc_.draining()) drain();
  bhttp::async_read_header(socket_, buffer_, *parser_,
                           beast::bind_front_handler(&session::on_header, shared_from_this()));
}

// Answers a request that could not be read, then closes: 431 for headers over the limit, 413 for a
// body (or its chunk framing) over the limit, 400 for a malformed request. Returns false when the
// connection should just be closed (timeout, reset).
bool session::reply_read_error(beast::error_code ec) {
  const bool in_header = waiting_ || !parser_->is_header_done();
  waiting_ = false;
  count_in_flight();
  req_ = {};
  req_.keep_alive(false);
  extra_headers_.clear();
  if (ec == bhttp::error::header_limit || (ec == bhttp::error::buffer_overflow && in_header)) {
    reply_error({431, "header_too_large",
                 "the request line and headers are larger than " + std::to_string(max_header_bytes) + " bytes"});
    return true;
  }
  if (ec == bhttp::error::body_limit || ec == bhttp::error::buffer_overflow) {
    std::string message = chunk_framing_.exceeded || ec == bhttp::error::buffer_overflow
                              ? "the chunked framing (chunk lines, extensions, trailers) is larger than " +
                                    std::to_string(max_chunk_framing_bytes) + " bytes"
                              : "the body is larger than " + std::to_string(max_body_bytes) + " bytes";
    reply_error({413, "payload_too_large", std::move(message)});
    return true;
  }
  if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
      ec != bhttp::error::partial_message && ec != bhttp::error::end_of_stream) {
    reply_error({400, "invalid_request", "malformed HTTP request: " + ec.message()});
    return true;
  }
  return false;
}

void session::on_header(beast::error_code ec, std::size_t) {
  if (ec == bhttp::error::end_of_stream) return close();
  if (ec) {
    if (!reply_read_error(ec)) close();
    return;
  }
  // From here the request is in flight: SIGTERM waits for it.
  waiting_ = false;
  count_in_flight();
  set_deadline(write_timeout);
  const auto& h = parser_->get();
  if (!parser_->is_done() && beast::iequals(h[bhttp::field::expect], "100-continue")) {
    static constexpr std::string_view continue_line = "HTTP/1.1 100 Continue\r\n\r\n";
    asio::async_write(socket_, asio::buffer(continue_line.data(), continue_line.size()),
                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        if (ec) return self->close();
                        self->read_body();
                      });
    return;
  }
  read_body();
}

void session::read_body() {
  bhttp::async_read(socket_, buffer_, *parser_, beast::bind_front_handler(&session::on_read, shared_from_this()));
}

void session::on_read(beast::error_code ec, std::size_t) {
  if (ec) {
    if (!reply_read_error(ec)) close();
    return;
  }
  req_ = parser_->release();
  extra_headers_.clear();
  handle();
}

void session::handle() {
  auto t = req_.target();
  std::string_view target(t.data(), t.size());
  if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
  auto method = req_.method();
  bool get = method == bhttp::verb::get || method == bhttp::verb::head;

  if (target == "/v1/check") {
    if (method != bhttp::verb::post) return reply_error({405, "method_not_allowed", "use POST for /v1/check"});
    return handle_check();
  }
  if (target == "/v1/reset") {
    if (method != bhttp::verb::post) return reply_error({405, "method_not_allowed", "use POST for /v1/reset"});
    return handle_reset();
  }
  if (target == "/v1/rules") {
    if (!get) return reply_error({405, "method_not_allowed", "use GET for /v1/rules"});
    return reply(bhttp::status::ok, svc_.render_rules(*svc_.current_for(worker_)), "application/json");
  }
  if (target == "/healthz" || target == "/readyz" || target == "/metrics") {
    if (!get) return reply_error({405, "method_not_allowed", "use GET for " + std::string(target)});
    if (target == "/healthz") return reply(bhttp::status::ok, "{\"status\":\"ok\"}", "application/json");
    if (target == "/readyz") {
      if (svc_.draining())
        return reply(bhttp::status::service_unavailable, "{\"status\":\"draining\"}", "application/json");
      if (svc_.backend().ready()) return reply(bhttp::status::ok, "{\"status\":\"ready\"}", "application/json");
      return reply(bhttp::status::service_unavailable, "{\"status\":\"backend_unavailable\"}", "application/json");
    }
    return reply(bhttp::status::ok, svc_.render_metrics(), "text/plain; version=0.0.4; charset=utf-8");
  }
  reply_error({404, "not_found", "no endpoint " + std::string(target.substr(0, 128))});
}

void session::handle_check() {
  auto content_type = req_[bhttp::field::content_type];
  if (auto e = non_json_body({content_type.data(), content_type.size()}, "/v1/check")) return reply_error(*e);
  snap_ = svc_.current_for(worker_);
  auto parsed = parse_check_body(
      req_.body(), *snap_->rules,
      [snap = snap_.get()](const check_item& item) -> const prepared_rule& { return snap->prepared_for(item); });
  if (auto* e = std::get_if<api_error>(&parsed)) return reply_error(*e);
  batch_ = std::move(std::get<check_batch>(parsed));
  results_.assign(batch_.items.size(), std::nullopt);
  started_ = steady::now();
  clear_deadline();  // the backend has its own timeout
  outstanding_ = 1;  // held until every check is issued, so an inline completion cannot finish early
  for (std::size_t i = 0; i < batch_.items.size(); ++i) {
    const check_item& item = batch_.items[i];  // its rule and prepared rule: an override's, if any
    if (item.error) continue;
    if (!snap_->cfg.enabled) {  // not checked, but a bad request is still the caller's error
      auto valid = validate(item.request(), svc_.backend());
      results_[i] = valid ? result<decision>(disabled_decision(*item.rule)) : result<decision>(valid.error());
      continue;
    }
    ++outstanding_;
    const check_request req = item.request();
    svc_.backend().async_check(req, [self = shared_from_this(), i](result<decision> r) {
      // Inline completions (memory backend) run here and now; Redis completes on its own thread
      // and is posted back to this connection's thread.
      auto ex = self->socket_.get_executor();
      asio::dispatch(ex, [self, i, r = std::move(r)]() mutable { self->on_check_done(i, std::move(r)); });
    });
  }
  if (--outstanding_ == 0) finish_check();
}

void session::on_check_done(std::size_t index, result<decision> r) {
  results_[index] = std::move(r);
  if (--outstanding_ == 0) finish_check();
}

void session::finish_check() {
  auto latency = steady::now() - started_;
  const auto& cfg = snap_->cfg;
  for (std::size_t i = 0; i < batch_.items.size(); ++i) {
    const check_item& item = batch_.items[i];
    if (item.error || !results_[i]) continue;
    const result<decision>& r = *results_[i];
    if (!r && r.error().code == condition::invalid_request) continue;  // the caller's, not the backend's
    if (!r) {
      svc_.stats().record_backend_error(item.rule->name, r.error(), latency);
      spdlog::warn("event=check_failed rule={} error={}", item.rule->name, log_value(r.error().message));
      continue;
    }
    if (item.cost == 0) {
      svc_.stats().record_look(item.rule->name, latency);
      continue;
    }
    svc_.stats().record_decision(item.rule->name, item.tenant, *r, latency, item.rule->shadow);
    if (!r->allowed && cfg.server.log_rejections && svc_.rejections().admit(item.rule->name)) {
      const std::string_view shadow = item.rule->shadow ? " shadow=true" : "";
      if (item.rule->is_dual_layer()) {
        spdlog::info("event=check rate_limited=true{} rule={} tenant={} user={} rejected_by={}", shadow,
                     item.rule->name, log_value(item.tenant), log_value(item.user), to_string(r->rejected_by));
      } else {
        spdlog::info("event=check rate_limited=true{} rule={} key={}", shadow, item.rule->name, log_value(item.key));
      }
    }
  }
  // A shadow rule's refusals are admitted from here on, marked as such.
  auto answer = [&](std::size_t i) -> std::pair<decision, bool> {
    const decision& d = results_[i]->value();
    const bool shadow_rejected = batch_.items[i].rule->shadow && !d.allowed;
    return {shadow_rejected ? shadow_admitted(d) : d, shadow_rejected};
  };

  if (!batch_.batch) {
    const check_item& item = batch_.items[0];
    const result<decision>& r = *results_[0];
    if (!r) return reply_error(api_error_of(r.error()));
    const auto [d, shadow_rejected] = answer(0);
    for (const auto& f :
         sluice::http::rate_limit_headers(d, *item.rule, std::chrono::system_clock::now(), snap_->headers)) {
      extra_headers_ += f.name;
      extra_headers_ += ": ";
      extra_headers_ += f.value;
      extra_headers_ += "\r\n";
    }
    return reply(d.allowed ? bhttp::status::ok : bhttp::status::too_many_requests,
                 render_decision(*item.rule, d, shadow_rejected), "application/json");
  }
  std::string body = "{\"results\":[";
  for (std::size_t i = 0; i < batch_.items.size(); ++i) {
    if (i) body += ',';
    const check_item& item = batch_.items[i];
    if (item.error) {
      body += render_error(*item.error);
    } else if (!*results_[i]) {
      body += render_error(api_error_of(results_[i]->error()));
    } else {
      const auto [d, shadow_rejected] = answer(i);
      body += render_decision(*item.rule, d, shadow_rejected);
    }
  }
  body += "]}";
  reply(bhttp::status::ok, body, "application/json");
}

namespace {

// Whether `authorization` is "Bearer <token>", compared in time independent of where they differ.
bool bearer_matches(std::string_view authorization, std::string_view token) {
  constexpr std::string_view scheme = "Bearer ";
  if (authorization.size() != scheme.size() + token.size() || !authorization.starts_with(scheme)) return false;
  unsigned char differ = 0;
  for (std::size_t i = 0; i < token.size(); ++i) {
    differ |= static_cast<unsigned char>(authorization[scheme.size() + i] ^ token[i]);
  }
  return differ == 0;
}

}  // namespace

// POST /v1/reset: behind [server] admin_token; the key's state forgotten on the backend.
void session::handle_reset() {
  snap_ = svc_.current_for(worker_);
  const std::string& token = snap_->cfg.server.admin_token;
  if (token.empty()) {
    return reply_error({403, "forbidden", "resets are off: set [server] admin_token to allow them"});
  }
  auto authorization = req_[bhttp::field::authorization];
  if (!bearer_matches({authorization.data(), authorization.size()}, token)) {
    extra_headers_ += "WWW-Authenticate: Bearer\r\n";
    return reply_error({401, "unauthorized", "POST /v1/reset needs Authorization: Bearer <admin_token>"});
  }
  auto content_type = req_[bhttp::field::content_type];
  if (auto e = non_json_body({content_type.data(), content_type.size()}, "/v1/reset")) return reply_error(*e);
  auto parsed = parse_reset_body(req_.body(), *snap_->rules);
  if (auto* e = std::get_if<api_error>(&parsed)) return reply_error(*e);
  reset_ = std::move(std::get<check_item>(parsed));
  clear_deadline();  // the backend has its own timeout
  svc_.backend().async_reset(reset_.request(), [self = shared_from_this()](result<void> r) {
    auto ex = self->socket_.get_executor();
    asio::dispatch(ex, [self, r = std::move(r)]() mutable { self->finish_reset(std::move(r)); });
  });
}

void session::finish_reset(result<void> r) {
  const check_item& item = reset_;
  svc_.stats().record_reset(item.rule->name, r.ok());
  if (!r) {
    spdlog::warn("event=reset_failed rule={} error={}", item.rule->name, log_value(r.error().message));
    return reply_error(api_error_of(r.error()));
  }
  if (item.rule->is_dual_layer()) {
    spdlog::info("event=reset rule={} tenant={} user={}", item.rule->name, log_value(item.tenant),
                 log_value(item.user));
  } else {
    spdlog::info("event=reset rule={} key={}", item.rule->name, log_value(item.key));
  }
  reply(bhttp::status::ok, R"({"reset":true})", "application/json");
}

void session::reply_error(const api_error& e) {
  if (e.status == 405) {
    const bool post = req_.target().starts_with("/v1/check") || req_.target().starts_with("/v1/reset");
    extra_headers_ += post ? "Allow: POST\r\n" : "Allow: GET, HEAD\r\n";
  }
  reply(static_cast<bhttp::status>(e.status), render_error(e), "application/json");
}

// Serializes the response by hand (status line, extra_headers_, body) and writes it in one send:
// cheaper than Beast's serializer for these small, fixed-shape answers.
void session::reply(bhttp::status status, std::string_view body, std::string_view content_type) {
  int code = static_cast<int>(status);
  bool keep_alive = req_.keep_alive() && !svc_.draining() && code != 413;
  auto reason = bhttp::obsolete_reason(status);
  out_.clear();
  out_ += "HTTP/1.1 ";
  out_ += std::to_string(code);
  out_ += ' ';
  out_.append(reason.data(), reason.size());
  out_ += "\r\nServer: sluiced\r\nContent-Type: ";
  out_ += content_type;
  out_ += "\r\n";
  out_ += extra_headers_;
  out_ += "Content-Length: ";
  out_ += std::to_string(body.size());
  out_ += "\r\n";
  if (!keep_alive) {
    out_ += "Connection: close\r\n";
  } else if (req_.version() == 10) {
    out_ += "Connection: keep-alive\r\n";
  }
  out_ += "\r\n";
  if (req_.method() != bhttp::verb::head) out_ += body;
  svc_.stats().record_response(code);
  set_deadline(write_timeout);
  asio::async_write(socket_, asio::buffer(out_),
                    beast::bind_front_handler(&session::on_write, shared_from_this(), !keep_alive));
}

void session::on_write(bool close_after, beast::error_code ec, std::size_t) {
  if (counted_) {
    counted_ = false;
    svc_.request_end();
  }
  snap_.reset();
  batch_ = {};
  results_.clear();
  // The client was promised keep-alive: a drain that began meanwhile is handled in do_read.
  if (ec || close_after) return close();
  do_read();
}

void session::close() {
  if (counted_) {
    counted_ = false;
    svc_.request_end();
  }
  // Half-close, then read and discard what the client still sends (e.g. the rest of a body over the
  // limit) until it closes too: closing with unread data would reset the connection and could make
  // the client lose the response.
  beast::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) return (void)socket_.close(ec);
  set_deadline(std::chrono::seconds(2));
  discard();
}

void session::discard() {
  if (discarded_ > 4 * max_body_bytes) {
    beast::error_code ec;
    socket_.close(ec);
    return;
  }
  socket_.async_read_some(asio::buffer(discard_buf_), [self = shared_from_this()](beast::error_code ec, std::size_t n) {
    self->discarded_ += n;
    if (ec) {
      beast::error_code ignored;
      self->socket_.close(ignored);
      return;
    }
    self->discard();
  });
}

}  // namespace sluice::server
