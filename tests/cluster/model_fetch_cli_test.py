"""Workers without the coordinator's filesystem: each `fucina worker` runs in its own mount
namespace where a tmpfs hides the folder holding the model, so it fetches its shard's tensors
from the coordinator (fucina.cluster.v1.ModelSource) into its --model-cache, and loads from that
cache the next time. Also a cache corrupted on disk (before a load, and under a loaded shard),
and a transfer cut by kill -9 and resumed.

Needs root's `unshare -m` (skipped with a message otherwise) and the SmolLM2 model
(FUCINA_DEFAULT_MODEL). Reuses cluster_cli_test's process and gRPC helpers (same environment:
FUCINA_BIN; Debian's python3-grpcio).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_cli_test as cc  # noqa: E402

FAST_DEATH = ("--heartbeat-ms", "200", "--dead-after-ms", "1000")
# Each worker may hold about 70% of SmolLM2 (98 MB): one alone cannot take the model, so the
# coordinator plans only with both, the one that registered first taking the first layers, and a
# restarted worker gets the same layers back. A short context keeps the KV out of the way.
BUDGET = ("--memory-budget", "72M")
SMALL_KV = ("--ctx", "256", "--kv-slots", "1")
UNSHARE = shutil.which("unshare") or ""
FETCH_S = 120  # a shard's transfer over loopback, with room for a slow machine
NO_UNSHARE = None  # set by setUpModule when private mount namespaces are not allowed


def setUpModule():
    global NO_UNSHARE
    cc.setUpModule()
    if not UNSHARE:
        NO_UNSHARE = "unshare (util-linux) not installed"
        return
    d = tempfile.mkdtemp(prefix="fucina-ns-probe-", dir=cc.TMP.name)
    open(os.path.join(d, "probe"), "w").close()
    p = subprocess.run([UNSHARE, "-m", "--propagation", "private", "sh", "-c",
                        'mount -t tmpfs tmpfs "$0" && test ! -e "$0/probe"', d],
                       capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        NO_UNSHARE = (f"private mount namespaces are not permitted here (unshare -m, mount -t "
                      f"tmpfs: {p.stderr.strip()!r}); these tests need root or CAP_SYS_ADMIN")


def tearDownModule():
    cc.tearDownModule()


class HiddenModelProc(cc.Proc):
    """`fucina worker ...` in a new mount namespace where a tmpfs covers `hidden` (the folder
    of the coordinator's model): the worker sees an empty folder there."""

    def __init__(self, hidden, args, name):
        self.args = args
        self.log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log",
                                               dir=cc.TMP.name, delete=False)
        self.p = subprocess.Popen(
            [UNSHARE, "-m", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs tmpfs "$0" && exec "$@"', hidden, cc.BIN, *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log)
        line = self._read_line(cc.START_S)
        m = re.fullmatch(r"listening grpc=(\S+) metrics=(\S+)", line)
        if m is None:
            self.kill()
            raise AssertionError(f"worker: unexpected first line {line!r}\n{self.stderr()}")
        self.grpc, self.metrics = m.group(1), m.group(2)


def moved(line):
    m = re.search(r"(\d+) bytes moved", line)
    return int(m.group(1)) if m else None


@unittest.skipUnless(cc.HAVE_SMOLLM2, cc.NO_SMOLLM2)
class ModelFetchTest(cc.ClusterTestCase):
    def setUp(self):
        if NO_UNSHARE:
            self.skipTest(NO_UNSHARE)
        # The coordinator's model in a folder of its own, which the workers' tmpfs hides.
        self.models = tempfile.mkdtemp(prefix="models-", dir=cc.TMP.name)
        self.model = os.path.join(self.models, "SmolLM2-135M-Instruct.Q4_1.gguf")
        shutil.copyfile(cc.SMOLLM2, self.model)
        self.addCleanup(shutil.rmtree, self.models, True)

    def worker(self, c, cache, *extra):
        flags = ["--coordinator", c.front.grpc, "--threads", "1", "--listen", "127.0.0.1:0",
                 "--metrics", "127.0.0.1:0", "--cluster-token-file", cc.TOKEN_FILE,
                 "--model-cache", cache, *extra]
        proc = HiddenModelProc(self.models, ["worker", *flags], "worker")
        c.procs.append(proc)
        return proc

    def wait_dead(self, c, proc):
        """Until the coordinator no longer counts `proc` (killed) as a live worker, so a worker
        started next is planned without it."""
        deadline = time.monotonic() + 30
        while any(w.alive and w.address == proc.grpc
                  for w in c.api.GetPlacement(cc.pb.GetPlacementRequest(), timeout=10).workers):
            self.assertLess(time.monotonic(), deadline, f"{proc.grpc} still alive\n{c.logs()}")
            time.sleep(cc.POLL_S)

    def restart(self, c, proc, cache):
        proc.kill()
        self.wait_dead(c, proc)
        return self.worker(c, cache, *BUDGET)

    def cache(self):
        return tempfile.mkdtemp(prefix="model-cache-", dir=cc.TMP.name)

    def load_lines(self, proc):
        """The worker's per-load lines: 'shard layers [a, b): model from ...'."""
        return re.findall(r"^shard [^\n]*: model from [^\n]*$", proc.stderr(), re.M)

    def wait_loads(self, proc, n, timeout=FETCH_S):
        deadline = time.monotonic() + timeout
        while len(self.load_lines(proc)) < n:
            self.assertLess(time.monotonic(), deadline,
                            f"no {n} model loads within {timeout} s:\n{proc.stderr()}")
            time.sleep(cc.POLL_S)
        return self.load_lines(proc)

    def verified(self, cache):
        """Lines of the cache's journal of verified tensors (one model folder)."""
        folders = os.listdir(cache)
        self.assertEqual(len(folders), 1, folders)
        path = os.path.join(cache, folders[0], "verified")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [line for line in f.read().splitlines() if len(line) > 65]

    def test_workers_without_the_file_fetch_their_shards_and_reuse_their_caches(self):
        ref, _ = cc.reference(self.model, cc.PROMPT, 16)
        size = os.path.getsize(self.model)
        c = self.cluster()
        c.coordinator(self.model, *FAST_DEATH, *SMALL_KV)
        caches = [self.cache(), self.cache()]
        workers = [self.worker(c, caches[0], *BUDGET)]
        cc.wait_for_log(self, workers[0], r"registered with")
        workers.append(self.worker(c, caches[1], *BUDGET))
        self.wait_ready(c, 2, timeout=FETCH_S)
        self.assertEqual(list(self.generate(c, cc.greedy(cc.PROMPT, 16)).token_ids), ref)
        for w in workers:
            log = w.stderr()
            # The coordinator's file is not there for the worker: it said so, then fetched.
            self.assertIn(f"cannot read {self.model} here (No such file or directory)", log)
            lines = self.load_lines(w)
            self.assertEqual(len(lines), 1, log)
            self.assertIn("model from the network", lines[0])
            # Only the shard's tensors: half the layers (and the embeddings) move, not the file.
            self.assertLess(moved(lines[0]), 0.8 * size, lines[0])
        self.assertTrue(os.path.exists(self.model))  # still there for the coordinator

        # A restarted worker loads from its cache: nothing moves.
        workers[1] = self.restart(c, workers[1], caches[1])
        lines = self.wait_loads(workers[1], 1)
        self.wait_ready(c, 2, timeout=FETCH_S)
        self.assertRegex(lines[-1], r"model from the cache .*: \d+ tensors verified, 0 bytes moved",
                         workers[1].stderr())
        self.assertEqual(list(self.generate(c, cc.greedy(cc.PROMPT, 16)).token_ids), ref)

        # A byte flipped in a cached tensor: that tensor alone is fetched again.
        workers[1].kill()
        self.wait_dead(c, workers[1])
        folder = os.path.join(caches[1], os.listdir(caches[1])[0])
        with open(os.path.join(folder, "model.gguf"), "r+b") as f:
            data = f.read()
            at = len(data.rstrip(b"\0")) - 1  # the last byte of the last tensor it holds
            f.seek(at)
            f.write(bytes([data[at] ^ 0xFF]))
        workers[1] = self.worker(c, caches[1], *BUDGET)
        line = self.wait_loads(workers[1], 1)[-1]
        self.wait_ready(c, 2, timeout=FETCH_S)
        self.assertIn("model from the network", line)
        self.assertIn("1 tensors fetched, 1 of them to replace corrupted cache copies", line)
        self.assertLess(moved(line), 0.25 * size, line)
        self.assertEqual(list(self.generate(c, cc.greedy(cc.PROMPT, 16)).token_ids), ref)

    def test_a_tensor_changed_after_the_load_is_written_back_while_serving(self):
        ref, _ = cc.reference(self.model, cc.PROMPT, 16)
        c = self.cluster()
        c.coordinator(self.model, *SMALL_KV)
        cache = self.cache()
        worker = self.worker(c, cache)
        self.wait_ready(c, 1, timeout=FETCH_S)
        self.assertEqual(list(self.generate(c, cc.greedy(cc.PROMPT, 16)).token_ids), ref)
        # 64 KiB of garbage inside the tensors of the loaded cache, the worker running on.
        path = os.path.join(cache, os.listdir(cache)[0], "model.gguf")
        at, size = os.path.getsize(path) // 2, 64 << 10
        with open(self.model, "rb") as f:
            f.seek(at)
            original = f.read(size)
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(b"\x7f" * size)
        # The background recheck (32 MiB/s: the 98 MB model in about 3 s a sweep) finds it and
        # writes the coordinator's bytes back into the file the shard is mapped from.
        deadline = time.monotonic() + 60
        while True:
            with open(path, "rb") as f:
                f.seek(at)
                if f.read(size) == original:
                    break
            self.assertLess(time.monotonic(), deadline, f"not written back:\n{worker.stderr()}")
            time.sleep(cc.POLL_S)
        self.assertRegex(worker.stderr(), r"model cache .*: tensor \S+ changed after it was "
                                          r"verified")
        self.assertEqual(self.load_lines(worker)[1:], [])  # no reload
        self.assertEqual(list(self.generate(c, cc.greedy(cc.PROMPT, 16)).token_ids), ref)

    def test_a_train_job_on_workers_without_the_file_fetches_the_rest_of_the_model(self):
        # Two stages: each worker holds half the layers for serving; a train replica needs the
        # whole model, so each fetches the other half, then trains like a worker with the file.
        c = self.cluster()
        c.coordinator(self.model, *SMALL_KV, "--train-dir", self.models)
        workers = [self.worker(c, self.cache())]
        cc.wait_for_log(self, workers[0], r"registered with")
        workers.append(self.worker(c, self.cache()))
        self.wait_ready(c, 2, timeout=FETCH_S)
        data = os.path.join(cc.ROOT, "tests/data/train/digits.jsonl")
        job = dict(population=4, iterations=2, seed=3, sigma=0.02, lr=0.02)
        stub = cc.tpb_grpc.TrainStub(c.channel(c.front.grpc))
        with open(data) as f:
            tasks = [cc.tpb.TrainTask(**__import__("json").loads(line)) for line in f]
        started = stub.StartJob(cc.tpb.StartJobRequest(tasks=tasks, **job), timeout=60)
        events = list(stub.WatchJob(cc.tpb.WatchJobRequest(job_id=started.job_id),
                                    timeout=FETCH_S))
        self.assertEqual(events[-1].state, cc.tpb.JOB_STATE_SUCCEEDED, f"{events[-1]}\n{c.logs()}")
        self.assertEqual(max(e.workers for e in events), 2)
        size = os.path.getsize(self.model)
        for w in workers:
            self.assertRegex(self.load_lines(w)[-1], r"^shard whole model: model from the ")
        # The second worker joined for the last layers: its replica fetched the first ones.
        line = self.load_lines(workers[1])[-1]
        self.assertIn("model from the network", line)
        self.assertLess(moved(line), 0.8 * size, line)
        # The same job where the file is at hand, in one process: the same parameters.
        p = subprocess.run([cc.BIN, "train", "es", self.model, "--data", data, "--threads", "1",
                            *[a for k, v in job.items() for a in (f"--{k}", str(v))]],
                           capture_output=True, text=True, timeout=FETCH_S)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(f"checksum {events[-1].checksum:016x}", p.stdout)

    def test_a_transfer_killed_midway_resumes_with_what_was_verified(self):
        ref, _ = cc.reference(self.model, cc.PROMPT, 16)
        c = self.cluster()
        c.coordinator(self.model, *FAST_DEATH)
        cache = self.cache()
        # 20 MB/s: the whole model (one stage) takes seconds, long enough to be cut midway.
        slow = self.worker(c, cache, "--model-fetch-rate", "20M")
        deadline = time.monotonic() + FETCH_S
        while len(self.verified(cache) if os.listdir(cache) else []) < 2:
            self.assertLess(time.monotonic(), deadline, f"nothing verified:\n{slow.stderr()}")
            self.assertEqual(self.load_lines(slow), [], "the transfer finished before the kill")
            time.sleep(cc.POLL_S)
        slow.kill()  # SIGKILL, mid-transfer
        self.assertEqual(self.load_lines(slow), [], "the transfer finished before the kill")
        self.wait_dead(c, slow)
        kept = len(self.verified(cache))
        self.assertGreaterEqual(kept, 2)

        again = self.worker(c, cache)
        self.wait_ready(c, 1, timeout=FETCH_S)
        line = self.wait_loads(again, 1)[-1]
        self.assertIn("model from the network", line)
        self.assertIn(f", {kept} reused from the cache)", line)
        self.assertNotIn("corrupted", line)
        self.assertEqual(list(self.generate(c, cc.greedy(cc.PROMPT, 16)).token_ids), ref)


if __name__ == "__main__":
    unittest.main()
