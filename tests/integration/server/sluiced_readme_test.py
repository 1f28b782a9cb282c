#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The README's samples are what they claim: the curl commands of its sample of sluiced, sent to a
sluiced running the example config, answer the lines printed under each (all but the time fields),
and its first library snippet is the hello example that make test builds and runs.

Usage: SLUICED=/path/to/sluiced SOURCE_DIR=/path/to/sluice python3 sluiced_readme_test.py
"""

import os
import re
import socket
import sys
import unittest

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluiced_harness import Sluiced  # noqa: E402

SOURCE = os.environ["SOURCE_DIR"]
TIME_HEADERS = ("X-RateLimit-Reset:",)  # seconds since the epoch: differ at each run


def samples():
    """(curl flags, JSON body, path, printed lines) of each command of the first sh block of the
    README's section on sluiced."""
    with open(os.path.join(SOURCE, "README.md")) as f:
        section = f.read().split("\n## As a service: sluiced\n", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    out = []
    for line in block.splitlines():
        m = re.match(r"curl (-s|-si) --json '(.*)' http://127\.0\.0\.1:8080(/\S+)$", line)
        if m:
            out.append((m.group(1), m.group(2), m.group(3), []))
        elif line.startswith("#") and out:
            out[-1][3].append(line[2:] if line.startswith("# ") else "")
    return out


def post(port, path, body):
    """The response exactly as the server sent it to a request as curl --json sends it: status line,
    headers, blank line, body."""
    data = body.encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(("POST %s HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: curl/7.88.1\r\n"
                   "Content-Type: application/json\r\nAccept: application/json\r\nContent-Length: %d\r\n\r\n"
                   % (path, len(data))).encode() + data)
        raw = b""
        while b"\r\n\r\n" not in raw:
            raw += s.recv(65536)
        head, _, rest = raw.partition(b"\r\n\r\n")
        length = int(re.search(rb"\r\nContent-Length: (\d+)", head).group(1))
        while len(rest) < length:
            rest += s.recv(65536)
    return (head + b"\r\n\r\n" + rest).decode()


class ReadmeSamples(unittest.TestCase):
    def test_the_samples_are_what_sluiced_answers(self):
        cases = samples()
        self.assertGreaterEqual(len(cases), 3, "the README's sample of sluiced has its curl commands")
        with open(os.path.join(SOURCE, "examples", "sluice.toml")) as f:
            config = f.read()
        s = Sluiced(config)
        try:
            for flags, body, path, printed in cases:
                raw = post(s.port, path, body)
                head, _, answer = raw.partition("\r\n\r\n")
                got = head.split("\r\n") + [""] + [answer] if flags == "-si" else [answer]
                self.assertEqual(len(got), len(printed), "%s: %r against %r" % (body, got, printed))
                for g, p in zip(got, printed):
                    if p.startswith(TIME_HEADERS):
                        self.assertRegex(g, r"^%s \d+$" % re.escape(p.split(":")[0] + ":"), body)
                    else:
                        self.assertEqual(g, p, body)
        finally:
            s.close()

    def test_the_first_library_snippet_is_the_hello_example(self):
        # examples/hello/hello.cpp is built and run by make test (example_hello): the snippet a
        # reader pastes is that program, but for its licence line.
        with open(os.path.join(SOURCE, "README.md")) as f:
            section = f.read().split("\n## Using the library\n", 1)[1]
        snippet = section.split("```cpp\n", 1)[1].split("```", 1)[0]
        with open(os.path.join(SOURCE, "examples", "hello", "hello.cpp")) as f:
            program = f.read().split("\n", 1)[1]
        self.assertEqual(snippet, program)


if __name__ == "__main__":
    unittest.main(verbosity=2)
