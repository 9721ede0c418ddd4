"""Hostile and unlucky conditions for real `fucina` processes, checked the way a user meets them:
a worker that hangs (SIGSTOP) rather than dies, a spare worker that comes and goes during a long
stream, a model file truncated while served, absurd start-up flags, and the defaults a new user
sees (model id, system prompt, validation shared by both front ends).

Reuses cluster_cli_test's process and gRPC helpers (same environment: FUCINA_BIN,
FUCINA_DEFAULT_MODEL, FUCINA_QWEN3_TOKENIZER; Debian's python3-grpcio).
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_cli_test as cc  # noqa: E402

FAST_DEATH = ("--heartbeat-ms", "200", "--dead-after-ms", "1000")
DEAD_AFTER_S = 1.0


def setUpModule():
    cc.setUpModule()


def tearDownModule():
    cc.tearDownModule()


def long_request(max_tokens=2000):
    return cc.greedy(cc.PROMPT, max_tokens, ignore_eos=True)


@unittest.skipUnless(cc.HAVE_TOKENIZER, cc.NO_TOKENIZER)
class WorkerFaultTest(cc.ClusterTestCase):
    def wait_until(self, what, predicate, timeout, c):
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                self.fail(f"{what} within {timeout} s\n{c.logs()}")
            time.sleep(cc.POLL_S)

    def hang(self, proc):
        """SIGSTOP `proc` (resumed at cleanup, so it can be killed); returns when it stopped."""
        proc.p.send_signal(signal.SIGSTOP)
        self.addCleanup(lambda: proc.p.poll() is None and proc.p.send_signal(signal.SIGCONT))
        return time.monotonic()

    def assert_stream_fails_in_time(self, c, stream, since):
        """The stream ends with UNAVAILABLE within --dead-after-ms + 2 s of `since`; the
        error's details."""
        with self.assertRaises(cc.grpc.RpcError) as ctx:
            for _ in stream:
                pass
        self.assertLess(time.monotonic() - since, DEAD_AFTER_S + 2.0,
                        f"the stream outlived a hung worker\n{c.logs()}")
        self.assertEqual(ctx.exception.code(), cc.grpc.StatusCode.UNAVAILABLE,
                         ctx.exception.details())
        return ctx.exception.details()

    def test_a_hung_worker_fails_its_streams_in_time_and_health_says_so(self):
        # SIGSTOP: no crash, no closed socket; the calls to it simply never return. It is
        # declared dead after --dead-after-ms of silence; then its in-flight calls are cancelled,
        # the stream fails naming it, health stops serving while the survivor is planned in, and
        # new requests are served again by the survivor.
        model = cc.fixture("dense")
        ref, _ = cc.reference(model, cc.PROMPT, 8)
        c = self.cluster()
        c.coordinator(model, *FAST_DEATH)
        workers = [c.worker(), c.worker()]
        p = self.wait_ready(c, 2)
        stream = c.api.GenerateStream(long_request(), timeout=cc.RPC_S)
        self.assertTrue(next(stream).token_ids)
        # The last stage: the one the coordinator waits on for every token.
        victim = next(w for w in workers if w.grpc == p.stages[-1].address)
        details = self.assert_stream_fails_in_time(c, stream, self.hang(victim))
        self.assertIn(victim.grpc, details)
        # Health: not serving while re-planning, then serving on the survivor.
        p = self.wait_ready(c, 1)
        self.check_stages(p, 4, [w.grpc for w in workers if w is not victim])
        self.wait_health(c, 1)
        self.assertEqual(list(self.generate(c, cc.greedy(cc.PROMPT, 8)).token_ids), ref)

    def test_a_hung_expert_worker_frees_the_stage_waiting_on_it(self):
        # Two stages call one expert worker for their MoE layers. When the expert worker hangs,
        # a stage is stuck inside its Forward, waiting on it. The coordinator cancels its call
        # to that stage; the stage must pass the cancellation on to its own expert call, or its
        # actor stays busy until that call's deadline (2 min) and the re-plan, which loads a
        # shard on it, waits as long.
        model = cc.fixture("moe")
        ref, _ = cc.reference(model, cc.PROMPT, 8)
        c = self.cluster()
        c.coordinator(model, "--expert-workers", "1", *FAST_DEATH)
        workers = [c.worker(), c.worker(), c.worker()]
        p = self.wait_ready(c, 2, experts=1)
        expert = next(w for w in workers if w.grpc == p.experts[0].address)
        stream = c.api.GenerateStream(long_request(), timeout=cc.RPC_S)
        self.assertTrue(next(stream).token_ids)
        details = self.assert_stream_fails_in_time(c, stream, self.hang(expert))
        self.assertIn(expert.grpc, details)
        # The survivors: one stage and one expert worker, loaded well before any deadline.
        p = self.wait_ready(c, 1, experts=1, timeout=15)
        self.assertNotIn(expert.grpc, [p.stages[0].address, p.experts[0].address])
        self.assertEqual(list(self.generate(c, cc.greedy(cc.PROMPT, 8)).token_ids), ref)

    def test_health_stops_serving_as_soon_as_a_worker_hangs(self):
        c = self.cluster()
        c.coordinator(cc.fixture("dense"), "--heartbeat-ms", "200", "--dead-after-ms", "1500")
        only = c.worker()
        self.wait_ready(c, 1)
        self.wait_health(c, 1)
        stream = c.api.GenerateStream(long_request(), timeout=cc.RPC_S)
        self.assertTrue(next(stream).token_ids)
        stopped_at = self.hang(only)
        self.wait_health(c, 2, timeout=1.5 + 2.0)
        self.assertLess(time.monotonic() - stopped_at, 1.5 + 2.0)
        # No survivor: a new request is refused at once, not queued behind the hung call.
        started = time.monotonic()
        details = self.assert_rpc_error(cc.grpc.StatusCode.UNAVAILABLE, c.api.Generate,
                                        cc.greedy(cc.PROMPT, 4), timeout=30)
        self.assertLess(time.monotonic() - started, 2.0)
        self.assertIn("not ready", details)
        with self.assertRaises(cc.grpc.RpcError):
            for _ in stream:
                pass

    def test_a_spare_worker_coming_and_going_leaves_running_streams_alone(self):
        # A worker with a 1-byte budget registers (so it is planned around, never given a
        # stage), then is killed in the middle of a long stream: the stream must finish whole.
        c = self.cluster()
        c.coordinator(cc.fixture("dense"), *FAST_DEATH)
        c.worker()
        self.wait_ready(c, 1)
        spare = c.worker("--memory-budget", "1")
        # Its arrival is planned in (a drain re-plan) once nothing runs; wait for that plan.
        self.wait_until("the spare worker's re-plan",
                        lambda: c.front.stderr().count("placement:") >= 2, cc.READY_S, c)
        self.wait_ready(c, 1)
        gen = 1000
        stream = c.api.GenerateStream(long_request(gen), timeout=cc.RPC_S)
        chunks = [next(stream)]
        spare.kill()
        killed_at = time.monotonic()
        for chunk in stream:
            chunks.append(chunk)
        self.assertGreater(time.monotonic() - killed_at, DEAD_AFTER_S,
                           "the stream ended before the spare was declared dead: lengthen it")
        self.assertIn("marked dead", c.front.stderr())
        self.assertEqual(chunks[-1].usage.completion_tokens, gen, c.logs())
        self.assertEqual(chunks[-1].finish_reason, "length")


    def test_a_cancelled_stream_counts_as_an_abort_not_a_failure(self):
        c = self.cluster()
        c.serve(cc.fixture("dense"), 1)
        self.wait_ready(c, 1)
        stream = c.api.GenerateStream(long_request(), timeout=cc.RPC_S)
        self.assertTrue(next(stream).token_ids)
        stream.cancel()
        name = c.api.ListModels(cc.pb.ListModelsRequest(), timeout=10).models[0].name
        abort = f'fucina_request_success_total{{finished_reason="abort",model_name="{name}"}}'
        failure = f'fucina_request_failure_total{{model_name="{name}"}}'
        self.wait_until("the abort counted",
                        lambda: cc.series(cc.scrape(c.front.metrics)).get(abort) == 1, 10, c)
        self.assertEqual(cc.series(cc.scrape(c.front.metrics))[failure], 0)


@unittest.skipUnless(cc.HAVE_SMOLLM2, cc.NO_SMOLLM2)
class ServedModelTest(cc.ClusterTestCase):
    def test_a_model_file_truncated_while_served_fails_requests_not_the_process(self):
        # A copy, so the shared model stays whole. Requests after the truncation end with an
        # error naming the file; the process keeps answering (no SIGBUS) and reports not ready.
        path = os.path.join(cc.TMP.name, "truncated.gguf")
        shutil.copyfile(cc.SMOLLM2, path)
        c = self.cluster()
        c.serve(path, 1)
        self.wait_ready(c, 1)
        self.generate(c, cc.greedy(cc.PROMPT, 4))
        os.truncate(path, os.path.getsize(path) // 2)
        details = self.assert_rpc_error(cc.grpc.StatusCode.UNAVAILABLE, c.api.Generate,
                                        cc.greedy(cc.PROMPT, 4), timeout=30)
        self.assertIn("truncated", details)
        self.assertIn(path, details)
        self.assertIsNone(c.front.p.poll(), "the server died")
        self.wait_health(c, 2)
        info = c.api.ListModels(cc.pb.ListModelsRequest(), timeout=10).models[0]
        self.assertFalse(info.ready)
        self.assertIn("truncated", info.status)

    def test_defaults_a_new_user_meets(self):
        # The model id is the file's stem (general.name stays an alias); a chat without a system
        # message gets `fucina run`'s default system prompt, so both give the same greedy reply.
        c = self.cluster()
        c.serve(cc.SMOLLM2, 1)
        self.wait_ready(c, 1)
        stem = os.path.splitext(os.path.basename(cc.SMOLLM2))[0]
        self.assertEqual(c.api.ListModels(cc.pb.ListModelsRequest(), timeout=10).models[0].name,
                         stem)
        question = "What is the capital of France?"
        request = cc.pb.GenerateRequest(
            messages=cc.pb.ChatMessages(messages=[cc.pb.ChatMessage(role="user",
                                                                    content=question)]),
            max_tokens=24, sampling=cc.pb.Sampling(temperature=0))
        served = self.generate(c, request).text
        self.assertIn("Paris", served)
        run = subprocess.run([cc.BIN, "run", cc.SMOLLM2, "--chat", question, "--gen", "24",
                              "--temp", "0", "--threads", "1"], capture_output=True, timeout=300)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(served, run.stdout.decode().rstrip("\n"))
        general_name = cc.pb.GenerateRequest(model="Smollm2 135M 8k Lc100K Mix1 Ep2",
                                             prompt=cc.PROMPT, max_tokens=2)
        self.generate(c, general_name)

    def test_grpc_validates_like_http(self):
        c = self.cluster()
        c.serve(cc.SMOLLM2, 1)
        self.wait_ready(c, 1)
        invalid = cc.grpc.StatusCode.INVALID_ARGUMENT
        for sampling, field in [(cc.pb.Sampling(temperature=-1), "temperature"),
                                (cc.pb.Sampling(presence_penalty=float("nan")), "presence_penalty"),
                                (cc.pb.Sampling(repetition_penalty=0), "repetition_penalty"),
                                (cc.pb.Sampling(top_p=-1), "top_p"),
                                (cc.pb.Sampling(logit_bias={49152: 1.0}), "logit_bias")]:
            details = self.assert_rpc_error(invalid, c.api.Generate,
                                            cc.pb.GenerateRequest(prompt=cc.PROMPT, max_tokens=2,
                                                                  sampling=sampling), timeout=30)
            self.assertIn(f"field '{field}'", details)
        # logit_bias is applied: the greedy first token banned, another forced.
        first = self.generate(c, cc.greedy(cc.PROMPT, 1)).token_ids[0]
        forced = 42 if first != 42 else 43
        r = self.generate(c, cc.pb.GenerateRequest(
            prompt=cc.PROMPT, max_tokens=3,
            sampling=cc.pb.Sampling(temperature=0, logit_bias={first: -100, forced: 100})))
        self.assertEqual(list(r.token_ids), [forced] * 3)
        developer = cc.pb.GenerateRequest(
            messages=cc.pb.ChatMessages(messages=[
                cc.pb.ChatMessage(role="developer", content="Be brief."),
                cc.pb.ChatMessage(role="user", content="Hi")]), max_tokens=2)
        self.generate(c, developer)


class StartupFlagTest(unittest.TestCase):
    """Flags that cannot work are refused at start with exit code 2 and the flag's name."""

    def check(self, args, flag):
        p = subprocess.run([cc.BIN, *args], capture_output=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        err = p.stderr.decode(errors="replace")
        self.assertEqual(p.returncode, 2, f"fucina {' '.join(args)}: {err}")
        self.assertIn(flag, err)

    @unittest.skipUnless(cc.HAVE_SMOLLM2, cc.NO_SMOLLM2)
    def test_absurd_flags_are_refused(self):
        serve = ["serve", cc.SMOLLM2, *cc.FRONT_ADDRESSES]
        for extra, flag in [(("--threads", "100000"), "--threads"),
                            (("--ctx", "100000000"), "--ctx"),
                            (("--ctx", "8000000"), "--ctx"),  # cannot fit this machine's memory
                            (("--max-connections", "0"), "--max-connections"),
                            (("--http-idle-timeout", "-1"), "--http-idle-timeout"),
                            (("--temp", "nan"), "--temp"),
                            (("--top-p", "0"), "--top-p"),
                            (("--repeat-penalty", "-3"), "--repeat-penalty"),
                            (("--workers", "0"), "--workers"),
                            (("--dead-after-ms", "100"), "--dead-after-ms"),
                            (("--micro-batches", "-1"), "--micro-batches"),
                            (("--micro-batches", "1000"), "--micro-batches"),
                            (("--max-step-tokens", "0"), "--max-step-tokens")]:
            with self.subTest(flag=extra):
                self.check([*serve, *extra], flag)
        self.check(["coordinator", cc.SMOLLM2, *cc.FRONT_ADDRESSES, "--kv-slots", "0"],
                   "--kv-slots")
        self.check(["run", cc.SMOLLM2, "--prompt", "x", "--threads", "100000"], "--threads")
        self.check(["run", cc.SMOLLM2, "--prompt", "x", "--temp", "-1"], "--temp")

    @unittest.skipUnless(shutil.which("cmake"), "cmake not installed")
    def test_the_cuda_option_says_there_are_no_cuda_kernels_yet(self):
        with tempfile.TemporaryDirectory(prefix="fucina-cuda-configure-") as build:
            p = subprocess.run(["cmake", "-S", cc.ROOT, "-B", build, "-DFUCINA_CUDA=ON",
                                "-DFUCINA_TESTS=OFF"], capture_output=True, timeout=120)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(b"no CUDA kernels yet", p.stderr)

    def test_worker_threads_are_checked_before_anything_starts(self):
        worker = ["worker", "--coordinator", "127.0.0.1:1", "--listen", "127.0.0.1:0",
                  "--metrics", "127.0.0.1:0"]
        self.check([*worker, "--threads", "100000"], "--threads")
        self.check([*worker, "--model-fetch-rate", "fast"], "--model-fetch-rate")


if __name__ == "__main__":
    unittest.main(verbosity=2)
