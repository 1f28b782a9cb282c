// SPDX-License-Identifier: Apache-2.0
#include "sluice/limiter_state.hpp"

namespace sluice {

compiled_policy compiled_policy::from(const policy& p) noexcept {
  compiled_policy c;
  c.algorithm = p.algorithm;
  if (p.algorithm == algorithm::token_bucket) {
    c.gcra = make_gcra_params(p.rate, p.burst);
  } else {
    c.window = {.limit = p.limit, .window_ns = p.window.count(), .calendar = p.calendar};
  }
  return c;
}

limiter_state limiter_state::make(const compiled_policy& p) noexcept {
  limiter_state s;
  switch (p.algorithm) {
    case algorithm::token_bucket: s.state_.emplace<gcra_state>(); break;
    case algorithm::sliding_window_log: s.state_.emplace<sliding_window_log_state>(); break;
    case algorithm::sliding_window_counter: s.state_.emplace<sliding_window_counter_state>(); break;
    case algorithm::fixed_window: s.state_.emplace<fixed_window_state>(); break;
  }
  return s;
}

namespace {

template <class State>
const auto& params_of(const compiled_policy& p) {
  if constexpr (std::is_same_v<State, gcra_state>) {
    return p.gcra;
  } else {
    return p.window;
  }
}

}  // namespace

void limiter_state::retune(const compiled_policy& from, const compiled_policy& to, std::int64_t now) noexcept {
  if (auto* bucket = std::get_if<gcra_state>(&state_)) bucket->retune(from.gcra, to.gcra, now);
  // Windows: the counts stay; the new limit applies to them from now on.
}

decision limiter_state::evaluate(const compiled_policy& p, std::int64_t now, std::int64_t cost) {
  return std::visit([&](auto& s) { return s.evaluate(params_of<std::decay_t<decltype(s)>>(p), now, cost); }, state_);
}

void limiter_state::commit(const compiled_policy& p, std::int64_t now, std::int64_t cost) {
  std::visit([&](auto& s) { s.commit(params_of<std::decay_t<decltype(s)>>(p), now, cost); }, state_);
}

std::int64_t limiter_state::idle_at(const compiled_policy& p) const noexcept {
  return std::visit([&](const auto& s) { return s.idle_at(params_of<std::decay_t<decltype(s)>>(p)); }, state_);
}

}  // namespace sluice
