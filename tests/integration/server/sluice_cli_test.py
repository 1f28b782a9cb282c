# SPDX-License-Identifier: Apache-2.0
"""The sluice CLI as a user runs it: simulate (table, SVG), config check, and check/rules against a
running sluiced."""

import json
import os
import shlex
import struct
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluiced_harness import Sluiced  # noqa: E402

CLI = os.environ.get("SLUICE_CLI", "sluice")
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
EXAMPLE = os.path.join(SOURCE, "examples", "sluice.toml")
SVG = "{http://www.w3.org/2000/svg}"


def series(root, name):
    return [e for e in root.iter() if e.get("data-series") == name]


def readme_chart_commands():
    """The README's `sluice simulate ... --svg docs/X.svg` commands, as argument lists."""
    with open(os.path.join(SOURCE, "README.md")) as f:
        text = f.read().replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith("./build/tools/sluice simulate") and "--svg docs/" in line:
            yield shlex.split(line)[1:]


def run(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60)


class Cli(unittest.TestCase):
    def test_simulate_prints_the_2n_pitfall_and_draws_it(self):
        with tempfile.TemporaryDirectory() as d:
            svg = os.path.join(d, "c.svg")
            r = run("simulate", "--algorithm", "token_bucket", "--rate", "1.6667", "--burst", "100",
                    "--rule", EXAMPLE + ":ai", "--pattern", "10/s from 0s to 60s", "--svg", svg)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("most admitted in any 60s: 199", r.stdout)
            self.assertIn("most admitted in any 60s: 100", r.stdout)
            root = ET.parse(svg).getroot()  # well-formed
            for name in ("in_window", "admitted", "remaining", "limit"):
                self.assertEqual(sorted(e.get("data-policy") for e in series(root, name)), ["0", "1"], name)
            for e in series(root, "admitted"):
                self.assertGreater(e.get("d").count(" H"), 50, "one step per second")

    def test_the_readme_charts_are_what_their_commands_draw(self):
        commands = list(readme_chart_commands())
        self.assertEqual(len(commands), 2)
        for args in commands:
            chart = args[args.index("--svg") + 1]
            with tempfile.TemporaryDirectory() as d:
                drawn = os.path.join(d, "chart.svg")
                args = [a.replace("examples/", os.path.join(SOURCE, "examples") + "/") for a in args]
                args[args.index("--svg") + 1] = drawn
                r = run(*args)
                self.assertEqual(r.returncode, 0, r.stderr)
                with open(drawn) as f:
                    new = f.read()
            committed = os.path.join(SOURCE, chart)
            if os.environ.get("SLUICE_UPDATE_CHARTS") == "1":
                with open(committed, "w") as f:
                    f.write(new)
            with open(committed) as f:
                self.assertEqual(f.read(), new, "%s is not what its README command draws" % chart)

    def test_png_is_rendered_and_not_blank(self):
        with tempfile.TemporaryDirectory() as d:
            png = os.path.join(d, "c.png")
            csv = os.path.join(d, "log.csv")
            with open(csv, "w") as f:
                f.write("time,key\n" + "".join("%.1f,user:%d\n" % (1700000000 + i / 10, i % 3) for i in range(600)))
            r = run("simulate", "--algorithm", "fixed_window", "--limit", "50", "--window", "60s",
                    "--rule", EXAMPLE + ":api", "--csv", csv, "--png", png)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("total       600", r.stdout)
            with open(png, "rb") as f:
                data = f.read()
            self.assertEqual(data[:8], b"\x89PNG\r\n\x1a\n")
            width, height = struct.unpack(">II", data[16:24])
            self.assertEqual(width, 960)
            self.assertLess(height, 700, "one chart for every policy")
            pixels, at = b"", 8
            while at < len(data):
                length, kind = struct.unpack(">I4s", data[at:at + 8])
                if kind == b"IDAT":
                    pixels += data[at + 8:at + 8 + length]
                at += 12 + length
            raw = zlib.decompress(pixels)
            self.assertGreater(len(set(raw)), 8, "drawn, not blank")
            empty = os.path.join(d, "empty.csv")
            open(empty, "w").close()
            bad = run("simulate", "--algorithm", "fixed_window", "--limit", "1", "--window", "1s", "--csv", empty)
            self.assertEqual(bad.returncode, 2)
            self.assertIn("no rows", bad.stderr)

    def test_replay_against_sluiced_beside_the_prediction(self):
        s = Sluiced('[[rules]]\nname = "api"\nalgorithm = "fixed_window"\nlimit = 5\nwindow = "1h"\n')
        self.addCleanup(s.close)
        with tempfile.TemporaryDirectory() as d:
            svg = os.path.join(d, "c.svg")
            r = run("simulate", "--rule", s.config_path + ":api", "--pattern", "burst 3 at 0s; 10/s from 100ms to 600ms",
                    "--url", "http://127.0.0.1:%d" % s.port, "--step", "100ms", "--svg", svg)
            self.assertEqual(r.returncode, 0, r.stderr)
            predicted, observed = r.stdout.split("\n\n")[:2]
            self.assertIn("fixed_window limit=5 window=3600s", predicted)
            self.assertIn("(observed)", observed)
            for table in (predicted, observed):
                self.assertIn("     total         8         5         3", table)
            root = ET.parse(svg).getroot()
            self.assertEqual(sorted(e.get("data-policy") for e in series(root, "admitted")), ["0", "1"])
            self.assertIn("replaying on keys simulate-", r.stdout)
            # A rerun has keys of its own: it does not start with the last run's debt.
            again = run("simulate", "--rule", s.config_path + ":api", "--pattern", "burst 3 at 0s",
                        "--url", "http://127.0.0.1:%d" % s.port)
            self.assertEqual(again.returncode, 0, again.stderr)
            self.assertIn("     total         3         3         0", again.stdout.split("\n\n")[1])
        # Bounded: no more than two minutes of traffic is paced against a service.
        r = run("simulate", "--rule", s.config_path + ":api", "--pattern", "burst 1 at 10m", "--url",
                "http://127.0.0.1:%d" % s.port)
        self.assertEqual(r.returncode, 2)
        self.assertIn("at most 120 s", r.stderr)

    def test_bad_pattern_and_config_are_refused_with_where(self):
        r = run("simulate", "--algorithm", "fixed_window", "--limit", "1", "--window", "1s", "--pattern",
                "burst 1\nidle soon")
        self.assertEqual(r.returncode, 2)
        self.assertIn("2:6: expected a time", r.stderr)
        policy = ("simulate", "--algorithm", "fixed_window", "--limit", "1", "--window", "1s", "--pattern", "burst 1")
        for zoom, message in ((("--from", "soon"), "--from must be a time like 50s"),
                              (("--to", "-3s"), "--to must be a time like 50s"),
                              (("--from", "20s", "--to", "10s"), "--to must be after --from")):
            r = run(*policy, *zoom, "--svg", os.devnull)
            self.assertEqual(r.returncode, 2, zoom)
            self.assertIn(message, r.stderr)
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
            f.write("[[rules]]\nname = \"x\"\n")
            f.flush()
            r = run("config", "check", f.name)
            self.assertEqual(r.returncode, 1)
            self.assertIn(":1:1: [[rules]] is missing 'algorithm'", r.stderr)
        r = run("config", "check", EXAMPLE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ok (6 rules, 2 overrides, backend memory)", r.stdout)

    def test_files_that_are_not_regular_files_are_refused_at_once(self):
        policy = ("simulate", "--algorithm", "fixed_window", "--limit", "1", "--window", "1s")
        with tempfile.TemporaryDirectory() as d:
            fifo = os.path.join(d, "fifo")
            os.mkfifo(fifo)  # no writer: reading it would wait for ever
            for args, code, message in (
                    (("config", "check", "/dev/zero"), 1, "/dev/zero: not a regular file"),
                    (("config", "check", fifo), 1, fifo + ": not a regular file"),
                    (("config", "check", d), 1, d + ": is a directory, not a file"),
                    (("simulate", "--rule", fifo + ":api", "--pattern", "burst 1"), 2, fifo + ": not a regular file"),
                    (policy + ("--csv", "/dev/zero"), 2, "/dev/zero: not a regular file"),
                    (policy + ("--csv", fifo), 2, fifo + ": not a regular file"),
                    (policy + ("--traffic", "/dev/zero"), 2, "/dev/zero: not a regular file"),
                    (policy + ("--traffic", d), 2, d + ": is a directory, not a file"),
                    (policy + ("--csv", os.path.join(d, "missing.csv")), 2, "missing.csv: cannot open the file")):
                r = run(*args)
                self.assertEqual(r.returncode, code, args)
                self.assertIn(message, r.stderr, args)

    def test_check_and_rules_against_sluiced(self):
        s = Sluiced('[[rules]]\nname = "api"\nalgorithm = "fixed_window"\nlimit = 1\nwindow = "1h"\n'
                    '[[rules]]\nname = "monthly"\nalgorithm = "fixed_window"\nlimit = 9\nwindow = "calendar_month"\n'
                    'shadow = true\n'
                    '[[overrides]]\nrule = "api"\nkey = "vip"\nlimit = 50\n')
        self.addCleanup(s.close)
        url = "http://127.0.0.1:%d" % s.port
        first = run("check", "--url", url, "--rule", "api", "--key", "user:42")
        self.assertEqual(first.returncode, 0, first.stderr)
        self.assertTrue(first.stdout.startswith("200 "), first.stdout)
        second = run("check", "--url", url, "--rule", "api", "--key", "user:42")
        self.assertTrue(second.stdout.startswith("429 "), second.stdout)
        self.assertIn('"allowed":false', second.stdout)
        self.assertEqual(second.returncode, 1, "refused")
        unknown = run("check", "--url", url, "--rule", "nope", "--key", "user:42")
        self.assertTrue(unknown.stdout.startswith("404 "), unknown.stdout)
        self.assertEqual(unknown.returncode, 3, "the request refused")
        rules = run("rules", "--url", url)
        self.assertEqual(rules.returncode, 0)
        lines = rules.stdout.splitlines()
        self.assertEqual(lines[0].split(), ["RULE", "ALGORITHM", "LIMIT", "WINDOW", "SOURCE", "NOTES"])
        self.assertEqual(lines[1].split(), ["api", "fixed_window", "1", "3600s", "file"])
        self.assertEqual(lines[2].split(), ["monthly", "fixed_window", "9", "calendar_month", "file", "shadow"])
        self.assertEqual(lines[4].split(), ["OVERRIDE", "OF", "FOR", "LIMIT", "SOURCE"])
        self.assertEqual(lines[5].split()[:5], ["api", "key", "vip", "limit", "50"])
        self.assertEqual(lines[1].index("fixed_window"), lines[0].index("ALGORITHM"), "columns line up")
        as_json = run("rules", "--url", url, "--json")
        self.assertTrue(as_json.stdout.startswith("200 "), as_json.stdout)
        body = json.loads(as_json.stdout[4:])
        self.assertEqual(body["overrides"], 1)
        self.assertEqual(body["override_list"][0]["key"], "vip")
        down = run("check", "--url", "http://127.0.0.1:1", "--key", "k")
        self.assertEqual(down.returncode, 2)
        self.assertIn("cannot reach", down.stderr)

    def test_version_and_help_name_the_exit_codes(self):
        version = run("--version")
        self.assertEqual(version.returncode, 0)
        self.assertRegex(version.stdout, r"^sluice \d+\.\d+\.\d+\n$")
        self.assertIn("Exit codes: 0 done (check: admitted), 1 check: refused", run("--help").stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
