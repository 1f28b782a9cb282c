#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every C++ block of the README and docs/ compiles against the public headers, as a reader would
paste it. A whole program (one with main) compiles as it is; a fragment compiles inside a function,
after the names it leaves to the reader (now, fail, redis, backend, ...) are declared below.

Usage: snippets_test.py SOURCE_DIR CXX
"""

import os
import re
import subprocess
import sys
import tempfile

# What fragments use without defining: each declared where a reader's program would have it.
PLACEHOLDERS = """
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#include <sluice/backend.hpp>
#include <sluice/clock.hpp>
#include <sluice/redis_backend.hpp>
using namespace std::chrono_literals;
inline sluice::time_point now{};
inline std::string secret;
inline std::unique_ptr<sluice::redis_backend> redis;
inline std::unique_ptr<sluice::backend> backend;
inline std::vector<sluice::rule> default_rules;
inline int fail(const std::string&) { return 1; }
inline void reply_429(sluice::nanoseconds) {}
inline void load(const std::string&, const std::string&, std::int64_t) {}
inline void log(const std::string&) {}
"""

# The HTTP middleware's fragments also leave the service's own parts to the reader.
HTTP_PLACEHOLDERS = """
#include <optional>
#include <sluice/http/middleware.hpp>
template <class Request>
std::optional<sluice::http::identity> my_auth(const Request&) { return std::nullopt; }
"""
BEAST_PLACEHOLDERS = """
#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <sluice/http/beast.hpp>
inline sluice::http::beast::response handle_request(const sluice::http::beast::request&) { return {}; }
"""
HTTPLIB_PLACEHOLDERS = """
#include <sluice/http/httplib.hpp>
inline std::optional<std::shared_ptr<sluice::http::middleware>> mw;
inline httplib::Server server;
"""


def blocks(path):
    with open(path) as f:
        return re.findall(r"```cpp\n(.*?)```", f.read(), re.S)


def program(block):
    """The block as a translation unit: as it is when it has main, else its includes first and the
    rest in a function."""
    if re.search(r"^int main\(", block, re.M):
        return block
    includes = [l for l in block.splitlines() if l.startswith("#include")]
    body = "\n".join(l for l in block.splitlines() if not l.startswith("#include"))
    prelude = "\n".join(includes) + "\n" + PLACEHOLDERS
    if "sluice::http" in block or "limiter" in block:
        prelude += HTTP_PLACEHOLDERS + (HTTPLIB_PLACEHOLDERS if "httplib" in block else "")
    if "co_await" in block:
        # A line of a Beast session coroutine, with what such a session holds.
        return (prelude + BEAST_PLACEHOLDERS + "boost::asio::awaitable<void> snippet(const sluice::http::beast::limiter& limiter,"
                " const sluice::http::beast::request& req, boost::beast::tcp_stream& stream) {\n" + body + "\n}\n")
    return prelude + "\nint snippet() {\n" + body + "\nreturn 0;\n}\n"


def main():
    source, cxx = sys.argv[1], sys.argv[2]
    docs = [os.path.join(source, "README.md")] + sorted(
        os.path.join(source, "docs", f) for f in os.listdir(os.path.join(source, "docs")) if f.endswith(".md"))
    failed = 0
    count = 0
    with tempfile.TemporaryDirectory() as d:
        for doc in docs:
            for i, block in enumerate(blocks(doc)):
                count += 1
                unit = os.path.join(d, "snippet.cpp")
                with open(unit, "w") as f:
                    f.write(program(block))
                r = subprocess.run([cxx, "-std=c++20", "-fsyntax-only", "-Wno-unused", "-I", os.path.join(source, "include"),
                                    unit], capture_output=True, text=True)
                if r.returncode != 0:
                    failed += 1
                    print("%s, C++ block %d does not compile:\n%s\n%s" % (os.path.relpath(doc, source), i + 1, block,
                                                                         r.stderr[:3000]))
    print("%d C++ blocks, %d do not compile" % (count, failed))
    if count == 0:
        print("no C++ block found: the test reads nothing")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
