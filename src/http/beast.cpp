// SPDX-License-Identifier: Apache-2.0
// The Beast adapter. Every Asio/Beast template the middleware needs is instantiated here, once.
#include "sluice/http/beast.hpp"

#include <algorithm>
#include <array>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <mutex>
#include <string>

namespace sluice::http::beast {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;

namespace {

// All lines of a header field joined by ", " (a view when there is one line, the common case). A
// scan of the request's few fields, comparing lengths first, costs less than Beast's lookup by name,
// whose case-insensitive comparisons run at every level of its tree.
std::string_view joined(const request& req, std::string_view name, std::string& storage) {
  const boost::beast::string_view wanted(name.data(), name.size());
  std::string_view first;
  bool found = false;
  for (const auto& f : req) {
    const boost::beast::string_view n = f.name_string();
    if (n.size() != wanted.size() || !boost::beast::iequals(n, wanted)) continue;
    const std::string_view value(f.value().data(), f.value().size());
    if (!found) {
      first = value;
      found = true;
      continue;
    }
    if (storage.empty()) storage.assign(first);
    storage += ", ";
    storage += value;
  }
  return storage.empty() ? first : std::string_view(storage);
}

// Where a completion and the awaiting coroutine meet: whichever comes second hands over.
struct rendezvous {
  std::mutex m;
  std::optional<outcome> result;
  std::function<void(outcome)> resume;
};

}  // namespace

namespace {

boost::beast::string_view beast_view(std::string_view s) { return {s.data(), s.size()}; }

// Adds the fields as one element of Beast's container, preformatted: the first field's value
// followed by "\r\nName: value" for each other one. Beast writes an element as "name: value\r\n",
// so the response carries the same lines; each element costs an allocation, a tree insert and
// several steps of the serializer, most of what the middleware added to a small response. The
// values come from numbers and configured names: they hold no CR or LF of their own.
void insert_fields(response& res, const header_fields& fields) {
  if (fields.empty()) return;
  std::size_t size = 0;
  for (const auto& h : fields) size += h.name.size() + h.value.size() + 4;
  std::array<char, 512> small;  // every field this middleware writes fits: no allocation
  std::string large;
  char* out = small.data();
  if (size > small.size()) {
    large.resize(size);
    out = large.data();
  }
  char* at = out;
  auto put = [&at](std::string_view s) { at = std::copy(s.begin(), s.end(), at); };
  put(fields.front().value);
  for (std::size_t i = 1; i < fields.size(); ++i) {
    put("\r\n");
    put(fields[i].name);
    put(": ");
    put(fields[i].value);
  }
  const std::string_view first = fields.front().name;
  const bhttp::field f = first == "Retry-After" ? bhttp::field::retry_after : bhttp::field::unknown;
  res.insert(f, beast_view(first), boost::beast::string_view(out, static_cast<std::size_t>(at - out)));
}

// The operation that waits for a rendezvous' outcome. A plain function on purpose: GCC 12
// destroys a lambda written inside a co_await expression twice (its captured shared_ptr too).
struct wait_initiation {
  std::shared_ptr<rendezvous> meet;

  template <class Handler>
  void operator()(Handler handler) const {
    auto executor = asio::get_associated_executor(handler);
    auto h = std::make_shared<Handler>(std::move(handler));
    auto resume = [h, executor](outcome r) {
      asio::post(executor, [h, r = std::move(r)]() mutable { (*h)(std::move(r)); });
    };
    std::unique_lock lock(meet->m);
    if (meet->result) {
      outcome ready = std::move(*meet->result);
      lock.unlock();
      resume(std::move(ready));
      return;
    }
    meet->resume = std::move(resume);
  }
};

asio::awaitable<outcome> wait_for(std::shared_ptr<rendezvous> meet) {
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(outcome)>(wait_initiation{std::move(meet)},
                                                                             asio::use_awaitable);
}

}  // namespace

response verdict::refusal(const request& req) const {
  response res{bhttp::status::too_many_requests, req.version()};
  res.set(bhttp::field::content_type, "application/json");
  insert_fields(res, outcome_.headers);
  res.keep_alive(req.keep_alive());
  res.body() = outcome_.body;
  res.prepare_payload();
  return res;
}

void verdict::apply(response& res) const {
  if (outcome_.headers.empty()) return;
  // Replace, not duplicate, fields the handler may have set itself (rare: test the first one).
  if (res.find(beast_view(outcome_.headers.front().name)) != res.end()) {
    for (const auto& h : outcome_.headers) res.erase(beast_view(h.name));
  }
  insert_fields(res, outcome_.headers);
}

limiter::limiter(std::shared_ptr<middleware> mw, identify_function identify)
    : mw_(std::move(mw)), identify_(std::move(identify)) {}

std::optional<pending_check> limiter::prepare(const request& req, const asio::ip::address& peer) const {
  std::string_view method(req.method_string().data(), req.method_string().size());
  std::string_view target(req.target().data(), req.target().size());
  const route_limit* route = mw_->find(method, target);
  if (!route) return std::nullopt;

  std::optional<identity> who;
  if (mw_->needs_identity(*route) && identify_) who = identify_(req);

  // The peer as bytes: no text round trip on every request.
  ip_address peer_ip;
  if (peer.is_v4()) {
    auto v4 = peer.to_v4().to_bytes();
    peer_ip.bytes[10] = peer_ip.bytes[11] = 0xff;
    std::copy(v4.begin(), v4.end(), peer_ip.bytes.begin() + 12);
  } else {
    auto v6 = peer.to_v6().to_bytes();
    std::copy(v6.begin(), v6.end(), peer_ip.bytes.begin());
  }
  // Only the configured forwarding header is looked up (and only when the peer is a trusted proxy
  // does the middleware read it).
  std::string storage;
  address_sources from{.peer_ip = peer_ip};
  if (!mw_->is_trusted_proxy(peer_ip)) {
    // Not from a trusted proxy: the headers would be ignored anyway.
  } else if (mw_->options().client_ip_header == forwarding_header::forwarded) {
    from.forwarded = joined(req, "Forwarded", storage);
  } else {
    from.x_forwarded_for = joined(req, "X-Forwarded-For", storage);
  }
  return mw_->prepare(*route, from, who ? &*who : nullptr);
}

asio::awaitable<verdict> limiter::check(const request& req, const asio::ip::address& peer) const {
  std::optional<pending_check> pending = prepare(req, peer);
  if (!pending) co_return verdict{};
  if (mw_->completes_inline()) co_return verdict(mw_->check(*pending));  // nothing to wait for

  auto meet = std::make_shared<rendezvous>();
  mw_->check_async(std::move(*pending), [meet](outcome o) {
    std::unique_lock lock(meet->m);
    if (!meet->resume) {
      meet->result = std::move(o);  // completed before the coroutine suspended (e.g. inline)
      return;
    }
    auto resume = std::move(meet->resume);
    lock.unlock();
    resume(std::move(o));
  });

  {
    std::lock_guard lock(meet->m);
    if (meet->result) co_return verdict(std::move(*meet->result));  // the in-process backend's path
  }

  // Completes on another thread: suspend, and resume through the coroutine's own executor.
  outcome o = co_await wait_for(meet);
  co_return verdict(std::move(o));
}

namespace {

// The 429, or the handler's response with the rate-limit fields added.
response respond(const verdict& v, const request& req, const handler_function& handler) {
  if (!v.admitted()) return v.refusal(req);
  response res = handler(req);
  v.apply(res);
  return res;
}

}  // namespace

verdict limiter::decide_inline(const request& req, const asio::ip::address& peer) const {
  const std::optional<pending_check> pending = prepare(req, peer);
  return pending ? verdict(mw_->check(*pending)) : verdict{};
}

asio::awaitable<response> limiter::serve(const request& req, const asio::ip::address& peer,
                                         const handler_function& handler) const {
  // In-process backend: decide here, without a nested coroutine (a measurable share per request).
  // (Not `c ? x : co_await y`: GCC 12 miscompiles that expression; it crashed in free() here.)
  if (mw_->completes_inline()) co_return respond(decide_inline(req, peer), req, handler);
  const verdict v = co_await check(req, peer);
  co_return respond(v, req, handler);
}

void limiter::async_check(const request& req, const asio::ip::address& peer, asio::any_io_executor executor,
                          std::function<void(verdict)> done) const {
  std::optional<pending_check> pending = prepare(req, peer);
  if (!pending) {
    asio::post(executor, [done = std::move(done)]() { done(verdict{}); });
    return;
  }
  mw_->check_async(std::move(*pending), [executor, done = std::move(done)](outcome o) {
    asio::post(executor, [done, o = std::move(o)]() mutable { done(verdict(std::move(o))); });
  });
}

}  // namespace sluice::http::beast
