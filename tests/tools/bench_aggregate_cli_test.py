"""Smoke test of `fucina bench cluster-aggregate`: on a tiny random-weight fixture, one short
pass prints every section, exits 0 and leaves none of its server processes behind.

Environment: FUCINA_BIN (the fucina binary). Needs nothing else: the fixture has a byte
tokenizer, and the bench starts its own processes on ephemeral ports.
"""
import os
import re
import secrets
import subprocess
import tempfile
import time
import unittest

BIN = os.environ.get("FUCINA_BIN", "")


def processes_with(marker):
    """Pids whose environment holds `marker` (the bench's children inherit it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:  # gone, or not ours to read
            pass
    return found


@unittest.skipUnless(BIN, "FUCINA_BIN not set")
class BenchAggregateTest(unittest.TestCase):
    def test_short_run_prints_every_section_and_leaves_no_process(self):
        with tempfile.TemporaryDirectory(prefix="fucina-bench-test-") as tmp:
            model = os.path.join(tmp, "tiny.gguf")
            # 4 layers: the 3-worker configuration needs a layer per stage.
            subprocess.run([BIN, "gguf", "make-fixture", model, "--arch", "qwen3", "--layers", "4",
                            "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim",
                            "16", "--ffn", "128", "--seed", "3"],
                           check=True, capture_output=True, timeout=60)
            marker = "FUCINA_BENCH_TEST_MARKER=" + secrets.token_hex(8)
            env = dict(os.environ)
            env[marker.split("=")[0]] = marker.split("=")[1]
            env.pop("FUCINA_API_KEY", None)
            start = time.monotonic()
            proc = subprocess.run(
                [BIN, "bench", "cluster-aggregate", model, "--gen", "4", "--streams", "2",
                 "--repeats", "1", "--prompt-tokens", "16", "--long-prompt-tokens", "600",
                 "--timeout", "30"],
                capture_output=True, text=True, timeout=50, env=env)
            elapsed = time.monotonic() - start
            out = proc.stdout
            self.assertEqual(proc.returncode, 0, f"stdout:\n{out}\nstderr:\n{proc.stderr}")
            self.assertEqual(processes_with(marker), [], "bench children outlived it")
        self.assertLess(elapsed, 45, out)
        self.assertRegex(out, r"(?m)^decode t/s = tokens received after every stream had its "
                              r"first token")
        self.assertRegex(out, r"(?m)^ceiling: 2 x fucina run --threads 1 at once: [0-9.]+ t/s")
        self.assertRegex(out, r"(?m)^2 streams:$")
        # Each configuration with the stage count its placement reported.
        for name, stages in (("coordinator \\+ 1 worker x 1 thread", 1),
                             ("coordinator \\+ 2 workers x 1 thread", 2),
                             ("coordinator \\+ 3 workers x 1 thread", 3),
                             ("serve --workers 1 --threads 2", 1)):
            self.assertRegex(out, rf"(?m)^  {name} +{stages} +[0-9.]+ +[0-9.]+x +[0-9.]+x ", out)
        self.assertRegex(out, r"(?m)^  configuration .* TTFT p50/p99 ms  layers$")
        self.assertRegex(out, r"(?m)^  coordinator \+ 2 workers x 1 thread +2 +[0-9.]+ +[0-9.]+x +"
                              r"[0-9.]+x +[0-9.]+x +[0-9]+/[0-9]+ +0-")
        self.assertRegex(out, r"(?m)^  target, 2 workers x 1 thread: >= 0.90 x ceiling: ")
        # The per-step breakdown of each coordinator configuration: a line per stage, and its
        # parts add up to the step's own time within 10%.
        for name, stages in (("coordinator \\+ 1 worker x 1 thread", 1),
                             ("coordinator \\+ 2 workers x 1 thread", 2),
                             ("coordinator \\+ 3 workers x 1 thread", 3)):
            section = re.search(rf"(?ms)^  step breakdown, {name}:\n(.*?)^    parts ([0-9.]+) of "
                                rf"([0-9.]+) ms: unaccounted (-?[0-9.]+) ms \((-?[0-9.]+)%\)$", out)
            self.assertIsNotNone(section, out)
            lines = section.group(1)
            self.assertEqual(len(re.findall(r"(?m)^    stage \d \(\d+ steps\)  queue ", lines)),
                             stages, lines)
            self.assertEqual(len(re.findall(r"(?m)^    transport to stage \d ", lines)), stages)
            self.assertRegex(lines, r"kernels [0-9.]+")
            self.assertLess(abs(float(section.group(5))), 10, section.group(0))
        self.assertIn("coordinator bytes per generated token", out)
        self.assertRegex(out, r"(?m)^TTFT of an 8-token request .* during a 600-token prefill")
        # Without chunking needs a flag the server may not have: measured or said why not.
        self.assertRegex(out, r"(?m)^  --max-step-tokens 8192 \(no chunking\) +(TTFT|not measured)")
        self.assertRegex(out, r"(?m)^  server default +TTFT +[0-9.]+ ms")
        self.assertNotIn("failed", out)


if __name__ == "__main__":
    unittest.main()
