"""The alerts and the Grafana dashboard against live metrics.

`promtool check rules` and `promtool test rules` (deploy/prometheus/rules_test.yaml: a firing and
a quiet case per alert) pass. Then a real Prometheus (Debian's) scrapes a coordinator and two
worker processes serving a MoE fixture with an expert worker (so per-stage and per-expert series
exist), with deploy/prometheus/scrape.yaml's jobs pointed at them; after some traffic every
PromQL expression of deploy/grafana/fucina.json and of the rules evaluates without error and
returns series.

Reuses cluster_cli_test's process and gRPC helpers (same environment: FUCINA_BIN,
FUCINA_QWEN3_TOKENIZER; Debian's python3-grpcio, python3-yaml).
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cluster"))
import cluster_cli_test as cc  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RULES = os.path.join(ROOT, "deploy", "prometheus", "rules.yaml")
SCRAPE = os.path.join(ROOT, "deploy", "prometheus", "scrape.yaml")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "fucina.json")
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
SCRAPE_S = 1  # seconds between scrapes here


def setUpModule():
    cc.setUpModule()


def tearDownModule():
    cc.tearDownModule()


def dashboard_exprs():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    exprs = []
    for panel in dash["panels"]:
        for target in panel["targets"]:
            # Grafana's variables: every model.
            exprs.append((panel["title"], target["expr"].replace("$model", ".*")))
    return exprs


def rule_exprs():
    with open(RULES) as f:
        rules = yaml.safe_load(f)
    return [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RulesTest(unittest.TestCase):
    @unittest.skipUnless(PROMTOOL, "promtool not installed")
    def test_promtool_checks_and_unit_tests_pass(self):
        for args in (["check", "rules", RULES],
                     ["test", "rules", os.path.join(os.path.dirname(RULES), "rules_test.yaml")]):
            p = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_every_panel_has_queries(self):
        with open(DASHBOARD) as f:
            dash = json.load(f)
        self.assertGreaterEqual(len(dash["panels"]), 12)
        for panel in dash["panels"]:
            self.assertTrue(panel["targets"], panel["title"])
            for t in panel["targets"]:
                self.assertTrue(t["expr"].strip(), panel["title"])


@unittest.skipUnless(PROMETHEUS and cc.HAVE_TOKENIZER, "prometheus or the tokenizer missing")
class LiveMetricsTest(cc.ClusterTestCase):
    def test_every_dashboard_and_alert_query_returns_series(self):
        c = self.cluster()
        c.coordinator(cc.fixture("moe"), "--expert-workers", "1", "--spec")
        workers = [c.worker(), c.worker()]
        self.wait_ready(c, 1, experts=1)
        for i in range(6):
            self.generate(c, cc.greedy(f"{cc.PROMPT} {i} {i} {i}", 8))

        # The scrape jobs of deploy/prometheus/scrape.yaml, aimed at these processes.
        with open(SCRAPE) as f:
            config = yaml.safe_load(f)
        config["global"]["scrape_interval"] = f"{SCRAPE_S}s"
        config["global"]["evaluation_interval"] = f"{SCRAPE_S}s"
        config["rule_files"] = [RULES]
        jobs = {j["job_name"]: j for j in config["scrape_configs"]}
        jobs["fucina-coordinator"]["static_configs"] = [{"targets": [c.front.metrics]}]
        jobs["fucina-worker"]["static_configs"] = [{"targets": [w.metrics for w in workers]}]
        tmp = tempfile.mkdtemp(dir=cc.TMP.name)
        path = os.path.join(tmp, "prometheus.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        port = free_port()
        log = open(os.path.join(tmp, "prometheus.log"), "w")
        prom = subprocess.Popen([PROMETHEUS, f"--config.file={path}",
                                 f"--storage.tsdb.path={os.path.join(tmp, 'data')}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}/api/v1/query?query="

            def query(expr):
                with urllib.request.urlopen(base + urllib.parse.quote(expr), timeout=10) as r:
                    return json.load(r)

            # Every target up and scraped a few times, with traffic between the scrapes.
            deadline = time.monotonic() + 60
            while True:
                try:
                    up = query('count(up{job=~"fucina.*"} == 1)')["data"]["result"]
                    samples = query('count_over_time(up{job="fucina-coordinator"}[1m])')
                    n = samples["data"]["result"]
                    if up and int(up[0]["value"][1]) == 3 and n and int(n[0]["value"][1]) >= 4:
                        break
                except OSError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    with open(log.name) as f:
                        self.fail(f"targets not scraped within 60 s\n{f.read()[-2000:]}")
                self.generate(c, cc.greedy(cc.PROMPT, 4))
                time.sleep(SCRAPE_S)
            for name, expr in dashboard_exprs() + rule_exprs():
                with self.subTest(query=name):
                    # An alert's comparison as `bool`: every series, firing or not.
                    r = query(re.sub(r" (>|==) ", r" \1 bool ", expr))
                    self.assertEqual(r["status"], "success", f"{name}: {expr}")
                    self.assertTrue(r["data"]["result"], f"{name}: no series for {expr}")
        finally:
            prom.terminate()
            prom.wait(timeout=30)
            log.close()


if __name__ == "__main__":
    unittest.main()
