"""The cluster plane against hostile clients and unlucky operators, on real `fucina` processes on
127.0.0.1: dozens of WatchJob streams (each would hold a gRPC thread), a worker started without
--memory-budget sent absurd sizes, a coordinator stopped (SIGSTOP) longer than --dead-after-ms,
and a worker whose TLS certificate does not name the address it registers.

Reuses cluster_cli_test's process and gRPC helpers (same environment: FUCINA_BIN,
FUCINA_QWEN3_TOKENIZER for the random-weight fixture, FUCINA_DEFAULT_MODEL for SmolLM2;
Debian's python3-grpcio).
"""
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_cli_test as cc  # noqa: E402

BOUND_S = 30  # for a condition polled: far past what it needs, far short of a hang


def setUpModule():
    cc.setUpModule()


def tearDownModule():
    cc.tearDownModule()


def threads_of(proc):
    return len(os.listdir(f"/proc/{proc.p.pid}/task"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PlaneTestCase(cc.ClusterTestCase):
    def wait_until(self, what, predicate, c, timeout=BOUND_S):
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                self.fail(f"{what} within {timeout} s\n{c.logs()}")
            time.sleep(cc.POLL_S)


@unittest.skipUnless(cc.HAVE_TOKENIZER, cc.NO_TOKENIZER)
class StreamCapTest(PlaneTestCase):
    def test_watch_streams_beyond_the_cap_are_refused_and_generate_still_works(self):
        c = self.cluster()
        c.serve(cc.fixture("dense"), 1, "--max-watch-streams", "4")
        self.wait_ready(c, 1)
        train = cc.tpb_grpc.TrainStub(c.channel(c.front.grpc))
        tasks = [cc.tpb.TrainTask(prompt="Question: 1 plus 1?", answer=" 2")] * 2
        job = train.StartJob(cc.tpb.StartJobRequest(tasks=tasks, raw=True, iterations=100000,
                                                    population=2, sigma=0.05, lr=0.1),
                             timeout=60)
        self.addCleanup(lambda: train.StopJob(cc.tpb.StopJobRequest(job_id=job.job_id),
                                              timeout=60))
        before = threads_of(c.front)
        codes = []
        lock = threading.Lock()
        calls = []

        def watch():
            call = train.WatchJob(cc.tpb.WatchJobRequest(job_id=job.job_id), timeout=cc.RPC_S)
            with lock:
                calls.append(call)
            try:
                for _ in call:
                    pass
                code = cc.grpc.StatusCode.OK
            except cc.grpc.RpcError as e:
                code = e.code()
            with lock:
                codes.append(code)

        watchers = [threading.Thread(target=watch, daemon=True) for _ in range(40)]
        for t in watchers:
            t.start()

        def refused():
            with lock:
                return sum(code == cc.grpc.StatusCode.RESOURCE_EXHAUSTED for code in codes)

        self.wait_until("36 of 40 WatchJob streams refused beyond a cap of 4",
                        lambda: refused() >= 36, c)
        with lock:
            ended = list(codes)
        self.assertEqual(ended.count(cc.grpc.StatusCode.RESOURCE_EXHAUSTED), 36, ended)
        self.assertEqual(len(ended), 36, ended)  # the 4 admitted still stream
        # Streams refused take no thread; the 4 admitted hold one each.
        self.assertLess(threads_of(c.front) - before, 20)
        # The cap is WatchJob's: Generate is served beside the streams.
        reply = self.generate(c, cc.greedy(cc.PROMPT, 4))
        self.assertEqual(len(reply.token_ids), 4)
        with lock:
            admitted = list(calls)
        for call in admitted:
            call.cancel()
        for t in watchers:
            t.join(BOUND_S)
        # Places are given back: a new stream is admitted once the old ones went.
        self.wait_until("a new WatchJob stream admitted after the others ended",
                        lambda: self._admitted(train, job.job_id), c)

    @staticmethod
    def _admitted(train, job_id):
        call = train.WatchJob(cc.tpb.WatchJobRequest(job_id=job_id), timeout=1)
        try:
            for _ in call:
                pass
        except cc.grpc.RpcError as e:
            return e.code() == cc.grpc.StatusCode.DEADLINE_EXCEEDED
        return True


@unittest.skipUnless(cc.HAVE_SMOLLM2, cc.NO_SMOLLM2)
class DefaultBudgetTest(PlaneTestCase):
    def lone_worker(self, *extra):
        """A worker whose coordinator is not there: it serves its gRPC port all the same."""
        c = self.cluster()
        c.front = types.SimpleNamespace(grpc=f"127.0.0.1:{free_port()}")
        return c, c.worker(*extra)

    def shard(self, context):
        return cc.wire.LoadShardRequest(model_path=cc.SMOLLM2, stage=0, first_layer=0,
                                        last_layer=30, embeddings=True, head=True,
                                        context=context, cache_type="f16")

    def test_a_worker_without_a_budget_gets_one_and_checks_every_size_against_it(self):
        c, w = self.lone_worker()
        stub = c.worker_stub(w)
        with open("/proc/meminfo") as f:
            total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
        budget = self.stats(stub).memory_budget
        self.assertGreater(budget, 0, "a worker started without --memory-budget has none")
        self.assertLessEqual(budget, total * 1024)
        # A context no session could hold is refused at LoadShard, naming the field.
        for context, code in ((1 << 40, cc.grpc.StatusCode.INVALID_ARGUMENT),
                              (1 << 24, cc.grpc.StatusCode.RESOURCE_EXHAUSTED)):
            details = self.assert_rpc_error(code, stub.LoadShard, self.shard(context),
                                            timeout=60)
            self.assertIn("context", details)
        stub.LoadShard(self.shard(64), timeout=60)

    def test_a_step_beyond_the_budget_is_refused_per_segment(self):
        c, w = self.lone_worker("--memory-budget", "300M")
        stub = c.worker_stub(w)
        stub.LoadShard(self.shard(2048), timeout=60)
        # All-position logits of a 2048-token segment: 2048 x 49152 floats, twice (computed,
        # then copied into the reply), far past what the budget leaves after the weights.
        big = cc.wire.Segment(session_id=1, pos0=0, token_ids=[1] * 2048, all_logits=True)
        small = cc.wire.Segment(session_id=2, pos0=0, token_ids=[1, 2, 3], prefill_only=True)
        reply = stub.Forward(cc.wire.ForwardRequest(segments=[big, small]), timeout=60)
        self.assertEqual([e.index for e in reply.errors], [0], reply.errors)
        self.assertEqual(reply.errors[0].code, cc.grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
        self.assertIn("segments", reply.errors[0].message)
        # 5,000 new sessions in one step: those past the budget are refused, the worker lives.
        flood = [cc.wire.Segment(session_id=100 + i, pos0=0, token_ids=[1], prefill_only=True)
                 for i in range(5000)]
        reply = stub.Forward(cc.wire.ForwardRequest(segments=flood), timeout=120)
        self.assertGreater(len(reply.errors), 4000)
        stats = self.stats(stub)
        self.assertLessEqual(stats.weight_bytes + stats.kv_bytes, 300 << 20)
        with open(f"/proc/{w.p.pid}/status") as f:
            rss_kb = int(next(line for line in f if line.startswith("VmRSS:")).split()[1])
        self.assertLess(rss_kb, 1 << 20, "the worker grew past 1 GiB")


class FakeWorker:
    """A worker's gRPC face that loads any shard (and computes nothing), so a test decides
    exactly when its heartbeats are sent."""

    def __init__(self):
        from concurrent import futures

        class Servicer(cc.wire_grpc.WorkerServicer):
            def LoadShard(self, request, context):
                return cc.wire.LoadShardResponse(weight_bytes=1, kv_bytes_per_session=1)

            def GetStats(self, request, context):
                return cc.wire.WorkerStats()

        self.server = cc.grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        cc.wire_grpc.add_WorkerServicer_to_server(Servicer(), self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def close(self):
        self.server.stop(None)


@unittest.skipUnless(cc.HAVE_TOKENIZER, cc.NO_TOKENIZER)
class StoppedCoordinatorTest(PlaneTestCase):
    def test_a_coordinator_stopped_past_dead_after_keeps_its_workers(self):
        c = self.cluster()
        c.coordinator(cc.fixture("dense"), "--heartbeat-ms", "100", "--dead-after-ms", "1000")
        worker = FakeWorker()
        self.addCleanup(worker.close)
        registry = c.registry_stub()
        wid = registry.Register(cc.wire.RegisterRequest(
            address=worker.address,
            capabilities=cc.wire.Capabilities(cores=1, memory_budget=1 << 30, device="cpu")),
            timeout=10).worker_id

        def beat():
            return registry.Heartbeat(cc.wire.HeartbeatRequest(worker_id=wid), timeout=10).known

        def planned():
            self.assertTrue(beat(), c.logs())
            return c.api.GetPlacement(cc.pb.GetPlacementRequest(), timeout=10).ready

        self.wait_until("the fake worker planned in", planned, c)
        c.front.p.send_signal(signal.SIGSTOP)
        self.addCleanup(lambda: c.front.p.poll() is None and
                        c.front.p.send_signal(signal.SIGCONT))
        # The scenario: stopped for 3x --dead-after-ms, with no heartbeat waiting when it wakes.
        time.sleep(3.0)
        c.front.p.send_signal(signal.SIGCONT)
        # Silent for 0.3 s of the coordinator's own running time (under --dead-after-ms): the
        # worker is still known and was never declared dead.
        time.sleep(0.3)
        self.assertTrue(beat(), f"the worker was declared dead\n{c.logs()}")
        self.assertNotIn("marked dead", c.front.stderr())
        self.assertIn("did not run for", c.front.stderr())  # and it says why
        self.assertTrue(c.api.GetPlacement(cc.pb.GetPlacementRequest(), timeout=10).ready)


class CertificateNameTest(PlaneTestCase):
    def test_a_worker_whose_certificate_lacks_its_address_is_refused_once_clearly(self):
        if not cc.HAVE_TOKENIZER:
            self.skipTest(cc.NO_TOKENIZER)
        tls = cc.certs()
        # Same CA, a certificate for localhost only: the coordinator dials the worker at
        # 127.0.0.1 (its advertised address), which that certificate does not name.
        d = os.path.dirname(tls["ca"])
        p = subprocess.run([os.path.join(cc.ROOT, "scripts/make-cluster-certs.sh"), "--name",
                            "narrow", d, "localhost"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        narrow = {"ca": tls["ca"], "cert": os.path.join(d, "narrow.crt"),
                  "key": os.path.join(d, "narrow.key")}
        c = cc.Cluster(tls=tls)
        self.addCleanup(c.close)
        c.coordinator(cc.fixture("dense"), "--heartbeat-ms", "100", "--dead-after-ms", "600")
        c.tls = narrow
        w = c.worker()
        c.tls = tls
        self.wait_until("the worker said which name its certificate lacks",
                        lambda: "must name 127.0.0.1" in w.stderr(), c)
        # Backed off: no loop of registrations, deaths and re-plans.
        time.sleep(2.0)  # a window a looping worker would fill with attempts
        self.assertEqual(w.stderr().count("cannot register"), 1, w.stderr())
        self.assertNotIn("registered with", w.stderr())
        self.assertNotIn("marked dead", c.front.stderr())


if __name__ == "__main__":
    unittest.main()
