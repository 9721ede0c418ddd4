"""The pipeline with real processes: micro-batches in flight, stages that pass activations to
each other, continuous batching with chunked prefill, and a stage killed mid-flight.

Every request's greedy (and seeded) ids equal those of the single-process engine (`fucina run`)
whatever the stages, the micro-batches and the chunking, with requests of mixed prompt lengths
arriving while others decode.

Reuses cluster_cli_test's process and gRPC helpers (same environment: FUCINA_BIN,
FUCINA_DEFAULT_MODEL, FUCINA_QWEN3_TOKENIZER; Debian's python3-grpcio).
"""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_cli_test as cc  # noqa: E402

FAST_DEATH = ("--heartbeat-ms", "200", "--dead-after-ms", "1000")
DEAD_AFTER_S = 1.0

# Mixed lengths: with --max-step-tokens 16 the long ones are prefilled over several steps.
PROMPTS = [
    "Hi",
    cc.PROMPT,
    "Write a short story about a robot who learns to paint, in three sentences, with a twist "
    "at the end that nobody expects, and give it a title.",
    "List the planets of the solar system in order from the sun and say one fact about each.",
]
GEN = 12
SEEDED = ("--temp", "0.8", "--seed", "7")


def setUpModule():
    cc.setUpModule()


def tearDownModule():
    cc.tearDownModule()


class PipelineTestCase(cc.ClusterTestCase):
    def references(self, model):
        greedy = [cc.reference(model, p, GEN)[0] for p in PROMPTS]
        seeded = cc.reference(model, PROMPTS[1], GEN, *SEEDED)[0]
        for ids in greedy + [seeded]:
            self.assertTrue(ids)  # some end early (end of generation): they leave early here too
        return greedy, seeded

    def run_mixed(self, c, greedy_refs, seeded_ref, what):
        """Two streams start and decode; then the other prompts (and a seeded one) arrive while
        they do. Every reply equals its reference."""
        requests = [cc.greedy(p, GEN) for p in PROMPTS]
        seeded = cc.pb.GenerateRequest(prompt=PROMPTS[1], max_tokens=GEN,
                                       sampling=cc.pb.Sampling(temperature=0.8, seed=7))
        early = [c.api.GenerateStream(requests[i], timeout=cc.RPC_S) for i in (2, 0)]
        got = {2: [], 0: []}
        for i, stream in zip((2, 0), early):
            got[i].extend(next(stream).token_ids)  # decoding now
        late = {i: c.api.Generate.future(requests[i], timeout=cc.RPC_S) for i in (1, 3)}
        late_seeded = c.api.Generate.future(seeded, timeout=cc.RPC_S)
        for i, stream in zip((2, 0), early):
            for chunk in stream:
                got[i].extend(chunk.token_ids)
        for i, f in late.items():
            got[i] = list(f.result().token_ids)
        for i, ref in enumerate(greedy_refs):
            self.assertEqual(got[i], ref, f"{what}: prompt {i}\n{c.logs()}")
        self.assertEqual(list(late_seeded.result().token_ids), seeded_ref, f"{what}: seeded")

    def start(self, model, workers, remote, *flags):
        """`serve --workers N`, or a coordinator and N worker processes; waits for the plan."""
        c = self.cluster()
        if remote:
            c.coordinator(model, *flags)
            for _ in range(workers):
                c.worker()
        else:
            c.serve(model, workers, *flags)
        self.wait_ready(c, workers)
        return c

    def matrix(self, model, num_layers, processes=()):
        greedy_refs, seeded_ref = self.references(model)
        for workers in (1, 2, 3):
            for micro in (1, 2, 3, 4):
                what = f"serve --workers {workers} --micro-batches {micro}"
                with self.subTest(topology=what):
                    c = self.cluster()
                    c.serve(model, workers, "--micro-batches", str(micro),
                            "--max-step-tokens", "16", "--batch", "8")
                    self.wait_ready(c, workers)
                    # Read again: the placement wait_ready saw may predate the loaded plan.
                    p = c.api.GetPlacement(cc.pb.GetPlacementRequest(), timeout=10)
                    self.check_stages(p, num_layers)
                    self.assertEqual(p.micro_batches, micro)
                    self.run_mixed(c, greedy_refs, seeded_ref, what)
                    c.close()
        for workers, micro in processes:
            what = f"coordinator + {workers} worker processes, --micro-batches {micro}"
            with self.subTest(topology=what):
                c = self.cluster()
                c.coordinator(model, "--micro-batches", str(micro), "--max-step-tokens", "16",
                              "--batch", "8")
                procs = [c.worker() for _ in range(workers)]
                p = self.wait_ready(c, workers)
                self.check_stages(p, num_layers, [w.grpc for w in procs])
                self.run_mixed(c, greedy_refs, seeded_ref, what)
                c.close()


@unittest.skipUnless(cc.HAVE_TOKENIZER, cc.NO_TOKENIZER)
class FixtureParityTest(PipelineTestCase):
    def test_dense_fixture(self):
        self.matrix(cc.fixture("dense"), 4, processes=[(2, 2), (3, 3)])

    def test_moe_fixture(self):
        self.matrix(cc.fixture("moe"), 3, processes=[(2, 4)])


@unittest.skipUnless(cc.HAVE_SMOLLM2, cc.NO_SMOLLM2)
class SmolLM2ParityTest(PipelineTestCase):
    def test_smollm2(self):
        greedy_refs, seeded_ref = self.references(cc.SMOLLM2)
        for workers, micro, remote in ((1, 1, False), (2, 2, True), (3, 4, True), (3, 3, False)):
            what = f"{workers} stage(s), --micro-batches {micro}, {'processes' if remote else 'serve'}"
            with self.subTest(topology=what):
                c = self.start(cc.SMOLLM2, workers, remote, "--micro-batches", str(micro),
                               "--max-step-tokens", "16", "--batch", "8")
                self.run_mixed(c, greedy_refs, seeded_ref, what)
                c.close()


@unittest.skipUnless(cc.HAVE_SMOLLM2, cc.NO_SMOLLM2)
class SpeculativeTest(PipelineTestCase):
    def test_smollm2_spec_equals_plain_and_drafts_land(self):
        """--spec on one and two stages (the drafter on the coordinator, verify steps through
        the pipeline): every reply equals the single-process engine's plain decoding, a copy
        request lands drafts (fewer steps than tokens), and a request may opt out."""
        greedy_refs, seeded_ref = self.references(cc.SMOLLM2)
        doc = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He "
               "trimmed the wick, polished the great lens until it shone, and wound the "
               "clockwork that turned the light.")
        copy = cc.pb.GenerateRequest(
            messages=cc.pb.ChatMessages(messages=[cc.pb.ChatMessage(
                role="user", content=f"Repeat the following text exactly: {doc}")]),
            max_tokens=40, sampling=cc.pb.Sampling(temperature=0))
        for workers, remote in ((1, False), (2, True)):
            what = f"{workers} stage(s), {'processes' if remote else 'serve'}, --spec"
            with self.subTest(topology=what):
                c = self.start(cc.SMOLLM2, workers, remote, "--spec", "--micro-batches", "2",
                               "--max-step-tokens", "16", "--batch", "8")
                self.run_mixed(c, greedy_refs, seeded_ref, what)
                spec = c.api.Generate(copy, timeout=cc.RPC_S)
                copy.speculative = False
                plain = c.api.Generate(copy, timeout=cc.RPC_S)
                copy.ClearField("speculative")
                self.assertEqual(list(spec.token_ids), list(plain.token_ids), what)
                self.assertIn("lighthouse keeper climbed", spec.text, what)
                m = cc.series(cc.scrape(c.front.metrics))
                drafts = sum(v for k, v in m.items()
                             if k.startswith("fucina_spec_decode_num_drafts_total"))
                accepted = sum(v for k, v in m.items()
                               if k.startswith("fucina_spec_decode_num_accepted_tokens_total"))
                self.assertGreater(drafts, 0, what)
                # The copy alone lands most of its tokens as drafts.
                self.assertGreater(accepted, 20, what)
                c.close()


@unittest.skipUnless(cc.HAVE_TOKENIZER, cc.NO_TOKENIZER)
class StageToStageTest(PipelineTestCase):
    def test_the_coordinator_carries_no_activations(self):
        c = self.cluster()
        c.coordinator(cc.fixture("dense"))
        procs = [c.worker() for _ in range(3)]
        p = self.wait_ready(c, 3)
        name = c.api.ListModels(cc.pb.ListModelsRequest(), timeout=10).models[0].name
        r = self.generate(c, cc.greedy(cc.PROMPT, 8))
        self.assertEqual(r.usage.completion_tokens, 8)
        m = cc.series(cc.scrape(c.front.metrics))
        self.assertEqual(m[f'fucina_coordinator_activation_bytes_total{{model_name="{name}"}}'], 0)
        sent = f'fucina_coordinator_forward_bytes_total{{direction="sent",model_name="{name}"}}'
        self.assertGreater(m[sent], 0)
        # ... while every stage after the first received what the one before it sent.
        by_address = {w.grpc: w for w in procs}
        stats = [self.stats(c.worker_stub(by_address[s.address])) for s in p.stages]
        self.assertGreater(stats[0].activation_bytes_out, 0)
        self.assertEqual(stats[0].activation_bytes_in, 0)
        for before, after in zip(stats, stats[1:]):
            self.assertEqual(after.activation_bytes_in, before.activation_bytes_out)
        self.assertEqual(stats[-1].activation_bytes_out, 0)


@unittest.skipUnless(cc.HAVE_TOKENIZER, cc.NO_TOKENIZER)
class MidFlightFaultTest(PipelineTestCase):
    def sessions(self, c, placement, by_address):
        return {s.address: self.stats(c.worker_stub(by_address[s.address])).sessions
                for s in placement.stages}

    def test_killing_a_middle_stage_fails_its_streams_in_time_and_leaks_nothing(self):
        model = cc.fixture("moe")
        ref, _ = cc.reference(model, cc.PROMPT, 8)
        c = self.cluster()
        c.coordinator(model, "--expert-workers", "1", "--micro-batches", "3", "--batch", "6",
                      *FAST_DEATH)
        procs = [c.worker() for _ in range(4)]
        by_address = {w.grpc: w for w in procs}
        p = self.wait_ready(c, 3, experts=1)
        expert = by_address[p.experts[0].address]
        victim = by_address[p.stages[1].address]
        streams = [c.api.GenerateStream(cc.greedy(prompt, 2000, ignore_eos=True),
                                        timeout=cc.RPC_S) for prompt in PROMPTS + PROMPTS[:2]]
        for s in streams:
            self.assertTrue(next(s).token_ids)  # six streams decoding, three groups in flight
        victim.kill()
        killed_at = time.monotonic()
        for s in streams:
            with self.assertRaises(cc.grpc.RpcError) as ctx:
                for _ in s:
                    pass
            self.assertEqual(ctx.exception.code(), cc.grpc.StatusCode.UNAVAILABLE,
                             ctx.exception.details())
            self.assertIn(victim.grpc, ctx.exception.details())
        self.assertLess(time.monotonic() - killed_at, DEAD_AFTER_S + 2.0,
                        f"the streams outlived the killed stage\n{c.logs()}")

        # Re-planned on the survivors, the expert worker among them.
        p = self.wait_ready(c, 2, experts=1)
        self.assertNotIn(victim.grpc, [s.address for s in p.stages])
        self.assertEqual(p.experts[0].address, expert.grpc)
        self.assertEqual(list(self.generate(c, cc.greedy(cc.PROMPT, 8)).token_ids), ref)
        # Nothing leaked: every stage holds exactly the coordinator's resident slots (the one
        # finished conversation), and the expert worker holds no session and no queued call.
        p = c.api.GetPlacement(cc.pb.GetPlacementRequest(), timeout=10)
        self.assertEqual(p.resident_slots, 1)
        self.assertEqual(set(self.sessions(c, p, by_address).values()), {1})
        e = self.stats(c.worker_stub(expert))
        self.assertEqual((e.sessions, e.queue_depth), (0, 0))
        # Two running streams: both stages hold their sessions, and give them back on cancel.
        running = [c.api.GenerateStream(cc.greedy(prompt, 2000, ignore_eos=True),
                                        timeout=cc.RPC_S) for prompt in PROMPTS[2:]]
        for s in running:
            self.assertTrue(next(s).token_ids)
        p = c.api.GetPlacement(cc.pb.GetPlacementRequest(), timeout=10)
        self.assertEqual(p.resident_slots, 3)
        self.assertEqual(set(self.sessions(c, p, by_address).values()), {3})
        for s in running:
            s.cancel()
        deadline = time.monotonic() + 5
        while set(self.sessions(c, p, by_address).values()) != {1}:
            self.assertLess(time.monotonic(), deadline, "cancelled streams kept their sessions")
            time.sleep(cc.POLL_S)
        p = c.api.GetPlacement(cc.pb.GetPlacementRequest(), timeout=10)
        self.assertEqual(p.resident_slots, 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
