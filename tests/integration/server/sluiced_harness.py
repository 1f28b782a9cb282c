# SPDX-License-Identifier: Apache-2.0
"""Starts the real sluiced (and redis-server) for end-to-end tests; standard library only.

Each process is started on 127.0.0.1 with port 0 (sluiced) or a free port (redis-server), in a
temporary directory, and is ended by its PID only.
"""

import copy
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
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


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


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
        # Text logs or JSON ones ([log] format).
        m = re.search(r'event=listening address=127\.0\.0\.1:(\d+)|"event":"listening","address":"127\.0\.0\.1:(\d+)"',
                      self.log_text())
        return (m.group(1) or m.group(2)) if m else None

    def grpc_port(self):
        """The port of the gRPC server ([server] grpc_listen), once its log says it listens."""
        m = wait_for(lambda: re.search(r"event=grpc_listening address=\S+ port=(\d+)", self.log_text()),
                     what="the gRPC port")
        return int(m.group(1))

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

    def reset(self, token, **fields):
        """POST /v1/reset with `token` as its bearer (None: no Authorization header)."""
        headers = {"Authorization": "Bearer " + token} if token is not None else {}
        return self.request("POST", "/v1/reset", fields, headers=headers)

    def client(self):
        """A second connection to this sluiced, for another thread (request() is not thread-safe)."""
        other = copy.copy(self)
        other.conn = None
        return other

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


class ServerProcess:
    """A server this test started (`proc`) in its own temporary directory (`dir`): killed by its PID
    and its directory removed, nothing else."""

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        self.kill()
        self.dir.cleanup()


class RedisServer(ServerProcess):
    """A throwaway redis-server on a free loopback port; `extra` goes on its command line, after the
    config file `config` when given (a sentinel needs one it can rewrite)."""

    def __init__(self, port=None, extra=(), config=None):
        self.dir = tempfile.TemporaryDirectory(prefix="sluice-redis-")
        self.config_file = []
        if config is not None:
            self.config_file = [os.path.join(self.dir.name, "redis.conf")]
            with open(self.config_file[0], "w") as f:
                f.write(config)
        self.fixed_port = port is not None  # or, after the first start, the one it runs on
        self.port = port or free_port()
        self.extra = list(extra)
        self.proc = None
        self.start()

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def start(self):
        for _ in range(5):
            self.proc = subprocess.Popen(
                ["redis-server", *self.config_file, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", self.dir.name, *self.extra],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # It exits at once when another process took the port since free_port() chose it.
            wait_for(lambda: self.ping() or self.proc.poll() is not None, timeout=30, what="redis-server to answer")
            if self.proc.poll() is None:
                self.fixed_port = True  # a restart comes back on the same port
                return
            if self.fixed_port:
                break
            self.port = free_port()
        raise AssertionError("redis-server did not start on port %d" % self.port)

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



class RedisCluster:
    """A throwaway Redis Cluster: 3 masters and 3 replicas on loopback (each node's bus port, port +
    10000, free too), joined by `redis-cli --cluster create` and healthy: every node says
    cluster_state:ok and every replica's link to its master is up."""

    NODE_TIMEOUT_MS = 1000

    def __init__(self, extra=()):
        self.nodes = []
        try:
            while len(self.nodes) < 6:
                port = free_port()
                if port + 10000 > 65535 or not port_free(port + 10000):
                    continue
                self.nodes.append(RedisServer(port, extra=[
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(self.NODE_TIMEOUT_MS), "--cluster-replica-validity-factor", "0",
                    *extra]))
            subprocess.run(["redis-cli", "--cluster", "create", *[n.address for n in self.nodes],
                            "--cluster-replicas", "1", "--cluster-yes"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
            self.wait_healthy()
        except BaseException:
            self.close()
            raise

    @property
    def seeds(self):
        return [n.address for n in self.nodes]

    def alive(self):
        return [n for n in self.nodes if n.proc.poll() is None]

    def masters(self):
        return [n for n in self.alive() if "role:master" in n.cli("INFO", "replication")]

    def replica_of(self, master):
        for n in self.alive():
            if n is not master and ("master_port:%d" % master.port) in n.cli("INFO", "replication"):
                return n
        raise AssertionError("no replica of " + master.address)

    def master_of_key(self, key):
        slot = int(self.alive()[0].cli("CLUSTER", "KEYSLOT", key))
        for line in self.alive()[0].cli("CLUSTER", "NODES").splitlines():
            fields = line.split()
            if "master" not in fields[2] or "fail" in fields[2]:
                continue
            for r in fields[8:]:
                lo, _, hi = r.partition("-")
                if r[0] != "[" and int(lo) <= slot <= int(hi or lo):
                    port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
                    return next(n for n in self.nodes if n.port == port)
        raise AssertionError("no master for slot %d" % slot)

    def healthy(self):
        for n in self.alive():
            if "cluster_state:ok" not in n.cli("CLUSTER", "INFO"):
                return False
            repl = n.cli("INFO", "replication")
            if "role:slave" in repl and "master_link_status:up" not in repl:
                return False
        return True

    def wait_healthy(self):
        wait_for(self.healthy, timeout=60, what="the Redis Cluster to be healthy")

    def close(self):
        for n in self.nodes:
            n.close()


class RedisSentinelGroup:
    """A throwaway Sentinel group on loopback: a master, two replicas (in sync) and three sentinels
    watching it as MASTER_NAME with a quorum of two, which know each other and the replicas."""

    MASTER_NAME = "mymaster"

    def __init__(self):
        self.servers, self.sentinels = [], []
        try:
            sync_now = ["--repl-diskless-sync-delay", "0"]
            self.servers.append(RedisServer(extra=sync_now))
            for _ in range(2):
                self.servers.append(RedisServer(extra=sync_now + ["--replicaof", "127.0.0.1",
                                                                  str(self.servers[0].port)]))
            for r in self.servers[1:]:
                wait_for(lambda: "master_link_status:up" in r.cli("INFO", "replication"), timeout=30,
                         what="a replica to sync")
            config = ("sentinel monitor %s 127.0.0.1 %d 2\nsentinel down-after-milliseconds %s 1000\n"
                      "sentinel failover-timeout %s 10000\n"
                      % (self.MASTER_NAME, self.servers[0].port, self.MASTER_NAME, self.MASTER_NAME))
            for _ in range(3):
                self.sentinels.append(RedisServer(extra=["--sentinel"], config=config))
            for s in self.sentinels:
                wait_for(lambda: self._knows_all(s), timeout=30, what="the sentinels to find each other")
        except BaseException:
            self.close()
            raise

    def _knows_all(self, sentinel):
        fields = sentinel.cli("SENTINEL", "MASTER", self.MASTER_NAME).splitlines()
        info = dict(zip(fields[::2], fields[1::2]))
        return info.get("num-other-sentinels") == "2" and info.get("num-slaves") == "2"

    @property
    def sentinel_addresses(self):
        return [s.address for s in self.sentinels]

    def master(self):
        """The server the first sentinel names as master."""
        port = int(self.sentinels[0].cli("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.MASTER_NAME).split()[1])
        return next(s for s in self.servers if s.port == port)

    def close(self):
        for n in self.sentinels + self.servers:
            n.close()


class EtcdServer(ServerProcess):
    """A throwaway single-member etcd on free loopback ports (client and peer), in a temporary data
    directory; `kill` and `start` keep the ports and the data. With `tls=True` it serves TLS with a
    CA and certificates made here (`ca`, `cert`, `key` are the client's files)."""

    def __init__(self, tls=False):
        self.dir = tempfile.TemporaryDirectory(prefix="sluice-etcd-")
        self.port = free_port()
        self.peer_port = free_port()
        self.tls = tls
        self.user = None
        self.proc = None
        if tls:
            self._make_certs()
        self.start()

    @property
    def endpoint(self):
        return "127.0.0.1:%d" % self.port

    def _make_certs(self):
        d = self.dir.name
        self.ca, self.cert, self.key = (os.path.join(d, n) for n in ("ca.pem", "client.pem", "client-key.pem"))

        def openssl(*args):
            subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=sluice-test-ca",
                "-keyout", os.path.join(d, "ca-key.pem"), "-out", self.ca)
        ext = os.path.join(d, "san.ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
        for name in ("server", "client"):
            key, csr, pem = (os.path.join(d, name + s) for s in ("-key.pem", ".csr", ".pem"))
            openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + name, "-keyout", key, "-out", csr)
            openssl("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", os.path.join(d, "ca-key.pem"),
                    "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", pem)

    def start(self):
        scheme = "https" if self.tls else "http"
        client_url = "%s://127.0.0.1:%d" % (scheme, self.port)
        peer_url = "http://127.0.0.1:%d" % self.peer_port
        args = ["etcd", "--name", "t", "--data-dir", os.path.join(self.dir.name, "data"),
                "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", "t=" + peer_url, "--log-level", "error"]
        if self.tls:
            d = self.dir.name
            args += ["--cert-file", os.path.join(d, "server.pem"), "--key-file", os.path.join(d, "server-key.pem"),
                     "--trusted-ca-file", self.ca, "--client-cert-auth"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.healthy, timeout=20, what="etcd to answer")

    def ctl(self, *args, check=True):
        cmd = ["etcdctl", "--endpoints", self.endpoint, "--dial-timeout", "2s", "--command-timeout", "5s"]
        if self.tls:
            cmd += ["--cacert", self.ca, "--cert", self.cert, "--key", self.key]
        if self.user:
            cmd += ["--user", self.user]
        r = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, ETCDCTL_API="3"))
        if check and r.returncode != 0:
            raise AssertionError("etcdctl %s: %s" % (" ".join(args), r.stderr.strip()))
        return r.stdout.strip()

    def healthy(self):
        return self.proc.poll() is None and subprocess.run(
            ["etcdctl", "--endpoints", self.endpoint, "--dial-timeout", "1s", "endpoint", "health"] +
            (["--cacert", self.ca, "--cert", self.cert, "--key", self.key] if self.tls else []),
            capture_output=True, timeout=10, env=dict(os.environ, ETCDCTL_API="3")).returncode == 0

    def put(self, key, value):
        """Returns the revision of the put."""
        out = self.ctl("put", key, value, "-w", "json")
        return json.loads(out)["header"]["revision"]

    def delete(self, key):
        self.ctl("del", key)

    def enable_auth(self, password):
        self.ctl("user", "add", "root:" + password)
        self.ctl("auth", "enable")
        self.user = "root:" + password



class TcpProxy:
    """A loopback TCP proxy to `port` that a test can cut (every connection closed, none accepted)
    and restore on the same port: a network between a client and a server that goes away."""

    def __init__(self, port):
        self.target = port
        self.port = free_port()
        self.conns = []
        self.lock = threading.Lock()
        self.listener = None
        self.restore()

    def restore(self):
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        wait_for(lambda: self._bind(), timeout=10, what="the proxy's port free again")
        self.listener.listen(64)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _bind(self):
        try:
            self.listener.bind(("127.0.0.1", self.port))
            return True
        except OSError:
            return False

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread, which lets go of it
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self):
        self.cut()
