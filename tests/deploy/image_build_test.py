"""The image builds from source: deploy/docker/build-image.sh on the offline Debian 12 base
(tests/deploy/docker_env.py) configures and compiles `fucina` in the Dockerfile's build stage
and the runtime image answers --help. Slow (a whole Release build inside the container, and
apt and crates.io fetches), so only under `ctest -L deploy`; the cheap checks of what it
depends on are in image_scripts_test.py.

Environment: a Docker daemon (exit 77, skipped, without one) and network access to Debian's
mirror and crates.io from the build container. The CAs this machine adds to its trust store
(/usr/local/share/ca-certificates, e.g. a TLS-inspecting proxy's) are put in
deploy/docker/extra-ca/ for the build and taken out after. scripts/test.sh leaves this test
(label `image`) out: `ctest -L deploy` runs it.
"""
import os
import shutil
import subprocess
import unittest

import docker_env

BUILD_IMAGE = os.path.join(docker_env.ROOT, "deploy", "docker", "build-image.sh")
TAG = "fucina-test/from-source:dev"


HOST_CAS = "/usr/local/share/ca-certificates"
EXTRA_CA = os.path.join(docker_env.ROOT, "deploy", "docker", "extra-ca")


def lend_host_cas():
    """Copies the host's added CAs into extra-ca/ (those not there already); their paths."""
    lent = []
    if os.path.isdir(HOST_CAS):
        for name in sorted(os.listdir(HOST_CAS)):
            target = os.path.join(EXTRA_CA, name)
            if name.endswith(".crt") and not os.path.exists(target):
                shutil.copyfile(os.path.join(HOST_CAS, name), target)
                lent.append(target)
    return lent


def setUpModule():
    problem = docker_env.daemon_problem()
    if problem:
        raise unittest.SkipTest(problem)
    docker_env.ensure_base()


class ImageBuildTest(unittest.TestCase):
    def test_from_source_build_configures_compiles_and_runs(self):
        for path in lend_host_cas():
            self.addCleanup(os.remove, path)
        r = subprocess.run([BUILD_IMAGE, TAG, "--build-arg", f"BASE={docker_env.BASE}"],
                           capture_output=True, text=True, timeout=3 * 3600,
                           env={**os.environ, "DOCKER": docker_env.DOCKER})
        self.addCleanup(docker_env.docker, "image", "rm", "-f", TAG, check=False)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-6000:])
        self.assertIn(f"built {TAG}", r.stdout)
        out = docker_env.docker("run", "--rm", TAG, "pull", "--help").stdout
        self.assertIn("member", out)  # this tree's binary, not an older image's


def main():
    try:
        setUpModule()
    except unittest.SkipTest as e:
        print(f"skipped: {e}")
        raise SystemExit(77)
    unittest.main()


if __name__ == "__main__":
    main()
