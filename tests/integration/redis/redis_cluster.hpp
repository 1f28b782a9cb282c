// SPDX-License-Identifier: Apache-2.0
// tests/integration/redis/redis_cluster.hpp — a real Redis Cluster for tests: 3 masters and 3
// replicas of Debian's redis-server on 127.0.0.1.
//
// Each node is a redis_server (redis_server.hpp) started in cluster mode on a free port whose bus
// port (port + 10000) is free too, with cluster-node-timeout 1000 ms and
// cluster-replica-validity-factor 0 (a replica may always take over). `redis-cli --cluster create`
// joins them; the fixture then waits until every node reports cluster_state:ok and every replica's
// master_link_status:up (a replica that has not finished its first sync refuses to fail over).
// Every process it started is ended by its PID at the end. Given certificates (cluster_tls), each
// node also serves TLS on a port of its own, the cluster bus and replication run over TLS, and the
// cluster announces the TLS ports (CLUSTER SHARDS' tls-port): tls_seeds() are those.
//
//   sluice::testing::redis_cluster cluster;
//   auto b = sluice::make_redis_cluster_backend({.addresses = cluster.seeds()});
//   redis_server& m = cluster.master_of(slot);   // the node serving a slot now
//
// Not thread-safe.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "integration/free_port.hpp"
#include "integration/redis/redis_server.hpp"
#include "integration/run_command.hpp"

namespace sluice::testing {

/// A cluster over TLS: the nodes' certificate and key, and the CA that signed it.
struct cluster_tls {
  std::string cert_file, key_file, ca_file;
};

class redis_cluster {
 public:
  static constexpr int node_timeout_ms = 1000;

  /// `extra` is added to every node's command line, e.g. {"--cluster-require-full-coverage", "no"}.
  explicit redis_cluster(std::vector<std::string> extra = {}, int masters = 3, int replicas_per_master = 1,
                         const cluster_tls* tls = nullptr) {
    const int count = masters * (1 + replicas_per_master);
    std::vector<std::string> args = {"--cluster-enabled",
                                     "yes",
                                     "--cluster-config-file",
                                     "nodes.conf",
                                     "--cluster-node-timeout",
                                     std::to_string(node_timeout_ms),
                                     "--cluster-replica-validity-factor",
                                     "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto bus_free = [](int port) { return port + 10000 <= 65535 && port_free(port + 10000); };
    for (int i = 0; i < count; ++i) {
      std::vector<std::string> node_args = args;
      if (tls != nullptr) {
        // The bus listens on the TLS port + 10000.
        int tls_port = free_port();
        for (int attempt = 0; attempt < 20 && !bus_free(tls_port); ++attempt) tls_port = free_port();
        tls_ports_.push_back(tls_port);
        node_args.insert(node_args.end(),
                         {"--tls-port", std::to_string(tls_port), "--tls-cluster", "yes", "--tls-replication", "yes",
                          "--tls-cert-file", tls->cert_file, "--tls-key-file", tls->key_file, "--tls-ca-cert-file",
                          tls->ca_file, "--tls-auth-clients", "no"});
      }
      nodes_.push_back(std::make_unique<redis_server>(node_args, bus_free));
    }
    std::vector<std::string> create = {"/usr/bin/redis-cli"};
    if (tls != nullptr) create.insert(create.end(), {"--tls", "--cacert", tls->ca_file});
    create.insert(create.end(), {"--cluster", "create"});
    for (const auto& a : tls != nullptr ? tls_seeds() : seeds()) create.push_back(a);
    create.insert(create.end(), {"--cluster-replicas", std::to_string(replicas_per_master), "--cluster-yes"});
    if (const command_result r = run_command(create); r.exit_code != 0) {
      throw std::runtime_error("redis-cli --cluster create failed: " + r.output);
    }
    wait_healthy();
  }

  redis_cluster(const redis_cluster&) = delete;
  redis_cluster& operator=(const redis_cluster&) = delete;

  /// Every node's address: what a client is given as seeds.
  std::vector<std::string> seeds() const {
    std::vector<std::string> out;
    for (const auto& n : nodes_) out.push_back(n->address());
    return out;
  }

  /// With cluster_tls: every node's TLS address.
  std::vector<std::string> tls_seeds() const {
    std::vector<std::string> out;
    for (int port : tls_ports_) out.push_back("127.0.0.1:" + std::to_string(port));
    return out;
  }

  std::vector<redis_server*> nodes() const {
    std::vector<redis_server*> out;
    for (const auto& n : nodes_) out.push_back(n.get());
    return out;
  }

  /// The nodes alive that are masters now.
  std::vector<redis_server*> masters() {
    std::vector<redis_server*> out;
    for (const auto& n : nodes_) {
      if (n->pid() > 0 && info(*n, "replication").find("role:master") != std::string::npos) out.push_back(n.get());
    }
    return out;
  }

  /// The node that serves `slot` now, as a live node sees it (CLUSTER SLOTS).
  redis_server& master_of(int slot) {
    if (redis_server* m = find_master_of(slot)) return *m;
    throw std::runtime_error("no master serves slot " + std::to_string(slot));
  }

  /// The same, or nullptr while no node is seen to serve it (during a failover's switch).
  redis_server* find_master_of(int slot) {
    for (const auto& n : nodes_) {
      if (n->pid() <= 0) continue;
      auto r = n->command({"CLUSTER", "SLOTS"});
      for (std::size_t i = 0; i < r->elements; ++i) {
        const redisReply* range = r->element[i];
        if (slot < range->element[0]->integer || slot > range->element[1]->integer) continue;
        for (const auto& m : nodes_) {
          if (m->port() == range->element[2]->element[1]->integer) return m.get();
        }
      }
      break;
    }
    return nullptr;
  }

  /// A replica of `master`.
  redis_server& replica_of(redis_server& master) {
    for (const auto& n : nodes_) {
      if (n->pid() <= 0 || n.get() == &master) continue;
      if (info(*n, "replication").find("master_port:" + std::to_string(master.port()) + "\r\n") != std::string::npos) {
        return *n;
      }
    }
    throw std::runtime_error("no replica of " + master.address());
  }

  /// Until every live node says cluster_state:ok and every live replica's link to its master is up
  /// (bounded: 60 s).
  void wait_healthy() {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < give_up) {
      bool ok = true;
      for (const auto& n : nodes_) {
        if (n->pid() <= 0) continue;
        try {
          if (n->string({"CLUSTER", "INFO"}).find("cluster_state:ok") == std::string::npos) ok = false;
          const std::string repl = info(*n, "replication");
          if (repl.find("role:slave") != std::string::npos && repl.find("master_link_status:up") == std::string::npos) {
            ok = false;
          }
        } catch (const std::exception&) {
          ok = false;
        }
        if (!ok) break;
      }
      if (ok) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    throw std::runtime_error("the Redis Cluster did not become healthy within 60 s");
  }

  static std::string info(redis_server& n, const std::string& section) { return n.string({"INFO", section}); }

 private:
  std::vector<std::unique_ptr<redis_server>> nodes_;
  std::vector<int> tls_ports_;  // with cluster_tls, by node
};

}  // namespace sluice::testing
