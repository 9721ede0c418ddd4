"""The chart's pods run: rendered specs executed as containers of the built image.

`helm template` renders the chart for SmolLM2 from a hostPath, two CPU workers, an API key and
the chart's own cluster token and mutual-TLS certificates. Each rendered pod (the coordinator
Deployment's and the worker StatefulSet's) becomes a container of the image, as a kubelet would
run it: the rendered args with $(VAR) expanded from the rendered env (Secret keys and the pod's
name and namespace), the security context (user, read-only root, no capabilities, no privilege
escalation), memory limits, emptyDir/hostPath/Secret volumes, and the containers' ports
published on 127.0.0.1. They share a docker network the test creates, where each Service's name
is a network alias: the workers register with the coordinator by its Service name and advertise
their names in the headless Service. Then:
  - every startup and readiness probe, as rendered, passes;
  - a chat request answers through the coordinator (HTTP, with the key; 401 without), and a
    gRPC request by the Service name from a client container on the network;
  - a worker killed with SIGKILL: the coordinator re-plans onto the survivor and answers the
    same greedy reply; the pod recreated (as its StatefulSet would) rejoins;
  - SIGTERM to the coordinator (docker stop, the pod's grace) exits cleanly.
Traffic goes only to 127.0.0.1 and to the test's own containers.

Environment: FUCINA_BIN, FUCINA_DEFAULT_MODEL, FUCINA_HELM; a Docker daemon (scripts/test.sh
starts one); root for debootstrap the first time. Run with Debian's python3 (python3-yaml).
"""
import base64
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import chart_render as cr
import docker_env as de

BIN = os.environ.get("FUCINA_BIN", "")
MODEL = os.environ.get("FUCINA_DEFAULT_MODEL", "")
IMAGE_REPO, IMAGE_TAG = "fucina-test/fucina", "suite"
API_KEY = "sk-pods-test"
NAMESPACE = "default"
START_S = 180  # a pod's probes must pass within this


def setUpModule():
    if not (BIN and os.access(BIN, os.X_OK)):
        raise unittest.SkipTest("FUCINA_BIN is not set")
    if not (MODEL and os.path.exists(MODEL)):
        raise unittest.SkipTest("FUCINA_DEFAULT_MODEL is not set")
    if not cr.HELM:
        raise unittest.SkipTest("FUCINA_HELM is not set (scripts/test.sh unpacks helm)")
    problem = de.daemon_problem()
    if problem:
        raise unittest.SkipTest(problem)


def quantity_bytes(q):
    """A Kubernetes memory quantity (512Mi, 2Gi, 1G) in bytes."""
    m = re.fullmatch(r"([0-9.]+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(q))
    scale = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 1 << 10,
             "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}[m.group(2)]
    return int(float(m.group(1)) * scale)


class Pod:
    """One rendered pod run as docker containers, the way a kubelet would run it."""

    def __init__(self, test, name, template, secrets, network, aliases):
        self.test, self.name, self.network, self.aliases = test, name, network, aliases
        self.spec = template["spec"]
        self.secrets = secrets
        self.container = f"{network}-{name}"
        self.ports = {}  # containerPort -> published 127.0.0.1 port
        self.secret_dirs = {}

    # ---- the container's settings, from the rendered spec ----

    def env(self, c):
        out = {}
        for e in c.get("env", []):
            if "value" in e:
                out[e["name"]] = e["value"]
                continue
            src = e["valueFrom"]
            if "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                out[e["name"]] = base64.b64decode(self.secrets[ref["name"]][ref["key"]]).decode()
            elif src.get("fieldRef", {}).get("fieldPath") == "metadata.name":
                out[e["name"]] = self.name
            elif src.get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
                out[e["name"]] = NAMESPACE
            else:
                raise AssertionError(f"env source the test cannot emulate: {e}")
        return out

    def expand(self, args, env):
        # $(VAR) as the kubelet expands it; an unknown name stays as written.
        return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                       lambda m: env.get(m.group(1), m.group(0)), a) for a in args]

    def security(self, c):
        pod_sc = self.spec.get("securityContext", {})
        sc = c.get("securityContext", {})
        out = []
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
        if uid is not None:
            out += ["--user", f"{uid}:{gid if gid is not None else uid}"]
        if "fsGroup" in pod_sc:
            out += ["--group-add", str(pod_sc["fsGroup"])]
        if sc.get("readOnlyRootFilesystem"):
            out.append("--read-only")
        if sc.get("allowPrivilegeEscalation") is False:
            out += ["--security-opt", "no-new-privileges"]
        for cap in sc.get("capabilities", {}).get("drop", []):
            out += ["--cap-drop", cap]
        return out

    def volumes(self, c, tmp):
        by_name = {v["name"]: v for v in self.spec.get("volumes", [])}
        fs_group = self.spec.get("securityContext", {}).get("fsGroup", 0)
        out = []
        for m in c.get("volumeMounts", []):
            v = by_name[m["name"]]
            ro = ",readonly" if m.get("readOnly") else ""
            if "emptyDir" in v:
                # A node folder, as the kubelet makes one: mode 0777, group fsGroup, setgid.
                d = tempfile.mkdtemp(dir=tmp, prefix=f"{self.name}-{m['name']}-")
                os.chown(d, 0, fs_group)
                os.chmod(d, 0o2777)
                out += ["--mount", f"type=bind,src={d},dst={m['mountPath']}"]
            elif "hostPath" in v:
                out += ["--mount", f"type=bind,src={v['hostPath']['path']},"
                                   f"dst={m['mountPath']}{ro}"]
            elif "secret" in v:
                # Files as the kubelet writes them: defaultMode, group fsGroup.
                name = v["secret"]["secretName"]
                d = self.secret_dirs.get(name)
                if d is None:
                    d = tempfile.mkdtemp(dir=tmp, prefix="secret-")
                    os.chmod(d, 0o755)
                    for key, data in self.secrets[name].items():
                        path = os.path.join(d, key)
                        with open(path, "wb") as f:
                            f.write(base64.b64decode(data))
                        os.chown(path, 0, fs_group)
                        os.chmod(path, v["secret"].get("defaultMode", 0o644))
                    self.secret_dirs[name] = d
                out += ["--mount", f"type=bind,src={d},dst={m['mountPath']},readonly"]
            else:
                raise AssertionError(f"volume the test cannot emulate: {v}")
        return out

    def docker_args(self, c, tmp, name, detach):
        env = self.env(c)
        out = ["run", "--name", name, "--hostname", self.name, "--network", self.network]
        for a in self.aliases:
            out += ["--network-alias", a]
        out += ["-d"] if detach else []
        out += self.security(c) + self.volumes(c, tmp)
        mem = c.get("resources", {}).get("limits", {}).get("memory")
        if mem:
            out += ["--memory", str(quantity_bytes(mem))]
        for k, v in env.items():
            out += ["-e", f"{k}={v}"]
        for p in c.get("ports", []):
            out += ["-p", f"127.0.0.1::{p['containerPort']}"]
        if c.get("command"):
            out += ["--entrypoint", c["command"][0]]
        self.test.assertEqual(c["image"], f"{IMAGE_REPO}:{IMAGE_TAG}")
        out.append(c["image"])
        out += self.expand(c.get("command", [])[1:] + c.get("args", []), env)
        return out

    # ---- lifecycle ----

    def start(self, tmp):
        for c in self.spec.get("initContainers", []):
            de.docker(*self.docker_args(c, tmp, f"{self.container}-{c['name']}", False),
                      timeout=300)
        main = self.spec["containers"][0]
        de.docker(*self.docker_args(main, tmp, self.container, True))
        for p in main.get("ports", []):
            r = de.docker("port", self.container, f"{p['containerPort']}/tcp")
            self.ports[p["containerPort"]] = int(r.stdout.split()[0].rsplit(":", 1)[1])

    def logs(self):
        r = de.docker("logs", "--tail", "40", self.container, check=False)
        return r.stdout + r.stderr

    def running(self):
        r = de.docker("inspect", "-f", "{{.State.Running}}", self.container, check=False)
        return r.stdout.strip() == "true"

    def port(self, ref):
        main = self.spec["containers"][0]
        if isinstance(ref, str):
            ref = [p["containerPort"] for p in main["ports"] if p["name"] == ref][0]
        return self.ports[ref]

    def probe_once(self, probe):
        """One probe as the kubelet runs it (httpGet, tcpSocket, grpc): True on success."""
        timeout = probe.get("timeoutSeconds", 1)
        try:
            if "httpGet" in probe:
                g = probe["httpGet"]
                url = f"http://127.0.0.1:{self.port(g['port'])}{g.get('path', '/')}"
                with urllib.request.urlopen(url, timeout=timeout) as r:
                    return 200 <= r.status < 400
            if "tcpSocket" in probe:
                with socket.create_connection(("127.0.0.1",
                                               self.port(probe["tcpSocket"]["port"])), timeout):
                    return True
            if "grpc" in probe:
                return grpc_serving(f"127.0.0.1:{self.port(probe['grpc']['port'])}", timeout)
        except (OSError, urllib.error.URLError):
            return False
        raise AssertionError(f"probe the test cannot emulate: {probe}")

    def wait_probes(self, deadline):
        main = self.spec["containers"][0]
        for kind in ("startupProbe", "readinessProbe"):
            probe = main[kind]
            while not self.probe_once(probe):
                if not self.running():
                    self.test.fail(f"{self.name} exited before its {kind} passed:\n"
                                   f"{self.logs()}")
                if time.monotonic() > deadline:
                    self.test.fail(f"{self.name}: {kind} {probe} failing after "
                                   f"{START_S} s:\n{self.logs()}")
                time.sleep(0.2)

    def remove(self):
        de.docker("rm", "-f", self.container, check=False)


def grpc_serving(address, timeout):
    """grpc.health.v1.Health/Check with the empty service name, through Debian's grpcio:
    True when SERVING (the response's field 1 is 1)."""
    import grpc
    with grpc.insecure_channel(address) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            return check(b"", timeout=timeout) == b"\x08\x01"
        except grpc.RpcError:
            return False


class PodsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        de.ensure_base()
        de.build_image(BIN, f"{IMAGE_REPO}:{IMAGE_TAG}")
        cls.tmp = tempfile.mkdtemp(prefix="fucina-pods-")
        cls.network = f"fucina-pods-{os.getpid()}"
        de.docker("network", "create", cls.network)
        cls.pods = []

    @classmethod
    def tearDownClass(cls):
        for p in cls.pods:
            p.remove()
        de.docker("network", "rm", cls.network, check=False)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def render(self):
        docs, _ = cr.render(sets=[
            f"image.repository={IMAGE_REPO}", f"image.tag={IMAGE_TAG}",
            f"model.hostPath={os.path.dirname(os.path.abspath(MODEL))}",
            f"model.file={os.path.basename(MODEL)}", "model.servedName=smollm2",
            f"apiKey.value={API_KEY}", "workers.cpu.replicas=2", "workers.cpu.threads=1",
            "coordinator.ctx=1024", "coordinator.drainSeconds=20"])
        secrets = {d["metadata"]["name"]: d["data"] for d in cr.by_kind(docs, "Secret")}
        return docs, secrets

    def pod(self, name, template, secrets, aliases):
        p = Pod(self, name, template, secrets, self.network, aliases)
        self.pods.append(p)
        return p

    def chat(self, coordinator, key=API_KEY):
        body = json.dumps({"model": "smollm2", "temperature": 0, "max_tokens": 12,
                           "messages": [{"role": "user", "content": "Name a colour."}]})
        req = urllib.request.Request(
            f"http://127.0.0.1:{coordinator.port('http')}/v1/chat/completions",
            data=body.encode(), headers={"content-type": "application/json",
                                         **({"authorization": f"Bearer {key}"} if key else {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def test_rendered_pods_serve_survive_a_worker_and_drain(self):
        docs, secrets = self.render()
        t0 = time.monotonic()
        coord_svc = cr.one(docs, "Service", "t-fucina-coordinator")
        workers_svc = cr.one(docs, "Service", "t-fucina-workers")
        dep = cr.one(docs, "Deployment", "t-fucina-coordinator")
        sts = cr.one(docs, "StatefulSet", "t-fucina-worker-cpu")
        svc = coord_svc["metadata"]["name"]
        coordinator = self.pod(f"{dep['metadata']['name']}-0", dep["spec"]["template"], secrets,
                               [svc, f"{svc}.{NAMESPACE}", f"{svc}.{NAMESPACE}.svc"])
        coordinator.start(self.tmp)

        def worker(i):
            name = f"{sts['metadata']['name']}-{i}"
            head = workers_svc["metadata"]["name"]
            return self.pod(name, sts["spec"]["template"], secrets,
                            [f"{name}.{head}", f"{name}.{head}.{NAMESPACE}.svc"])

        workers = [worker(i) for i in range(sts["spec"]["replicas"])]
        for w in workers:
            w.start(self.tmp)
        deadline = time.monotonic() + START_S
        for p in workers + [coordinator]:
            p.wait_probes(deadline)
        ready_s = time.monotonic() - t0
        print(f"# {len(workers)} workers and the coordinator ready in {ready_s:.1f} s")

        # HTTP through the coordinator, with and without the key.
        status, reply = self.chat(coordinator)
        self.assertEqual(status, 200, reply)
        first = reply["choices"][0]["message"]["content"]
        self.assertTrue(first.strip(), reply)
        status, reply = self.chat(coordinator, key=None)
        self.assertEqual(status, 401, reply)
        # gRPC by the Service name, from a client container on the network (TLS from the CA of
        # the chart's Secret).
        tls_dir = coordinator.secret_dirs["t-fucina-cluster-tls"]
        r = de.docker("run", "--rm", "--network", self.network, "--read-only",
                      "--mount", f"type=bind,src={tls_dir},dst=/tls,readonly",
                      "--user", "10001:10001", "--group-add", "10001",
                      f"{IMAGE_REPO}:{IMAGE_TAG}", "client", "generate",
                      f"--addr={svc}:{coord_svc['spec']['ports'][1]['port']}",
                      "--tls-ca=/tls/ca.crt", f"--api-key={API_KEY}", "--chat=Name a colour.",
                      "--gen=12", "--temp=0", timeout=120)
        self.assertEqual(r.stdout.strip(), first.strip())

        # A worker dies: the survivor takes the whole model, same greedy reply.
        de.docker("kill", workers[1].container)
        workers[1].remove()
        self.wait_metric(coordinator, "fucina_workers", 1, 'state="alive"')
        coordinator.wait_probes(time.monotonic() + START_S)
        status, reply = self.chat(coordinator)
        self.assertEqual(status, 200, reply)
        self.assertEqual(reply["choices"][0]["message"]["content"], first)
        # Its StatefulSet makes the pod again: it rejoins.
        again = worker(1)
        again.start(self.tmp)
        again.wait_probes(time.monotonic() + START_S)
        self.wait_metric(coordinator, "fucina_workers", 2, 'state="alive"')
        coordinator.wait_probes(time.monotonic() + START_S)
        status, reply = self.chat(coordinator)
        self.assertEqual(status, 200, reply)
        self.assertEqual(reply["choices"][0]["message"]["content"], first)

        # Stopped as the kubelet stops it: SIGTERM, then SIGKILL after the pod's grace.
        grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        de.docker("stop", "-t", str(grace), coordinator.container, timeout=grace + 30)
        code = de.docker("inspect", "-f", "{{.State.ExitCode}}", coordinator.container)
        self.assertEqual(code.stdout.strip(), "0", coordinator.logs())
        self.assertIn("draining", coordinator.logs())

    def wait_metric(self, pod, name, want, labels):
        url = f"http://127.0.0.1:{pod.port('metrics')}/metrics"
        deadline = time.monotonic() + 60
        pattern = re.compile(rf"^{name}\{{[^}}]*{re.escape(labels)}[^}}]*\}} (\S+)$", re.M)
        while True:
            with urllib.request.urlopen(url, timeout=5) as r:
                m = pattern.search(r.read().decode())
            if m and float(m.group(1)) == want:
                return
            if time.monotonic() > deadline:
                self.fail(f"{name}{{{labels}}} is {m and m.group(1)}, not {want}:\n{pod.logs()}")
            time.sleep(0.2)


if __name__ == "__main__":
    cr.main(setUpModule)
