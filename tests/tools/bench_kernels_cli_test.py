"""Smoke test of `fucina bench kernels`: one short pass at small sizes prints the read
bandwidth, a row per weight type and the decode attention section with its bounds, every
figure a positive number; bad sizes are refused with a message naming the option.

Environment: FUCINA_BIN (the fucina binary). Needs nothing else.
"""
import os
import re
import subprocess
import unittest

BIN = os.environ.get("FUCINA_BIN", "")
NUM = r"([0-9]+\.[0-9]+)"


def bench(*extra, types="q8_0,f16", env=None):
    return subprocess.run(
        [BIN, "bench", "kernels", "--types", types, "--working-set-mib", "16", "--rows",
         "256", "--cols", "256", "--batch", "4", "--prefill-batch", "8", "--min-seconds", "0.01",
         *extra], capture_output=True, text=True, timeout=120, env=env)


@unittest.skipUnless(BIN, "FUCINA_BIN not set")
class BenchKernelsTest(unittest.TestCase):
    def check_decode_attention(self, proc):
        out = proc.stdout
        self.assertEqual(proc.returncode, 0, f"stdout:\n{out}\nstderr:\n{proc.stderr}")
        isa = re.search(r"(?m)^isa: (\w+)", out)
        self.assertIsNotNone(isa, out)
        has_cvt = isa.group(1) != "scalar"
        m = re.search(rf"(?m)^read bandwidth: {NUM} GB/s \(1 thread\), {NUM} GB/s", out)
        self.assertIsNotNone(m, out)
        self.assertGreater(float(m.group(1)), 0)
        for t in ("q8_0", "f16"):
            self.assertRegex(out, rf"(?m)^{t}\s+\|\s+{NUM}", out)
        self.assertRegex(out, r"(?m)^decode attention: one query per head after 96 positions, "
                              r"16 query heads on 8 kv heads of 128 dims")
        # The bound counts every product the group's query heads need, not one per value.
        self.assertIn("one multiply-add per query head", out)
        # Without a SIMD level the conversion streams have no bound to offer: 0.00, said so.
        self.assertEqual("(cvt: SIMD levels only, n/a here)" not in out, has_cvt, out)
        for kv in ("f16", "q8_0"):
            row = re.search(rf"(?m)^{kv}\s+(\d+) \|(.*)\|(.*)$", out)
            self.assertIsNotNone(row, out)
            self.assertGreaterEqual(int(row.group(1)), 2)  # at least two layers' caches
            for half in (row.group(2), row.group(3)):
                rates = [float(x) for x in re.findall(r"([0-9]+\.[0-9]+)\s", half + " ")]
                shares = [float(x) for x in re.findall(r"([0-9]+)%", half)]
                self.assertEqual(len(rates), 3, row.group(0))  # read, convert, attention
                self.assertGreater(rates[0], 0, row.group(0))
                self.assertGreater(rates[2], 0, row.group(0))
                self.assertEqual(rates[1] > 0, has_cvt, row.group(0))
                self.assertEqual(len(shares), 2, row.group(0))
                self.assertAlmostEqual(shares[0], 100 * rates[2] / rates[0], delta=1.0)

    def test_short_pass_prints_matvec_and_decode_attention_figures(self):
        self.check_decode_attention(bench("--kv-context", "96"))

    def test_scalar_level_reports_no_conversion_bound(self):
        proc = bench("--kv-context", "96", env=dict(os.environ, FUCINA_ISA="scalar"))
        self.assertRegex(proc.stdout, r"(?m)^isa: scalar")
        self.check_decode_attention(proc)

    def test_zero_context_skips_the_section(self):
        proc = bench("--kv-context", "0", types="q8_0")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("decode attention", proc.stdout)

    def test_absurd_context_is_refused_by_name(self):
        for bad in ("-1", "10000000", "lots"):
            proc = bench("--kv-context", bad)
            self.assertNotEqual(proc.returncode, 0, bad)
            self.assertIn("--kv-context", proc.stdout + proc.stderr, bad)


if __name__ == "__main__":
    unittest.main()
