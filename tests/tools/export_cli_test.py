"""End-to-end tests of `fucina gguf export` and `fucina serve --adapter`.

The trained files are written with ggml's own Python GGUF writer (PyPI `gguf`), as llama.cpp
lays out LoRA adapters, and the export is checked against W + alpha/rank * B A computed here in
numpy float64 from those arrays: no code of ours on the reference side. Then a server applying
the adapter unmerged (on two stages) and a server of the merged file answer the same prompts
with the same greedy text and logprobs.

Environment: FUCINA_BIN (the fucina binary). The fixture has a byte tokenizer; servers listen on
ephemeral 127.0.0.1 ports and readiness is polled on /health, never slept for.
"""
import json
import os
import re
import select
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter

BIN = os.environ.get("FUCINA_BIN", "")
HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 32, 64, 2, 1, 16, 2
RANK, ALPHA = 4, 8.0
PROMPTS = ["Once upon a time", "The capital of"]


def run(*args, check=True):
    proc = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"fucina {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return proc


def tensors(path):
    return {t.name: t for t in GGUFReader(path).tensors}


def matrix(t):
    """A GGUF f32 tensor as numpy rows: [dims[1], dims[0]]."""
    assert t.tensor_type == Q.F32, t.name
    return np.asarray(t.data, dtype=np.float32).reshape(-1, int(t.shape[0]))


def write_gguf(path, kv, arrays):
    """A GGUF with string/float metadata and f32 arrays (numpy shapes, rows first)."""
    w = GGUFWriter(path, kv.get("general.architecture", "qwen3"))
    for key, value in kv.items():
        if key == "general.architecture":
            continue
        if isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_float32(key, value)
    for name, a in arrays.items():
        w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class Server:
    """`fucina serve` on ephemeral ports; `http` is the address it announced."""

    def __init__(self, args, log_dir):
        self.log = tempfile.NamedTemporaryFile(dir=log_dir, suffix=".log", delete=False)
        self.p = subprocess.Popen(
            [BIN, "serve", *args, "--threads", "1", "--listen", "127.0.0.1:0", "--metrics",
             "127.0.0.1:0", "--http", "127.0.0.1:0", "--cache-type", "f32"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log)
        line = self._first_line(30)
        m = re.search(r" http=(\S+)", line)
        if m is None:
            self.close()
            raise AssertionError(f"unexpected first line {line!r}\n{self.stderr()}")
        self.http = m.group(1)
        deadline = time.monotonic() + 30
        while True:
            status, body = self.call("GET", "/health")
            if status == 200:
                break
            if status != 503 or time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"/health answered {status}: {body}\n{self.stderr()}")
            # Polled: in-process workers load right after the listening line.
            select.select([], [], [], 0.02)

    def _first_line(self, timeout):
        fd, buf = self.p.stdout.fileno(), b""
        deadline = time.monotonic() + timeout
        while b"\n" not in buf:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                self.close()
                raise AssertionError(f"no listening line in {timeout} s\n{self.stderr()}")
            chunk = os.read(fd, 4096)
            if not chunk:
                self.close()
                raise AssertionError(f"exited before listening\n{self.stderr()}")
            buf += chunk
        return buf.split(b"\n", 1)[0].decode()

    def call(self, method, path, body=None):
        req = urllib.request.Request(f"http://{self.http}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def complete(self, prompt):
        status, body = self.call("POST", "/v1/completions",
                                 {"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                  "logprobs": 1})
        assert status == 200, f"{status}: {body}"
        choice = json.loads(body)["choices"][0]
        # The fixture's byte tokens are mostly not UTF-8 on their own, so the text and token
        # strings carry U+FFFD: the logprobs are what tells the tokens apart.
        logprobs = choice["logprobs"]
        return (choice["text"], logprobs["tokens"]), logprobs["token_logprobs"]

    def stderr(self):
        with open(self.log.name, "rb") as f:
            return f.read()[-4000:].decode(errors="replace")

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=30)
        self.p.stdout.close()
        self.log.close()


@unittest.skipUnless(BIN, "FUCINA_BIN not set")
class ExportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="fucina-export-test-")
        cls.dir = cls.tmp.name
        cls.base = os.path.join(cls.dir, "base.gguf")
        # init-std 0.2: peaked next-token distributions, so greedy text has no near-ties.
        run("gguf", "make-fixture", cls.base, "--arch", "qwen3", "--layers", LAYERS, "--hidden",
            HIDDEN, "--ffn", FFN, "--heads", HEADS, "--kv-heads", KV_HEADS, "--head-dim", HEAD_DIM,
            "--init-std", "0.2", "--seed", "5")
        # A training run's directory: LoRA on q and v of every layer, ffn_down of layer 1
        # replaced.
        cls.run_dir = os.path.join(cls.dir, "run")
        os.mkdir(cls.run_dir)
        rng = np.random.default_rng(7)
        cls.lora = {}
        arrays = {}
        for layer in range(LAYERS):
            for target, out in (("attn_q", HEADS * HEAD_DIM), ("attn_v", KV_HEADS * HEAD_DIM)):
                name = f"blk.{layer}.{target}.weight"
                a = rng.normal(0, 1 / np.sqrt(HIDDEN), (RANK, HIDDEN))  # [rank, in]
                b = rng.normal(0, 0.3, (out, RANK))                     # [out, rank]
                cls.lora[name] = (a.astype(np.float32), b.astype(np.float32))
                arrays[name + ".lora_a"] = a
                arrays[name + ".lora_b"] = b
        cls.adapters = os.path.join(cls.run_dir, "adapters.gguf")
        write_gguf(cls.adapters, {"general.architecture": "qwen3", "general.type": "adapter",
                                  "adapter.type": "lora", "adapter.lora.alpha": ALPHA}, arrays)
        cls.replaced = "blk.1.ffn_down.weight"
        cls.replacement = rng.normal(0, 0.2, (HIDDEN, FFN)).astype(np.float32)
        write_gguf(os.path.join(cls.run_dir, "tensors.gguf"), {"general.type": "tensors"},
                   {cls.replaced: cls.replacement})

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_export_of_a_run_directory_matches_numpy(self):
        out = os.path.join(self.dir, "merged_dir.gguf")
        proc = run("gguf", "export", self.base, "--adapters", self.run_dir, "--out", out,
                   "--type", "f32", "--threads", "2")
        self.assertIn("adapters.gguf", proc.stdout)
        self.assertIn("tensors.gguf", proc.stdout)
        base, merged = tensors(self.base), tensors(out)
        self.assertEqual(sorted(base), sorted(merged))
        worst = 0.0
        for name, t in base.items():
            got = matrix(merged[name])
            if name in self.lora:
                a, b = self.lora[name]
                want = matrix(t).astype(np.float64) + ALPHA / RANK * (
                    b.astype(np.float64) @ a.astype(np.float64))
                worst = max(worst, float(np.abs(got - want).max()))
                self.assertGreater(float(np.abs(want - matrix(t)).max()), 0.05, name)
            elif name == self.replaced:
                np.testing.assert_array_equal(got, self.replacement)
            else:
                np.testing.assert_array_equal(got, matrix(t), err_msg=name)
        print(f"max |merged - numpy W + s B A| = {worst:.3g}")
        self.assertLess(worst, 1e-5)

    def test_q8_0_export_quantizes_the_matrices(self):
        out = os.path.join(self.dir, "merged_q8.gguf")
        run("gguf", "export", self.base, "--adapters", self.adapters, "--out", out, "--type",
            "q8_0")
        for name, t in tensors(out).items():
            matrix_tensor = len(t.shape) == 2 and "_norm" not in name
            self.assertEqual(t.tensor_type, Q.Q8_0 if matrix_tensor else Q.F32, name)

    def test_errors_name_the_file_and_leave_no_output(self):
        out = os.path.join(self.dir, "never.gguf")
        empty = os.path.join(self.dir, "empty_run")
        os.makedirs(empty, exist_ok=True)
        proc = run("gguf", "export", self.base, "--adapters", empty, "--out", out, check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(empty, proc.stderr)
        bad = os.path.join(self.dir, "bad_dims.gguf")
        write_gguf(bad, {"general.type": "tensors"},
                   {"blk.0.attn_q.weight": np.zeros((HIDDEN, 8), np.float32)})
        proc = run("gguf", "export", self.base, "--adapters", bad, "--out", out, check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(bad, proc.stderr)
        self.assertIn("blk.0.attn_q.weight", proc.stderr)
        proc = run("gguf", "export", self.base, "--adapters", self.base, "--out", out,
                   check=False)
        self.assertIn("general.type", proc.stderr)
        self.assertFalse(os.path.exists(out) or os.path.exists(out + ".tmp"))
        # serve refuses an adapter it cannot read, naming it, before listening.
        missing = os.path.join(self.dir, "missing.gguf")
        proc = run("serve", self.base, "--adapter", missing, "--listen", "127.0.0.1:0",
                   "--metrics", "127.0.0.1:0", "--http", "", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(missing, proc.stderr)

    def test_serve_with_the_adapter_equals_serve_of_the_merged_file(self):
        merged = os.path.join(self.dir, "merged_lora.gguf")
        run("gguf", "export", self.base, "--adapters", self.adapters, "--out", merged)
        servers = []
        try:
            # The adapter on two pipeline stages (each applies its own layers' adapters).
            servers.append(Server([self.base, "--adapter", self.adapters, "--workers", "2"],
                                  self.dir))
            servers.append(Server([merged], self.dir))
            servers.append(Server([self.base], self.dir))
            adapted, exported, plain = servers
            worst, moved = 0.0, 0.0
            for prompt in PROMPTS:
                text_a, lp_a = adapted.complete(prompt)
                text_m, lp_m = exported.complete(prompt)
                text_p, lp_p = plain.complete(prompt)
                self.assertEqual(text_a, text_m, prompt)
                self.assertEqual(len(lp_a), len(lp_m))
                worst = max([worst] + [abs(x - y) for x, y in zip(lp_a, lp_m)])
                moved = max(moved, abs(lp_a[0] - lp_p[0]))
            print(f"max |logprob adapter - merged| = {worst:.3g}; "
                  f"first-token logprob moved by {moved:.3g} from the base")
            self.assertLess(worst, 1e-4)
            self.assertGreater(moved, 1e-2)  # the adapter matters
        finally:
            for s in servers:
                s.close()


if __name__ == "__main__":
    unittest.main()
