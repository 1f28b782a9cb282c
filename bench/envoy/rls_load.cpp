// rls_load — an asynchronous gRPC load client of envoy.service.ratelimit.v3 ShouldRateLimit.
//
// Keeps --in-flight calls outstanding (split over --threads, each with its own channel and
// completion queue) for --seconds, each asking about one descriptor [(--key, "user:N")] with N
// uniform over --values, and prints one line: calls per second, latency percentiles, how many
// were over the limit, and how many failed. Stops by itself.
//
//   rls_load --target 127.0.0.1:8081 --domain bench --seconds 10 --in-flight 64 --values 100000
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"

namespace {

namespace rls = ::envoy::service::ratelimit::v3;
using steady = std::chrono::steady_clock;

struct options {
  std::string target = "127.0.0.1:8081";
  std::string domain = "bench";
  std::string key = "user";
  int seconds = 10;
  int in_flight = 64;
  int threads = 2;
  int values = 100'000;
};

struct call {
  grpc::ClientContext context;
  rls::RateLimitRequest request;
  rls::RateLimitResponse response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<rls::RateLimitResponse>> reader;
  steady::time_point started;
};

struct totals {
  std::vector<std::int64_t> latencies_ns;
  std::uint64_t over_limit = 0;
  std::uint64_t failed = 0;
};

// One thread's share of the load: `in_flight` calls kept outstanding until `end`.
totals drive(const options& o, int in_flight, steady::time_point end, unsigned seed) {
  grpc::ChannelArguments args;
  args.SetInt("grpc.use_local_subchannel_pool", 1);  // a connection of its own per thread
  auto channel = grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), args);
  auto stub = rls::RateLimitService::NewStub(channel);
  grpc::CompletionQueue cq;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> value(0, o.values - 1);
  totals t;
  t.latencies_ns.reserve(1 << 20);
  auto start_call = [&] {
    auto* c = new call;
    c->request.set_domain(o.domain);
    auto* e = c->request.add_descriptors()->add_entries();
    e->set_key(o.key);
    e->set_value("user:" + std::to_string(value(rng)));
    c->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    c->started = steady::now();
    c->reader = stub->PrepareAsyncShouldRateLimit(&c->context, c->request, &cq);
    c->reader->StartCall();
    c->reader->Finish(&c->response, &c->status, c);
  };
  for (int i = 0; i < in_flight; ++i) start_call();
  int outstanding = in_flight;
  void* tag = nullptr;
  bool ok = false;
  while (outstanding > 0 && cq.Next(&tag, &ok)) {
    std::unique_ptr<call> c(static_cast<call*>(tag));
    --outstanding;
    const steady::time_point now = steady::now();
    if (!ok || !c->status.ok()) {
      ++t.failed;
    } else {
      t.latencies_ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(now - c->started).count());
      if (c->response.overall_code() == rls::RateLimitResponse::OVER_LIMIT) ++t.over_limit;
    }
    if (now < end) {
      start_call();
      ++outstanding;
    }
  }
  return t;
}

bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* v = argv[i + 1];
    if (flag == "--target") {
      o.target = v;
    } else if (flag == "--domain") {
      o.domain = v;
    } else if (flag == "--key") {
      o.key = v;
    } else if (flag == "--seconds") {
      o.seconds = std::atoi(v);
    } else if (flag == "--in-flight") {
      o.in_flight = std::atoi(v);
    } else if (flag == "--threads") {
      o.threads = std::atoi(v);
    } else if (flag == "--values") {
      o.values = std::atoi(v);
    } else {
      return false;
    }
  }
  return argc % 2 == 1 && o.seconds > 0 && o.seconds <= 600 && o.in_flight > 0 && o.threads > 0 &&
         o.threads <= o.in_flight && o.values > 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (!parse(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: rls_load [--target host:port] [--domain D] [--key K] [--seconds 1..600] [--in-flight N]"
                 " [--threads T] [--values V]\n");
    return 2;
  }
  const steady::time_point begin = steady::now();
  const steady::time_point end = begin + std::chrono::seconds(o.seconds);
  std::vector<totals> per(static_cast<std::size_t>(o.threads));
  std::vector<std::thread> threads;
  for (int i = 0; i < o.threads; ++i) {
    const int share = o.in_flight / o.threads + (i < o.in_flight % o.threads ? 1 : 0);
    threads.emplace_back([&, i, share] { per[static_cast<std::size_t>(i)] = drive(o, share, end, 17u + i); });
  }
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(steady::now() - begin).count();
  totals all;
  for (auto& t : per) {
    all.latencies_ns.insert(all.latencies_ns.end(), t.latencies_ns.begin(), t.latencies_ns.end());
    all.over_limit += t.over_limit;
    all.failed += t.failed;
  }
  std::sort(all.latencies_ns.begin(), all.latencies_ns.end());
  auto pct = [&](double p) {
    if (all.latencies_ns.empty()) return 0.0;
    return all.latencies_ns[static_cast<std::size_t>(p * static_cast<double>(all.latencies_ns.size() - 1))] / 1e3;
  };
  std::printf("calls=%zu seconds=%.2f rps=%.0f p50_us=%.0f p99_us=%.0f over_limit=%llu failed=%llu\n",
              all.latencies_ns.size(), elapsed, static_cast<double>(all.latencies_ns.size()) / elapsed, pct(0.5),
              pct(0.99), static_cast<unsigned long long>(all.over_limit), static_cast<unsigned long long>(all.failed));
  return all.failed == 0 ? 0 : 1;
}
