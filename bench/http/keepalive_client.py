# SPDX-License-Identifier: Apache-2.0
"""One keep-alive connection sending N requests of GET /public, one at a time, as if from 20,000
client addresses behind a trusted proxy (as public_xff.lua does); each response is read whole
before the next request. For bench/http/run.sh's instruction counts.

    python3 keepalive_client.py PORT N
"""
import socket
import sys

port, n = int(sys.argv[1]), int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port))
buf = b""
for i in range(n):
    k = i % 20000
    ip = "10.%d.%d.7" % ((k // 250) % 250, k % 250)
    s.sendall(("GET /public HTTP/1.1\r\nHost: bench\r\nX-Forwarded-For: %s\r\n\r\n" % ip).encode())
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("connection closed after %d responses" % i)
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(rest) < length:
        rest += s.recv(65536)
    buf = rest[length:]
s.close()
