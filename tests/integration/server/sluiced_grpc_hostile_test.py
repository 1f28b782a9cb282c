#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The gRPC port of the real sluiced against hostile HTTP/2 peers, in raw frames over real sockets:
header blocks without end (CONTINUATION floods, HPACK's table expanding a few bytes into
kilobytes), streams that never finish, answers never read (a zero window), idle and old
connections, connections past the cap, and rapid resets. Each asserts the connection is closed (or
the stream refused) within a bound, that sluiced's memory stays bounded, and that an honest client
is still answered. The frames are HTTP/2's (RFC 9113), so these hold whatever serves the port.

Usage: SLUICED=/path/to/sluiced python3 sluiced_grpc_hostile_test.py
"""

import os
import re
import socket
import struct
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluiced_harness import Sluiced  # noqa: E402

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
NO_ERROR, PROTOCOL_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0, 1, 7, 8, 9, 11
SETTINGS_INITIAL_WINDOW_SIZE = 4
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

DOMAIN_YAML = """domain: edge
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000000}
"""


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def hpack_int(value, prefix_bits, first=0):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def literal(name, value, indexing=False):
    """A header field as a literal with a new name: without indexing, or added to HPACK's table."""
    name, value = name.encode(), value.encode() if isinstance(value, str) else value
    first = b"\x40" if indexing else b"\x00"
    return first + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


def request_block(path=METHOD):
    return b"".join(literal(n, v) for n, v in [
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "sluice"),
        ("content-type", "application/grpc"), ("te", "trailers")])


def pb_bytes(field, data):
    return varint(field << 3 | 2) + varint(len(data)) + data


def varint(n):
    out = bytearray()
    while n >= 128:
        out.append(n % 128 + 128)
        n //= 128
    out.append(n)
    return bytes(out)


def rate_limit_request(user):
    entry = pb_bytes(1, b"user") + pb_bytes(2, user.encode())
    return pb_bytes(1, b"edge") + pb_bytes(2, pb_bytes(1, entry))


def grpc_message(body):
    return b"\x00" + struct.pack(">I", len(body)) + body


class Peer:
    """One raw HTTP/2 connection: frames out as given, frames in as read."""

    def __init__(self, port, settings=b""):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sent = 0
        self.send(PREFACE + frame(SETTINGS, 0, 0, settings))

    def send(self, data):
        self.sock.sendall(data)
        self.sent += len(data)

    def try_send(self, data):
        """False once the server has closed the connection."""
        try:
            self.send(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def next_frame(self, timeout=10.0):
        """(type, flags, stream, payload), or None at the end of the connection."""
        self.sock.settimeout(timeout)
        while len(self.buf) < 9 or len(self.buf) < 9 + int.from_bytes(self.buf[:3], "big"):
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self.buf += chunk
        n = int.from_bytes(self.buf[:3], "big")
        kind, flags = self.buf[3], self.buf[4]
        stream = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
        payload, self.buf = self.buf[9:9 + n], self.buf[9 + n:]
        if kind == SETTINGS and not flags & ACK:
            self.try_send(frame(SETTINGS, ACK, 0))
        return kind, flags, stream, payload

    def frames_until_closed(self, timeout=10.0):
        """Every frame read until the server closes the connection; fails if it stays open."""
        deadline = time.monotonic() + timeout
        frames = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("the server kept the connection open for %.0f s" % timeout)
            try:
                f = self.next_frame(timeout=left)
            except socket.timeout:
                continue
            if f is None:
                return frames
            frames.append(f)

    def close(self):
        self.sock.close()


def goaway_code(frames):
    codes = [struct.unpack(">I", p[4:8])[0] for kind, _, _, p in frames if kind == GOAWAY]
    return codes[-1] if codes else None


def honest_call(port, user="honest"):
    """One ShouldRateLimit on a new connection: RateLimitResponse's overall_code (1 OK, 2 OVER_LIMIT)."""
    peer = Peer(port)
    try:
        peer.send(frame(HEADERS, END_HEADERS, 1, request_block()) +
                  frame(DATA, END_STREAM, 1, grpc_message(rate_limit_request(user))))
        while True:
            f = peer.next_frame()
            if f is None:
                raise AssertionError("the server closed an honest client's connection")
            kind, _, stream, payload = f
            if kind == DATA and stream == 1 and len(payload) >= 5:
                body = payload[5:]
                assert body[0] == 0x08, body  # field 1, varint: overall_code
                return body[1]
            if kind == RST_STREAM and stream == 1:
                raise AssertionError("the honest call was reset: %r" % payload)
    finally:
        peer.close()


class GrpcHostileTest(unittest.TestCase):
    def start(self, **limits):
        self.yaml_dir = tempfile.TemporaryDirectory(prefix="sluiced-envoy-")
        with open(os.path.join(self.yaml_dir.name, "edge.yaml"), "w") as f:
            f.write(DOMAIN_YAML)
        keys = "".join("%s = %d\n" % (k, v) for k, v in limits.items())
        # Under AddressSanitizer freed memory waits in a quarantine of up to 256 MB, which RSS
        # would count: a small one keeps RSS a measure of what sluiced holds.
        env = dict(os.environ)
        env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=4:thread_local_quarantine_size_kb=64").lstrip(":")
        self.s = Sluiced('[server]\nthreads = 2\ngrpc_listen = "127.0.0.1:0"\n%s\n[envoy]\nconfig_dir = "%s"\n'
                         % (keys, self.yaml_dir.name), env=env)
        self.port = self.s.grpc_port()
        self.peers = []
        self.assertEqual(honest_call(self.port), 1)

    def tearDown(self):
        for p in getattr(self, "peers", []):
            p.close()
        if hasattr(self, "s"):
            code = self.s.stop()
            self.yaml_dir.cleanup()
            log = self.s.log_text()
            self.s.dir.cleanup()
            self.assertEqual(code, 0, "sluiced did not exit cleanly:\n" + log[-4000:])

    def peer(self, settings=b""):
        p = Peer(self.port, settings)
        self.peers.append(p)
        return p

    def rss_kib(self):
        with open("/proc/%d/status" % self.s.proc.pid) as f:
            return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1))

    def closed_total(self, reason):
        text = self.s.request("GET", "/metrics").body.decode()
        m = re.search(r'sluice_grpc_connections_closed_total\{reason="%s"\} (\d+)' % reason, text)
        return int(m.group(1)) if m else 0

    def flood_until_closed(self, peer, chunk, limit_bytes):
        """Sends `chunk` until the server closes the connection or `limit_bytes` are sent."""
        while peer.sent < limit_bytes and peer.try_send(chunk):
            pass
        return peer.sent

    # --- header blocks -------------------------------------------------------------------------

    def test_continuation_flood_closes_the_connection_at_the_header_limit(self):
        self.start()
        before = self.rss_kib()
        for make_fragment in (
                lambda i: literal("x-filler-%d" % i, "v" * 200),  # fields that each decode
                lambda i: b"\x00\x7f\xff\xff\x03" + b"a" * 4000):  # one name of 65 KB, never ending
            p = self.peer()
            p.send(frame(HEADERS, 0, 1, request_block()))
            i = 0
            while p.sent < 50 << 20:
                fragment = b"".join(make_fragment(i + k) for k in range(4))
                i += 4
                if not p.try_send(frame(CONTINUATION, 0, 1, fragment)):
                    break
            frames = p.frames_until_closed()
            # What the sockets' buffers hold aside, the server stopped reading at the bound.
            self.assertLess(p.sent, 10 << 20, "the server read %d bytes of one header block" % p.sent)
            self.assertIn(goaway_code(frames), (None, PROTOCOL_ERROR, COMPRESSION_ERROR, ENHANCE_YOUR_CALM))
        self.assertLess(self.rss_kib() - before, 20 << 10)
        self.assertGreaterEqual(self.closed_total("header_limit") + self.closed_total("protocol"), 2)
        self.assertEqual(honest_call(self.port), 1)

    def test_hpack_table_expansion_is_counted_decoded(self):
        # One 4 KB field added to HPACK's table, then named by a one-byte index again and again:
        # a small block that decodes into megabytes.
        self.start()
        p = self.peer()
        big = literal("x-big", "b" * 4000, indexing=True)
        block = request_block() + big + b"\xbe" * 2000  # 0xbe: dynamic table entry 62
        p.send(frame(HEADERS, END_HEADERS, 1, block))
        frames = p.frames_until_closed()
        self.assertEqual(goaway_code(frames), ENHANCE_YOUR_CALM)
        self.assertEqual(self.closed_total("header_limit"), 1)
        self.assertEqual(honest_call(self.port), 1)

    # --- streams -------------------------------------------------------------------------------

    def test_streams_past_max_concurrent_streams_are_refused_and_unfinished_ones_time_out(self):
        self.start(grpc_max_concurrent_streams=10, grpc_request_timeout_ms=1000)
        before = self.rss_kib()
        # Before the peer has acknowledged the limit, streams past it are refused one by one.
        p = self.peer()
        opened = [2 * i + 1 for i in range(30)]
        p.send(b"".join(frame(HEADERS, END_HEADERS, sid, request_block()) for sid in opened))  # no END_STREAM
        refused, answered, advertised = set(), set(), None
        deadline = time.monotonic() + 10
        while len(refused) + len(answered) < 30 and time.monotonic() < deadline:
            kind, flags, stream, payload = p.next_frame()
            if kind == SETTINGS and not flags & ACK:
                entries = {struct.unpack(">H", payload[i:i + 2])[0]: struct.unpack(">I", payload[i + 2:i + 6])[0]
                           for i in range(0, len(payload), 6)}
                advertised = entries.get(3)  # SETTINGS_MAX_CONCURRENT_STREAMS
            elif kind == RST_STREAM and struct.unpack(">I", payload)[0] == REFUSED_STREAM:
                refused.add(stream)
            elif kind == HEADERS and flags & END_STREAM:
                answered.add(stream)  # trailers-only: DEADLINE_EXCEEDED once the request timeout passes
        self.assertEqual(advertised, 10)
        self.assertEqual(len(refused), 20)
        self.assertEqual(answered, set(opened[:10]))
        # Once it has acknowledged the limit, a peer that goes past it loses the connection.
        q = self.peer()
        while q.next_frame()[0] != SETTINGS:  # read (and acknowledge) the server's settings
            pass
        q.send(b"".join(frame(HEADERS, END_HEADERS, 2 * i + 1, request_block()) for i in range(11)))
        self.assertEqual(goaway_code(q.frames_until_closed()), PROTOCOL_ERROR)
        self.assertLess(self.rss_kib() - before, 20 << 10)
        self.assertEqual(honest_call(self.port), 1)

    def test_many_connections_of_unfinished_streams_stay_bounded(self):
        self.start(grpc_max_connections=40)
        before = self.rss_kib()
        # 100,000 streams opened, never finished: unbounded, as a few KB each, they would take
        # hundreds of MB; at 100 a connection they hold a few.
        peers = [self.peer() for _ in range(20)]
        for p in peers:
            p.send(b"".join(frame(HEADERS, END_HEADERS, 2 * i + 1, request_block()) for i in range(5000)))
        for p in peers:
            refused = 0
            while refused < 4900:
                f = p.next_frame()
                self.assertIsNotNone(f, "the server closed a connection that kept within its limits")
                if f[0] == RST_STREAM and struct.unpack(">I", f[3])[0] == REFUSED_STREAM:
                    refused += 1
        self.assertLess(self.rss_kib() - before, 64 << 10)
        self.assertEqual(honest_call(self.port), 1)

    def test_answers_never_read_close_the_connection(self):
        # A zero window: the answers cannot be sent, so they wait, at most write_timeout.
        self.start(grpc_write_timeout_ms=1000)
        p = self.peer(settings=struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, 0))
        calls = b"".join(frame(HEADERS, END_HEADERS, 2 * i + 1, request_block()) +
                         frame(DATA, END_STREAM, 2 * i + 1, grpc_message(rate_limit_request("z%d" % i)))
                         for i in range(500))
        p.try_send(calls)
        started = time.monotonic()
        frames = p.frames_until_closed(timeout=10)
        self.assertFalse(any(kind == DATA for kind, _, _, _ in frames), "DATA sent into a zero window")
        self.assertLess(time.monotonic() - started, 5)
        refused = sum(1 for kind, _, _, pl in frames if kind == RST_STREAM and struct.unpack(">I", pl)[0] == 7)
        self.assertGreaterEqual(refused, 400)  # past max_concurrent_streams (100)
        self.assertEqual(self.closed_total("stalled"), 1)
        self.assertEqual(honest_call(self.port), 1)

    def test_rapid_reset_closes_the_connection(self):
        self.start(grpc_reset_burst=200, grpc_resets_per_second=10)
        p = self.peer()
        pairs = b"".join(frame(HEADERS, END_HEADERS, 2 * i + 1, request_block()) +
                         frame(RST_STREAM, 0, 2 * i + 1, struct.pack(">I", CANCEL)) for i in range(5000))
        p.try_send(pairs)
        frames = p.frames_until_closed()
        self.assertIsNotNone(goaway_code(frames))
        self.assertEqual(self.closed_total("resets") + self.closed_total("protocol"), 1)
        self.assertEqual(honest_call(self.port), 1)

    # --- connections ---------------------------------------------------------------------------

    def test_a_call_past_its_grpc_timeout_gets_no_answer_message(self):
        self.start()
        p = self.peer()

        def call(stream, timeout):
            p.send(frame(HEADERS, END_HEADERS, stream, request_block() + literal("grpc-timeout", timeout)) +
                   frame(DATA, END_STREAM, stream, grpc_message(rate_limit_request("timed"))))
            got_message = False
            while True:
                kind, flags, sid, payload = p.next_frame()
                if sid != stream:
                    continue
                if kind == DATA and payload:
                    got_message = True
                if kind == HEADERS and flags & END_STREAM:  # the trailers (grpc-status)
                    return got_message

        # A timeout of 0 is over before the answer is written: DEADLINE_EXCEEDED, trailers only.
        self.assertFalse(call(1, "0n"))
        self.assertTrue(call(3, "10S"))

    def test_idle_connections_are_closed(self):
        self.start(grpc_idle_timeout_ms=500)
        p = self.peer()
        started = time.monotonic()
        frames = p.frames_until_closed(timeout=5)
        self.assertEqual(goaway_code(frames), NO_ERROR)
        self.assertGreaterEqual(time.monotonic() - started, 0.4)
        self.assertEqual(self.closed_total("idle"), 1)

    def test_old_connections_are_told_goaway_and_closed_after_their_grace(self):
        self.start(grpc_max_connection_age_ms=500, grpc_max_connection_age_grace_ms=500)
        p = self.peer()
        p.send(frame(HEADERS, END_HEADERS, 1, request_block()))  # a call that never ends
        frames = p.frames_until_closed(timeout=5)
        self.assertEqual([k for k, _, _, _ in frames].count(GOAWAY), 2, "GOAWAY, then GOAWAY once the grace ends")
        self.assertEqual(self.closed_total("aged"), 1)

    def test_at_the_connection_cap_the_longest_idle_connection_makes_room(self):
        self.start(grpc_max_connections=20)
        idle = [self.peer() for _ in range(60)]  # the preface only
        for _ in range(5):
            self.assertEqual(honest_call(self.port), 1)
        self.assertGreater(self.closed_total("shed"), 0)
        open_now = int(re.search(r"sluice_grpc_connections (\d+)",
                                 self.s.request("GET", "/metrics").body.decode()).group(1))
        self.assertLessEqual(open_now, 22)
        self.assertTrue(idle)


if __name__ == "__main__":
    unittest.main(verbosity=2)
