// SPDX-License-Identifier: Apache-2.0
// src/redis/strand.hpp — the strand every part of the Redis backend runs on (connection, breaker,
// the checks in flight), and the project's one Asio alias for these files.
//
// Thread-safe: type names only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>

namespace sluice::detail {

namespace asio = boost::asio;

using strand_type = asio::strand<asio::io_context::executor_type>;

}  // namespace sluice::detail
