"""Evolution-strategies training across processes: `fucina train es` embedded with 1 and 2
in-process workers and a coordinator with 2 worker processes (driven by the example grpcio
client, examples/python/train_client.py) end with bit-identical trainable parameters, and so
does the job scored through the serving pipeline's two stage processes; a worker killed with
SIGKILL mid-job, whole replica or pipeline stage, changes nothing; a stopped job resumes from its checkpoint to the
same result; generate requests are served while a job trains; bad requests name the field.

Reuses cluster_cli_test's process and gRPC helpers (same environment: FUCINA_BIN,
FUCINA_QWEN3_TOKENIZER for the random-weight fixture; Debian's python3-grpcio).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_cli_test as cc  # noqa: E402

EXAMPLE = os.path.join(cc.ROOT, "examples/python/train_client.py")
# A small job: LoRA on q and v, nll reward; raw prompts (the fixture has no chat template).
JOB = {"population": 8, "sigma": 0.05, "lr": 0.1, "seed": 5}
FAST_DEATH = ("--heartbeat-ms", "200", "--dead-after-ms", "1000")


def setUpModule():
    cc.setUpModule()


def tearDownModule():
    cc.tearDownModule()


def write_tasks(path, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"Question {i}: what is {i} plus {i % 3}?",
                                "answer": f" {i + i % 3}"}) + "\n")
    return path


def checksum_of(text):
    m = re.findall(r"checksum ([0-9a-f]{16})", text)
    if not m:
        raise AssertionError(f"no checksum in:\n{text}")
    return m[-1]


@unittest.skipUnless(cc.HAVE_TOKENIZER, cc.NO_TOKENIZER)
class TrainClusterTest(cc.ClusterTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = cc.fixture("dense")
        cls.tasks = write_tasks(os.path.join(cc.TMP.name, "train-tasks.jsonl"), 6)
        cls.train_dir = os.path.join(cc.TMP.name, "train-jobs")

    def embedded(self, iterations, *extra):
        args = [cc.BIN, "train", "es", self.model, "--data", self.tasks, "--raw", "--mode",
                "lora", "--iterations", str(iterations), *extra]
        for k, v in JOB.items():
            args += [f"--{k}", str(v)]
        p = subprocess.run(args, capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout

    def start(self, c, iterations, **fields):
        stub = cc.tpb_grpc.TrainStub(c.channel(c.front.grpc))
        with open(self.tasks) as f:
            tasks = [cc.tpb.TrainTask(**json.loads(line)) for line in f]
        request = cc.tpb.StartJobRequest(tasks=tasks, raw=True, mode="lora",
                                         iterations=iterations, **JOB, **fields)
        return stub, stub.StartJob(request, timeout=60)

    def watch(self, stub, job_id):
        return list(stub.WatchJob(cc.tpb.WatchJobRequest(job_id=job_id), timeout=cc.RPC_S))

    def processes(self, workers=2, *extra):
        c = self.cluster()
        c.coordinator(self.model, "--train-dir", self.train_dir, *extra)
        procs = [c.worker() for _ in range(workers)]
        self.wait_ready(c, len(procs))
        return c, procs

    def wait_ready(self, c, workers):
        deadline = time.monotonic() + cc.READY_S
        while True:
            p = c.api.GetPlacement(cc.pb.GetPlacementRequest(), timeout=10)
            if p.ready and sum(w.alive for w in p.workers) == workers:
                return
            if time.monotonic() > deadline:
                self.fail(f"{workers} workers not ready within {cc.READY_S} s\n{c.logs()}")
            time.sleep(cc.POLL_S)

    def test_one_process_two_in_process_and_two_worker_processes_agree(self):
        one = self.embedded(3, "--workers", "1", "--threads", "1")
        two = self.embedded(3, "--workers", "2", "--threads", "2")
        self.assertEqual(checksum_of(one), checksum_of(two), one + two)
        rewards = [float(x) for x in re.findall(r"reward (-?[\d.]+)", one)]
        self.assertGreater(rewards[-1], rewards[0], one)

        c, _ = self.processes(2)
        env = {**os.environ, "PYTHONPATH": os.path.join(cc.TMP.name, "stubs")}
        args = [sys.executable, EXAMPLE, "--addr", c.front.grpc, "--data", self.tasks,
                "--raw", "--iterations", "3", "--population", "8", "--sigma", "0.05", "--lr",
                "0.1", "--seed", "5"]
        p = subprocess.run(args, capture_output=True, text=True, timeout=cc.RPC_S, env=env)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr + c.logs())
        self.assertIn("JOB_STATE_SUCCEEDED", p.stdout)
        self.assertEqual(checksum_of(p.stdout), checksum_of(one), p.stdout)
        # Both workers evaluated members; per generation O(population) bytes crossed.
        sent = [int(x) for x in re.findall(r"(\d+) B sent", p.stdout)]
        self.assertEqual(len(sent), 3, p.stdout)
        self.assertTrue(all(0 < b < 2000 for b in sent), sent)
        self.assertIn("2 workers", p.stdout)
        metrics = cc.series(cc.scrape(c.front.metrics))
        job = re.search(r"job (\S+) started", p.stdout).group(1)
        self.assertEqual(metrics[f'fucina_es_generation{{job="{job}"}}'], 3.0)
        self.assertEqual(
            metrics[f'fucina_es_members_total{{job="{job}",outcome="evaluated"}}'], 24.0)
        self.assertGreater(metrics[f'fucina_es_bytes_sent_total{{job="{job}"}}'], 0)
        self.assertIn(f'fucina_es_reward{{job="{job}",stat="mean"}}', metrics)
        self.assertIn(f'fucina_es_member_eval_seconds_count{{job="{job}"}}', metrics)
        listed = subprocess.run([cc.BIN, "client", "train", "list", "--addr", c.front.grpc],
                                capture_output=True, text=True, timeout=30)
        self.assertRegex(listed.stdout, rf"{job} succeeded generation 3/3 checksum "
                                        rf"{checksum_of(one)}")
        # The same job through the serving pipeline: each worker process holds its stage's
        # layers and every member is scored through both, activations going worker to worker.
        stub, piped = self.start(c, 3, pipeline=True)
        events = self.watch(stub, piped.job_id)
        self.assertEqual(events[-1].state, cc.tpb.JOB_STATE_SUCCEEDED, f"{events[-1]}{c.logs()}")
        self.assertEqual(f"{events[-1].checksum:016x}", checksum_of(one))
        self.assertEqual(events[-2].workers, 1, events[-2])  # one replica: the pipeline
        self.assertTrue(all(0 < e.bytes_sent < 2000 for e in events[1:-1]), events)

    def run_killing_one(self, iterations, **fields):
        """A job on 2 worker processes, the second killed with SIGKILL once the first
        generation is done; returns the reference checksum and the job's events."""
        reference = checksum_of(self.embedded(iterations, "--workers", "1", "--threads", "1"))
        c, procs = self.processes(2, *FAST_DEATH)
        stub, job = self.start(c, iterations, **fields)
        seen = []
        for event in stub.WatchJob(cc.tpb.WatchJobRequest(job_id=job.job_id), timeout=cc.RPC_S):
            seen.append(event)
            if event.generation == 1 and not event.HasField("train_reward"):
                procs[1].p.send_signal(signal.SIGKILL)
        return c, reference, seen

    def test_a_stage_killed_mid_pipelined_job_changes_nothing(self):
        c, reference, seen = self.run_killing_one(4, pipeline=True)
        last = seen[-1]
        # The survivor holds the whole model as the next plan's only stage, replays the log
        # and finishes the job with the uninterrupted run's parameters.
        self.assertEqual(last.state, cc.tpb.JOB_STATE_SUCCEEDED, f"{last}\n{c.logs()}")
        self.assertEqual(f"{last.checksum:016x}", reference)

    def test_a_worker_killed_mid_job_changes_nothing(self):
        c, reference, seen = self.run_killing_one(6)
        last = seen[-1]
        self.assertEqual(last.state, cc.tpb.JOB_STATE_SUCCEEDED, f"{last}\n{c.logs()}")
        self.assertEqual(f"{last.checksum:016x}", reference)
        self.assertEqual(seen[-2].workers, 1, seen[-2])

    def test_stop_then_resume_matches_an_uninterrupted_run(self):
        reference = checksum_of(self.embedded(5, "--workers", "1", "--threads", "1"))
        out = os.path.join(self.train_dir, "stopped", "job")
        c, _ = self.processes(1)
        stub, job = self.start(c, 1000, out_dir="stopped/job", job_id="stop-me")
        for event in stub.WatchJob(cc.tpb.WatchJobRequest(job_id=job.job_id), timeout=cc.RPC_S):
            if event.generation >= 2 and not event.HasField("train_reward"):
                stub.StopJob(cc.tpb.StopJobRequest(job_id=job.job_id), timeout=10)
            last = event
        self.assertEqual(last.state, cc.tpb.JOB_STATE_STOPPED, last)
        with open(os.path.join(out, "state.json")) as f:
            stopped_at = json.load(f)["generation"]
        self.assertGreaterEqual(stopped_at, 2)
        self.assertLess(stopped_at, 5)
        self.assertTrue(os.path.exists(os.path.join(out, "adapters.gguf")))
        # Resumed (by a new job) to 5 generations: the uninterrupted run's parameters.
        resumed = stub.StartJob(cc.tpb.StartJobRequest(resume_from="stopped/job", iterations=5,
                                                       out_dir="stopped/job"), timeout=60)
        events = self.watch(stub, resumed.job_id)
        self.assertEqual(events[-1].state, cc.tpb.JOB_STATE_SUCCEEDED, events[-1])
        self.assertEqual(events[-1].generation, 5)
        self.assertEqual(f"{events[-1].checksum:016x}", reference)
        # The same checkpoint resumed embedded, to 5 as well.
        again = subprocess.run([cc.BIN, "train", "es", "--resume", out, "--iterations", "5",
                                self.model], capture_output=True, text=True, timeout=300)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertEqual(checksum_of(again.stdout), reference)

    def test_generate_requests_are_served_while_a_job_trains(self):
        c, _ = self.processes(2)
        expected = cc.reference(self.model, cc.PROMPT, 8)[0]
        stub, job = self.start(c, 1000)
        events = stub.WatchJob(cc.tpb.WatchJobRequest(job_id=job.job_id), timeout=cc.RPC_S)
        next(events)
        next(events)  # training is under way
        for _ in range(2):
            reply = self.generate(c, cc.greedy(cc.PROMPT, 8))
            self.assertEqual(list(reply.token_ids), expected)
        self.assertEqual(stub.GetJob(cc.tpb.GetJobRequest(job_id=job.job_id), timeout=10).state,
                         cc.tpb.JOB_STATE_RUNNING)
        stub.StopJob(cc.tpb.StopJobRequest(job_id=job.job_id), timeout=10)
        for event in events:
            last = event
        self.assertEqual(last.state, cc.tpb.JOB_STATE_STOPPED)

    def test_bad_requests_name_the_field(self):
        c, _ = self.processes(1)
        stub = cc.tpb_grpc.TrainStub(c.channel(c.front.grpc))
        good = [cc.tpb.TrainTask(prompt="a", answer="b")]
        cases = [
            (cc.tpb.StartJobRequest(tasks=good, population=5), "population"),
            (cc.tpb.StartJobRequest(tasks=good + [cc.tpb.TrainTask(prompt="a", answer="")]),
             "tasks[1]"),
            (cc.tpb.StartJobRequest(), "tasks"),
            (cc.tpb.StartJobRequest(tasks=good, mode="half"), "mode"),
            (cc.tpb.StartJobRequest(tasks=good, reward="rule", rule="(["), "rule"),
            (cc.tpb.StartJobRequest(tasks=good, job_id="bad id!"), "job_id"),
            # Checkpoint folders stay under the coordinator's --train-dir.
            (cc.tpb.StartJobRequest(tasks=good, out_dir="/etc/cron.d"), "out_dir"),
            (cc.tpb.StartJobRequest(tasks=good, out_dir="a/../../x"), "out_dir"),
            (cc.tpb.StartJobRequest(resume_from="../elsewhere"), "resume_from"),
        ]
        for request, field in cases:
            with self.subTest(field=field):
                details = self.assert_rpc_error(cc.grpc.StatusCode.INVALID_ARGUMENT,
                                                stub.StartJob, request, timeout=30)
                self.assertIn(field, details)
        details = self.assert_rpc_error(cc.grpc.StatusCode.NOT_FOUND, stub.StartJob,
                                        cc.tpb.StartJobRequest(resume_from="missing"), timeout=30)
        self.assertIn("state.json", details)
        self.assertFalse(os.path.exists("/etc/cron.d/state.json.tmp"))
        self.assert_rpc_error(cc.grpc.StatusCode.NOT_FOUND, stub.GetJob,
                              cc.tpb.GetJobRequest(job_id="nope"), timeout=10)
        self.assertEqual(list(stub.ListJobs(cc.tpb.ListJobsRequest(), timeout=10).jobs), [])


if __name__ == "__main__":
    unittest.main()
