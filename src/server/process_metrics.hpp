// SPDX-License-Identifier: Apache-2.0
// server/process_metrics.hpp — the standard process metrics every Prometheus client library exports
// (process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_max_fds, process_start_time_seconds), read from Linux's /proc/self at
// each scrape, so that dashboards made for any exporter work on sluiced.
//
//   std::string out;
//   sluice::server::append_process_metrics(out);
//
// Thread-safe. A value /proc does not give is left out, not made up.
#pragma once

#include <string>

namespace sluice::server {

void append_process_metrics(std::string& out);

}  // namespace sluice::server
