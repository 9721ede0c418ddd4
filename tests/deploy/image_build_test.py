"""The image builds from source: deploy/docker/build-image.sh on the offline Debian 12 base
(tests/deploy/docker_env.py) configures and compiles `fucina` in the Dockerfile's build stage
and the runtime image answers --help. Slow (a whole Release build inside the container, and
apt and crates.io fetches), so only under `ctest -L deploy`; the cheap checks of what it
depends on are in image_scripts_test.py.

Environment: FUCINA_IMAGE_BUILD=1 to run at all (a whole build on the machine's cores: never as
a side effect of the suite), a Docker daemon (exit 77, skipped, without either), network access
to Debian's mirror and crates.io from the build container.
"""
import os
import subprocess
import unittest

import docker_env

BUILD_IMAGE = os.path.join(docker_env.ROOT, "deploy", "docker", "build-image.sh")
TAG = "fucina-test/from-source:dev"


def setUpModule():
    if os.environ.get("FUCINA_IMAGE_BUILD") != "1":
        raise unittest.SkipTest("set FUCINA_IMAGE_BUILD=1 to build the image from source (a whole "
                                "Release build in a container)")
    problem = docker_env.daemon_problem()
    if problem:
        raise unittest.SkipTest(problem)
    docker_env.ensure_base()


class ImageBuildTest(unittest.TestCase):
    def test_from_source_build_configures_compiles_and_runs(self):
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
