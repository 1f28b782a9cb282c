#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""sluiced's gRPC port as other gRPC stacks call it: Python's grpcio (Debian's python3-grpcio, on
gRPC core) and rls_load, an nghttp2 client that frames calls as Envoy's own `envoy_grpc` client does.
The messages come from the project's .proto files, compiled here by protoc into a temporary
directory. Each call asserts what a caller relies on: the answer, the status code of what the
server refuses (an unknown method, a compressed message, one over the size limit), health
checking, and deadlines.

Usage: SLUICED=/path/to/sluiced RLS_LOAD=/path/to/rls_load PROTO_DIR=src/envoy/proto \\
       /usr/bin/python3 sluiced_grpc_interop_test.py
"""

import glob
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluiced_harness import Sluiced  # noqa: E402

import grpc  # noqa: E402  (python3-grpcio)

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
HEALTH = "/grpc.health.v1.Health/Check"
DOMAIN_YAML = """domain: edge
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: bulk
    rate_limit: {unit: day, requests_per_unit: 1000000000}
"""


def compile_protos(out_dir):
    """The project's protos as Python modules in `out_dir` (protoc's --python_out)."""
    proto_dir = os.environ["PROTO_DIR"]
    files = [os.path.relpath(p, proto_dir) for p in glob.glob(os.path.join(proto_dir, "**", "*.proto"), recursive=True)]
    subprocess.run(["protoc", "-I", proto_dir, "--python_out", out_dir, *files], check=True)
    sys.path.insert(0, out_dir)
    from envoy.service.ratelimit.v3 import rls_pb2  # noqa: E402
    return rls_pb2


def should_rate_limit(channel, rls):
    """ShouldRateLimit on `channel`, with the messages of `rls` (compile_protos)."""
    return channel.unary_unary(METHOD, request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=rls.RateLimitResponse.FromString)


class GrpcInteropTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.protos = tempfile.TemporaryDirectory(prefix="sluice-protos-")
        cls.rls = compile_protos(cls.protos.name)
        cls.yaml_dir = tempfile.TemporaryDirectory(prefix="sluiced-envoy-")
        with open(os.path.join(cls.yaml_dir.name, "edge.yaml"), "w") as f:
            f.write(DOMAIN_YAML)
        cls.s = Sluiced('[server]\nthreads = 2\ngrpc_listen = "127.0.0.1:0"\n[envoy]\nconfig_dir = "%s"\n'
                        % cls.yaml_dir.name)
        cls.target = "127.0.0.1:%d" % cls.s.grpc_port()
        cls.channel = grpc.insecure_channel(cls.target)
        cls.should_rate_limit = should_rate_limit(cls.channel, cls.rls)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        code = cls.s.stop()
        log = cls.s.log_text()
        cls.s.dir.cleanup()
        cls.yaml_dir.cleanup()
        cls.protos.cleanup()
        assert code == 0, "sluiced did not exit cleanly:\n" + log[-4000:]

    def request(self, user, hits=0, padding=""):
        req = self.rls.RateLimitRequest(domain="edge", hits_addend=hits)
        d = req.descriptors.add()
        e = d.entries.add()
        e.key, e.value = "user", user
        if padding:
            e2 = d.entries.add()
            e2.key, e2.value = "padding", padding
        return req

    def test_grpcio_counts_and_refuses(self):
        OK, OVER = self.rls.RateLimitResponse.OK, self.rls.RateLimitResponse.OVER_LIMIT
        first = self.should_rate_limit(self.request("grpcio"), timeout=10)
        self.assertEqual(first.overall_code, OK)
        self.assertEqual(first.statuses[0].limit_remaining, 1)
        self.assertEqual(first.statuses[0].current_limit.requests_per_unit, 2)
        self.assertGreater(first.statuses[0].duration_until_reset.seconds, 0)
        self.assertEqual(self.should_rate_limit(self.request("grpcio"), timeout=10).statuses[0].limit_remaining, 0)
        over = self.should_rate_limit(self.request("grpcio"), timeout=10)
        self.assertEqual(over.overall_code, OVER)
        self.assertEqual(over.statuses[0].code, OVER)

    def test_grpcio_gets_the_status_codes_of_what_is_refused(self):
        def code_of(call):
            with self.assertRaises(grpc.RpcError) as caught:
                call()
            return caught.exception.code()

        # An empty domain is the caller's error.
        bad = self.rls.RateLimitRequest(domain="")
        bad.descriptors.add().entries.add(key="user", value="x")
        self.assertEqual(code_of(lambda: self.should_rate_limit(bad, timeout=10)), grpc.StatusCode.INVALID_ARGUMENT)
        # A method the server does not have.
        other = self.channel.unary_unary("/envoy.service.ratelimit.v3.RateLimitService/Other",
                                         request_serializer=lambda m: m, response_deserializer=lambda b: b)
        self.assertEqual(code_of(lambda: other(b"", timeout=10)), grpc.StatusCode.UNIMPLEMENTED)
        # A compressed message: sluiced reads only identity.
        self.assertEqual(code_of(lambda: self.should_rate_limit(self.request("gzip"), timeout=10,
                                                                compression=grpc.Compression.Gzip)),
                         grpc.StatusCode.UNIMPLEMENTED)
        # A message over grpc_max_message_bytes (64 KiB).
        self.assertEqual(code_of(lambda: self.should_rate_limit(self.request("big", padding="x" * 70000), timeout=10)),
                         grpc.StatusCode.RESOURCE_EXHAUSTED)
        # None of them counted.
        self.assertEqual(self.should_rate_limit(self.request("gzip"), timeout=10).statuses[0].limit_remaining, 1)

    def test_grpcio_health_check_says_serving(self):
        check = self.channel.unary_unary(HEALTH, request_serializer=lambda m: m, response_deserializer=lambda b: b)
        # HealthCheckRequest{service: ""} is empty; HealthCheckResponse{status: SERVING} is field 1 = 1.
        self.assertEqual(check(b"", timeout=10), b"\x08\x01")
        service = b"\x0a" + bytes([len("envoy.service.ratelimit.v3.RateLimitService")]) + \
            b"envoy.service.ratelimit.v3.RateLimitService"
        self.assertEqual(check(service, timeout=10), b"\x08\x01")

    def test_grpcio_deadline_is_sent_and_a_short_one_is_met(self):
        # grpcio sends grpc-timeout; sluiced answers well within a second.
        answer = self.should_rate_limit(self.request("deadline"), timeout=1.0)
        self.assertEqual(answer.overall_code, self.rls.RateLimitResponse.OK)

    def test_an_nghttp2_client_framed_as_envoy_is_answered(self):
        out = subprocess.run([os.environ["RLS_LOAD"], "--target", self.target, "--domain", "edge", "--key", "bulk",
                              "--seconds", "1", "--in-flight", "8", "--threads", "1", "--values", "100"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        m = re.search(r"calls=(\d+) .* over_limit=(\d+) failed=(\d+)", out.stdout)
        self.assertIsNotNone(m, out.stdout)
        self.assertGreater(int(m.group(1)), 0, out.stdout)
        self.assertEqual((m.group(2), m.group(3)), ("0", "0"), out.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
