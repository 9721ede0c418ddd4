"""Smoke test of `fucina bench es`: on a tiny random-weight fixture, one short pass prints every
section, writes its figures to --json, exits 0 and leaves none of its processes behind.

Environment: FUCINA_BIN (the fucina binary). Needs nothing else: the fixture has a byte
tokenizer, the tasks are written here, and the bench starts its own processes on ephemeral
ports.
"""
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_aggregate_cli_test import processes_with  # noqa: E402

BIN = os.environ.get("FUCINA_BIN", "")


@unittest.skipUnless(BIN, "FUCINA_BIN not set")
class BenchEsTest(unittest.TestCase):
    def test_short_run_prints_every_section_and_leaves_no_process(self):
        with tempfile.TemporaryDirectory(prefix="fucina-bench-es-test-") as tmp:
            model = os.path.join(tmp, "tiny.gguf")
            # 2 layers: the 2-worker configuration needs a layer per stage.
            subprocess.run([BIN, "gguf", "make-fixture", model, "--arch", "qwen3", "--layers", "2",
                            "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim",
                            "16", "--ffn", "128", "--seed", "3"],
                           check=True, capture_output=True, timeout=60)
            data = os.path.join(tmp, "tasks.jsonl")
            with open(data, "w") as f:
                f.write('{"prompt": "ab", "answer": "c"}\n{"prompt": "de", "answer": "f"}\n')
            figures = os.path.join(tmp, "figures.json")
            marker = "FUCINA_BENCH_TEST_MARKER=" + secrets.token_hex(8)
            env = dict(os.environ)
            env[marker.split("=")[0]] = marker.split("=")[1]
            env.pop("FUCINA_API_KEY", None)
            start = time.monotonic()
            proc = subprocess.run(
                [BIN, "bench", "es", model, "--data", data, "--population", "2",
                 "--iterations", "1", "--timeout", "30", "--json", figures],
                capture_output=True, text=True, timeout=50, env=env)
            elapsed = time.monotonic() - start
            out = proc.stdout
            self.assertEqual(proc.returncode, 0, f"stdout:\n{out}\nstderr:\n{proc.stderr}")
            self.assertEqual(processes_with(marker), [], "bench children outlived it")
            with open(figures) as f:
                figs = json.load(f)
        self.assertLess(elapsed, 20, out)
        self.assertNotIn("failed", out)
        self.assertRegex(out, r"(?m)^members/s = members evaluated / evaluate seconds")
        self.assertRegex(out, r"(?m)^  ceiling: 2 x train es --workers 1 --threads 1 +[0-9.]+ ")
        for name, workers in (("coordinator \\+ 1 worker x 1 thread", 1),
                              ("coordinator \\+ 2 workers x 1 thread", 2)):
            self.assertRegex(out, rf"(?m)^  {name} +[0-9.]+ +([0-9.]+%|n/a) +{workers} "
                                  r"+generation 1$")
        # One job from one seed: the embedded runs and the cluster runs end alike.
        self.assertRegex(out, r"(?m)^  final checksums agree ")
        self.assertRegex(out, r"(?m)^  evaluate [0-9.]+ s, update [0-9.]+ s, communicate "
                              r"[0-9.]+ s \(part of both\); total [0-9.]+ s")
        self.assertEqual(figs["coordinator_2_workers"]["generations"][0]["workers"], 2)
        self.assertGreater(figs["coordinator_2_workers"]["members_per_second"], 0)
        self.assertIn("evaluate_seconds", figs["time_split_2_workers"])
        # The bytes follow the population, not the parameter count.
        rows = figs["bytes_per_generation"]
        self.assertEqual([r["parameters"] for r in rows],
                         ["full: one attn_v tensor", "full: every attn_q, attn_v, ffn_down",
                          "lora: q,v rank 8"])
        self.assertGreater(rows[1]["values"], 10 * rows[0]["values"])
        totals = [r["bytes"] for r in rows]
        self.assertGreater(min(totals), 0)
        self.assertLess(max(totals) - min(totals), 0.05 * min(totals), totals)
        for r in rows:
            self.assertRegex(out, rf"(?m)^  {r['parameters']} +{r['values']} +[0-9]+ +[0-9]+ "
                                  r"+[0-9]+$")

    def test_odd_population_is_a_usage_error(self):
        proc = subprocess.run([BIN, "bench", "es", "missing.gguf", "--population", "3"],
                              capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("--population must be even", proc.stderr)


if __name__ == "__main__":
    unittest.main()
