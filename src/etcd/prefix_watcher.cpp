// SPDX-License-Identifier: Apache-2.0
#include "sluice/etcd/prefix_watcher.hpp"

#include <thread>

#include "etcd/backoff.hpp"
#include "etcd/channel.hpp"
#include "etcd/publisher.hpp"
#include "etcd/session.hpp"
#include "etcd/stopper.hpp"

namespace sluice::etcd {

struct prefix_watcher::impl {
  impl(etcd_options o, std::shared_ptr<grpc::ChannelCredentials> c, callback on_update)
      : options(std::move(o)),
        credentials(std::move(c)),
        pub(options.prefix,
            {.max_keys = options.max_keys,
             .max_value_bytes = options.max_value_bytes,
             .max_key_bytes = options.max_key_bytes},
            std::move(on_update)),
        delays(options.backoff_base, options.backoff_cap),
        rereads(delays, options.backoff_cap) {}

  // Sessions one after the other, each on the next endpoint, a backoff between them.
  void run() {
    unsigned failures = 0;  // sessions in a row that established no watch
    bool must_read = true;
    for (std::size_t next = 0; !stop.stopping(); next = (next + 1) % options.endpoints.size()) {
      const std::string& endpoint = options.endpoints[next];
      detail::session_end end = detail::session(options, credentials, endpoint, stop, pub, rereads).run(must_read);
      if (stop.stopping()) return;
      must_read = end.must_read;
      failures = end.worked ? 0 : failures + 1;
      pub.disconnected(endpoint, end.error);
      if (!stop.sleep_for(delays.delay(failures))) return;
    }
  }

  const etcd_options options;
  const std::shared_ptr<grpc::ChannelCredentials> credentials;
  detail::stopper stop;
  detail::publisher pub;
  detail::backoff delays;
  detail::reread_pacing rereads;  // full reads closer together than backoff_cap back off
  std::thread thread;
};

result<std::unique_ptr<prefix_watcher>> prefix_watcher::create(etcd_options options, callback on_update) {
  if (auto ok = validate(options); !ok) return ok.error();
  auto credentials = detail::make_credentials(options);
  if (!credentials) return credentials.error();
  auto i = std::make_unique<impl>(std::move(options), std::move(*credentials), std::move(on_update));
  i->thread = std::thread([p = i.get()] { p->run(); });
  return std::unique_ptr<prefix_watcher>(new prefix_watcher(std::move(i)));
}

prefix_watcher::prefix_watcher(std::unique_ptr<impl> impl) : impl_(std::move(impl)) {}

prefix_watcher::~prefix_watcher() {
  impl_->stop.stop();
  impl_->thread.join();
}

watch_status prefix_watcher::status() const { return impl_->pub.status(); }

snapshot prefix_watcher::entries() const { return impl_->pub.entries(); }

std::pair<snapshot, watch_status> prefix_watcher::current() const { return impl_->pub.current(); }

}  // namespace sluice::etcd
