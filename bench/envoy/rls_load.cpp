// SPDX-License-Identifier: Apache-2.0
// rls_load — a load client of envoy.service.ratelimit.v3 ShouldRateLimit: gRPC over HTTP/2.
//
// Keeps --in-flight calls outstanding (split over --threads, each with a connection of its own)
// for --seconds, each asking about one descriptor [(--key, "user:N")] with N uniform over
// --values, and prints one line: calls per second, latency percentiles, how many were over the
// limit, and how many failed. Stops by itself: calls still open 5 s after --seconds fail.
//
//   rls_load --target 127.0.0.1:8081 --domain bench --seconds 10 --in-flight 64 --values 100000
//
// The messages are the project's protos; the HTTP/2 framing is nghttp2's, as with Envoy's default
// gRPC client (`envoy_grpc`, on Envoy's own HTTP/2 codec). grpc++'s client cost 14–27 µs of CPU per
// call here, as much as the server it measured; on two cores the figure was then mostly the load
// generator's. This one costs a few µs, as wrk does for the HTTP API it is compared with.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.pb.h"

namespace {

namespace rls = ::envoy::service::ratelimit::v3;
using steady = std::chrono::steady_clock;

constexpr char method_path[] = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
constexpr auto grace = std::chrono::seconds(5);  // for the calls open when --seconds end

struct options {
  std::string target = "127.0.0.1:8081";
  std::string domain = "bench";
  std::string key = "user";
  int seconds = 10;
  int in_flight = 64;
  int threads = 2;
  int values = 100'000;
};

struct totals {
  std::vector<std::int64_t> latencies_ns;
  std::uint64_t over_limit = 0;
  std::uint64_t failed = 0;
};

// One call: its request frame (gRPC's 5-byte prefix, then the message), and what came back.
struct call {
  std::string request;
  std::size_t sent = 0;
  std::string response;
  steady::time_point started;
  bool http_ok = false;  // :status 200
  int grpc_status = -1;  // from the trailers (or a trailers-only answer)
};

// gRPC's message framing: compressed flag 0, big-endian length, the message.
std::string frame(const rls::RateLimitRequest& request) {
  const std::string body = request.SerializeAsString();
  const auto n = static_cast<std::uint32_t>(body.size());
  std::string out{'\0', static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                  static_cast<char>(n)};
  return out + body;
}

// The answer's one message, if it is exactly one uncompressed message.
bool parse_answer(const std::string& data, rls::RateLimitResponse& out) {
  if (data.size() < 5 || data[0] != 0) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const std::size_t n = std::size_t{p[1]} << 24 | std::size_t{p[2]} << 16 | std::size_t{p[3]} << 8 | p[4];
  return n == data.size() - 5 && out.ParseFromArray(data.data() + 5, static_cast<int>(n));
}

int connect_to(const std::string& target) {
  const auto colon = target.rfind(':');
  if (colon == std::string::npos) return -1;
  std::string host = target.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), target.substr(colon + 1).c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd >= 0) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const timeval wake{1, 0};  // a read waits at most 1 s: the loop then looks at the clock
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wake, sizeof wake);
  }
  return fd;
}

// One connection's share of the load: `in_flight` calls kept outstanding until `end`.
class driver {
 public:
  driver(const options& o, int in_flight, steady::time_point end, unsigned seed)
      : o_(o), in_flight_(in_flight), end_(end), rng_(seed), value_(0, o.values - 1) {
    t_.latencies_ns.reserve(1 << 20);
  }

  totals run() {
    fd_ = connect_to(o_.target);
    if (fd_ < 0) {
      std::fprintf(stderr, "rls_load: cannot connect to %s\n", o_.target.c_str());
      t_.failed = static_cast<std::uint64_t>(in_flight_);
      return std::move(t_);
    }
    nghttp2_session_callbacks* cb = nullptr;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_header_callback(cb, &driver::on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, &driver::on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, &driver::on_close);
    nghttp2_session_client_new(&session_, cb, this);
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, nullptr, 0);
    for (int i = 0; i < in_flight_; ++i) start_call();
    loop();
    t_.failed += calls_.size();  // still outstanding when the connection failed or went silent
    nghttp2_session_del(session_);
    close(fd_);
    return std::move(t_);
  }

 private:
  void start_call() {
    auto c = std::make_unique<call>();
    rls::RateLimitRequest request;
    request.set_domain(o_.domain);
    auto* e = request.add_descriptors()->add_entries();
    e->set_key(o_.key);
    e->set_value("user:" + std::to_string(value_(rng_)));
    c->request = frame(request);
    c->started = steady::now();
    const nghttp2_nv headers[] = {
        field(":method", "POST"),
        field(":scheme", "http"),
        field(":path", method_path),
        field(":authority", o_.target),
        field("content-type", "application/grpc"),
        field("te", "trailers"),
        field("grpc-timeout", "5S"),
    };
    nghttp2_data_provider body{};
    body.source.ptr = c.get();
    body.read_callback = &driver::read_body;
    const std::int32_t id = nghttp2_submit_request(session_, nullptr, headers, std::size(headers), &body, nullptr);
    if (id < 0) {
      ++t_.failed;
      return;
    }
    calls_.emplace(id, std::move(c));
  }

  static nghttp2_nv field(const char* name, std::string_view value) {
    return {reinterpret_cast<std::uint8_t*>(const_cast<char*>(name)),
            reinterpret_cast<std::uint8_t*>(const_cast<char*>(value.data())), std::strlen(name), value.size(),
            NGHTTP2_NV_FLAG_NONE};
  }

  // Writes what the session has to send, reads what came, until no call is left (or the grace
  // after the end is over, or the connection fails).
  void loop() {
    std::vector<std::uint8_t> in(64 << 10);
    std::string out;
    while (!calls_.empty() && steady::now() < end_ + grace) {
      // Every frame due, in one write: the session hands them out one at a time.
      out.clear();
      for (;;) {
        const std::uint8_t* data = nullptr;
        const ssize_t n = nghttp2_session_mem_send(session_, &data);
        if (n < 0) return;
        if (n == 0) break;
        out.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
      }
      for (std::size_t off = 0; off < out.size();) {
        const ssize_t w = send(fd_, out.data() + off, out.size() - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        off += static_cast<std::size_t>(w);
      }
      const ssize_t r = read(fd_, in.data(), in.size());
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (r <= 0) return;
      if (nghttp2_session_mem_recv(session_, in.data(), static_cast<std::size_t>(r)) < 0) return;
      for (; finished_ > 0; --finished_) {
        if (steady::now() < end_) start_call();
      }
    }
  }

  static ssize_t read_body(nghttp2_session*, std::int32_t, std::uint8_t* buf, std::size_t length, std::uint32_t* flags,
                           nghttp2_data_source* source, void*) {
    auto* c = static_cast<call*>(source->ptr);
    const std::size_t n = std::min(length, c->request.size() - c->sent);
    std::memcpy(buf, c->request.data() + c->sent, n);
    c->sent += n;
    if (c->sent == c->request.size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return static_cast<ssize_t>(n);
  }

  call* find(std::int32_t id) {
    auto it = calls_.find(id);
    return it == calls_.end() ? nullptr : it->second.get();
  }

  static int on_header(nghttp2_session*, const nghttp2_frame* f, const std::uint8_t* name, std::size_t namelen,
                       const std::uint8_t* value, std::size_t valuelen, std::uint8_t, void* user) {
    call* c = static_cast<driver*>(user)->find(f->hd.stream_id);
    if (c == nullptr) return 0;
    const std::string_view n(reinterpret_cast<const char*>(name), namelen);
    const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
    if (n == ":status") c->http_ok = v == "200";
    if (n == "grpc-status") c->grpc_status = std::atoi(std::string(v).c_str());
    return 0;
  }

  static int on_data(nghttp2_session*, std::uint8_t, std::int32_t id, const std::uint8_t* data, std::size_t len,
                     void* user) {
    if (call* c = static_cast<driver*>(user)->find(id)) c->response.append(reinterpret_cast<const char*>(data), len);
    return 0;
  }

  static int on_close(nghttp2_session*, std::int32_t id, std::uint32_t error_code, void* user) {
    auto* self = static_cast<driver*>(user);
    auto it = self->calls_.find(id);
    if (it == self->calls_.end()) return 0;
    const call& c = *it->second;
    rls::RateLimitResponse response;
    if (error_code != 0 || !c.http_ok || c.grpc_status != 0 || !parse_answer(c.response, response)) {
      ++self->t_.failed;
    } else {
      self->t_.latencies_ns.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now() - c.started).count());
      if (response.overall_code() == rls::RateLimitResponse::OVER_LIMIT) ++self->t_.over_limit;
    }
    self->calls_.erase(it);
    ++self->finished_;
    return 0;
  }

  const options& o_;
  const int in_flight_;
  const steady::time_point end_;
  std::mt19937 rng_;
  std::uniform_int_distribution<int> value_;
  totals t_;
  int fd_ = -1;
  nghttp2_session* session_ = nullptr;
  std::unordered_map<std::int32_t, std::unique_ptr<call>> calls_;
  int finished_ = 0;  // calls closed since the last read: as many new ones start
};

bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* v = argv[i + 1];
    if (flag == "--target") {
      o.target = v;
    } else if (flag == "--domain") {
      o.domain = v;
    } else if (flag == "--key") {
      o.key = v;
    } else if (flag == "--seconds") {
      o.seconds = std::atoi(v);
    } else if (flag == "--in-flight") {
      o.in_flight = std::atoi(v);
    } else if (flag == "--threads") {
      o.threads = std::atoi(v);
    } else if (flag == "--values") {
      o.values = std::atoi(v);
    } else {
      return false;
    }
  }
  return argc % 2 == 1 && o.seconds > 0 && o.seconds <= 600 && o.in_flight > 0 && o.threads > 0 &&
         o.threads <= o.in_flight && o.values > 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (!parse(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: rls_load [--target host:port] [--domain D] [--key K] [--seconds 1..600] [--in-flight N]"
                 " [--threads T] [--values V]\n");
    return 2;
  }
  const steady::time_point begin = steady::now();
  const steady::time_point end = begin + std::chrono::seconds(o.seconds);
  std::vector<totals> per(static_cast<std::size_t>(o.threads));
  std::vector<std::thread> threads;
  for (int i = 0; i < o.threads; ++i) {
    const int share = o.in_flight / o.threads + (i < o.in_flight % o.threads ? 1 : 0);
    threads.emplace_back([&, i, share] { per[static_cast<std::size_t>(i)] = driver(o, share, end, 17u + i).run(); });
  }
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(steady::now() - begin).count();
  totals all;
  for (auto& t : per) {
    all.latencies_ns.insert(all.latencies_ns.end(), t.latencies_ns.begin(), t.latencies_ns.end());
    all.over_limit += t.over_limit;
    all.failed += t.failed;
  }
  std::sort(all.latencies_ns.begin(), all.latencies_ns.end());
  auto pct = [&](double p) {
    if (all.latencies_ns.empty()) return 0.0;
    return all.latencies_ns[static_cast<std::size_t>(p * static_cast<double>(all.latencies_ns.size() - 1))] / 1e3;
  };
  std::printf("calls=%zu seconds=%.2f rps=%.0f p50_us=%.0f p99_us=%.0f over_limit=%llu failed=%llu\n",
              all.latencies_ns.size(), elapsed, static_cast<double>(all.latencies_ns.size()) / elapsed, pct(0.5),
              pct(0.99), static_cast<unsigned long long>(all.over_limit), static_cast<unsigned long long>(all.failed));
  return all.failed == 0 && !all.latencies_ns.empty() ? 0 : 1;
}
