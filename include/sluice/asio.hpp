// SPDX-License-Identifier: Apache-2.0
// sluice/asio.hpp — checks in Boost.Asio's completion-token style, for every backend.
//
// `sluice::async_check(backend, request, token)` starts `backend.async_check` and completes with
// `void(sluice::result<sluice::decision>)` through any completion token: a callback,
// `boost::asio::use_future`, `boost::asio::use_awaitable`, ... The handler runs on its associated
// executor (never inside async_check itself), and outstanding work is kept on that executor.
//
//   // callback
//   sluice::async_check(*backend, req, [](sluice::result<sluice::decision> d) { ... });
//   // future
//   std::future<sluice::result<sluice::decision>> f = sluice::async_check(*backend, req, boost::asio::use_future);
//   // coroutine
//   sluice::result<sluice::decision> d = co_await sluice::async_check(*backend, req, boost::asio::use_awaitable);
//
// The request's views (rule, key, tenant, user) must stay valid until the handler runs.
// Thread-safe as the backend is.
#pragma once

#include <atomic>
#include <boost/asio/async_result.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <memory>
#include <utility>

#include "sluice/backend.hpp"

namespace sluice {

namespace detail {

// Holds a (possibly move-only) handler and keeps its executor busy until the check completes.
template <class Handler>
struct pending_check {
  using executor_type = boost::asio::associated_executor_t<Handler>;

  explicit pending_check(Handler&& h)
      : handler(std::move(h)), work(boost::asio::make_work_guard(boost::asio::get_associated_executor(handler))) {}

  Handler handler;
  boost::asio::executor_work_guard<executor_type> work;
};

}  // namespace detail

template <class CompletionToken>
auto async_check(backend& b, const check_request& request, CompletionToken&& token) {
  return boost::asio::async_initiate<CompletionToken, void(result<decision>)>(
      [](auto handler, backend* be, check_request req) {
        using handler_type = decltype(handler);
        auto state = std::make_shared<detail::pending_check<handler_type>>(std::move(handler));
        // A backend may complete inline (the memory backend does): Asio's rule is that a handler
        // never runs inside the initiating call, so an inline completion is posted.
        auto initiating = std::make_shared<std::atomic<bool>>(true);
        be->async_check(req, [state, initiating](result<decision> d) {
          auto ex = state->work.get_executor();
          auto run = [state, d = std::move(d)]() mutable {
            auto h = std::move(state->handler);
            state->work.reset();
            std::move(h)(std::move(d));
          };
          if (*initiating) {
            boost::asio::post(ex, std::move(run));
          } else {
            boost::asio::dispatch(ex, std::move(run));
          }
        });
        *initiating = false;
      },
      token, &b, request);
}

}  // namespace sluice
