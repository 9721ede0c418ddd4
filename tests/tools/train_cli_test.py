"""End-to-end tests of `fucina train es` on a tiny random-weight fixture: the reward rises, the
checkpoint folder carries the trained tensors (as f32, read back with ggml's own GGUF reader)
or the adapters, the same job on two workers, whole or as pipeline stages, ends bit-identical, a run resumed from a checkpoint ends like an uninterrupted one, and bad inputs
fail naming what is wrong.

Environment: FUCINA_BIN (the fucina binary).
"""
import json
import os
import re
import subprocess
import tempfile
import unittest

from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader

BIN = os.environ.get("FUCINA_BIN", "")


def run(*args, check=True):
    proc = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True,
                          errors="replace", timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"fucina {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return proc


@unittest.skipUnless(BIN, "FUCINA_BIN not set")
class TrainEsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        cls.model = os.path.join(cls.dir, "m.gguf")
        run("gguf", "make-fixture", cls.model, "--arch", "qwen3", "--layers", "2", "--hidden",
            "32", "--ffn", "64", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
            "--seed", "5")
        # Byte vocabulary, no chat template: every answer is "A".
        cls.data = os.path.join(cls.dir, "tasks.jsonl")
        with open(cls.data, "w") as f:
            for i in range(6):
                f.write(json.dumps({"prompt": f"q{i}{i * 7 % 10}x", "answer": "A"}) + "\n")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def train(self, *extra, tensors=r"token_embd\.weight|blk\.[0-9]+\.ffn_down\.weight",
              population=16, check=True):
        return run("train", "es", self.model, "--data", self.data, "--raw", "--mode", "full",
                   "--tensors", tensors, "--population", population, "--sigma", "0.05", "--lr", "0.1", "--iterations",
                   "8", "--seed", "3", "--threads", "2", *extra, check=check)

    def test_reward_rises_and_the_checkpoint_holds_the_trained_tensors(self):
        out = os.path.join(self.dir, "trained")
        proc = self.train("--out", out)
        first = float(re.search(r"^generation 0: reward (-?[\d.]+)", proc.stdout, re.M).group(1))
        final = float(re.search(r"^final, generation 8: reward (-?[\d.]+)", proc.stdout,
                                re.M).group(1))
        self.assertEqual(len(re.findall(r"^generation \d+/8: members mean", proc.stdout, re.M)),
                         8, proc.stdout)
        self.assertGreater(final - first, 0.5, proc.stdout)
        checksum = re.search(r"checksum ([0-9a-f]{16})", proc.stdout).group(1)
        # Same job, same parameters (fixed seed), also with two workers sharing the members.
        again = self.train("--workers", "2")
        self.assertIn(f"checksum {checksum}", again.stdout)
        # And through a pipeline: two workers holding a layer each, every member scored
        # through both; its checkpoint, merged from the stages' files, is the same file.
        piped_out = os.path.join(self.dir, "piped")
        piped = self.train("--workers", "2", "--pipeline", "--out", piped_out)
        self.assertIn("as pipeline stages", piped.stdout)
        self.assertIn(f"checksum {checksum}", piped.stdout)
        with open(os.path.join(out, "tensors.gguf"), "rb") as a, \
                open(os.path.join(piped_out, "tensors.gguf"), "rb") as b:
            self.assertEqual(a.read(), b.read())

        r = GGUFReader(os.path.join(out, "tensors.gguf"))
        self.assertEqual(bytes(r.fields["general.type"].parts[-1]).decode(), "tensors")
        tensors = {t.name: t for t in r.tensors}
        base = {t.name: t for t in GGUFReader(self.model).tensors}
        self.assertEqual(set(tensors), {"token_embd.weight", "blk.0.ffn_down.weight",
                                        "blk.1.ffn_down.weight"})
        self.assertEqual(tensors["blk.0.ffn_down.weight"].tensor_type, Q.F32)
        self.assertEqual(list(tensors["blk.0.ffn_down.weight"].shape),
                         list(base["blk.0.ffn_down.weight"].shape))
        self.assertFalse((tensors["blk.0.ffn_down.weight"].data ==
                          base["blk.0.ffn_down.weight"].data).all())
        with open(os.path.join(out, "state.json")) as f:
            state = json.load(f)
        self.assertEqual(state["generation"], 8)
        self.assertEqual(state["checksum"], checksum)
        # Merged into the base, the trained tensors score what the run ended with.
        merged = os.path.join(self.dir, "merged.gguf")
        run("gguf", "export", self.model, "--adapters", out, "--out", merged)
        scored = run("train", "es", merged, "--data", self.data, "--raw", "--mode", "full",
                     "--tensors", r"token_embd\.weight", "--iterations", "0")
        again = float(re.search(r"generation 0: reward (-?[\d.]+)", scored.stdout).group(1))
        self.assertAlmostEqual(again, final, places=4)

    def test_a_resumed_run_ends_like_an_uninterrupted_one(self):
        reference = re.search(r"checksum ([0-9a-f]{16})", self.train().stdout).group(1)
        out = os.path.join(self.dir, "half")
        half = run("train", "es", self.model, "--data", self.data, "--raw", "--mode", "full",
                   "--tensors", r"token_embd\.weight|blk\.[0-9]+\.ffn_down\.weight",
                   "--population", "16", "--sigma", "0.05", "--lr", "0.1", "--iterations", "3",
                   "--seed", "3", "--threads", "2", "--out", out, "--checkpoint-every", "2")
        self.assertNotIn(f"checksum {reference}", half.stdout)
        rest = run("train", "es", self.model, "--resume", out, "--iterations", "8", "--out", out)
        self.assertIn("generation 4/8", rest.stdout)
        self.assertNotIn("generation 3/8", rest.stdout)
        self.assertIn(f"checksum {reference}", rest.stdout)
        # A damaged state is refused, naming the file.
        with open(os.path.join(out, "state.json"), "w") as f:
            f.write("{}")
        bad = run("train", "es", self.model, "--resume", out, "--iterations", "9", check=False)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("state.json", bad.stderr)

    def test_lora_mode_writes_an_adapter_file(self):
        out = os.path.join(self.dir, "lora", "adapters.gguf")
        run("train", "es", self.model, "--data", self.data, "--raw", "--mode", "lora",
            "--targets", "q,v,down", "--rank", "4", "--alpha", "8", "--population", "16",
            "--sigma", "0.05", "--lr", "0.2", "--iterations", "4", "--seed", "3",
            "--out", os.path.dirname(out))
        r = GGUFReader(out)
        meta = {f.name: f for f in r.fields.values()}
        self.assertIn("adapter.lora.alpha", meta)
        self.assertEqual(bytes(r.fields["general.type"].parts[-1]).decode(), "adapter")
        self.assertEqual(bytes(r.fields["adapter.type"].parts[-1]).decode(), "lora")
        tensors = {t.name: t for t in r.tensors}
        self.assertEqual(len(tensors), 12)  # 2 layers x 3 targets x (A, B)
        a = tensors["blk.1.attn_q.weight.lora_a"]
        b = tensors["blk.1.attn_q.weight.lora_b"]
        self.assertEqual(list(a.shape), [32, 4])   # [in, rank]
        self.assertEqual(list(b.shape), [4, 32])   # [rank, out]
        self.assertEqual(a.tensor_type, Q.F32)
        self.assertTrue((b.data != 0).any())  # B starts at zero and has moved
        # The adapters serve without merging; adapters for another model are refused by name.
        gen = run("run", self.model, "65,66,67", "--adapter", out, "--gen", "4", "--temp", "0",
                  "--print-ids")
        self.assertRegex(gen.stdout, r"ids: \d+(,\d+){3}")
        # The run's folder serves the same: its adapters.gguf.
        by_dir = run("run", self.model, "65,66,67", "--adapter", os.path.dirname(out), "--gen",
                     "4", "--temp", "0", "--print-ids")
        self.assertEqual(by_dir.stdout, gen.stdout)
        bad = run("run", self.model, "65,66", "--adapter", self.model, "--gen", "1", check=False)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("not a LoRA adapter", bad.stderr)
        proc = run("train", "es", self.model, "--data", self.data, "--raw", "--mode", "lora",
                   "--targets", "q,x", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("targets", proc.stderr)

    def test_bad_inputs_name_what_is_wrong(self):
        bad = os.path.join(self.dir, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"prompt": "a", "answer": "b"}\n{"prompt": "a"}\n')
        proc = run("train", "es", self.model, "--data", bad, "--raw", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("bad.jsonl:2", proc.stderr)
        self.assertIn('"answer"', proc.stderr)
        proc = self.train(tensors="nothing_matches", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("no trainable tensors", proc.stderr)
        proc = self.train(tensors="([", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("tensors", proc.stderr)
        proc = self.train(population=5, check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("population", proc.stderr)
        proc = self.train("--reward", "rule", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("rule", proc.stderr)
        proc = self.train("--reward", "nope", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("--reward", proc.stderr)


if __name__ == "__main__":
    unittest.main()
