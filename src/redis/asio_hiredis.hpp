// src/redis/asio_hiredis.hpp — drives a hiredis async context from a Boost.Asio strand.
//
// hiredis's event-library hooks (addRead/delRead/addWrite/delWrite/cleanup), implemented on a
// posix::stream_descriptor that borrows the context's socket (hiredis owns and closes it). Every
// hiredis call, these handlers included, runs on the given strand.
//
//   redisAsyncContext* ac = redisAsyncConnect("127.0.0.1", 6379);
//   sluice::detail::attach(ac, strand, after_read);   // then redisAsyncCommand... on the strand
//
// Not thread-safe: use the context only on its strand.
#pragma once

#include <hiredis/async.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <memory>

#include "redis/strand.hpp"

namespace sluice::detail {

/// Called on the strand after hiredis has read from the context's socket and run the callbacks of
/// the replies made whole; it may free the context.
using after_read_fn = void (*)(redisAsyncContext*);

class asio_hiredis_adapter : public std::enable_shared_from_this<asio_hiredis_adapter> {
 public:
  asio_hiredis_adapter(redisAsyncContext* ac, const strand_type& strand, after_read_fn after_read)
      : ac_(ac), strand_(strand), socket_(strand, ac->c.fd), after_read_(after_read) {}

  void add_read() {
    reading_ = true;
    arm(read_armed_, asio::posix::stream_descriptor::wait_read);
  }
  void del_read() { reading_ = false; }
  void add_write() {
    writing_ = true;
    arm(write_armed_, asio::posix::stream_descriptor::wait_write);
  }
  void del_write() { writing_ = false; }

  // The context is being freed: forget it, and give the socket back without closing it.
  void cleanup() {
    ac_ = nullptr;
    reading_ = writing_ = false;
    boost::system::error_code ignored;
    socket_.cancel(ignored);
    socket_.release();
  }

 private:
  void arm(bool& armed, asio::posix::stream_descriptor::wait_type type) {
    if (armed || ac_ == nullptr) return;
    armed = true;
    socket_.async_wait(type,
                       asio::bind_executor(strand_, [self = shared_from_this(), type](boost::system::error_code ec) {
                         self->on_ready(type, ec);
                       }));
  }

  void on_ready(asio::posix::stream_descriptor::wait_type type, boost::system::error_code ec) {
    const bool read = type == asio::posix::stream_descriptor::wait_read;
    (read ? read_armed_ : write_armed_) = false;
    if (ac_ == nullptr || ec == asio::error::operation_aborted) return;
    if (read ? !reading_ : !writing_) return;
    // Either call may free the context, which calls cleanup() and clears ac_.
    if (read) {
      redisAsyncHandleRead(ac_);
      if (ac_ != nullptr) after_read_(ac_);
    } else {
      redisAsyncHandleWrite(ac_);
    }
    if (ac_ == nullptr) return;
    if (read ? reading_ : writing_) arm(read ? read_armed_ : write_armed_, type);
  }

  redisAsyncContext* ac_;
  strand_type strand_;
  asio::posix::stream_descriptor socket_;
  after_read_fn after_read_;
  bool reading_ = false;
  bool writing_ = false;
  bool read_armed_ = false;
  bool write_armed_ = false;
};

/// Attaches `ac` to `strand`, calling `after_read` after each read. The adapter lives until hiredis
/// calls cleanup (or longer, while a wait it started is still queued).
inline void attach(redisAsyncContext* ac, const strand_type& strand, after_read_fn after_read) {
  auto* holder =
      new std::shared_ptr<asio_hiredis_adapter>(std::make_shared<asio_hiredis_adapter>(ac, strand, after_read));
  ac->ev.data = holder;
  ac->ev.addRead = [](void* p) { static_cast<std::shared_ptr<asio_hiredis_adapter>*>(p)->get()->add_read(); };
  ac->ev.delRead = [](void* p) { static_cast<std::shared_ptr<asio_hiredis_adapter>*>(p)->get()->del_read(); };
  ac->ev.addWrite = [](void* p) { static_cast<std::shared_ptr<asio_hiredis_adapter>*>(p)->get()->add_write(); };
  ac->ev.delWrite = [](void* p) { static_cast<std::shared_ptr<asio_hiredis_adapter>*>(p)->get()->del_write(); };
  ac->ev.cleanup = [](void* p) {
    auto* h = static_cast<std::shared_ptr<asio_hiredis_adapter>*>(p);
    (*h)->cleanup();
    delete h;
  };
}

}  // namespace sluice::detail
