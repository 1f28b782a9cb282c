"""Starts the real sluiced (and redis-server) for end-to-end tests; standard library only.

Each process is started on 127.0.0.1 with port 0 (sluiced) or a free port (redis-server), in a
temporary directory, and is ended by its PID only.
"""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

SLUICED = os.environ.get("SLUICED", "sluiced")


def wait_for(predicate, timeout=10.0, interval=0.02, what="condition"):
    """Polls `predicate` until it returns a truthy value or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(interval)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lower-case name -> value
        self.body = body

    def json(self):
        return json.loads(self.body)


class Sluiced:
    """One sluiced process with its own config file and log."""

    def __init__(self, config_text, extra_args=(), env=None, preexec_fn=None):
        self.dir = tempfile.TemporaryDirectory(prefix="sluiced-test-")
        self.config_path = os.path.join(self.dir.name, "sluice.toml")
        self.log_path = os.path.join(self.dir.name, "sluiced.log")
        self.write_config(config_text)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [SLUICED, "--config", self.config_path, "--listen", "127.0.0.1:0", *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec_fn)
        line = wait_for(lambda: self._listening_line(), timeout=20, what="sluiced to listen")
        self.port = int(line)
        self.conn = None

    def _listening_line(self):
        if self.proc.poll() is not None:
            raise AssertionError("sluiced exited early with %s:\n%s" % (self.proc.returncode, self.log_text()))
        m = re.search(r"event=listening address=127\.0\.0\.1:(\d+)", self.log_text())
        return m.group(1) if m else None

    def write_config(self, text):
        # Write then rename, as an editor or config manager does, so a reload never sees half a file.
        tmp = self.config_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.config_path)

    def log_text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def request(self, method, path, body=None, headers=None, keep_alive=True):
        if self.conn is None or not keep_alive:
            if self.conn is not None:
                self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        headers = dict(headers or {})
        if method == "POST" and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
        try:
            self.conn.request(method, path, body=body, headers=headers or {})
            r = self.conn.getresponse()
        except (ConnectionError, http.client.HTTPException):
            # The server closed a kept-alive connection (e.g. after an error reply); retry once afresh.
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            self.conn.request(method, path, body=body, headers=headers or {})
            r = self.conn.getresponse()
        data = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        if hdrs.get("connection", "").lower() == "close":
            self.conn.close()
            self.conn = None
        return Response(r.status, hdrs, data)

    def check(self, **fields):
        return self.request("POST", "/v1/check", fields)

    def stop_conn(self):
        """Closes the harness's own keep-alive connection."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def reload(self, text, trigger="sighup"):
        """Writes a new config and waits until sluiced has logged the reload's outcome."""
        before = self.log_text().count("event=reload ")
        self.write_config(text)
        if trigger == "sighup":
            self.send_signal(signal.SIGHUP)
        wait_for(lambda: self.log_text().count("event=reload ") > before, timeout=10, what="the reload")
        return self.log_text().splitlines()[-1]

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def close(self):
        self.stop()
        self.dir.cleanup()


class RedisServer:
    """A throwaway redis-server on a free loopback port."""

    def __init__(self, port=None):
        self.dir = tempfile.TemporaryDirectory(prefix="sluice-redis-")
        self.port = port or free_port()
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir.name],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.ping, timeout=10, what="redis-server to answer")

    def ping(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def cli(self, *args, last_arg=None):
        """Runs one command through redis-cli (`last_arg` goes through stdin: it may be large)."""
        extra = ["-x"] if last_arg is not None else []
        return subprocess.run(["redis-cli", "-p", str(self.port), *extra, *args], input=last_arg,
                              capture_output=True, text=True, timeout=10).stdout.strip()

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        self.kill()
        self.dir.cleanup()
