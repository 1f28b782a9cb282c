// SPDX-License-Identifier: Apache-2.0
#include "envoy/grpc_server.hpp"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/composite_key.hpp"
#include "sluice/clock.hpp"
#include "sluice/host_port.hpp"

namespace sluice::envoy {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using socket_type = asio::basic_stream_socket<tcp, asio::io_context::executor_type>;

namespace {

constexpr std::int64_t never = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t ns_per_ms = 1'000'000;
// How often each io thread looks at its connections' deadlines, and how long a connection being
// closed may take to write its GOAWAY before its socket is closed anyway.
constexpr auto sweep_interval = std::chrono::milliseconds(250);
constexpr std::int64_t close_linger_ns = 1000 * ns_per_ms;
// gRPC's message prefix: a compressed flag and a 4-byte big-endian length.
constexpr std::size_t prefix_bytes = 5;
// Bytes gathered from nghttp2 into one socket write.
constexpr std::size_t write_batch_bytes = 64 << 10;

std::int64_t now_ns() { return to_ns(coarse_clock().now()); }
std::int64_t ms_to_ns(std::chrono::milliseconds d) { return d.count() <= 0 ? never : d.count() * ns_per_ms; }

nghttp2_nv field(std::string_view name, std::string_view value) {
  return {reinterpret_cast<std::uint8_t*>(const_cast<char*>(name.data())),
          reinterpret_cast<std::uint8_t*>(const_cast<char*>(value.data())), name.size(), value.size(),
          NGHTTP2_NV_FLAG_NONE};
}

// grpc-message is percent-encoded (gRPC over HTTP/2, "Responses"): printable ASCII but '%' is kept.
std::string percent_encoded(std::string_view s) {
  static constexpr detail::kept_bytes kept = [] {
    detail::kept_bytes t{};
    for (int b = 0x20; b <= 0x7e; ++b) t[static_cast<std::size_t>(b)] = b != '%';
    return t;
  }();
  std::string out;
  out.reserve(s.size());
  detail::append_percent_encoded(out, s, kept);
  return out;
}

// grpc-timeout: at most 8 digits and a unit (H M S m u n). Returns ns, or nullopt if malformed.
std::optional<std::int64_t> parse_grpc_timeout(std::string_view v) {
  if (v.size() < 2 || v.size() > 9) return std::nullopt;
  std::int64_t n = 0;
  const auto digits = v.substr(0, v.size() - 1);
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc() || end != digits.data() + digits.size() || n < 0) return std::nullopt;
  switch (v.back()) {
    case 'H': return n * 3600 * 1'000'000'000;
    case 'M': return n * 60 * 1'000'000'000;
    case 'S': return n * 1'000'000'000;
    case 'm': return n * 1'000'000;
    case 'u': return n * 1'000;
    case 'n': return n;
    default: return std::nullopt;
  }
}

// Request bytes held by every connection of one server, against grpc_limits::max_buffered_bytes.
class byte_budget {
 public:
  explicit byte_budget(std::size_t cap) : cap_(cap) {}
  bool take(std::size_t n) {
    std::size_t held = held_.load(std::memory_order_relaxed);
    do {
      if (n > cap_ - held) return false;
    } while (!held_.compare_exchange_weak(held, held + n, std::memory_order_relaxed));
    return true;
  }
  void give_back(std::size_t n) { held_.fetch_sub(n, std::memory_order_relaxed); }

 private:
  const std::size_t cap_;
  std::atomic<std::size_t> held_{0};
};

}  // namespace

// One io thread: its io_context and the connections it owns. Touched only from that thread but
// for `open`, read by the acceptor's thread.
struct grpc_worker {
  std::atomic<std::size_t> open{0};  // before `io`: connections its handlers hold end as it goes
  asio::io_context io{1};
  asio::steady_timer sweep_timer{io};
  std::vector<std::weak_ptr<grpc_connection>> connections;
  std::thread thread;
};

struct session_template;

struct grpc_server::impl {
  impl(methods m, const grpc_limits& l);
  ~impl();

  void accept();
  void sweep(grpc_worker& w);
  void call_started() {
    std::lock_guard lock(mutex);
    ++unanswered;
  }
  void call_answered() {
    std::lock_guard lock(mutex);
    if (--unanswered == 0) none_unanswered.notify_all();
  }
  void count_close(close_reason r) { counters.closed[static_cast<int>(r)].fetch_add(1, std::memory_order_relaxed); }

  const methods table;
  const grpc_limits limits;
  std::unique_ptr<session_template> sessions;  // what each connection's nghttp2 session is made with
  byte_budget buffered;
  stats counters;  // before `workers`: connections ending with their io_context count here
  std::vector<std::unique_ptr<grpc_worker>> workers;
  std::optional<tcp::acceptor> acceptor;  // on workers[0]
  std::optional<asio::steady_timer> accept_retry;
  std::size_t next_worker = 0;  // acceptor's thread
  std::size_t max_open_per_worker = 1;
  int port = 0;
  std::atomic<bool> stopping{false};
  std::mutex mutex;
  std::condition_variable none_unanswered;
  int unanswered = 0;  // calls handed to a method and not answered yet; guarded by mutex
  bool stopped = false;
};

// One call on one connection: its request as it arrives, then its answer until it is written.
struct grpc_stream {
  std::string body;  // the DATA so far: gRPC's prefix and message
  std::size_t budgeted = 0;
  const grpc_server::method* method = nullptr;
  bool post = false, grpc_content = false, identity = true;
  std::string encoding;
  std::int64_t begun_ns = 0;
  std::int64_t deadline_ns = never;
  bool answered = false;    // an answer was submitted (or the call refused)
  bool dispatched = false;  // handed to its method
  bool request_ended = false;
  std::string answer;  // gRPC's prefix and the answer's message, then the trailers' values
  std::size_t answer_sent = 0;
  std::string status;
  std::int64_t answered_at = 0;
};

// One HTTP/2 connection on one io thread.
struct grpc_connection : std::enable_shared_from_this<grpc_connection> {
  grpc_connection(socket_type s, grpc_server::impl& server, grpc_worker& w)
      : socket(std::move(s)), server(server), worker(w) {
    worker.open.fetch_add(1, std::memory_order_relaxed);
    server.counters.open.fetch_add(1, std::memory_order_relaxed);
    server.counters.accepted.fetch_add(1, std::memory_order_relaxed);
    created_ns = idle_since_ns = now_ns();
  }

  ~grpc_connection() {
    for (auto& [id, s] : streams) release(s);
    if (h2 != nullptr) nghttp2_session_del(h2);
    worker.open.fetch_sub(1, std::memory_order_relaxed);
    server.counters.open.fetch_sub(1, std::memory_order_relaxed);
  }

  bool start();
  void read();
  void flush();
  void close(close_reason why, std::uint32_t h2_error);        // GOAWAY, then the socket
  void begin_close(close_reason why, std::uint32_t h2_error);  // the same, from inside a callback
  void drop();                                                 // the socket, at once
  void go_away(std::int64_t deadline);                         // GOAWAY; calls open may still answer
  void sweep(std::int64_t now);
  void answer(std::int32_t id, grpc_code code, std::string_view detail, std::string_view message);
  bool idle() const { return streams.empty() && !closing; }

  // Each step of a request, from nghttp2's callbacks.
  int on_begin_frame(const nghttp2_frame_hd& hd);
  int on_begin_headers(const nghttp2_frame& f);
  int on_header(const nghttp2_frame& f, std::string_view name, std::string_view value);
  int on_data(std::int32_t id, const std::uint8_t* data, std::size_t len);
  int on_frame_recv(const nghttp2_frame& f);
  int on_frame_send(const nghttp2_frame& f);
  int on_stream_close(std::int32_t id, std::uint32_t error_code);
  ssize_t read_answer(std::int32_t id, std::uint8_t* buf, std::size_t length, std::uint32_t* flags);

  grpc_stream* find(std::int32_t id) {
    auto it = streams.find(id);
    return it == streams.end() ? nullptr : &it->second;
  }
  void release(grpc_stream& s) {
    server.buffered.give_back(s.budgeted);
    s.budgeted = 0;
    std::string().swap(s.body);
  }
  void dispatch(std::int32_t id, grpc_stream& s);
  void refuse(std::int32_t id, grpc_stream& s, grpc_code code, std::string_view detail);
  void refuse_http(std::int32_t id, grpc_stream& s, std::string_view status);
  bool fatal(close_reason why) {
    fatal_reason = why;
    return false;
  }
  bool take_reset(std::int64_t now);

  socket_type socket;
  grpc_server::impl& server;
  grpc_worker& worker;
  nghttp2_session* h2 = nullptr;
  std::array<std::uint8_t, 16 << 10> in;
  std::string out;
  // in_nghttp2: inside mem_recv or mem_send, whose callbacks may queue frames but not send them.
  bool writing = false, reading = false, in_nghttp2 = false, closing = false, dropped = false;
  bool going_away = false;  // GOAWAY sent: the calls open may finish, no new one starts
  std::int64_t created_ns, idle_since_ns, write_started_ns = 0;
  std::int64_t going_away_deadline = never, close_deadline = never;
  std::unordered_map<std::int32_t, grpc_stream> streams;
  std::size_t block_encoded = 0, block_decoded = 0;  // of the header block being received
  std::int64_t reset_tat_ns = 0;                     // the resets' rate, as GCRA's arrival time
  std::optional<close_reason> fatal_reason;          // set by a callback that must end the connection
};

namespace {

grpc_connection& self_of(void* user) { return *static_cast<grpc_connection*>(user); }

nghttp2_session_callbacks* make_callbacks() {
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_begin_frame_callback(
      cb, [](nghttp2_session*, const nghttp2_frame_hd* hd, void* u) { return self_of(u).on_begin_frame(*hd); });
  nghttp2_session_callbacks_set_on_begin_headers_callback(
      cb, [](nghttp2_session*, const nghttp2_frame* f, void* u) { return self_of(u).on_begin_headers(*f); });
  nghttp2_session_callbacks_set_on_header_callback(
      cb, [](nghttp2_session*, const nghttp2_frame* f, const std::uint8_t* name, std::size_t namelen,
             const std::uint8_t* value, std::size_t valuelen, std::uint8_t, void* u) {
        return self_of(u).on_header(*f, {reinterpret_cast<const char*>(name), namelen},
                                    {reinterpret_cast<const char*>(value), valuelen});
      });
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
      cb, [](nghttp2_session*, std::uint8_t, std::int32_t id, const std::uint8_t* data, std::size_t len, void* u) {
        return self_of(u).on_data(id, data, len);
      });
  nghttp2_session_callbacks_set_on_frame_recv_callback(
      cb, [](nghttp2_session*, const nghttp2_frame* f, void* u) { return self_of(u).on_frame_recv(*f); });
  nghttp2_session_callbacks_set_on_frame_send_callback(
      cb, [](nghttp2_session*, const nghttp2_frame* f, void* u) { return self_of(u).on_frame_send(*f); });
  nghttp2_session_callbacks_set_on_stream_close_callback(
      cb, [](nghttp2_session*, std::int32_t id, std::uint32_t code, void* u) {
        return self_of(u).on_stream_close(id, code);
      });
  return cb;
}

}  // namespace

// What every connection's session is made with: one copy per server, read-only once made.
struct session_template {
  explicit session_template(const grpc_limits& l) : callbacks(make_callbacks()) {
    nghttp2_option_new(&option);
    // nghttp2's own flood guards, set explicitly: CONTINUATION frames per header block, entries
    // per SETTINGS frame, and — behind the connection's own count of resets, which sees streams
    // left unanswered too — the peer's RST_STREAMs.
    nghttp2_option_set_max_continuations(option, 8);
    nghttp2_option_set_max_settings(option, 32);
    nghttp2_option_set_stream_reset_rate_limit(option, 2 * l.reset_burst, 2 * l.resets_per_second);
  }
  ~session_template() {
    nghttp2_session_callbacks_del(callbacks);
    nghttp2_option_del(option);
  }
  nghttp2_session_callbacks* callbacks;
  nghttp2_option* option = nullptr;
};

grpc_server::impl::impl(methods m, const grpc_limits& l)
    : table(std::move(m)), limits(l), sessions(std::make_unique<session_template>(l)), buffered(l.max_buffered_bytes) {}

grpc_server::impl::~impl() = default;

// --- a connection's life ------------------------------------------------------------------------

bool grpc_connection::start() {
  if (nghttp2_session_server_new2(&h2, server.sessions->callbacks, this, server.sessions->option) != 0) return false;
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, server.limits.max_concurrent_streams},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, static_cast<std::uint32_t>(max_header_list_bytes)},
  };
  if (nghttp2_submit_settings(h2, NGHTTP2_FLAG_NONE, settings, std::size(settings)) != 0) return false;
  boost::system::error_code ec;
  socket.set_option(tcp::no_delay(true), ec);
  worker.connections.push_back(weak_from_this());
  flush();
  read();
  return true;
}

void grpc_connection::read() {
  if (reading || dropped) return;
  reading = true;
  socket.async_read_some(asio::buffer(in), [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
    self->reading = false;
    if (ec) return self->drop();
    self->in_nghttp2 = true;
    const ssize_t rv = nghttp2_session_mem_recv(self->h2, self->in.data(), n);
    self->in_nghttp2 = false;
    // A bad preface or a flood nghttp2 refused, or a bound of ours (fatal_reason).
    if (rv < 0 && !self->fatal_reason) self->fatal_reason = close_reason::protocol;
    self->flush();
    if (nghttp2_session_want_read(self->h2) != 0) self->read();
  });
}

void grpc_connection::flush() {
  if (writing || dropped || in_nghttp2) return;
  out.clear();
  in_nghttp2 = true;
  ssize_t n = 0;
  for (;;) {
    if (fatal_reason && !closing) {  // a bound a callback found: GOAWAY goes out with what is due
      begin_close(*fatal_reason,
                  *fatal_reason == close_reason::protocol ? NGHTTP2_PROTOCOL_ERROR : NGHTTP2_ENHANCE_YOUR_CALM);
    }
    if (dropped || out.size() >= write_batch_bytes) break;
    const std::uint8_t* data = nullptr;
    n = nghttp2_session_mem_send(h2, &data);
    if (n > 0) {
      out.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
    } else if (n < 0 || !fatal_reason || closing) {
      break;
    }
  }
  in_nghttp2 = false;
  if (n < 0) {
    if (!closing) server.count_close(close_reason::protocol);
    return drop();
  }
  if (dropped) return;
  if (out.empty()) {
    // Nothing more to say and nothing to hear: a GOAWAY was sent and every stream has ended.
    if (nghttp2_session_want_read(h2) == 0 && nghttp2_session_want_write(h2) == 0) drop();
    return;
  }
  writing = true;
  write_started_ns = now_ns();
  asio::async_write(socket, asio::buffer(out), [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
    self->writing = false;
    if (ec) return self->drop();
    self->flush();
  });
}

void grpc_connection::close(close_reason why, std::uint32_t h2_error) {
  begin_close(why, h2_error);
  flush();
}

void grpc_connection::begin_close(close_reason why, std::uint32_t h2_error) {
  if (closing || dropped) return;
  closing = true;
  server.count_close(why);
  close_deadline = now_ns() + close_linger_ns;
  // Queues GOAWAY with the error and stops reading; the socket closes once it is written.
  if (nghttp2_session_terminate_session(h2, h2_error) != 0) drop();
}

void grpc_connection::drop() {
  if (dropped) return;
  dropped = true;
  boost::system::error_code ec;
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);  // pending reads and writes complete with operation_aborted
}

void grpc_connection::go_away(std::int64_t deadline) {
  if (closing || going_away) return;
  going_away = true;
  going_away_deadline = deadline;
  nghttp2_submit_goaway(h2, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(h2), NGHTTP2_NO_ERROR, nullptr,
                        0);
  flush();
}

void grpc_connection::sweep(std::int64_t now) {
  if (dropped) return;
  if (closing) {
    if (now > close_deadline) drop();
    return;
  }
  const grpc_limits& l = server.limits;
  if (writing && now - write_started_ns > ms_to_ns(l.write_timeout)) return close(close_reason::stalled, 0);
  std::vector<std::int32_t> late;  // refused after the loop: a refusal's flush may end streams
  for (const auto& [id, s] : streams) {
    if (s.answered_at != 0 && now - s.answered_at > ms_to_ns(l.write_timeout))
      return close(close_reason::stalled, NGHTTP2_NO_ERROR);
    if (!s.request_ended && !s.answered && now - s.begun_ns > ms_to_ns(l.request_timeout)) late.push_back(id);
  }
  for (const std::int32_t id : late) {
    if (grpc_stream* s = find(id)) refuse(id, *s, grpc_code::deadline_exceeded, "the request did not arrive in time");
  }
  if (streams.empty() && now - idle_since_ns > ms_to_ns(l.idle_timeout)) return close(close_reason::idle, 0);
  if (!going_away && now - created_ns > ms_to_ns(l.max_connection_age)) {
    const std::int64_t grace = ms_to_ns(l.max_connection_age_grace);
    go_away(grace == never ? never : now + grace);
  }
  if (going_away && (streams.empty() || now > going_away_deadline)) {
    const close_reason why = server.stopping.load() ? close_reason::shutdown : close_reason::aged;
    return close(why, NGHTTP2_NO_ERROR);
  }
}

// A peer's resets (its RST_STREAMs, or streams it made us refuse) as a token bucket in GCRA form.
bool grpc_connection::take_reset(std::int64_t now) {
  const grpc_limits& l = server.limits;
  const std::int64_t interval =
      1'000'000'000 / static_cast<std::int64_t>(std::max<std::uint64_t>(1, l.resets_per_second));
  const std::int64_t tolerance = interval * static_cast<std::int64_t>(std::min<std::uint64_t>(l.reset_burst, 1u << 20));
  const std::int64_t tat = std::max(reset_tat_ns, now) + interval;
  if (tat - now > tolerance) return false;
  reset_tat_ns = tat;
  return true;
}

// --- a request, frame by frame ---------------------------------------------------------------------

int grpc_connection::on_begin_frame(const nghttp2_frame_hd& hd) {
  // The header block's bytes as sent, HEADERS and every CONTINUATION: refused at the frame that
  // passes the bound, before nghttp2 reads it. A field encodes in fewer bytes than its RFC size
  // (name + value + 32), so a block within the advertised list size always passes.
  if (hd.type == NGHTTP2_HEADERS) block_encoded = 0;
  if (hd.type == NGHTTP2_HEADERS || hd.type == NGHTTP2_CONTINUATION) {
    block_encoded += hd.length;
    if (block_encoded > max_header_list_bytes) {
      fatal(close_reason::header_limit);
      return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
  }
  return 0;
}

int grpc_connection::on_begin_headers(const nghttp2_frame& f) {
  block_decoded = 0;
  if (f.hd.type == NGHTTP2_HEADERS && f.headers.cat == NGHTTP2_HCAT_REQUEST) {
    streams.try_emplace(f.hd.stream_id).first->second.begun_ns = now_ns();
  }
  return 0;
}

int grpc_connection::on_header(const nghttp2_frame& f, std::string_view name, std::string_view value) {
  // Decoded sizes too: HPACK's table lets a few bytes name a field of kilobytes.
  block_decoded += name.size() + value.size() + 32;
  if (block_decoded > max_header_list_bytes) {
    fatal(close_reason::header_limit);
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  if (f.hd.type != NGHTTP2_HEADERS || f.headers.cat != NGHTTP2_HCAT_REQUEST) return 0;  // trailers
  grpc_stream* s = find(f.hd.stream_id);
  if (s == nullptr) return 0;
  if (name == ":method") {
    s->post = value == "POST";
  } else if (name == ":path") {
    auto it = server.table.find(std::string(value));
    s->method = it == server.table.end() ? nullptr : &it->second;
  } else if (name == "content-type") {
    // application/grpc, application/grpc+proto, application/grpc;params
    s->grpc_content = value == "application/grpc" ||
                      (value.starts_with("application/grpc") && (value[16] == '+' || value[16] == ';'));
  } else if (name == "grpc-encoding") {
    s->identity = value == "identity";
    s->encoding.assign(value.substr(0, 64));
  } else if (name == "grpc-timeout") {
    if (auto t = parse_grpc_timeout(value)) s->deadline_ns = now_ns() + std::min(*t, never / 2);
  }
  return 0;
}

int grpc_connection::on_data(std::int32_t id, const std::uint8_t* data, std::size_t len) {
  grpc_stream* s = find(id);
  if (s == nullptr || s->answered) return 0;  // refused already: the rest is read and dropped
  if (s->body.size() + len > prefix_bytes + server.limits.max_message_bytes) {
    refuse(id, *s, grpc_code::resource_exhausted,
           "request larger than " + std::to_string(server.limits.max_message_bytes) + " bytes");
    return 0;
  }
  if (!server.buffered.take(len)) {
    refuse(id, *s, grpc_code::resource_exhausted, "the server holds too many requests; try again");
    return 0;
  }
  s->budgeted += len;
  s->body.append(reinterpret_cast<const char*>(data), len);
  return 0;
}

int grpc_connection::on_frame_recv(const nghttp2_frame& f) {
  const bool request_part = f.hd.type == NGHTTP2_HEADERS || f.hd.type == NGHTTP2_DATA;
  if (!request_part) return 0;
  grpc_stream* s = find(f.hd.stream_id);
  if (s == nullptr) return 0;
  if (f.hd.type == NGHTTP2_HEADERS && f.headers.cat == NGHTTP2_HCAT_REQUEST && !s->answered) {
    // A call the headers already refuse is answered now, not after a body it would carry.
    if (!s->post) {
      refuse_http(f.hd.stream_id, *s, "405");
    } else if (!s->grpc_content) {
      refuse_http(f.hd.stream_id, *s, "415");
    } else if (s->method == nullptr) {
      refuse(f.hd.stream_id, *s, grpc_code::unimplemented, "unknown method");
    } else if (!s->identity) {
      refuse(f.hd.stream_id, *s, grpc_code::unimplemented, "grpc-encoding " + s->encoding + " is not supported");
    }
  }
  if ((f.hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) {
    s->request_ended = true;
    if (!s->answered) dispatch(f.hd.stream_id, *s);
  }
  return 0;
}

void grpc_connection::dispatch(std::int32_t id, grpc_stream& s) {
  const std::string& b = s.body;
  if (b.size() < prefix_bytes) return refuse(id, s, grpc_code::internal, "a unary call carries one message");
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  const std::size_t n = std::size_t{p[1]} << 24 | std::size_t{p[2]} << 16 | std::size_t{p[3]} << 8 | p[4];
  if (p[0] != 0) return refuse(id, s, grpc_code::internal, "a compressed message without grpc-encoding");
  if (n != b.size() - prefix_bytes) return refuse(id, s, grpc_code::internal, "a unary call carries one message");
  s.dispatched = true;
  server.call_started();
  (*s.method)(std::string_view(b).substr(prefix_bytes), grpc_responder(shared_from_this(), id));
  // The method has read the request: its bytes go back to the budget. `s` may have been answered
  // (inline) but is still in `streams`: streams end only in on_stream_close, never during recv.
  if (grpc_stream* still = find(id)) release(*still);
}

void grpc_connection::refuse(std::int32_t id, grpc_stream& s, grpc_code code, std::string_view detail) {
  release(s);
  s.answered = true;
  s.answered_at = now_ns();
  const std::string status = std::to_string(static_cast<int>(code));
  const std::string message = percent_encoded(detail);
  const nghttp2_nv headers[] = {field(":status", "200"), field("content-type", "application/grpc"),
                                field("grpc-status", status), field("grpc-message", message)};
  nghttp2_submit_response(h2, id, headers, std::size(headers), nullptr);  // trailers-only
  flush();
}

void grpc_connection::refuse_http(std::int32_t id, grpc_stream& s, std::string_view status) {
  release(s);
  s.answered = true;
  s.answered_at = now_ns();
  const nghttp2_nv headers[] = {field(":status", status)};
  nghttp2_submit_response(h2, id, headers, std::size(headers), nullptr);
  flush();
}

int grpc_connection::on_frame_send(const nghttp2_frame& f) {
  // A refusal sent before the request ended: the rest of it is not wanted (RFC 9113 8.1).
  if (f.hd.type != NGHTTP2_HEADERS || (f.hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) return 0;
  const grpc_stream* s = find(f.hd.stream_id);
  if (s != nullptr && !s->request_ended)
    nghttp2_submit_rst_stream(h2, NGHTTP2_FLAG_NONE, f.hd.stream_id, NGHTTP2_NO_ERROR);
  return 0;
}

int grpc_connection::on_stream_close(std::int32_t id, std::uint32_t error_code) {
  auto it = streams.find(id);
  if (it == streams.end()) return 0;
  const bool completed = it->second.answered && it->second.answer_sent == it->second.answer.size();
  release(it->second);
  streams.erase(it);  // a method's late answer finds no stream and is dropped
  if (streams.empty()) idle_since_ns = now_ns();
  // Streams that end unanswered or reset cost the peer nothing and the server a call's work: a
  // flood of them (rapid reset, or refusals provoked on purpose) closes the connection.
  if ((error_code != NGHTTP2_NO_ERROR || !completed) && !take_reset(now_ns())) {
    fatal(close_reason::resets);
    return NGHTTP2_ERR_CALLBACK_FAILURE;  // read nothing more
  }
  return 0;
}

// --- the answer ----------------------------------------------------------------------------------

void grpc_connection::answer(std::int32_t id, grpc_code code, std::string_view detail, std::string_view message) {
  if (closing || dropped) return;
  grpc_stream* s = find(id);
  if (s == nullptr || s->answered) return;
  if (now_ns() >= s->deadline_ns) {  // on the coarse clock (4 ms): a timeout of 0 is over at once
    code = grpc_code::deadline_exceeded;
    detail = "deadline exceeded";
  }
  if (code != grpc_code::ok) return refuse(id, *s, code, detail);
  s->answered = true;
  s->answered_at = now_ns();
  const auto n = static_cast<std::uint32_t>(message.size());
  s->answer.reserve(prefix_bytes + message.size());
  s->answer = {'\0', static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
               static_cast<char>(n)};
  s->answer.append(message);
  const nghttp2_nv headers[] = {field(":status", "200"), field("content-type", "application/grpc")};
  nghttp2_data_provider body{};
  body.read_callback = [](nghttp2_session*, std::int32_t id, std::uint8_t* buf, std::size_t length,
                          std::uint32_t* flags, nghttp2_data_source*,
                          void* u) { return self_of(u).read_answer(id, buf, length, flags); };
  nghttp2_submit_response(h2, id, headers, std::size(headers), &body);
  flush();
}

ssize_t grpc_connection::read_answer(std::int32_t id, std::uint8_t* buf, std::size_t length, std::uint32_t* flags) {
  grpc_stream* s = find(id);
  if (s == nullptr) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  const std::size_t n = std::min(length, s->answer.size() - s->answer_sent);
  std::memcpy(buf, s->answer.data() + s->answer_sent, n);
  s->answer_sent += n;
  if (s->answer_sent == s->answer.size()) {
    *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    const nghttp2_nv trailers[] = {field("grpc-status", "0")};
    nghttp2_submit_trailer(h2, id, trailers, std::size(trailers));
  }
  return static_cast<ssize_t>(n);
}

// --- the responder ---------------------------------------------------------------------------------

grpc_responder::grpc_responder(std::shared_ptr<grpc_connection> c, std::int32_t stream)
    : connection_(std::move(c)), stream_(stream) {}

grpc_responder& grpc_responder::operator=(grpc_responder&& other) noexcept {
  if (this != &other) {
    if (connection_) finish(grpc_code::internal, "the call was not answered");
    connection_ = std::move(other.connection_);
    stream_ = other.stream_;
  }
  return *this;
}

grpc_responder::~grpc_responder() {
  if (connection_) finish(grpc_code::internal, "the call was not answered");
}

void grpc_responder::finish(grpc_code code, std::string_view detail, std::string_view message) {
  if (!connection_) return;
  std::shared_ptr<grpc_connection> c = std::move(connection_);
  grpc_server::impl& server = c->server;
  const std::int32_t id = stream_;
  if (c->worker.io.get_executor().running_in_this_thread()) {
    c->answer(id, code, detail, message);
  } else {
    asio::post(c->worker.io,
               [c, id, code, d = std::string(detail), m = std::string(message)] { c->answer(id, code, d, m); });
  }
  server.call_answered();  // last: shutdown may end the server once no call is unanswered
}

// --- the server ------------------------------------------------------------------------------------

void grpc_server::impl::accept() {
  grpc_worker& target = *workers[next_worker];
  next_worker = (next_worker + 1) % workers.size();
  acceptor->async_accept(target.io, [this, &target](boost::system::error_code ec, socket_type socket) {
    if (stopping.load()) return;
    if (!ec) {
      asio::post(target.io, [this, &target, s = std::move(socket)]() mutable {
        auto c = std::make_shared<grpc_connection>(std::move(s), *this, target);
        if (target.open.load(std::memory_order_relaxed) > max_open_per_worker) {
          // At the cap: the connection idle longest makes room; if none is idle, this one goes.
          grpc_connection* oldest = nullptr;
          for (auto& weak : target.connections) {
            auto other = weak.lock();
            if (other && other->idle() && (oldest == nullptr || other->idle_since_ns < oldest->idle_since_ns))
              oldest = other.get();
          }
          if (oldest == nullptr) {
            count_close(close_reason::refused);
            c->drop();
            return;
          }
          oldest->close(close_reason::shed, NGHTTP2_NO_ERROR);
        }
        if (!c->start()) c->drop();
      });
    }
    if (!ec) return accept();
    // Out of descriptors (EMFILE) and the like: try again shortly rather than spin.
    accept_retry->expires_after(std::chrono::milliseconds(50));
    accept_retry->async_wait([this](boost::system::error_code e) {
      if (!e && !stopping.load()) accept();
    });
  });
}

void grpc_server::impl::sweep(grpc_worker& w) {
  w.sweep_timer.expires_after(sweep_interval);
  w.sweep_timer.async_wait([this, &w](boost::system::error_code ec) {
    if (ec) return;
    const std::int64_t now = now_ns();
    std::erase_if(w.connections, [now](std::weak_ptr<grpc_connection>& weak) {
      auto c = weak.lock();
      if (!c) return true;
      c->sweep(now);
      return false;
    });
    sweep(w);
  });
}

grpc_server::grpc_server(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

grpc_server::~grpc_server() { shutdown(std::chrono::milliseconds(0)); }

int grpc_server::port() const noexcept { return impl_->port; }

const grpc_server::stats& grpc_server::counters() const noexcept { return impl_->counters; }

result<std::unique_ptr<grpc_server>> grpc_server::start(const std::string& address, methods m,
                                                        const grpc_limits& limits) {
  auto where = parse_host_port(address);
  if (!where) return error(errc::config_invalid, "gRPC listen " + where.error().message);
  auto i = std::make_unique<impl>(std::move(m), limits);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned t = 0; t < threads; ++t) i->workers.push_back(std::make_unique<grpc_worker>());
  i->max_open_per_worker = std::max<std::size_t>(1, limits.max_connections / threads);
  boost::system::error_code ec;
  const auto ip = asio::ip::make_address(where->host, ec);
  tcp::endpoint endpoint;
  if (!ec) {
    endpoint = tcp::endpoint(ip, where->port);
  } else {
    tcp::resolver resolver(i->workers[0]->io);
    auto found = resolver.resolve(where->host, std::to_string(where->port), tcp::resolver::passive, ec);
    if (ec || found.empty()) return error(errc::config_invalid, "cannot resolve gRPC listen address " + address);
    endpoint = found.begin()->endpoint();
  }
  i->acceptor.emplace(i->workers[0]->io);
  i->acceptor->open(endpoint.protocol(), ec);
  if (!ec) i->acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) i->acceptor->bind(endpoint, ec);
  if (!ec) i->acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return error(errc::config_invalid, "cannot listen for gRPC on " + address + ": " + ec.message());
  i->port = i->acceptor->local_endpoint().port();
  i->accept_retry.emplace(i->workers[0]->io);
  i->accept();
  for (auto& w : i->workers) {
    i->sweep(*w);
    w->thread = std::thread([&io = w->io] { io.run(); });
  }
  return std::unique_ptr<grpc_server>(new grpc_server(std::move(i)));
}

void grpc_server::shutdown(std::chrono::milliseconds grace) {
  impl& s = *impl_;
  if (s.stopped) return;
  s.stopped = true;
  s.stopping = true;
  asio::post(s.workers[0]->io, [&s] {
    boost::system::error_code ec;
    s.acceptor->close(ec);
  });
  // GOAWAY to every connection: the calls it has started may still answer within the grace.
  const std::int64_t deadline = now_ns() + std::max<std::int64_t>(0, grace.count()) * ns_per_ms;
  for (auto& w : s.workers) {
    asio::post(w->io, [&w = *w, deadline] {
      for (auto& weak : w.connections)
        if (auto c = weak.lock()) c->go_away(deadline);
    });
  }
  const auto until = std::chrono::steady_clock::now() + grace;
  while (s.counters.open.load() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  for (auto& w : s.workers) {
    asio::post(w->io, [&w = *w] {
      for (auto& weak : w.connections) {
        if (auto c = weak.lock()) {
          if (!c->closing && !c->dropped) c->server.count_close(close_reason::shutdown);
          c->drop();
        }
      }
    });
  }
  // Methods still deciding (on Redis) answer into connections now closed; their server must live.
  {
    std::unique_lock lock(s.mutex);
    s.none_unanswered.wait(lock, [&] { return s.unanswered == 0; });
  }
  for (auto& w : s.workers) asio::post(w->io, [&io = w->io] { io.stop(); });
  for (auto& w : s.workers) w->thread.join();
}

std::string_view close_reason_name(close_reason r) {
  switch (r) {
    case close_reason::idle: return "idle";
    case close_reason::aged: return "aged";
    case close_reason::shed: return "shed";
    case close_reason::refused: return "refused";
    case close_reason::header_limit: return "header_limit";
    case close_reason::protocol: return "protocol";
    case close_reason::stalled: return "stalled";
    case close_reason::resets: return "resets";
    case close_reason::shutdown: return "shutdown";
    case close_reason::count_: break;
  }
  return "unknown";
}

}  // namespace sluice::envoy
