"""End-to-end tests of `fucina train es` on a tiny random-weight fixture: the reward rises, the
written model carries the trained tensors (as f32, read back with ggml's own GGUF reader) and
scores what training printed, and bad inputs fail naming what is wrong.

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
    proc = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=120)
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
        return run("train", "es", self.model, "--data", self.data, "--raw", "--tensors", tensors,
                   "--population", population, "--sigma", "0.05", "--lr", "0.1", "--iterations",
                   "8", "--seed", "3", "--threads", "2", *extra, check=check)

    def test_reward_rises_and_the_written_model_holds_the_trained_tensors(self):
        out = os.path.join(self.dir, "trained.gguf")
        proc = self.train("--out", out)
        rewards = [float(x) for x in re.findall(r"^generation \d+: reward (-?[\d.]+)",
                                                proc.stdout, re.M)]
        self.assertEqual(len(rewards), 9, proc.stdout)
        self.assertGreater(rewards[-1] - rewards[0], 0.5, proc.stdout)
        checksum = re.search(r"checksum ([0-9a-f]{16})", proc.stdout).group(1)
        # Same job, same parameters (fixed seed).
        again = self.train()
        self.assertIn(f"checksum {checksum}", again.stdout)

        r = GGUFReader(out)
        tensors = {t.name: t for t in r.tensors}
        base = {t.name: t for t in GGUFReader(self.model).tensors}
        self.assertEqual(set(tensors), set(base))
        self.assertEqual(tensors["blk.0.ffn_down.weight"].tensor_type, Q.F32)
        self.assertFalse((tensors["blk.0.ffn_down.weight"].data ==
                          base["blk.0.ffn_down.weight"].data).all())
        self.assertTrue((tensors["blk.0.attn_q.weight"].data ==
                         base["blk.0.attn_q.weight"].data).all())
        # Training the written model for 0 generations scores what the run ended with.
        scored = run("train", "es", out, "--data", self.data, "--raw", "--tensors",
                     r"token_embd\.weight", "--iterations", "0")
        final = float(re.search(r"generation 0: reward (-?[\d.]+)", scored.stdout).group(1))
        self.assertAlmostEqual(final, rewards[-1], places=4)

    def test_lora_mode_writes_an_adapter_file(self):
        out = os.path.join(self.dir, "adapters.gguf")
        proc = run("train", "es", self.model, "--data", self.data, "--raw", "--mode", "lora",
                   "--targets", "q,v,down", "--rank", "4", "--alpha", "8", "--population", "16",
                   "--sigma", "0.05", "--lr", "0.2", "--iterations", "4", "--seed", "3",
                   "--out", out)
        self.assertIn("training 12 tensors", proc.stdout)  # 2 layers x 3 targets x (A, B)
        r = GGUFReader(out)
        meta = {f.name: f for f in r.fields.values()}
        self.assertIn("adapter.lora.alpha", meta)
        self.assertEqual(bytes(r.fields["general.type"].parts[-1]).decode(), "adapter")
        self.assertEqual(bytes(r.fields["adapter.type"].parts[-1]).decode(), "lora")
        tensors = {t.name: t for t in r.tensors}
        self.assertEqual(len(tensors), 12)
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
        bad = run("run", self.model, "65,66", "--adapter", self.model, "--gen", "1", check=False)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("not a LoRA adapter", bad.stderr)
        proc = run("train", "es", self.model, "--data", self.data, "--raw", "--mode", "lora",
                   "--targets", "q,x", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("--targets", proc.stderr)

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
        self.assertIn("--tensors", proc.stderr)
        proc = self.train(population=5, check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("population", proc.stderr)
        proc = self.train("--reward", "acc", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("--reward", proc.stderr)


if __name__ == "__main__":
    unittest.main()
