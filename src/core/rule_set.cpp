#include "sluice/rule_set.hpp"

#include <algorithm>

namespace sluice {

result<std::shared_ptr<const rule_set>> rule_set::build(backend& b, const std::vector<rule>& rules, origin from,
                                                        const rule_set* previous) {
  std::shared_ptr<rule_set> set(new rule_set());
  set->rules_.reserve(rules.size());
  for (const rule& r : rules) {
    if (set->find(r.name) != nullptr) return error(errc::invalid_argument, "rule '" + r.name + "' is defined twice");
    const prepared_rule* before = previous ? previous->find(r.name) : nullptr;
    if (before != nullptr && before->definition() == r && before->owner() == &b) {
      // Unchanged: the same prepared form, so the same state.
      auto same = std::find_if(previous->rules_.begin(), previous->rules_.end(),
                               [&](const prepared_rule_ptr& p) { return p.get() == before; });
      set->rules_.push_back(*same);
      ++set->kept_;
      continue;
    }
    // Changed: limits alone carry the keys' state over (prepare_change), anything else starts afresh.
    auto made = before != nullptr && before->owner() == &b ? b.prepare_change(r, *before) : b.prepare(r);
    if (!made) return error(made.error().code, "rule '" + r.name + "': " + made.error().message);
    set->rules_.push_back(std::move(*made));
  }
  set->from_ = std::move(from);
  set->version_ = previous ? previous->version_ + 1 : 1;
  return std::shared_ptr<const rule_set>(std::move(set));
}

const prepared_rule* rule_set::find(std::string_view name) const noexcept {
  for (const auto& p : rules_) {
    if (p->definition().name == name) return p.get();
  }
  return nullptr;
}

}  // namespace sluice
