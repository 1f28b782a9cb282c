// SPDX-License-Identifier: Apache-2.0
// tests/support/log_capture.hpp — what is logged while it lives, in place of the default logger,
// for a test that asserts what an operator reads.
//
//   log_capture log;
//   ...                                   // code that logs, on any thread
//   EXPECT_NE(log.text().find("event=redis_circuit_open"), std::string::npos);
#pragma once

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <mutex>
#include <string>

namespace sluice::testing {

class log_capture {
 public:
  log_capture() : previous_(spdlog::default_logger()) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink_));
  }
  ~log_capture() { spdlog::set_default_logger(previous_); }
  log_capture(const log_capture&) = delete;
  log_capture& operator=(const log_capture&) = delete;

  /// Everything logged so far.
  std::string text() const { return sink_->text(); }

 private:
  // The lines, read under the sink's own lock: loggers write from the backend's threads.
  class sink : public spdlog::sinks::base_sink<std::mutex> {
   public:
    std::string text() {
      std::lock_guard lock(mutex_);
      return lines_;
    }

   protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
      spdlog::memory_buf_t line;
      formatter_->format(msg, line);
      lines_.append(line.data(), line.size());
    }
    void flush_() override {}

   private:
    std::string lines_;
  };

  std::shared_ptr<sink> sink_ = std::make_shared<sink>();
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace sluice::testing
