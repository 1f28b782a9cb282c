// SPDX-License-Identifier: Apache-2.0
#include "sluice/rule_set.hpp"

namespace sluice {

result<std::shared_ptr<const rule_set>> rule_set::build(backend& b, const std::vector<rule>& rules, origin from,
                                                        const rule_set* previous) {
  std::shared_ptr<rule_set> set(new rule_set());
  set->rules_.reserve(rules.size());
  for (const rule& r : rules) {
    if (set->find(r.name) != nullptr) return error(errc::invalid_argument, "rule '" + r.name + "' is defined twice");
    const prepared_rule_ptr* before = previous ? previous->entry(r.name) : nullptr;
    if (before != nullptr && (*before)->definition() == r && (*before)->owner() == &b) {
      // Unchanged: the same prepared form, so the same state.
      set->add(*before);
      ++set->kept_;
      continue;
    }
    // Changed: limits alone carry the keys' state over (prepare_change), anything else starts afresh.
    auto made = before != nullptr && (*before)->owner() == &b ? b.prepare_change(r, **before) : b.prepare(r);
    if (!made) return error(made.error().code, "rule '" + r.name + "': " + made.error().message);
    set->add(std::move(*made));
  }
  set->from_ = std::move(from);
  set->version_ = previous ? previous->version_ + 1 : 1;
  return std::shared_ptr<const rule_set>(std::move(set));
}

void rule_set::add(prepared_rule_ptr p) {
  by_name_.emplace(p->definition().name, rules_.size());  // a view of the prepared rule's own name
  rules_.push_back(std::move(p));
}

const prepared_rule_ptr* rule_set::entry(std::string_view name) const noexcept {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &rules_[it->second];
}

std::size_t rule_set::position(std::string_view name) const noexcept {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? npos : it->second;
}

const prepared_rule* rule_set::find(std::string_view name) const noexcept {
  const prepared_rule_ptr* p = entry(name);
  return p ? p->get() : nullptr;
}

}  // namespace sluice
