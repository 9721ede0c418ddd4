"""End-to-end tests of `fucina run` on the real SmolLM2-135M-Instruct model.

Environment: FUCINA_BIN (the fucina binary), FUCINA_DEFAULT_MODEL (the SmolLM2 GGUF).
"""
import json
import os
import re
import subprocess
import tempfile
import unittest

BIN = os.environ.get("FUCINA_BIN", "")
MODEL = os.environ.get("FUCINA_DEFAULT_MODEL", "")


def run(*args, stdin=None, check=True):
    proc = subprocess.run([BIN, "run", MODEL, *map(str, args)], capture_output=True, text=True,
                          input=stdin, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"fucina run {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return proc


@unittest.skipUnless(BIN and MODEL and os.path.exists(MODEL), "FUCINA_BIN / SmolLM2 not available")
class RunTest(unittest.TestCase):
    def test_chat_names_paris(self):
        out = run("--chat", "What is the capital of France?", "--temp", "0", "--gen", "32",
                  "--threads", "2").stdout
        self.assertIn("Paris", out)

    def test_tokenize_prints_ids_of_the_whole_file(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("Hello world\n<|im_start|>user")
        try:
            out = run("--tokenize", f.name).stdout.strip()
        finally:
            os.unlink(f.name)
        ids = [int(x) for x in out.split(",")]
        self.assertEqual(ids[-2], 1)   # <|im_start|> matched as a special token
        self.assertGreaterEqual(len(ids), 5)

    def test_token_ids_in_ids_out_and_greedy_is_deterministic(self):
        a = run("1,504,3575,282", "--gen", "12", "--temp", "0", "--print-ids").stdout
        b = run("1,504,3575,282", "--gen", "12", "--temp", "0", "--print-ids").stdout
        ids = re.search(r"^ids: ([0-9,]+)$", a, re.M)
        self.assertIsNotNone(ids, a)
        self.assertEqual(len(ids.group(1).split(",")), 12)
        self.assertEqual(a, b)

    def test_seeded_sampling_repeats_and_seeds_differ(self):
        args = ("--prompt", "Once upon a time", "--gen", "24", "--temp", "1.0", "--print-ids")
        a = run(*args, "--seed", "7").stdout
        b = run(*args, "--seed", "7").stdout
        c = run(*args, "--seed", "8").stdout
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)

    def test_spec_gives_the_same_tokens_in_fewer_passes(self):
        doc = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He "
               "trimmed the wick, polished the great lens until it shone, and wound the "
               "clockwork that turned the light.")
        args = ("--chat", f"Repeat the following text exactly: {doc}", "--gen", "48",
                "--print-ids")
        for sampling in (("--temp", "0"), ("--temp", "0.8", "--seed", "3"),
                         ("--temp", "1.2", "--seed", "11")):
            plain = run(*args, *sampling)
            spec = run(*args, *sampling, "--spec")
            self.assertEqual(spec.stdout, plain.stdout, sampling)
            stats = re.search(r"\[spec: (\d+) decode passes for (\d+) tokens; (\d+) drafts of "
                              r"(\d+) tokens, (\d+) accepted", spec.stderr)
            self.assertIsNotNone(stats, spec.stderr)
            passes, tokens, _, drafted, accepted = map(int, stats.groups())
            if sampling[1] == "0":  # greedy copies the document: most drafts land
                self.assertGreater(accepted, tokens // 2, spec.stderr)
                self.assertLess(passes, tokens // 2, spec.stderr)
            self.assertLessEqual(accepted, drafted)
        # A reference document the output copies from drafts too; unreadable, a clear error.
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(doc)
        try:
            ref = run("--chat", "Write one sentence about a lighthouse keeper.", "--temp", "0",
                      "--gen", "32", "--print-ids", "--spec-ref", f.name)
            plain = run("--chat", "Write one sentence about a lighthouse keeper.", "--temp",
                        "0", "--gen", "32", "--print-ids")
            self.assertEqual(ref.stdout, plain.stdout)
        finally:
            os.unlink(f.name)
        bad = run("--prompt", "hi", "--spec-ref", "/nonexistent/ref.txt", check=False)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("--spec-ref", bad.stderr)

    def test_bench_spec_reports_ratios_and_identical_tokens(self):
        for stages in ("0", "2"):
            proc = subprocess.run([BIN, "bench", "spec", MODEL, "--gen", "24", "--repeats", "1",
                                   "--stages", stages], capture_output=True, text=True,
                                  timeout=300)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            rows = re.findall(r"^(copy|code|chat) +([\d.]+) +([\d.]+) +([\d.]+)x .* (yes|NO)$",
                              proc.stdout, re.M)
            self.assertEqual([r[0] for r in rows], ["copy", "code", "chat"], proc.stdout)
            self.assertTrue(all(r[4] == "yes" for r in rows), proc.stdout)
            copy = rows[0]
            # Ratio as printed: spec over plain.
            self.assertAlmostEqual(float(copy[3]), float(copy[2]) / float(copy[1]), delta=0.02)

    def test_repl_keeps_the_conversation(self):
        out = run("--repl", "--temp", "0", "--gen", "24",
                  stdin="What is the capital of France?\nAnd of Italy?\n").stdout
        self.assertIn("Paris", out)
        self.assertIn("Rome", out)

    def test_bench_prints_both_rates(self):
        out = run("1,504,3575,282,4649", "--gen", "4", "--bench", "1").stdout
        self.assertRegex(out, r"(?m)^prefill: [0-9.]+ t/s$")
        self.assertRegex(out, r"(?m)^decode: [0-9.]+ t/s$")

    def test_bench_with_spec_measures_speculative_decoding(self):
        line = "The keeper trimmed the wick and wound the clock. "
        out = run("--prompt", line * 4, "--gen", "24", "--bench", "1", "--spec",
                  "--threads", "2").stdout
        self.assertRegex(out, r"(?m)^prefill: [0-9.]+ t/s$")
        self.assertRegex(out, r"(?m)^decode: [0-9.]+ t/s$")
        stats = re.search(r"(?m)^spec: (\d+) decode passes for (\d+) tokens; (\d+) drafts of "
                          r"(\d+) tokens, (\d+) accepted$", out)
        self.assertIsNotNone(stats, out)
        passes, tokens, _, drafted, accepted = map(int, stats.groups())
        self.assertEqual(tokens, 24)
        # The text repeats, so drafts land: fewer passes than tokens after the first.
        self.assertGreater(accepted, 0, out)
        self.assertLess(passes, tokens - 1, out)
        self.assertLessEqual(accepted, drafted)
        bad = run("1,504,3575", "--gen", "4", "--bench", "1", "--spec", "--streams", "2",
                  check=False)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("--streams", bad.stderr)

    def test_bench_prompts_decode_each_streams_own_prompt(self):
        with tempfile.TemporaryDirectory() as tmp:
            good = os.path.join(tmp, "prompts.txt")
            with open(good, "w") as f:
                f.write("1,504,3575\n\n28,46,373,1345,29,5\n")
            out = run("--bench", "1", "--gen", "4", "--streams", "3", "--bench-prompts", good,
                      "--threads", "1").stdout
            self.assertRegex(out, r"(?m)^prefill: [0-9.]+ t/s$")
            self.assertRegex(out, r"(?m)^decode: [0-9.]+ t/s$")
            self.assertRegex(out, r"(?m)^decode step: [0-9.]+ ms \(attention [0-9.]+, sampling "
                                  r"[0-9.]+, kernels and head -?[0-9.]+\)$")
            for content, needle in (("1,2\n3,x\n", "line 2"), ("1,99999999\n", "vocabulary"),
                                    ("\n", "no prompt")):
                bad = os.path.join(tmp, "bad.txt")
                with open(bad, "w") as f:
                    f.write(content)
                proc = run("--bench", "1", "--gen", "2", "--bench-prompts", bad, check=False)
                self.assertNotEqual(proc.returncode, 0)
                self.assertIn("--bench-prompts", proc.stderr)
                self.assertIn(needle, proc.stderr)
            missing = run("--bench", "1", "--bench-prompts", os.path.join(tmp, "none"),
                          check=False)
            self.assertNotEqual(missing.returncode, 0)
            self.assertIn("cannot open", missing.stderr)

    def test_grammar_flags_hold_the_reply(self):
        out = run("--prompt", "Is the sky blue? Answer:", "--temp", "0", "--gen", "16",
                  "--regex", r" (yes|no)\.", "--threads", "2").stdout
        self.assertRegex(out, r"^ (yes|no)\.\n$")
        with tempfile.TemporaryDirectory() as tmp:
            schema = os.path.join(tmp, "schema.json")
            with open(schema, "w") as f:
                f.write('{"type":"object","properties":{"size":{"enum":["small","large"]}},'
                        '"required":["size"],"additionalProperties":false}')
            for sampling in (("--temp", "0"), ("--temp", "1", "--seed", "4")):
                out = run("--chat", "How big is Paris?", "--gen", "40", "--json-schema",
                          "@" + schema, "--threads", "2", *sampling).stdout
                self.assertIn(json.loads(out)["size"], ("small", "large"), out)
            lark = os.path.join(tmp, "g.lark")
            with open(lark, "w") as f:
                f.write('start: "colour: " C\nC: "red" | "green" | "blue"\n')
            out = run("--prompt", "My favourite", "--temp", "0", "--gen", "16", "--lark", "@" + lark,
                      "--threads", "2").stdout
            self.assertRegex(out, r"^colour: (red|green|blue)\n$")
        p = run("--prompt", "hi", "--regex", "(unclosed", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("invalid regex", p.stderr)
        p = run("--prompt", "hi", "--regex", "a", "--lark", "start: \"a\"", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("at most one of --json-schema, --regex, --lark", p.stderr)
        p = run("--prompt", "hi", "--json-schema", "@/nonexistent/schema.json", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("cannot open /nonexistent/schema.json", p.stderr)

    def test_errors_are_clear(self):
        p = run("--prompt", "hi", "--cache-type", "q4", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("q4", p.stderr)
        p = run("1,99999999", "--gen", "2", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("99999999", p.stderr)
        p = run("--prompt", "hi", "--ctx", "8", "--gen", "64", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--ctx", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
