"""Multi-process tests of the cluster: `fucina serve | coordinator | worker | client` driven
through the public API (fucina.v1.Generation) and the internal one (fucina.cluster.v1.Worker)
with Python's grpcio, an independent gRPC implementation.

Environment: FUCINA_BIN (the fucina binary), FUCINA_DEFAULT_MODEL (the SmolLM2 GGUF; its tests
are skipped without it), FUCINA_QWEN3_TOKENIZER (folder with Qwen3's tokenizer.json, for the
random-weight fixtures; their tests are skipped without it). Runs with the system Python
(Debian's python3-grpcio and python3-protobuf); the stubs are generated from proto/ at start
with protoc and grpc_python_plugin.

Every server listens on ephemeral ports and announces them on stdout; every process started
here is killed when its test (or class) ends. Cluster processes share a join token file made
here (--cluster-token-file); the TLS tests make their certificates with
scripts/make-cluster-certs.sh (openssl).
"""
import collections
import json
import os
import re
import secrets
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("FUCINA_BIN", "")
SMOLLM2 = os.environ.get("FUCINA_DEFAULT_MODEL", "")
TOKENIZER = os.environ.get("FUCINA_QWEN3_TOKENIZER", "")
PROTOC = shutil.which("protoc") or ""
GRPC_PLUGIN = shutil.which("grpc_python_plugin") or ""
PROMTOOL = shutil.which("promtool") or ""
OPENSSL = shutil.which("openssl") or ""
NO_OPENSSL = "openssl not installed: no certificates for the TLS tests"

try:
    import grpc
except ImportError:  # the pyenv Python has no grpcio; the system one does
    grpc = None

HAVE_SMOLLM2 = bool(SMOLLM2) and os.path.exists(SMOLLM2)
HAVE_TOKENIZER = bool(TOKENIZER) and os.path.isdir(TOKENIZER)
NO_SMOLLM2 = "FUCINA_DEFAULT_MODEL (the SmolLM2 GGUF) not set or missing"
NO_TOKENIZER = "FUCINA_QWEN3_TOKENIZER not set: random-weight fixtures need its tokenizer.json"

# Filled by setUpModule: the generated message and stub modules, the join token and its file.
pb = pb_grpc = wire = wire_grpc = tpb = tpb_grpc = None
TMP = None
TOKEN = TOKEN_FILE = None

# Bounds (seconds). Generous next to what the tiny fixtures need, small next to a hang.
START_S = 60     # a process prints its `listening` line
READY_S = 60     # a model is planned and loaded
RPC_S = 120      # one generation
POLL_S = 0.05

PROMPT = "The quick brown fox"

# Ephemeral ports only; the HTTP front end (a fixed port by default) is not under test here.
FRONT_ADDRESSES = ("--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--http", "")


def setUpModule():
    global pb, pb_grpc, wire, wire_grpc, tpb, tpb_grpc, TMP, TOKEN, TOKEN_FILE
    if not BIN:
        raise unittest.SkipTest("FUCINA_BIN not set")
    if grpc is None:
        raise unittest.SkipTest(f"{sys.executable} has no grpcio (run with the system python3)")
    if not PROTOC or not GRPC_PLUGIN:
        raise unittest.SkipTest("protoc / grpc_python_plugin not installed")
    TMP = tempfile.TemporaryDirectory(prefix="fucina-cluster-test-")
    stubs = os.path.join(TMP.name, "stubs")
    os.makedirs(stubs)
    subprocess.run([PROTOC, "-I", os.path.join(ROOT, "proto"), f"--python_out={stubs}",
                    f"--grpc_out={stubs}", f"--plugin=protoc-gen-grpc={GRPC_PLUGIN}",
                    os.path.join(ROOT, "proto/fucina/v1/generate.proto"),
                    os.path.join(ROOT, "proto/fucina/v1/train.proto"),
                    os.path.join(ROOT, "proto/fucina/cluster/v1/worker.proto")],
                   check=True, capture_output=True, timeout=60)
    sys.path.insert(0, stubs)  # fucina/ and fucina/*/v1/ import as namespace packages
    import fucina.v1.generate_pb2 as pb_
    import fucina.v1.generate_pb2_grpc as pb_grpc_
    import fucina.cluster.v1.worker_pb2 as wire_
    import fucina.cluster.v1.worker_pb2_grpc as wire_grpc_
    import fucina.v1.train_pb2 as tpb_
    import fucina.v1.train_pb2_grpc as tpb_grpc_
    pb, pb_grpc, wire, wire_grpc = pb_, pb_grpc_, wire_, wire_grpc_
    tpb, tpb_grpc = tpb_, tpb_grpc_
    TOKEN = secrets.token_hex(32)
    TOKEN_FILE = os.path.join(TMP.name, "cluster-token")
    with open(os.open(TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(TOKEN + "\n")


def tearDownModule():
    if TMP is not None:
        TMP.cleanup()


# ---- fixtures and references ----

# Random-weight models. init-std 0.3 (not the default 0.02, nor --peaked) makes every layer
# change the next token: with small weights or peaked embeddings greedy decoding repeats a
# single token, and a stage that dropped its layers would go unnoticed. The seeds were picked
# so that the greedy and seeded outputs of PROMPT decode to valid UTF-8 (see
# FixtureTest.test_text_is_valid_utf8_when_tokens_split_a_character for the other case).
FIXTURES = {
    "dense": ["--arch", "qwen3", "--layers", "4", "--hidden", "64", "--heads", "4",
              "--kv-heads", "2", "--head-dim", "16", "--ffn", "128", "--init-std", "0.3",
              "--seed", "3"],
    "moe": ["--arch", "qwen3moe", "--layers", "3", "--hidden", "64", "--heads", "4",
            "--kv-heads", "2", "--head-dim", "16", "--experts", "4", "--experts-used", "2",
            "--expert-ffn", "64", "--init-std", "0.3", "--seed", "1"],
}
_fixture_paths = {}
_references = {}


def fixture(kind):
    if kind not in _fixture_paths:
        path = os.path.join(TMP.name, f"{kind}.gguf")
        p = subprocess.run([BIN, "gguf", "make-fixture", path, *FIXTURES[kind], "--tokenizer",
                            TOKENIZER, "--threads", "1"], capture_output=True, text=True,
                           timeout=120)
        if p.returncode != 0:
            raise AssertionError(f"fucina gguf make-fixture failed:\n{p.stderr}")
        _fixture_paths[kind] = path
    return _fixture_paths[kind]


def reference(model, prompt, gen, *sampling):
    """(ids, text bytes) of the single-process engine: `fucina run --print-ids`."""
    key = (model, prompt, gen, sampling)
    if key not in _references:
        args = sampling or ("--temp", "0")
        p = subprocess.run([BIN, "run", model, "--prompt", prompt, "--gen", str(gen), *args,
                            "--print-ids", "--threads", "1"], capture_output=True, timeout=300)
        if p.returncode != 0:
            raise AssertionError(f"fucina run failed:\n{p.stderr.decode(errors='replace')}")
        m = re.search(rb"\nids: ([0-9,]*)\n$", p.stdout)
        if m is None:
            raise AssertionError(f"no ids line in fucina run's output: {p.stdout!r}")
        ids = [int(x) for x in m.group(1).split(b",") if x]
        _references[key] = (ids, p.stdout[:m.start()])
    return _references[key]


# ---- processes ----

_certs = {}


def certs(name="cluster"):
    """{"ca", "cert", "key"} paths of a CA made by scripts/make-cluster-certs.sh and of a
    certificate it signed for localhost and 127.0.0.1; another `name` is another CA."""
    if not OPENSSL:
        raise unittest.SkipTest(NO_OPENSSL)
    if name not in _certs:
        d = os.path.join(TMP.name, f"certs-{name}")
        p = subprocess.run([os.path.join(ROOT, "scripts/make-cluster-certs.sh"), d],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise AssertionError(f"make-cluster-certs.sh failed:\n{p.stderr}")
        _certs[name] = {"ca": os.path.join(d, "ca.crt"), "cert": os.path.join(d, "node.crt"),
                        "key": os.path.join(d, "node.key")}
    return _certs[name]


def tls_flags(tls):
    return ["--tls-cert", tls["cert"], "--tls-key", tls["key"], "--tls-ca", tls["ca"]]


def read(path):
    with open(path, "rb") as f:
        return f.read()


class Proc:
    """A fucina server process; `grpc` and `metrics` are the addresses it announced."""

    def __init__(self, args, name, env=None):
        self.args = args
        self.log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", dir=TMP.name,
                                               delete=False)
        self.p = subprocess.Popen([BIN, *args], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=self.log,
                                  env=None if env is None else {**os.environ, **env})
        line = self._read_line(START_S)
        m = re.fullmatch(r"listening grpc=(\S+) metrics=(\S+)( http=\S+)?", line)
        if m is None:
            self.kill()
            raise AssertionError(f"fucina {' '.join(args)}: unexpected first line {line!r}\n"
                                 f"{self.stderr()}")
        self.grpc, self.metrics = m.group(1), m.group(2)

    def _read_line(self, timeout):
        fd = self.p.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + timeout
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                self.kill()
                raise AssertionError(f"fucina {' '.join(self.args)} printed no `listening` "
                                     f"line in {timeout} s\n{self.stderr()}")
            chunk = os.read(fd, 4096)
            if not chunk:
                self.kill()
                raise AssertionError(f"fucina {' '.join(self.args)} exited "
                                     f"({self.p.returncode}) before listening\n{self.stderr()}")
            buf += chunk
        return buf.split(b"\n", 1)[0].decode()

    def stderr(self):
        with open(self.log.name, "rb") as f:
            return f.read()[-4000:].decode(errors="replace")

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait(timeout=30)
        self.p.stdout.close()
        self.log.close()


def channel(address, ca=None, cert=None, key=None):
    """Plaintext, or TLS trusting the PEM CA file `ca` (with a client certificate when given)."""
    options = [("grpc.max_receive_message_length", 64 << 20)]
    if ca is None:
        return grpc.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(root_certificates=read(ca),
                                         private_key=read(key) if key else None,
                                         certificate_chain=read(cert) if cert else None)
    return grpc.secure_channel(address, creds, options=options)


class _CallDetails(collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                         "compression")), grpc.ClientCallDetails):
    pass


class _AddMetadata(grpc.UnaryUnaryClientInterceptor):
    """Adds fixed metadata (the join token) to every unary call, as fucina's clients do."""

    def __init__(self, pairs):
        self.pairs = pairs

    def intercept_unary_unary(self, continuation, details, request):
        details = _CallDetails(details.method, details.timeout,
                               list(details.metadata or []) + self.pairs, details.credentials,
                               details.wait_for_ready, details.compression)
        return continuation(details, request)


def with_token(ch, token=None):
    return grpc.intercept_channel(ch, _AddMetadata([("fucina-cluster-token", token or TOKEN)]))


class Cluster:
    """Processes of one test topology, killed together by close(). With `tls` (certs()),
    coordinator and workers run mutual TLS; the public API client trusts the CA and presents
    no certificate, the worker stubs present the cluster's."""

    def __init__(self, tls=None):
        self.tls = tls
        self.procs = []
        self.channels = []

    def _start(self, args, name, env=None):
        proc = Proc(args, name, env)
        self.procs.append(proc)
        return proc

    def _security(self):
        flags = ["--cluster-token-file", TOKEN_FILE]
        return flags + tls_flags(self.tls) if self.tls else flags

    def serve(self, model, workers, *extra):
        self.front = self._start(["serve", model, "--workers", str(workers), "--threads", "1",
                                  *FRONT_ADDRESSES, *extra], "serve")
        return self._api(self.front)

    def coordinator(self, model, *extra, env=None, security=True, listen="127.0.0.1:0"):
        flags = self._security() if security else []
        self.front = self._start(["coordinator", model, "--listen", listen,
                                  *FRONT_ADDRESSES[2:], *flags, *extra], "coordinator", env)
        return self._api(self.front)

    def worker(self, *extra, env=None, security=True, listen="127.0.0.1:0"):
        flags = self._security() if security else []
        return self._start(["worker", "--coordinator", self.front.grpc, "--threads", "1",
                            "--listen", listen, "--metrics", "127.0.0.1:0", *flags, *extra],
                           "worker", env)

    def channel(self, address, client_cert=False):
        if self.tls is None:
            ch = channel(address)
        elif client_cert:
            ch = channel(address, self.tls["ca"], self.tls["cert"], self.tls["key"])
        else:
            ch = channel(address, self.tls["ca"])
        self.channels.append(ch)
        return ch

    def _api(self, proc):
        ch = self.channel(proc.grpc)
        self.api = pb_grpc.GenerationStub(ch)
        self.health = ch.unary_unary("/grpc.health.v1.Health/Check",
                                     request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
        return self.api

    def worker_stub(self, proc):
        return wire_grpc.WorkerStub(with_token(self.channel(proc.grpc, client_cert=True)))

    def registry_stub(self, token=None, client_cert=True):
        ch = self.channel(self.front.grpc, client_cert=client_cert)
        return wire_grpc.RegistryStub(ch if token == "" else with_token(ch, token))

    def logs(self):
        return "\n".join(f"--- fucina {' '.join(p.args)}\n{p.stderr()}" for p in self.procs)

    def close(self):
        for ch in self.channels:
            ch.close()
        for p in self.procs:
            p.kill()

    def health_status(self):
        """grpc.health.v1 status of service "": 1 SERVING, 2 NOT_SERVING. The request is an
        empty HealthCheckRequest; the reply's field 1 (varint) is the status."""
        reply = self.health(b"", timeout=5)
        if reply == b"":
            return 0
        if len(reply) != 2 or reply[0] != 0x08:
            raise AssertionError(f"unexpected HealthCheckResponse {reply!r}")
        return reply[1]


def greedy(prompt, max_tokens, **kw):
    return pb.GenerateRequest(prompt=prompt, max_tokens=max_tokens,
                              sampling=pb.Sampling(temperature=0), **kw)


def scrape(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        return r.read().decode()


def series(text):
    """{'name{labels}': value} of a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def valid_utf8_prefix(raw):
    """Length of the longest prefix of `raw` that is valid UTF-8."""
    try:
        raw.decode()
        return len(raw)
    except UnicodeDecodeError as e:
        return e.start


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


class ClusterTestCase(unittest.TestCase):
    maxDiff = None

    def cluster(self):
        c = Cluster()
        self.addCleanup(c.close)
        return c

    def wait_ready(self, c, stages, experts=0, timeout=READY_S):
        """Polls until the placement has `stages` stages (and `experts` expert workers) and the
        model is loaded. ListModels.ready is checked after the placement because GetPlacement
        shows a new plan (ready) while its shards still load: see
        test_a_joining_worker_is_not_reported_ready_before_it_is_loaded."""
        deadline = time.monotonic() + timeout
        while True:
            p = c.api.GetPlacement(pb.GetPlacementRequest(), timeout=10)
            if p.ready and len(p.stages) == stages and len(p.experts) == experts:
                if c.api.ListModels(pb.ListModelsRequest(), timeout=10).models[0].ready:
                    return p
            if time.monotonic() > deadline:
                self.fail(f"no placement with {stages} stage(s) and {experts} expert "
                          f"worker(s) within {timeout} s; last: {p}\n{c.logs()}")
            time.sleep(POLL_S)

    def wait_health(self, c, status, timeout=10):
        deadline = time.monotonic() + timeout
        while c.health_status() != status:
            if time.monotonic() > deadline:
                self.fail(f"health did not become {status} within {timeout} s\n{c.logs()}")
            time.sleep(POLL_S)

    def check_stages(self, placement, num_layers, addresses=None):
        """Stages tile [0, num_layers) in order; the first embeds, the last has the head."""
        stages = placement.stages
        self.assertEqual(stages[0].first_layer, 0)
        self.assertEqual(stages[-1].last_layer, num_layers)
        for a, b in zip(stages, stages[1:]):
            self.assertEqual(a.last_layer, b.first_layer)
        for s in stages:
            self.assertLess(s.first_layer, s.last_layer, placement)
        self.assertEqual([s.embeddings for s in stages], [True] + [False] * (len(stages) - 1))
        self.assertEqual([s.head for s in stages], [False] * (len(stages) - 1) + [True])
        if addresses is not None:
            self.assertEqual(sorted(s.address for s in stages), sorted(addresses))

    def generate(self, c, request, timeout=RPC_S):
        try:
            return c.api.Generate(request, timeout=timeout)
        except grpc.RpcError as e:
            self.fail(f"Generate failed: {e.code()}: {e.details()}\n{c.logs()}")

    def stats(self, stub):
        return stub.GetStats(wire.StatsRequest(), timeout=10)

    def assert_rpc_error(self, code, fn, *args, **kw):
        with self.assertRaises(grpc.RpcError) as ctx:
            fn(*args, **kw)
        self.assertEqual(ctx.exception.code(), code, ctx.exception.details())
        return ctx.exception.details()

    def long_stream(self, c):
        """A streaming generation that runs far longer than any test waits for."""
        request = greedy(PROMPT, 2000, ignore_eos=True)
        return c.api.GenerateStream(request, timeout=RPC_S)


# ---- 1. greedy parity, 2. seeded sampling ----

class GreedyParityTest(ClusterTestCase):
    """Greedy ids through every topology equal those of the single-process engine."""

    GEN = 16

    def topologies(self, model, num_layers):
        ref, text = reference(model, PROMPT, self.GEN)
        self.assertEqual(len(ref), self.GEN)
        self.assertEqual(valid_utf8_prefix(text), len(text),
                         "the reference output is not UTF-8: pick another FIXTURES seed")
        for workers in (1, 2, 3):
            with self.subTest(topology=f"serve --workers {workers}"):
                c = self.cluster()
                c.serve(model, workers)
                p = self.wait_ready(c, workers)
                self.check_stages(p, num_layers, [""] * workers)  # in process: no address
                self.wait_health(c, 1)
                r = self.generate(c, greedy(PROMPT, self.GEN))
                self.assertEqual(list(r.token_ids), ref, c.logs())
                c.close()
        with self.subTest(topology="coordinator + 2 workers"):
            c = self.cluster()
            c.coordinator(model)
            workers = [c.worker(), c.worker()]
            p = self.wait_ready(c, 2)
            self.check_stages(p, num_layers, [w.grpc for w in workers])
            r = self.generate(c, greedy(PROMPT, self.GEN))
            self.assertEqual(list(r.token_ids), ref, c.logs())
            c.close()
        return ref

    @unittest.skipUnless(HAVE_SMOLLM2, NO_SMOLLM2)
    def test_smollm2(self):
        self.topologies(SMOLLM2, 30)

    @unittest.skipUnless(HAVE_TOKENIZER, NO_TOKENIZER)
    def test_dense_fixture(self):
        self.topologies(fixture("dense"), 4)

    @unittest.skipUnless(HAVE_TOKENIZER, NO_TOKENIZER)
    def test_moe_fixture_and_expert_workers(self):
        model = fixture("moe")
        ref = self.topologies(model, 3)
        # One pipeline stage; the 4 experts of every layer split over 2 expert workers.
        c = self.cluster()
        c.coordinator(model, "--expert-workers", "2")
        procs = [c.worker(), c.worker(), c.worker()]
        p = self.wait_ready(c, 1, experts=2)
        self.check_stages(p, 3)
        experts = [sorted(e.experts) for e in p.experts]
        self.assertTrue(all(experts), p)
        self.assertEqual(sorted(x for e in experts for x in e), [0, 1, 2, 3], p)
        by_address = {w.grpc: w for w in procs}
        self.assertEqual(len({p.stages[0].address} | {e.address for e in p.experts}), 3, p)
        r = self.generate(c, greedy(PROMPT, self.GEN))
        self.assertEqual(list(r.token_ids), ref, c.logs())
        # The routed rows really went to the expert workers, each to its own experts only.
        for e in p.experts:
            s = self.stats(c.worker_stub(by_address[e.address]))
            self.assertGreater(s.expert_tokens, 0, e)
            counts = list(s.expert_token_counts)
            self.assertEqual(len(counts), 4)
            self.assertEqual(sum(counts), s.expert_tokens)
            for x in range(4):
                if x not in e.experts:
                    self.assertEqual(counts[x], 0, (x, e))
        stage = self.stats(c.worker_stub(by_address[p.stages[0].address]))
        self.assertEqual(sum(stage.expert_token_counts), 0, "the stage ran experts itself")


@unittest.skipUnless(HAVE_TOKENIZER, NO_TOKENIZER)
class SampledTest(ClusterTestCase):
    def test_seeded_sampling_is_the_same_through_two_stages(self):
        model = fixture("dense")
        request = pb.GenerateRequest(prompt=PROMPT, max_tokens=16,
                                     sampling=pb.Sampling(temperature=0.8, seed=7))
        ids = {}
        for workers in (1, 2):
            c = self.cluster()
            c.serve(model, workers)
            self.wait_ready(c, workers)
            ids[workers] = list(self.generate(c, request).token_ids)
            c.close()
        self.assertEqual(len(ids[1]), 16)
        self.assertEqual(ids[2], ids[1])
        # The same sampler as the single-process engine's, and really sampling (not greedy).
        sampled, _ = reference(model, PROMPT, 16, "--temp", "0.8", "--seed", "7")
        self.assertEqual(ids[1], sampled)
        self.assertNotEqual(ids[1], reference(model, PROMPT, 16)[0])


# ---- 3, 4, 5: one SmolLM2 cluster of a coordinator and two worker processes ----

@unittest.skipUnless(HAVE_SMOLLM2, NO_SMOLLM2)
class SmolLM2ClusterTest(ClusterTestCase):
    @classmethod
    def setUpClass(cls):
        c = cls.c = Cluster()
        cls.addClassCleanup(c.close)
        c.coordinator(SMOLLM2)
        cls.workers = [c.worker(), c.worker()]
        cls.worker_stubs = [c.worker_stub(w) for w in cls.workers]

    def setUp(self):
        self.placement = self.wait_ready(self.c, 2)

    def test_stream_matches_unary(self):
        c = self.c
        request = greedy("Once upon a time", 24)
        unary = self.generate(c, request)
        messages = list(c.api.GenerateStream(request, timeout=RPC_S))
        self.assertGreater(len(messages), 1)
        self.assertEqual("".join(m.text for m in messages), unary.text)
        ids = [i for m in messages for i in m.token_ids]
        self.assertEqual(ids, list(unary.token_ids))
        self.assertEqual(len(ids), 24)
        last = messages[-1]
        self.assertEqual(last.finish_reason, "length")
        self.assertEqual(last.usage.completion_tokens, len(ids))
        self.assertEqual(last.usage.prompt_tokens, unary.usage.prompt_tokens)
        for m in messages[:-1]:
            self.assertEqual(m.finish_reason, "")
            self.assertFalse(m.HasField("usage"), m)

    def test_client_command(self):
        c = self.c

        def client(*args):
            return subprocess.run([BIN, "client", "generate", "--addr", c.front.grpc,
                                   "--timeout", "60", *args], capture_output=True, text=True,
                                  timeout=90)

        unary = self.generate(c, greedy("The capital of France is", 8))
        for stream in ([], ["--stream"]):
            p = client("--prompt", "The capital of France is", "--gen", "8", "--temp", "0",
                       *stream)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stdout, unary.text + "\n")
        p = client("--prompt", "hi", "--model", "nope")
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr, r"(?m)^error: NOT_FOUND: .*'nope'")
        self.assertEqual(p.stdout, "")

    def test_server_reflection_lists_the_services(self):
        # grpc.reflection.v1alpha, called generically: a ServerReflectionRequest with
        # list_services = "" (field 7, length 0); the reply lists service names as strings.
        ch = channel(self.c.front.grpc)
        try:
            call = ch.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
            replies = list(call(iter([b"\x3a\x00"]), timeout=10))
        finally:
            ch.close()
        self.assertEqual(len(replies), 1)
        for name in (b"fucina.v1.Generation", b"grpc.health.v1.Health"):
            self.assertIn(name, replies[0])

    def test_kv_reuse_forwards_only_the_new_rows(self):
        c = self.c
        prompt = "Fucina's KV reuse test: the three primary colors are"
        before = [self.stats(s).forwarded_positions for s in self.worker_stubs]
        first = self.generate(c, greedy(prompt, 8))
        self.assertEqual(first.usage.completion_tokens, 8)
        mid = [self.stats(s).forwarded_positions for s in self.worker_stubs]
        prompt2 = prompt + first.text + " In other words,"
        second = self.generate(c, greedy(prompt2, 8))
        after = [self.stats(s).forwarded_positions for s in self.worker_stubs]

        ids1 = list(c.api.Tokenize(pb.TokenizeRequest(text=prompt), timeout=10).ids)
        ids2 = list(c.api.Tokenize(pb.TokenizeRequest(text=prompt2), timeout=10).ids)
        self.assertEqual(first.usage.prompt_tokens, len(ids1))
        self.assertEqual(second.usage.prompt_tokens, len(ids2))
        # The slot of the first request holds its prompt and every generated token but the
        # last (sampled, never forwarded); at least one prompt token is recomputed for logits.
        held = ids1 + list(first.token_ids)[:-1]
        expected_cached = min(common_prefix(held, ids2), len(ids2) - 1)
        self.assertGreater(expected_cached, len(ids1))
        self.assertEqual(second.usage.cached_tokens, expected_cached)
        # Each step forwards the uncached prompt rows, then one row per generated token except
        # the last; both stages run every row.
        rows1 = (len(ids1) - first.usage.cached_tokens) + first.usage.completion_tokens - 1
        rows2 = (len(ids2) - second.usage.cached_tokens) + second.usage.completion_tokens - 1
        for w in range(2):
            self.assertEqual(mid[w] - before[w], rows1, f"worker {w}")
            self.assertEqual(after[w] - mid[w], rows2, f"worker {w}")
        # The reused KV gives what a cold server computes.
        cold = self.cluster()
        cold.serve(SMOLLM2, 2)
        self.wait_ready(cold, 2)
        fresh = self.generate(cold, greedy(prompt2, 8))
        self.assertEqual(fresh.usage.cached_tokens, 0)
        self.assertEqual(list(second.token_ids), list(fresh.token_ids))
        self.assertEqual(second.text, fresh.text)


# ---- 6. faults ----

@unittest.skipUnless(HAVE_SMOLLM2, NO_SMOLLM2)
class ConstraintTest(ClusterTestCase):
    """sampling.constraint on the public gRPC API, with worker processes: the last stage holds
    the matcher (its token table built from the model it loaded), so replies follow the
    grammar and end when it is complete, the same as one process; a bad grammar is refused
    with INVALID_ARGUMENT before it is queued."""

    def request(self, **constraint):
        return pb.GenerateRequest(prompt="Is the sky blue? Answer:", max_tokens=24,
                                  sampling=pb.Sampling(temperature=0,
                                                       constraint=pb.Constraint(**constraint)))

    def test_grammar_through_worker_processes_matches_one_process(self):
        cases = [dict(regex=" (yes|no)\\."), dict(lark='start: " " WORD "."\nWORD: /[a-z]{1,8}/'),
                 dict(json_schema='{"type":"object","properties":{"a":{"enum":["x","y"]}},'
                                  '"required":["a"],"additionalProperties":false}')]
        one = self.cluster()
        one.serve(SMOLLM2, 1)
        self.wait_ready(one, 1)
        want = [self.generate(one, self.request(**k)) for k in cases]
        one.close()
        c = self.cluster()
        c.coordinator(SMOLLM2)
        c.worker(), c.worker()
        self.wait_ready(c, 2)
        for k, w in zip(cases, want):
            r = self.generate(c, self.request(**k))
            self.assertEqual(r.finish_reason, "stop", (k, r.text))
            self.assertEqual(r.text, w.text, k)
            self.assertEqual(list(r.token_ids), list(w.token_ids), k)
        self.assertRegex(want[0].text, r"^ (yes|no)\.$")
        self.assertRegex(want[1].text, r"^ [a-z]{1,8}\.$")
        self.assertIn(json.loads(want[2].text)["a"], ("x", "y"))
        for bad, says in ((dict(regex="(unclosed"), "regex"),
                          (dict(json_schema="{not json"), "not valid JSON"),
                          (dict(lark="start: nowhere"), "nowhere")):
            with self.assertRaises(grpc.RpcError) as ctx:
                c.api.Generate(self.request(**bad), timeout=RPC_S)
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("sampling.constraint", ctx.exception.details())
            self.assertIn(says, ctx.exception.details())
        c.close()


@unittest.skipUnless(HAVE_TOKENIZER, NO_TOKENIZER)
class FaultTest(ClusterTestCase):
    FAST_DEATH = ("--heartbeat-ms", "200", "--dead-after-ms", "1000")

    def test_killed_worker_fails_the_stream_then_replans_and_rejoins(self):
        model = fixture("dense")
        ref, _ = reference(model, PROMPT, 16)
        c = self.cluster()
        c.coordinator(model, *self.FAST_DEATH)
        workers = [c.worker(), c.worker()]
        self.wait_ready(c, 2)
        stream = self.long_stream(c)
        self.assertTrue(next(stream).token_ids)
        victim, survivor = workers
        victim.kill()
        killed_at = time.monotonic()
        with self.assertRaises(grpc.RpcError) as ctx:
            for _ in stream:
                pass
        self.assertLess(time.monotonic() - killed_at, 5.0, "the stream outlived the worker")
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAVAILABLE,
                         ctx.exception.details())

        p = self.wait_ready(c, 1)
        self.check_stages(p, 4, [survivor.grpc])
        self.assertEqual(list(self.generate(c, greedy(PROMPT, 16)).token_ids), ref)

        newcomer = c.worker()
        p = self.wait_ready(c, 2)
        self.check_stages(p, 4, [survivor.grpc, newcomer.grpc])
        self.assertEqual(list(self.generate(c, greedy(PROMPT, 16)).token_ids), ref)

    def test_survivor_too_small_makes_the_model_not_ready(self):
        model = fixture("dense")
        small = ("--ctx", "256", "--kv-slots", "1", *self.FAST_DEATH)
        # What the whole model needs, as the planner counts it: ask with a 1-byte budget.
        probe = self.cluster()
        probe.coordinator(model, *small)
        probe.worker("--memory-budget", "1")
        deadline = time.monotonic() + READY_S
        while True:
            status = probe.api.GetPlacement(pb.GetPlacementRequest(), timeout=10).status
            m = re.search(r"needs (\d+) bytes", status)
            if m or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        self.assertIsNotNone(m, f"no memory need in the status: {status!r}\n{probe.logs()}")
        need = int(m.group(1))
        probe.close()
        # Each worker holds 60%: a half of the model fits, the whole does not.
        budget = str(need * 3 // 5)
        c = self.cluster()
        c.coordinator(model, *small)
        workers = [c.worker("--memory-budget", budget), c.worker("--memory-budget", budget)]
        self.wait_ready(c, 2)
        self.generate(c, greedy(PROMPT, 4))
        workers[0].kill()
        deadline = time.monotonic() + 10
        while True:
            info = c.api.ListModels(pb.ListModelsRequest(), timeout=10).models[0]
            if not info.ready or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        self.assertFalse(info.ready, "still ready 10 s after the kill")
        self.assertIn("memory", info.status)
        self.wait_health(c, 2)
        self.assertFalse(c.api.GetPlacement(pb.GetPlacementRequest(), timeout=10).ready)
        started = time.monotonic()
        details = self.assert_rpc_error(grpc.StatusCode.UNAVAILABLE, c.api.Generate,
                                        greedy(PROMPT, 4), timeout=30)
        self.assertLess(time.monotonic() - started, 2.0, "Generate did not fail fast")
        self.assertIn("not ready", details)
        self.assertIn("memory", details)


# ---- 7-10 and the text encoding: a dense fixture ----

@unittest.skipUnless(HAVE_TOKENIZER, NO_TOKENIZER)
class FixtureTest(ClusterTestCase):
    def test_cancelled_stream_frees_kv_on_every_stage(self):
        c = self.cluster()
        c.coordinator(fixture("dense"))
        stubs = [c.worker_stub(c.worker()), c.worker_stub(c.worker())]
        self.wait_ready(c, 2)
        stream = self.long_stream(c)
        self.assertTrue(next(stream).token_ids)
        self.assertEqual([self.stats(s).sessions for s in stubs], [1, 1])
        stream.cancel()
        deadline = time.monotonic() + 5
        while True:
            sessions = [self.stats(s).sessions for s in stubs]
            if sessions == [0, 0] or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        self.assertEqual(sessions, [0, 0], "KV still held 5 s after the cancel")
        # The coordinator's gauge of resident slots follows: the only slot was freed.
        usage = series(scrape(c.front.metrics))
        name = c.api.ListModels(pb.ListModelsRequest(), timeout=10).models[0].name
        self.assertEqual(usage[f'fucina_kv_cache_usage_perc{{model_name="{name}"}}'], 0,
                         "fucina_kv_cache_usage_perc still counts the cancelled request's slot")
        self.assertEqual(usage[f'fucina_num_requests_running{{model_name="{name}"}}'], 0)

    def test_a_joining_worker_is_not_reported_ready_before_it_is_loaded(self):
        # Clients wait on GetPlacement.ready or the gRPC health status before sending work, so
        # neither may claim a plan whose shards are still loading. Loading the fixture's shards
        # takes long enough (about 0.1 s) for a tight poll to look inside that window.
        c = self.cluster()
        c.coordinator(fixture("dense"))
        c.worker()
        self.wait_ready(c, 1)
        self.wait_health(c, 1)
        c.worker()
        deadline = time.monotonic() + READY_S
        while True:
            p = c.api.GetPlacement(pb.GetPlacementRequest(), timeout=10)
            if p.ready and len(p.stages) == 2:
                break
            self.assertLess(time.monotonic(), deadline, f"no 2-stage placement: {p}")
            time.sleep(0.005)
        serving = c.health_status() == 1
        try:
            c.api.Generate(greedy(PROMPT, 4), timeout=RPC_S)
            refused = None
        except grpc.RpcError as e:
            refused = f"{e.code()}: {e.details()}"
        with self.subTest(signal="GetPlacement"):
            self.assertIsNone(refused, "GetPlacement showed a ready 2-stage plan, yet Generate "
                                       "was refused")
        with self.subTest(signal="health"):
            self.assertFalse(serving and refused, "health said SERVING, yet Generate was "
                                                  f"refused: {refused}")
        # Once loaded, the new plan serves.
        self.wait_ready(c, 2)
        self.generate(c, greedy(PROMPT, 4))

    def test_malformed_worker_messages_are_invalid_argument(self):
        c = self.cluster()
        c.coordinator(fixture("dense"))
        procs = [c.worker(), c.worker()]
        p = self.wait_ready(c, 2)
        by_address = {w.grpc: c.worker_stub(w) for w in procs}
        stage0, stage1 = (by_address[s.address] for s in p.stages)
        sid = 987654321
        seg = lambda pos0=0: wire.Segment(session_id=sid, pos0=pos0, token_ids=[1],
                                          sampling=wire.Sampling(temperature=0))
        invalid = grpc.StatusCode.INVALID_ARGUMENT

        details = self.assert_rpc_error(invalid, stage0.Forward,
                                        wire.ForwardRequest(stage=1, segments=[seg()]),
                                        timeout=10)
        self.assertIn("stage 1", details)
        self.assertIn("stage 0", details)

        short = wire.Activations(type=wire.ACTIVATION_F32, rows=1, hidden=64, data=b"\0" * 10)
        details = self.assert_rpc_error(invalid, stage1.Forward,
                                        wire.ForwardRequest(stage=1, segments=[seg()],
                                                            activations=short), timeout=10)
        self.assertIn("10 bytes", details)
        self.assertIn(str(64 * 4), details)

        # A segment's own error rides in the reply: the call succeeds (not the worker's failure).
        reply = stage0.Forward(wire.ForwardRequest(stage=0, segments=[seg(pos0=5)]), timeout=10)
        self.assertEqual([e.code for e in reply.errors], [invalid.value[0]])
        self.assertIn(f"unknown session {sid}", reply.errors[0].message)

        # So do a session operation's, in a step of operations only (and one of a kind the
        # worker does not know).
        reply = stage1.Forward(wire.ForwardRequest(stage=1, session_ops=[
            wire.SessionOp(truncate=wire.TruncateSession(session_id=sid, length=1)),
            wire.SessionOp()]), timeout=10)
        self.assertEqual([(e.index, e.code) for e in reply.op_errors],
                         [(0, invalid.value[0]), (1, invalid.value[0])])
        self.assertIn(f"unknown session {sid}", reply.op_errors[0].message)
        self.assertIn("kind", reply.op_errors[1].message)

        # None of it created a session or hurt the shards.
        self.assertEqual([self.stats(s).sessions for s in (stage0, stage1)], [0, 0])
        ref, _ = reference(fixture("dense"), PROMPT, 16)
        self.assertEqual(list(self.generate(c, greedy(PROMPT, 16)).token_ids), ref)

    def test_metrics(self):
        c = self.cluster()
        c.coordinator(fixture("dense"))
        procs = [c.worker(), c.worker()]
        self.wait_ready(c, 2)
        name = c.api.ListModels(pb.ListModelsRequest(), timeout=10).models[0].name
        label = f'{{model_name="{name}"}}'
        key = lambda metric: metric + label

        before = series(scrape(c.front.metrics))
        r = self.generate(c, greedy(PROMPT, 12))
        mid = series(scrape(c.front.metrics))
        self.assertEqual(r.usage.completion_tokens, 12)
        self.assertEqual(mid[key("fucina_generation_tokens_total")] -
                         before[key("fucina_generation_tokens_total")], 12)
        self.assertEqual(mid[key("fucina_prompt_tokens_total")] -
                         before[key("fucina_prompt_tokens_total")], r.usage.prompt_tokens)
        self.assertEqual(mid[key("fucina_num_requests_running")], 0)
        self.assertEqual(mid[key("fucina_num_requests_waiting")], 0)
        length = f'fucina_request_success_total{{finished_reason="length",model_name="{name}"}}'
        self.assertEqual(mid[length] - before.get(length, 0), 1)

        again = self.generate(c, greedy(PROMPT, 12))
        after = series(scrape(c.front.metrics))
        self.assertGreater(again.usage.cached_tokens, 0)
        self.assertEqual(after[key("fucina_prefix_cache_hits_total")] -
                         mid[key("fucina_prefix_cache_hits_total")], again.usage.cached_tokens)
        self.assertEqual(after[key("fucina_prefix_cache_queries_total")] -
                         mid[key("fucina_prefix_cache_queries_total")], again.usage.prompt_tokens)

        worker_text = scrape(procs[0].metrics)
        worker = series(worker_text)
        stats = self.stats(c.worker_stub(procs[0]))
        self.assertEqual(worker["fucina_worker_forwarded_positions_total"],
                         stats.forwarded_positions)
        self.assertGreater(stats.forwarded_positions, 0)
        self.assertEqual(worker["fucina_worker_resident_sessions"], stats.sessions)
        self.assertIn("fucina_worker_forward_latency_seconds_count", worker)

        if not PROMTOOL:
            self.skipTest("promtool not installed: exposition format not linted")
        for text in (scrape(c.front.metrics), worker_text):
            p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                               text=True, timeout=30)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_queue_full_is_resource_exhausted(self):
        c = self.cluster()
        c.serve(fixture("dense"), 1, "--max-queue", "1", "--batch", "1")
        self.wait_ready(c, 1)
        running = self.long_stream(c)
        self.assertTrue(next(running).token_ids)
        queued = c.api.Generate.future(greedy(PROMPT, 4), timeout=RPC_S)
        try:
            # The queued request is counted as soon as it holds its queue place.
            name = c.api.ListModels(pb.ListModelsRequest(), timeout=10).models[0].name
            waiting = f'fucina_num_requests_waiting{{model_name="{name}"}}'
            deadline = time.monotonic() + 10
            while series(scrape(c.front.metrics)).get(waiting) != 1:
                self.assertLess(time.monotonic(), deadline, "the second request never queued")
                self.assertFalse(queued.done(), "the second request was not queued")
                time.sleep(POLL_S)
            details = self.assert_rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, c.api.Generate,
                                            greedy(PROMPT, 4), timeout=30)
            self.assertIn("queue full", details)
            running.cancel()
            self.assertEqual(queued.result(timeout=RPC_S).usage.completion_tokens, 4)
        finally:
            running.cancel()
            queued.cancel()

    def test_sigterm_drains_in_flight_requests(self):
        # A request running when SIGTERM arrives still completes; then the process exits 0.
        c = self.cluster()
        c.serve(fixture("dense"), 1)
        self.wait_ready(c, 1)
        stream = c.api.GenerateStream(greedy(PROMPT, 24), timeout=RPC_S)
        first = next(stream)
        self.assertTrue(first.token_ids)
        c.front.p.send_signal(signal.SIGTERM)
        rest = list(stream)
        self.assertEqual(rest[-1].usage.completion_tokens, 24)
        self.assertEqual(c.front.p.wait(timeout=30), 0, c.front.stderr())
        self.assertIn("draining", c.front.stderr())

    def test_text_is_valid_utf8_when_tokens_split_a_character(self):
        # With this prompt the dense fixture's greedy tokens include one that decodes to the
        # first two bytes of a three-byte character, followed by ASCII: the raw bytes are not
        # UTF-8. GenerateResponse.text is a proto3 string, which must be valid UTF-8 (grpcio
        # refuses to parse anything else), so the server has to replace such bytes. Cutting
        # the generation right after that token (14) leaves the character incomplete at the
        # end, which must not leak out either.
        model = fixture("dense")
        prompt = "Hello world, this is"
        c = self.cluster()
        c.serve(model, 1)
        self.wait_ready(c, 1)
        for gen in (16, 14):
            with self.subTest(max_tokens=gen):
                ids, raw = reference(model, prompt, gen)
                with self.assertRaises(UnicodeDecodeError):
                    raw.decode()  # the premise: the raw bytes are not UTF-8
                valid_prefix = raw[:valid_utf8_prefix(raw)].decode()
                r = self.generate(c, greedy(prompt, gen))
                self.assertEqual(list(r.token_ids), ids)
                self.assertTrue(r.text.startswith(valid_prefix), r.text)
                messages = list(c.api.GenerateStream(greedy(prompt, gen), timeout=RPC_S))
                self.assertEqual("".join(m.text for m in messages), r.text)


# ---- security: the cluster plane's token and mutual TLS, the public API key, limits ----

def raw_call(ch, method, metadata=()):
    """Calls a method descriptor with an empty request (valid for every proto message) and
    reads the whole reply; raises grpc.RpcError as the call fails."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    if method.server_streaming:
        return list(ch.unary_stream(path)(b"", timeout=10, metadata=metadata))
    return ch.unary_unary(path)(b"", timeout=10, metadata=metadata)


def run_fucina(args, env=None, timeout=60):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL,
                          env=None if env is None else {**os.environ, **env})


def wait_for_log(test, proc, pattern, timeout=10):
    deadline = time.monotonic() + timeout
    while re.search(pattern, proc.stderr()) is None:
        test.assertLess(time.monotonic(), deadline,
                        f"no {pattern!r} in the log within {timeout} s:\n{proc.stderr()}")
        time.sleep(POLL_S)


def rogue_register(address="127.0.0.1:9", **capabilities):
    """What the rogue worker of the report claimed: 1000 cores and 100 GB."""
    caps = {"cores": 1000, "memory_budget": 100 << 30, "device": "cpu", **capabilities}
    return wire.RegisterRequest(address=address, capabilities=wire.Capabilities(**caps))


@unittest.skipUnless(HAVE_TOKENIZER, NO_TOKENIZER)
class ClusterAuthTest(ClusterTestCase):
    """A client without the join token (or, under TLS, without a certificate the cluster CA
    signed) can neither join the cluster nor drive a worker."""

    def stage_view(self, placement):
        return [(s.worker_id, s.address, s.first_layer, s.last_layer) for s in placement.stages]

    def test_rogue_register_is_unauthenticated_and_changes_nothing(self):
        model = fixture("dense")
        ref, _ = reference(model, PROMPT, 16)
        c = self.cluster()
        c.coordinator(model)
        c.worker()
        before = self.wait_ready(c, 1)
        wrong = secrets.token_hex(32)
        unauth = grpc.StatusCode.UNAUTHENTICATED
        for token in ("", wrong, TOKEN[:-1]):
            with self.subTest(token="missing" if not token else "wrong"):
                details = self.assert_rpc_error(unauth, c.registry_stub(token).Register,
                                                rogue_register(), timeout=10)
                self.assertIn("cluster token", details)
        self.assert_rpc_error(unauth, c.registry_stub("").Heartbeat,
                              wire.HeartbeatRequest(worker_id=before.workers[0].worker_id),
                              timeout=10)
        after = c.api.GetPlacement(pb.GetPlacementRequest(), timeout=10)
        self.assertTrue(after.ready)
        self.assertEqual(self.stage_view(after), self.stage_view(before))
        self.assertEqual([w.address for w in after.workers], [w.address for w in before.workers])
        self.assertEqual(list(self.generate(c, greedy(PROMPT, 16)).token_ids), ref)
        # Each refusal is logged with the method and the peer, never with a token.
        log = c.front.stderr()
        self.assertRegex(log, r"refused /fucina\.cluster\.v1\.Registry/Register from "
                              r"ipv4:127\.0\.0\.1:\d+: missing cluster token")
        self.assertRegex(log, r"refused /fucina\.cluster\.v1\.Registry/Register from "
                              r"ipv4:127\.0\.0\.1:\d+: wrong cluster token")
        self.assertRegex(log, r"refused /fucina\.cluster\.v1\.Registry/Heartbeat from ")
        self.assertNotIn(TOKEN[:16], log)
        self.assertNotIn(wrong[:16], log)

    def test_every_cluster_method_needs_the_token(self):
        model = fixture("dense")
        ref, _ = reference(model, PROMPT, 16)
        c = self.cluster()
        c.coordinator(model)
        worker = c.worker()
        self.wait_ready(c, 1)
        targets = {"Worker": worker.grpc, "Registry": c.front.grpc,
                   "ModelSource": c.front.grpc}
        services = wire.DESCRIPTOR.services_by_name
        self.assertEqual(set(services), set(targets), "a cluster service is not tested here")
        for service, address in targets.items():
            ch = c.channel(address)
            for method in services[service].methods:
                for metadata in ((), (("fucina-cluster-token", secrets.token_hex(32)),),
                                 (("fucina-cluster-token", TOKEN), ("fucina-cluster-token",
                                                                    TOKEN))):
                    with self.subTest(method=method.full_name, metadata=len(metadata)):
                        self.assert_rpc_error(grpc.StatusCode.UNAUTHENTICATED, raw_call, ch,
                                              method, metadata)
        # None of them ran: no session was made, the shard is still loaded and serves.
        self.assertEqual(self.stats(c.worker_stub(worker)).sessions, 0)
        self.assertEqual(list(self.generate(c, greedy(PROMPT, 16)).token_ids), ref)

    def test_default_token_is_shared_through_the_cache_with_no_flags(self):
        # The README's commands: no token flag anywhere. The first process creates
        # $FUCINA_CACHE/cluster-token (0600), the others on this machine read it.
        cache = os.path.join(TMP.name, f"cache-{secrets.token_hex(4)}")
        env = {"FUCINA_CACHE": cache, "FUCINA_CLUSTER_TOKEN": ""}
        c = self.cluster()
        c.coordinator(fixture("dense"), env=env, security=False)
        c.worker(env=env, security=False)
        self.wait_ready(c, 1)
        path = os.path.join(cache, "cluster-token")
        mode = stat.S_IMODE(os.stat(path).st_mode)
        self.assertEqual(mode, 0o600, oct(mode))
        self.assertRegex(read(path).decode(), r"^[0-9a-f]{64}\n$")
        # A worker holding another token ($FUCINA_CLUSTER_TOKEN wins over the file) is
        # refused, says why, and never joins.
        stranger = c.worker(env={**env, "FUCINA_CLUSTER_TOKEN": secrets.token_hex(32)},
                            security=False)
        wait_for_log(self, stranger, r"cannot register with .*wrong cluster token.*"
                                     r"FUCINA_CLUSTER_TOKEN")
        workers = c.api.GetPlacement(pb.GetPlacementRequest(), timeout=10).workers
        self.assertEqual(len(workers), 1, workers)

    def check_mtls_cluster(self, kind, stages, experts, *extra):
        model = fixture(kind)
        ref, text = reference(model, PROMPT, 16)
        c = Cluster(tls=certs())
        self.addCleanup(c.close)
        c.coordinator(model, *extra)
        procs = [c.worker() for _ in range(stages + experts)]
        p = self.wait_ready(c, stages, experts)
        r = self.generate(c, greedy(PROMPT, 16))
        self.assertEqual(list(r.token_ids), ref, c.logs())
        self.assertEqual(r.text, text.decode())
        # Every worker took part, reached with the cluster's certificate and token.
        for proc in procs:
            s = self.stats(c.worker_stub(proc))
            self.assertGreater(s.forwarded_positions + s.expert_tokens, 0, proc.grpc)
        # `fucina client` over TLS, trusting the cluster CA.
        out = run_fucina(["client", "generate", "--addr", c.front.grpc, "--tls-ca", c.tls["ca"],
                          "--prompt", PROMPT, "--gen", "16", "--temp", "0"], timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout, r.text + "\n")
        return p

    @unittest.skipUnless(OPENSSL, NO_OPENSSL)
    def test_mutual_tls_cluster_generates_what_fucina_run_does(self):
        self.check_mtls_cluster("dense", 2, 0)

    @unittest.skipUnless(OPENSSL, NO_OPENSSL)
    def test_mutual_tls_expert_workers_generate_what_fucina_run_does(self):
        # Stage-to-expert-worker calls go worker to worker, over the same mutual TLS.
        self.check_mtls_cluster("moe", 1, 1, "--expert-workers", "1")

    @unittest.skipUnless(OPENSSL, NO_OPENSSL)
    def test_cluster_plane_refuses_clients_without_a_cluster_certificate(self):
        tls, rogue = certs(), certs("rogue")
        c = Cluster(tls=tls)
        self.addCleanup(c.close)
        c.coordinator(fixture("dense"))
        worker = c.worker()
        before = self.wait_ready(c, 1)
        # The coordinator's port also serves the public API: a client without a certificate
        # is served there, but its cluster calls are refused even with the right token.
        bare = c.channel(c.front.grpc)
        self.assertTrue(pb_grpc.GenerationStub(bare).ListModels(pb.ListModelsRequest(),
                                                               timeout=10).models[0].ready)
        details = self.assert_rpc_error(grpc.StatusCode.UNAUTHENTICATED,
                                        wire_grpc.RegistryStub(with_token(bare)).Register,
                                        rogue_register(), timeout=10)
        self.assertIn("certificate", details)
        # A worker has no public clients: the handshake itself fails without a certificate.
        self.assert_rpc_error(grpc.StatusCode.UNAVAILABLE,
                              wire_grpc.WorkerStub(with_token(c.channel(worker.grpc))).GetStats,
                              wire.StatsRequest(), timeout=10)
        # A certificate from another CA fails the handshake everywhere; so does plaintext.
        for address in (c.front.grpc, worker.grpc):
            for ch in (channel(address, tls["ca"], rogue["cert"], rogue["key"]),
                       channel(address)):
                self.addCleanup(ch.close)
                with self.subTest(address=address):
                    self.assert_rpc_error(grpc.StatusCode.UNAVAILABLE,
                                          wire_grpc.WorkerStub(with_token(ch)).GetStats,
                                          wire.StatsRequest(), timeout=10)
                    self.assert_rpc_error(grpc.StatusCode.UNAVAILABLE,
                                          wire_grpc.RegistryStub(with_token(ch)).Register,
                                          rogue_register(), timeout=10)
        after = c.api.GetPlacement(pb.GetPlacementRequest(), timeout=10)
        self.assertEqual(self.stage_view(after), self.stage_view(before))
        self.assertEqual(len(after.workers), 1)

    def test_plaintext_off_loopback_needs_insecure_cluster(self):
        model = fixture("dense")
        token = ["--cluster-token-file", TOKEN_FILE]
        ports = ["--metrics", "127.0.0.1:0", "--http", ""]
        refusals = {
            "coordinator --listen 0.0.0.0:0":
                ["coordinator", model, "--listen", "0.0.0.0:0", *ports, *token],
            "worker --listen 0.0.0.0:0":
                ["worker", "--coordinator", "127.0.0.1:9", "--listen", "0.0.0.0:0",
                 "--metrics", "127.0.0.1:0", *token],
            "worker --coordinator 192.0.2.1:50051":
                ["worker", "--coordinator", "192.0.2.1:50051", "--listen", "127.0.0.1:0",
                 "--metrics", "127.0.0.1:0", *token],
        }
        for name, args in refusals.items():
            with self.subTest(name):
                started = time.monotonic()
                p = run_fucina(args)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertLess(time.monotonic() - started, 30)
                self.assertIn("is not a loopback address", p.stderr)
                self.assertIn("--insecure-cluster", p.stderr)
                self.assertEqual(p.stdout, "")
        # With --insecure-cluster both start, and the worker joins from the wildcard address.
        c = self.cluster()
        c.coordinator(model, "--insecure-cluster", listen="0.0.0.0:0")
        self.assertTrue(c.front.grpc.startswith("0.0.0.0:"), c.front.grpc)
        c.worker("--insecure-cluster", listen="0.0.0.0:0")
        self.wait_ready(c, 1)
        self.generate(c, greedy(PROMPT, 4))

    @unittest.skipUnless(OPENSSL, NO_OPENSSL)
    def test_tls_cluster_listens_anywhere_without_insecure_cluster(self):
        c = Cluster(tls=certs())
        self.addCleanup(c.close)
        c.coordinator(fixture("dense"), listen="0.0.0.0:0")
        self.assertTrue(c.front.grpc.startswith("0.0.0.0:"), c.front.grpc)
        # Dialled by a name its certificate holds.
        c.front.grpc = "127.0.0.1:" + c.front.grpc.rsplit(":", 1)[1]
        c._api(c.front)
        c.worker()
        self.wait_ready(c, 1)
        self.generate(c, greedy(PROMPT, 4))


@unittest.skipUnless(HAVE_TOKENIZER, NO_TOKENIZER)
class PlacementReportTest(ClusterTestCase):
    def test_placement_reports_device_and_load_per_worker(self):
        c = self.cluster()
        c.coordinator(fixture("dense"), "--heartbeat-ms", "100")
        procs = [c.worker(), c.worker()]
        p = self.wait_ready(c, 2)
        self.assertEqual(sorted(w.address for w in p.workers), sorted(w.grpc for w in procs))
        for w in p.workers:
            self.assertEqual((w.device, w.cores, w.alive), ("cpu", 1, True), w)
        self.assertEqual([s.device for s in p.stages], ["cpu", "cpu"])

        def loads():
            return {w.address: w.load for w in
                    c.api.GetPlacement(pb.GetPlacementRequest(), timeout=10).workers}

        def wait_loads(sessions, timeout=10):
            deadline = time.monotonic() + timeout
            while True:
                now = loads()
                if all(w.sessions == sessions for w in now.values()):
                    return now
                self.assertLess(time.monotonic(), deadline,
                                f"loads did not reach {sessions} session(s): {now}")
                time.sleep(POLL_S)

        stream = self.long_stream(c)
        self.assertTrue(next(stream).token_ids)
        busy = wait_loads(1)
        for proc in procs:
            load, stats = busy[proc.grpc], self.stats(c.worker_stub(proc))
            self.assertGreater(load.kv_bytes, 0, load)
            self.assertEqual(load.kv_bytes, stats.kv_bytes)  # one session, allocated whole
            self.assertEqual(load.weight_bytes, stats.weight_bytes)
            self.assertGreaterEqual(load.queue_depth, 0)
            self.assertLess(load.age_ms, 5000)
        stream.cancel()
        idle = wait_loads(0)
        self.assertTrue(all(w.kv_bytes == 0 for w in idle.values()), idle)

    def test_register_claims_are_validated(self):
        c = self.cluster()
        c.coordinator(fixture("dense"))
        c.worker()
        before = self.wait_ready(c, 1)
        registry = c.registry_stub()
        cases = {
            "capabilities.cores": [{"cores": 0}, {"cores": -4}, {"cores": 100000}],
            "capabilities.memory_budget": [{"memory_budget": -1},
                                           {"memory_budget": 1 << 60}],
            "capabilities.device": [{"device": "tpu"}, {"device": "cpu" * 1000},
                                    {"device": "cpu\n"}],
            "address": [{"address": ""}, {"address": "no-port"},
                        {"address": "127.0.0.1:99999"}, {"address": "a b:1"},
                        {"address": "h" * 400 + ":1"}],
        }
        for field, claims in cases.items():
            for claim in claims:
                with self.subTest(field=field, claim=str(claim)[:40]):
                    details = self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                                                    registry.Register,
                                                    rogue_register(**{"cores": 2, **claim}),
                                                    timeout=10)
                    self.assertIn(field, details)
                    self.assertLess(len(details), 300)
        after = c.api.GetPlacement(pb.GetPlacementRequest(), timeout=10)
        self.assertEqual(len(after.workers), 1, after)
        self.assertEqual([s.address for s in after.stages], [s.address for s in before.stages])


@unittest.skipUnless(HAVE_TOKENIZER, NO_TOKENIZER)
class PublicApiAuthTest(ClusterTestCase):
    KEY = "fucina-test-" + "k" * 20

    def test_api_key_guards_the_public_api_but_not_health_or_reflection(self):
        c = self.cluster()
        c.serve(fixture("dense"), 1, "--api-key", self.KEY)
        ch = c.channel(c.front.grpc)
        unauth = grpc.StatusCode.UNAUTHENTICATED
        for method in pb.DESCRIPTOR.services_by_name["Generation"].methods:
            for metadata in ((), (("authorization", "Bearer nope-" + "x" * 20),),
                             (("authorization", self.KEY),)):
                with self.subTest(method=method.name, metadata=metadata[:1]):
                    self.assert_rpc_error(unauth, raw_call, ch, method, metadata)
        good = (("authorization", "Bearer " + self.KEY),)
        deadline = time.monotonic() + READY_S
        while not c.api.ListModels(pb.ListModelsRequest(), timeout=10,
                                   metadata=good).models[0].ready:
            self.assertLess(time.monotonic(), deadline, "not ready")
            time.sleep(POLL_S)
        r = c.api.Generate(greedy(PROMPT, 4), timeout=RPC_S, metadata=good)
        self.assertEqual(r.usage.completion_tokens, 4)
        # Health and reflection answer without a key.
        self.assertEqual(c.health_status(), 1)
        replies = list(ch.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")(
                iter([b"\x3a\x00"]), timeout=10))
        self.assertIn(b"fucina.v1.Generation", replies[0])
        self.assertNotIn("nope-", c.front.stderr())
        # `fucina client`: --api-key, else $FUCINA_API_KEY.
        args = ["client", "generate", "--addr", c.front.grpc, "--prompt", PROMPT, "--gen", "4",
                "--temp", "0"]
        no_env = {"FUCINA_API_KEY": ""}
        p = run_fucina(args, env=no_env, timeout=120)
        self.assertEqual(p.returncode, 1)
        self.assertIn("UNAUTHENTICATED", p.stderr)
        p = run_fucina([*args, "--api-key", self.KEY], env=no_env, timeout=120)
        self.assertEqual((p.returncode, p.stdout), (0, r.text + "\n"), p.stderr)
        p = run_fucina(args, env={"FUCINA_API_KEY": self.KEY}, timeout=120)
        self.assertEqual((p.returncode, p.stdout), (0, r.text + "\n"), p.stderr)

    def test_oversized_requests_are_refused_quickly_and_the_server_stays_healthy(self):
        c = self.cluster()
        c.serve(fixture("dense"), 1)
        self.wait_ready(c, 1)
        started = time.monotonic()
        details = self.assert_rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, c.api.Generate,
                                        greedy("a" * (17 << 20), 4), timeout=60)
        self.assertLess(time.monotonic() - started, 5.0, "the 17 MiB prompt was not refused fast")
        self.assertIn("16777216", details)
        self.assertEqual(c.health_status(), 1)
        self.assertEqual(self.generate(c, greedy(PROMPT, 4)).usage.completion_tokens, 4)
        # --max-request-bytes moves the limit both ways.
        small = self.cluster()
        small.serve(fixture("dense"), 1, "--max-request-bytes", "4K")
        self.wait_ready(small, 1)
        self.assert_rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, small.api.Generate,
                              greedy("a" * 8192, 4), timeout=30)
        self.assertEqual(self.generate(small, greedy("a " * 1000, 2)).usage.completion_tokens, 2)
        for bad in ("0", "1G", "lots"):
            with self.subTest(max_request_bytes=bad):
                p = run_fucina(["serve", fixture("dense"), "--max-request-bytes", bad,
                                *FRONT_ADDRESSES])
                self.assertEqual(p.returncode, 2)  # a usage error
                self.assertIn("--max-request-bytes", p.stderr)


class WorkerMetricsPortTest(ClusterTestCase):
    def test_a_taken_default_metrics_port_moves_and_a_given_one_fails(self):
        # Hold the default port, as a first worker on this machine would.
        holder = socket.socket()
        self.addCleanup(holder.close)
        try:
            holder.bind(("127.0.0.1", 9402))
            holder.listen(1)
        except OSError:
            pass  # something else holds it: it is taken either way
        args = ["worker", "--coordinator", "127.0.0.1:9", "--listen", "127.0.0.1:0",
                "--threads", "1", "--cluster-token-file", TOKEN_FILE]
        workers = []
        for i in range(2):
            w = Proc(args, f"metrics-{i}")
            self.addCleanup(w.kill)
            workers.append(w)
            self.assertNotEqual(w.metrics, "127.0.0.1:9402")
            self.assertRegex(w.metrics, r"^127\.0\.0\.1:\d+$")
            self.assertIn("127.0.0.1:9402 is taken", w.stderr())
            self.assertIn("fucina_worker_queue_depth", scrape(w.metrics))
        self.assertNotEqual(workers[0].metrics, workers[1].metrics)
        p = run_fucina([*args, "--metrics", "127.0.0.1:9402"])
        self.assertEqual(p.returncode, 1)
        self.assertIn("cannot listen on 127.0.0.1:9402 (metrics)", p.stderr)
        self.assertEqual(p.stdout, "")


if __name__ == "__main__":
    unittest.main(verbosity=2)
