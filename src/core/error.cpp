#include "sluice/error.hpp"

namespace sluice {
namespace {

class category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "sluice"; }
  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::invalid_argument: return "invalid argument";
      case errc::cost_exceeds_burst: return "cost exceeds the limiter's capacity";
      case errc::key_too_long: return "key too long";
      case errc::capacity_exhausted: return "key capacity exhausted";
      case errc::deadline_exceeded: return "deadline exceeded";
      case errc::cancelled: return "cancelled";
      case errc::unknown_rule: return "unknown rule";
      case errc::backend_unavailable: return "backend unavailable";
      case errc::backend_timeout: return "backend timeout";
      case errc::backend_protocol: return "backend protocol error";
      case errc::backend_overloaded: return "backend overloaded";
      case errc::config_invalid: return "invalid configuration";
    }
    return "unknown sluice error";
  }
};

}  // namespace

const std::error_category& error_category() noexcept {
  static const category instance;
  return instance;
}

}  // namespace sluice
