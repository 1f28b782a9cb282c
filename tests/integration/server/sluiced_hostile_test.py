#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""sluiced against hostile clients, over real sockets: HTTP framing that must be bounded, a browser's
cross-origin POST, floods of refusals, of connections and of keys, a config file written in place,
files that are not regular files, Envoy configs nesting too deep, and SIGTERM under keep-alive load. Each case failed before the fix it guards.

Usage: SLUICED=/path/to/sluiced python3 sluiced_hostile_test.py
"""

import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluiced_harness import Sluiced, wait_for, SLUICED  # noqa: E402

# Rates are tiny so that nothing refills while a test runs.
CONFIG = """[server]
threads = 2
watch_interval_ms = 100

[[rules]]
name = "api"
algorithm = "token_bucket"
rate = 0.01
burst = 5

[[rules]]
name = "ai"
algorithm = "sliding_window"
limit = 3
window = "60s"
"""


def raw_exchange(port, data, timeout=5.0, stop_after_response=True):
    """Sends `data` (bytes, or a list of byte chunks sent in turn) and reads until the server closes,
    a timeout, or (by default) one complete-looking response. Returns (bytes read, server closed)."""
    out = b""
    closed = False
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        try:
            for chunk in data if isinstance(data, list) else [data]:
                c.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before taking everything: fine
        try:
            while True:
                got = c.recv(65536)
                if not got:
                    closed = True
                    break
                out += got
                if stop_after_response and b"\r\n\r\n" in out:
                    head, _, body = out.partition(b"\r\n\r\n")
                    m = re.search(rb"Content-Length: (\d+)", head)
                    if m and len(body) >= int(m.group(1)):
                        break
        except (socket.timeout, ConnectionResetError):
            pass
    return out, closed


def status_of(response):
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", response)
    return int(m.group(1)) if m else 0


class HostileTest(unittest.TestCase):
    def start(self, config=CONFIG, env=None, preexec=None):
        s = Sluiced(config, env=env) if preexec is None else Sluiced(config, env=env, preexec_fn=preexec)
        self.addCleanup(s.close)
        return s

    def assert_alive_and_state_kept(self, s, remaining):
        self.assertIsNone(s.proc.poll(), "sluiced is still running:\n" + s.log_text()[-2000:])
        self.assertEqual(s.request("GET", "/healthz").status, 200)
        r = s.check(rule="api", key="victim")
        self.assertEqual(r.json()["remaining"], remaining, "limiter state survived")


class Framing(HostileTest):
    def test_oversized_trailer_field_is_refused_and_the_process_lives(self):
        s = self.start()
        self.assertEqual(s.check(rule="api", key="victim").json()["remaining"], 4)
        trailer = b"X: " + b"a" * 65536 + b"\r\n"
        for path in (b"/healthz", b"/v1/check"):
            req = (b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + trailer + b"\r\n")
            out, _ = raw_exchange(s.port, req)
            self.assertIn(status_of(out), (413, 431), out[:200])
        self.assert_alive_and_state_kept(s, 3)

    def test_trailer_section_is_bounded(self):
        s = self.start()
        s.check(rule="api", key="victim")
        # Many small trailer fields, 1 MiB in all, on a request that would otherwise get 200.
        trailers = b"".join(b"T%d: v\r\n" % i for i in range(120_000))
        req = b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + trailers + b"\r\n"
        out, _ = raw_exchange(s.port, req)
        self.assertEqual(status_of(out), 413, out[:200])
        self.assert_alive_and_state_kept(s, 3)

    def test_unterminated_chunk_extension_is_bounded(self):
        s = self.start()
        s.check(rule="api", key="victim")
        head = (b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n2;")
        # 4 MiB of extension with no end in sight: the answer must come long before the last byte.
        chunks = [head] + [b"a" * 65536] * 64
        out, closed = raw_exchange(s.port, chunks, timeout=10)
        self.assertEqual(status_of(out), 413, out[:200])
        self.assert_alive_and_state_kept(s, 3)

    def test_chunk_headers_count_against_one_budget(self):
        s = self.start()
        s.check(rule="api", key="victim")
        # 4,000 one-byte chunks, each with a 100-byte extension: 400 KB of framing for a 4 KB body.
        body = b"".join(b"1;" + b"e" * 100 + b"\r\n" + b" " + b"\r\n" for _ in range(4000)) + b"0\r\n\r\n"
        req = (b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n" + body)
        out, _ = raw_exchange(s.port, req)
        self.assertEqual(status_of(out), 413, out[:200])
        self.assertIn(b"chunked framing", out)
        self.assert_alive_and_state_kept(s, 3)

    def test_oversized_headers_get_431(self):
        s = self.start()
        out, _ = raw_exchange(s.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20000 + b"\r\n\r\n")
        self.assertEqual(status_of(out), 431, out[:200])
        self.assertEqual(s.request("GET", "/healthz").status, 200)

    def test_reasonable_chunked_request_is_still_served(self):
        s = self.start()
        body = json.dumps({"rule": "api", "key": "chunky"}).encode()
        req = (b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
               b"%x;name=value\r\n%s\r\n0\r\nX-Trailer: fine\r\n\r\n" % (len(body), body))
        out, _ = raw_exchange(s.port, req)
        self.assertEqual(status_of(out), 200, out[:300])


class ContentType(HostileTest):
    def test_check_requires_json(self):
        s = self.start()
        body = json.dumps({"rule": "api", "key": "browser"})
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                      "application/jsonx", ""):
            r = s.request("POST", "/v1/check", body, headers={"Content-Type": ctype})
            self.assertEqual(r.status, 415, ctype)
            self.assertEqual(r.json()["error"]["code"], "unsupported_media_type")
        # No Content-Type at all.
        out, _ = raw_exchange(s.port, b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                              % (len(body), body.encode()))
        self.assertEqual(status_of(out), 415)
        # None of them spent anything; JSON in any spelling is accepted.
        for ctype in ("application/json", "Application/JSON; charset=utf-8"):
            r = s.request("POST", "/v1/check", body, headers={"Content-Type": ctype})
            self.assertEqual(r.status, 200, ctype)
        self.assertEqual(r.json()["remaining"], 3, "the refused requests changed no state")


class RejectionLog(HostileTest):
    def test_refusal_lines_are_bounded_and_counted(self):
        s = self.start(CONFIG.replace("threads = 2", "threads = 2\nlog_rejections = true"))
        batch = {"checks": [{"rule": "ai", "key": "noisy"} for _ in range(1000)]}
        started = time.monotonic()
        for _ in range(5):
            r = s.request("POST", "/v1/check", batch)
            self.assertEqual(r.status, 200)
        refused = 5 * 1000 - 3
        seconds = time.monotonic() - started
        # Every refusal is accounted for: in full, or in a per-rule count line.
        def accounted():
            log = s.log_text()
            full = log.count("rate_limited=true")
            counted = sum(int(n) for n in re.findall(r"event=rejections_not_logged rule=ai count=(\d+)", log))
            return (full, counted) if full + counted == refused else None
        full, counted = wait_for(accounted, timeout=5, what="the refusal counts")
        self.assertLessEqual(full, 20 * (int(seconds) + 2), "at most 20 full lines a second")
        self.assertGreater(counted, 0)


class ConfigWrittenInPlace(HostileTest):
    def test_half_written_file_is_not_applied(self):
        s = self.start()
        self.assertEqual(s.check(rule="ai", key="k").json()["remaining"], 2)
        half = CONFIG[:CONFIG.index('[[rules]]\nname = "ai"')]
        stop = threading.Event()
        statuses = []

        def poll():
            while not stop.is_set():
                statuses.append(s.request("GET", "/healthz").status)
                r = s.request("POST", "/v1/check", {"rule": "ai", "key": "poller", "cost": 1})
                statuses.append(r.status)
                time.sleep(0.02)

        with open(s.config_path, "w") as f:  # in place, as a careless editor does
            f.write(half)
            f.flush()
            poller = threading.Thread(target=poll)
            poller.start()
            time.sleep(0.3)  # longer than the watch interval, shorter than the settle time
            f.write(CONFIG[len(half):])
        wait_for(lambda: "event=reload result=success" in s.log_text(), timeout=10, what="the reload")
        stop.set()
        poller.join()
        self.assertNotIn(404, statuses, "the half file's missing rule was never applied")
        self.assertIn("changed_rules=0", s.log_text())
        self.assertEqual(s.check(rule="ai", key="k").json()["remaining"], 1, "state kept: nothing changed")


    def test_a_writer_pausing_mid_file_does_not_remove_rules(self):
        s = self.start()
        self.assertEqual(s.check(rule="ai", key="k").json()["remaining"], 2)
        half = CONFIG[:CONFIG.index('[[rules]]\nname = "ai"')]
        with open(s.config_path, "w") as f:  # in place, and the writer pauses past the settle time
            f.write(half)
            f.flush()
            deferred = wait_for(lambda: re.search(r"event=reload_deferred trigger=file_change rules_removed=(\S+)",
                                                  s.log_text()), timeout=10, what="the reload to be held")
            self.assertEqual(deferred.group(1), "ai", "the line names the rules that would go")
            r = s.check(rule="ai", key="k")
            self.assertEqual((r.status, r.json()["remaining"]), (200, 1), "the rule still applies, its state kept")
            f.write(CONFIG[len(half):])
        wait_for(lambda: "event=reload result=success" in s.log_text(), timeout=10, what="the reload")
        self.assertIn("changed_rules=0", s.log_text())
        self.assertNotIn("event=reload_removes_rules", s.log_text())
        self.assertEqual(s.check(rule="ai", key="k").json()["remaining"], 0, "state kept: nothing changed")

    def test_rules_removed_for_good_apply_once_the_file_holds_still(self):
        s = self.start()
        with open(s.config_path, "w") as f:  # the operator did mean to remove "ai"
            f.write(CONFIG[:CONFIG.index('[[rules]]\nname = "ai"')])
        written = time.monotonic()
        wait_for(lambda: "event=reload result=success" in s.log_text(), timeout=20, what="the reload")
        self.assertGreaterEqual(time.monotonic() - written, 4.5, "held until unchanged for 5 s")
        log = s.log_text()
        self.assertLess(log.index("event=reload_deferred"), log.index("event=reload result=success"))
        self.assertIn("event=reload_removes_rules trigger=file_change rules=ai", log)
        self.assertEqual(s.check(rule="ai", key="k").status, 404)
        self.assertEqual(s.check(rule="api", key="k").status, 200)


class RefusedConfigFiles(HostileTest):
    """What is not a regular file is refused at once, without blocking, and changes nothing."""

    def test_a_fifo_or_directory_in_place_of_the_config_changes_nothing(self):
        s = self.start()
        self.assertEqual(s.check(rule="ai", key="k").json()["remaining"], 2)
        fifo = s.config_path + ".fifo"
        os.mkfifo(fifo)
        os.replace(fifo, s.config_path)  # seen by the watch: a FIFO without a writer must not block the reload
        wait_for(lambda: "event=reload result=failure" in s.log_text(), timeout=10, what="the refused reload")
        self.assertIn("not a regular file", s.log_text())
        os.unlink(s.config_path)
        os.mkdir(s.config_path)
        s.send_signal(signal.SIGHUP)
        wait_for(lambda: "is a directory" in s.log_text(), timeout=10, what="the refused reload")
        r = s.check(rule="ai", key="k")
        self.assertEqual((r.status, r.json()["remaining"]), (200, 1), "the limits in force still apply")
        self.assertNotIn("event=reload result=success", s.log_text())
        os.rmdir(s.config_path)
        s.write_config(CONFIG)  # the process stays sound: a good file loads again
        wait_for(lambda: "event=reload result=success" in s.log_text(), timeout=10, what="the reload")

    def test_check_config_refuses_devices_fifos_and_directories(self):
        with tempfile.TemporaryDirectory() as d:
            fifo = os.path.join(d, "fifo.toml")
            os.mkfifo(fifo)
            for path, message in (("/dev/zero", "/dev/zero: not a regular file"),
                                  (fifo, fifo + ": not a regular file"),
                                  (d, d + ": is a directory, not a file")):
                r = subprocess.run([SLUICED, "--check-config", "--config", path], capture_output=True, text=True,
                                   timeout=30)
                self.assertEqual(r.returncode, 1, path)
                self.assertIn(message, r.stderr)

    def test_an_envoy_config_nesting_too_deep_or_replacing_itself_stops_the_start(self):
        with tempfile.TemporaryDirectory() as d:
            envoy = os.path.join(d, "envoy")
            os.mkdir(envoy)
            config = os.path.join(d, "sluice.toml")
            with open(config, "w") as f:
                f.write('[server]\ngrpc_listen = "127.0.0.1:0"\n[envoy]\nconfig_dir = "%s"\n' % envoy)
            cases = (
                ("deep.yaml", "domain: a\ndescriptors: " + "[" * 1000000,
                 "deep.yaml:2: collections nest deeper than 64 levels"),
                ("self.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      name: x\n"
                 "      replaces: [{name: x}]\n      unit: second\n      requests_per_unit: 1\n",
                 "self.yaml:6: rate_limit 'x' replaces itself"),
            )
            for name, text, message in cases:
                path = os.path.join(envoy, name)
                with open(path, "w") as f:
                    f.write(text)
                r = subprocess.run([SLUICED, "--config", config, "--listen", "127.0.0.1:0"], capture_output=True,
                                   text=True, timeout=60)
                self.assertEqual(r.returncode, 1, r.stderr[-2000:])
                self.assertIn(message, r.stderr)
                os.unlink(path)


class Connections(HostileTest):
    def test_slow_connections_cannot_lock_out_new_clients(self):
        def low_fd_limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        s = self.start(preexec=low_fd_limit)
        slow = []
        try:
            # More half-sent requests than sluiced has descriptors for.
            for _ in range(300):
                c = socket.socket()
                c.settimeout(5)
                c.connect(("127.0.0.1", s.port))
                c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                slow.append(c)
            # Served well before the 60 s idle timeout would free a slot (the bound is wide for
            # sanitizer builds on a loaded machine; unloaded it takes milliseconds).
            started = time.monotonic()
            out, _ = raw_exchange(s.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=20)
            self.assertEqual(status_of(out), 200, "a new client is served while slow ones hold connections")
            self.assertLess(time.monotonic() - started, 20)
        finally:
            for c in slow:
                c.close()
        log = s.log_text()
        self.assertIn("event=connection_limit max_connections=192", log)
        # Sessions stay under the cap and sockets on their way to a worker are bounded: the
        # descriptors kept in reserve are never needed, so accepting never fails.
        self.assertNotIn("event=accept_failed", log)


class KeyFloods(HostileTest):
    CAPPED = """[server]
threads = 2

[backend]
max_keys_per_rule = 1000

[[rules]]
name = "window"
algorithm = "sliding_window"
limit = 100
window = "60s"
"""
    FLOOD = CAPPED.replace("threads = 2", "threads = 2\nsweep_interval_ms = 200") + """
[[rules]]
name = "closed"
algorithm = "sliding_window"
limit = 100
window = "60s"
when_full = "refuse"

[[rules]]
name = "fast"
algorithm = "token_bucket"
rate = 1000000
burst = 1
"""

    def flood(self, s, rule, keys, prefix="flood"):
        statuses = []
        for start in range(0, keys, 1000):
            batch = {"checks": [{"rule": rule, "key": "%s:%d" % (prefix, i)} for i in range(start, start + 1000)]}
            r = s.request("POST", "/v1/check", batch)
            self.assertEqual(r.status, 200)
            statuses += [x.get("allowed", x.get("error", {}).get("code")) for x in r.json()["results"]]
        return statuses

    def metric(self, s, name):
        text = s.request("GET", "/metrics").body.decode()
        m = re.search(re.escape(name) + r" (\d+)", text)
        return int(m.group(1)) if m else None

    def test_a_user_at_the_limit_is_not_forgiven_by_a_key_flood(self):
        s = self.start(self.CAPPED)
        self.assertEqual(s.check(rule="window", key="user", cost=100).status, 200)
        self.assertEqual(s.check(rule="window", key="user").status, 429)
        self.flood(s, "window", 5000)
        self.assertEqual(s.check(rule="window", key="user").status, 429, "the flood did not reset the user")
        self.assertGreater(self.metric(s, 'sluice_evictions_total{rule="window",kind="active"}'), 3000)

    def test_refuse_new_keys_when_full(self):
        s = self.start(self.FLOOD)
        results = self.flood(s, "closed", 2000)
        self.assertEqual(results[:1000].count(True), 1000)
        self.assertEqual(results[1000:].count("capacity_exhausted"), 1000)
        r = s.check(rule="closed", key="latecomer")
        self.assertEqual(r.status, 429)
        self.assertEqual(r.json()["error"]["code"], "capacity_exhausted")
        self.assertEqual(s.check(rule="closed", key="flood:7").status, 200, "known keys are still served")
        self.assertEqual(self.metric(s, 'sluice_evictions_total{rule="closed",kind="refused"}'), 1001)

    def test_idle_keys_are_swept(self):
        s = self.start(self.FLOOD)
        self.flood(s, "fast", 900)
        # Buckets refill in 1 µs: idle at once, and swept within sweep_interval_ms.
        wait_for(lambda: self.metric(s, "sluice_live_keys") == 0, timeout=5, what="the idle keys to be swept")


class Shutdown(HostileTest):
    def test_sigterm_answers_every_request_already_sent(self):
        s = self.start()
        body = json.dumps({"rule": "api", "key": "loop"}).encode()
        req = (b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
               % (len(body), body))
        lost, answered, closed_by_server = [], [0], [0]
        lock = threading.Lock()
        started = threading.Barrier(17)

        def client(n):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            started.wait()
            deadline = time.monotonic() + 10
            try:
                while time.monotonic() < deadline:  # keep-alive, one request after another
                    try:
                        c.sendall(req)
                    except OSError:
                        return  # closed before this request went out: nothing was lost
                    data = b""
                    while b"\r\n\r\n" not in data or not data.endswith(b"}"):
                        got = c.recv(65536)
                        if not got:
                            with lock:
                                lost.append(n)  # sent, and the connection closed unanswered
                            return
                        data += got
                    with lock:
                        answered[0] += 1
                    if b"Connection: close" in data:
                        with lock:
                            closed_by_server[0] += 1
                        return
            finally:
                c.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        started.wait()
        time.sleep(0.3)  # the clients are looping
        s.send_signal(signal.SIGTERM)
        for t in threads:
            t.join()
        self.assertEqual(lost, [], "no request sent on a kept-alive connection went unanswered")
        self.assertEqual(closed_by_server[0], 16, "each connection was told Connection: close")
        self.assertGreater(answered[0], 16)
        self.assertEqual(s.proc.wait(timeout=15), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
