// SPDX-License-Identifier: Apache-2.0
#include "etcd/session.hpp"

#include <chrono>
#include <vector>

#include "etcd/channel.hpp"

namespace sluice::etcd::detail {
namespace {

// Keys a full read asks for per Range call. A page that exceeds max_message_bytes (large
// values) is asked for again with half as many keys.
constexpr std::int64_t first_page_keys = 512;

// Pages one full read may take: max_keys keys in pages of 16 (a page shrinks only for values of
// megabytes), and as many pages again for keys beyond the bounds. Past it the read fails and is
// tried again after the backoff: an etcd or proxy answering `more` forever cannot keep it going.
std::size_t max_pages(const etcd_options& o) { return 64 + o.max_keys / 8; }

const char* code_name(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "status";
  }
}

change to_change(const mvccpb::KeyValue& kv, change::type kind) {
  return {.kind = kind,
          .key = kv.key(),
          .value = kv.value(),
          .create_revision = kv.create_revision(),
          .mod_revision = kv.mod_revision()};
}

}  // namespace

session::session(const etcd_options& options, std::shared_ptr<grpc::ChannelCredentials> credentials,
                 std::string endpoint, stopper& stop, publisher& pub, reread_pacing& rereads)
    : options_(options),
      range_(prefix_range(options.prefix)),
      credentials_(std::move(credentials)),
      endpoint_(std::move(endpoint)),
      stop_(stop),
      pub_(pub),
      rereads_(rereads) {}

session_end session::run(bool must_read) {
  must_read_ = must_read;
  auto ended = [&](std::string why) {
    return session_end{.error = std::move(why), .worked = worked_, .must_read = must_read_};
  };
  channel_ = make_channel(endpoint_, credentials_);
  if (auto up = wait_connected(channel_, endpoint_, options_.dial_timeout, stop_); !up)
    return ended(up.error().message);
  kv_ = etcdserverpb::KV::NewStub(channel_);
  watch_ = etcdserverpb::Watch::NewStub(channel_);
  auth_ = etcdserverpb::Auth::NewStub(channel_);
  if (!options_.username.empty()) {
    if (auto a = authenticate(); !a) return ended(a.error().message);
  }
  for (;;) {
    std::optional<prefix_state> fresh;
    if (must_read_) {
      if (!stop_.sleep_for(rereads_.wait_before(reread_pacing::clock::now()))) return ended("stopping");
      auto r = read_prefix();
      rereads_.read_ended(reread_pacing::clock::now());
      if (!r) return ended(r.error().message);
      fresh = std::move(*r);
    }
    watch_end end = watch(std::move(fresh));
    switch (end.then) {
      case watch_end::next::resume: return ended(std::move(end.error));
      case watch_end::next::read_now:  // the revisions the watch needs are gone
        must_read_ = true;
        continue;
      case watch_end::next::read_later:
        // After the backoff: a watch that is refused at once (permission) must not spin.
        must_read_ = true;
        return ended(std::move(end.error));
    }
  }
}

result<void> session::authenticate() {
  etcdserverpb::AuthenticateRequest req;
  req.set_name(options_.username);
  req.set_password(options_.password);
  etcdserverpb::AuthenticateResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + options_.request_timeout);
  stopper::call call(stop_, ctx);
  if (!call) return error(errc::cancelled, "stopping");
  grpc::Status s = auth_->Authenticate(&ctx, req, &resp);
  if (!s.ok()) return error(errc::backend_unavailable, failure("authenticate", s));
  token_ = resp.token();
  return {};
}

result<prefix_state> session::read_prefix() {
  prefix_state fresh = pub_.fresh_state();
  etcdserverpb::RangeRequest req;
  req.set_key(range_.key);
  req.set_range_end(range_.range_end);
  req.set_limit(first_page_keys);
  std::int64_t revision = 0;  // of the first page; every later page is read at the same one
  for (std::size_t pages = 0;; ++pages) {
    if (pages == max_pages(options_)) {
      return error(errc::backend_unavailable, "range on " + endpoint_ + " failed: the prefix takes more than " +
                                                  std::to_string(max_pages(options_)) + " pages to read");
    }
    etcdserverpb::RangeResponse resp;
    grpc::Status s = unary([&](grpc::ClientContext& ctx) { return kv_->Range(&ctx, req, &resp); });
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && req.limit() > 1) {
      req.set_limit(req.limit() / 2);
      continue;
    }
    if (!s.ok()) return error(errc::backend_unavailable, failure("range", s));
    if (revision == 0) {
      revision = resp.header().revision();
      req.set_revision(revision);
    }
    for (const auto& kv : resp.kvs()) fresh.load(to_change(kv, change::type::put));
    if (!resp.more() || resp.kvs().empty()) break;
    req.set_key(resp.kvs(resp.kvs_size() - 1).key() + '\0');  // the next key after the page's last
  }
  fresh.set_revision(revision);
  return fresh;
}

session::watch_end session::watch(std::optional<prefix_state> fresh) {
  const std::int64_t start = (fresh ? fresh->revision() : pub_.revision()) + 1;
  grpc::ClientContext ctx;
  add_token(ctx);
  stopper::call call(stop_, ctx);
  if (!call) return {.error = "stopping"};
  auto stream = watch_->Watch(&ctx);

  etcdserverpb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key(range_.key);
  create->set_range_end(range_.range_end);
  create->set_start_revision(start);
  create->set_progress_notify(true);
  etcdserverpb::WatchResponse resp;
  std::vector<change> events;
  if (stream->Write(req)) {
    while (stream->Read(&resp)) {
      if (resp.compact_revision() != 0) {
        ctx.TryCancel();
        stream->Finish();
        return {.error = "watch from revision " + std::to_string(start) + " compacted at " +
                         std::to_string(resp.compact_revision()),
                .then = watch_end::next::read_now};
      }
      if (resp.canceled()) {
        ctx.TryCancel();
        stream->Finish();
        return {.error = "watch canceled by " + endpoint_ + ": " + resp.cancel_reason(),
                .then = watch_end::next::read_later};
      }
      if (resp.created()) {  // the watch is up: the read (if any) becomes the snapshot
        worked_ = true;
        must_read_ = false;
        pub_.watching(endpoint_, std::move(fresh));
        fresh.reset();
        continue;
      }
      if (resp.events().empty()) {  // a progress notification
        pub_.progress(resp.header().revision());
        continue;
      }
      events.clear();
      for (const auto& e : resp.events()) {
        events.push_back(
            to_change(e.kv(), e.type() == mvccpb::Event::DELETE ? change::type::erase : change::type::put));
      }
      pub_.changes(events);
    }
  }
  grpc::Status s = stream->Finish();
  if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    // One response over max_message_bytes: it would come again at the same revision, so read the
    // prefix instead (pages adapt), and watch from after it.
    return {.error = failure("watch", s), .then = watch_end::next::read_now};
  }
  return {.error = failure("watch", s)};
}

grpc::Status session::unary(const std::function<grpc::Status(grpc::ClientContext&)>& call) {
  auto once = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + options_.request_timeout);
    add_token(ctx);
    stopper::call registered(stop_, ctx);
    if (!registered) return grpc::Status(grpc::StatusCode::CANCELLED, "stopping");
    return call(ctx);
  };
  grpc::Status s = once();
  // A token etcd no longer knows (it restarted, or the token expired): a new one, once.
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED && !options_.username.empty() && authenticate().ok()) {
    s = once();
  }
  return s;
}

void session::add_token(grpc::ClientContext& ctx) const {
  if (!token_.empty()) ctx.AddMetadata("token", token_);
}

std::string session::failure(const char* what, const grpc::Status& s) const {
  return std::string(what) + " on " + endpoint_ + " failed: " + code_name(s.error_code()) +
         (s.error_message().empty() ? "" : ": " + s.error_message());
}

}  // namespace sluice::etcd::detail
