"""What the from-source image build depends on, checked without building an image (the build
itself is tests/deploy/image_build_test.py, `ctest -L deploy`):

- CMake's cargo lookup (cmake/CargoStaticlib.cmake) passes over an older cargo earlier on PATH,
  as in the image's build stage, and hands cargo the rustc beside it; with none new enough it
  lists what it saw. A one-crate project is configured (not built) against fake cargos.
- deploy/docker/build-image.sh picks a docker client that can build with BuildKit: a newer
  client without the buildx plugin ahead of Debian's docker.io on PATH is passed over. Fake
  clients record what they are asked.

Environment: none (cmake and bash from the system).
"""
import os
import shutil
import stat
import subprocess
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CMAKE = shutil.which("cmake") or "/usr/bin/cmake"
BUILD_IMAGE = os.path.join(ROOT, "deploy", "docker", "build-image.sh")


def write_exe(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class CargoLookupTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        crate = os.path.join(self.dir, "crate")
        os.makedirs(os.path.join(crate, "src"))
        for name in ("Cargo.toml", "Cargo.lock", "src/lib.rs"):
            open(os.path.join(crate, name), "w").close()
        with open(os.path.join(self.dir, "CMakeLists.txt"), "w") as f:
            f.write("cmake_minimum_required(VERSION 3.20)\n"
                    "project(cargo_lookup LANGUAGES NONE)\n"
                    f"include({ROOT}/cmake/CargoStaticlib.cmake)\n"
                    f'fucina_cargo_staticlib(t t "{crate}" 1.87 "the test crate")\n')

    def tearDown(self):
        self.tmp.cleanup()

    def cargo(self, where, version):
        """A fake toolchain: cargo printing `version`, and a rustc beside it."""
        bin_dir = os.path.join(self.dir, where)
        write_exe(os.path.join(bin_dir, "cargo"),
                  f"#!/bin/sh\necho 'cargo {version} (fake)'\n")
        write_exe(os.path.join(bin_dir, "rustc"), "#!/bin/sh\nexit 0\n")
        return bin_dir

    def configure(self, *path):
        env = {"PATH": ":".join([*path, "/usr/bin", "/bin"]), "HOME": self.dir}
        build = os.path.join(self.dir, "build")
        shutil.rmtree(build, ignore_errors=True)
        r = subprocess.run([CMAKE, "-S", self.dir, "-B", build, "-G", "Ninja"],
                           capture_output=True, text=True, env=env, timeout=120)
        ninja = ""
        if r.returncode == 0:
            with open(os.path.join(build, "build.ninja")) as f:
                ninja = f.read()
        return r, ninja

    def test_an_older_cargo_earlier_on_path_is_passed_over(self):
        old = self.cargo("old/bin", "1.85.0")
        new = self.cargo("new/bin", "1.96.0")
        r, ninja = self.configure(old, new)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # The cargo build command runs the new cargo, with the rustc of its own toolchain.
        self.assertIn(os.path.join(new, "cargo") + " build --release", ninja)
        self.assertIn("RUSTC=" + os.path.join(new, "rustc"), ninja)
        self.assertNotIn(os.path.join(old, "cargo"), ninja)

    def test_no_cargo_new_enough_names_each_one_seen(self):
        old = self.cargo("old/bin", "1.85.0")
        older = self.cargo("older/bin", "1.80.1")
        r, _ = self.configure(old, older)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"found cargo 1.85.0 at {old}/cargo, cargo 1.80.1 at {older}/cargo; "
                      "the test crate need cargo (Rust >= 1.87",
                      " ".join(r.stderr.split()))  # CMake wraps and indents its messages


# A docker client: `buildx` answers when HAS_BUILDX, `DOCKER_BUILDKIT=1 build` works when
# BUILTIN; every call is logged as "NAME DOCKER_BUILDKIT ARGS".
FAKE_DOCKER = """#!/bin/sh
echo "{name} ${{DOCKER_BUILDKIT:-}} $*" >> "$DOCKER_LOG"
case "$1" in
  buildx) [ {has_buildx} = 1 ] && exit 0
          echo "docker: unknown command: docker buildx" >&2; exit 1 ;;
  build) if [ "${{DOCKER_BUILDKIT:-}}" = 1 ] && [ {builtin} = 0 ]; then
           echo "ERROR: BuildKit is enabled but the buildx component is missing or broken." >&2
           exit 1
         fi ;;
  image) echo 123000000 ;;
esac
exit 0
"""


class BuildImageClientTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.log = os.path.join(self.tmp.name, "log")
        open(self.log, "w").close()

    def tearDown(self):
        self.tmp.cleanup()

    def client(self, name, has_buildx, builtin):
        d = os.path.join(self.tmp.name, name)
        write_exe(os.path.join(d, "docker"),
                  FAKE_DOCKER.format(name=name, has_buildx=has_buildx, builtin=builtin))
        return d

    def build(self, path, docker=None):
        env = {"PATH": ":".join([*path, "/usr/bin", "/bin"]), "DOCKER_LOG": self.log}
        if docker:
            env["DOCKER"] = docker
        r = subprocess.run(["bash", BUILD_IMAGE, "fucina:t"], capture_output=True, text=True,
                           env=env, timeout=60)
        with open(self.log) as f:
            calls = [line.split(" ", 2) for line in f.read().splitlines()]
        return r, calls

    def builds(self, calls):
        return [c for c in calls if c[2].startswith(("build -f ", "buildx build "))]

    def test_a_client_without_buildx_is_passed_over_for_debians(self):
        newer = self.client("newer", has_buildx=0, builtin=0)
        debian = self.client("debian", has_buildx=0, builtin=1)
        r, calls = self.build([newer, debian])
        self.assertEqual(r.returncode, 0, r.stderr)
        [(name, buildkit, args)] = self.builds(calls)
        self.assertEqual((name, buildkit), ("debian", "1"))
        self.assertTrue(args.startswith("build -f " + os.path.join(ROOT, "deploy/docker/Dockerfile")
                                        + " -t fucina:t"), args)
        self.assertIn(f"built fucina:t with {debian}/docker: 123 MB", r.stdout)

    def test_buildx_is_used_where_the_client_has_it(self):
        with_buildx = self.client("buildx", has_buildx=1, builtin=0)
        r, calls = self.build([with_buildx])
        self.assertEqual(r.returncode, 0, r.stderr)
        [(name, _, args)] = self.builds(calls)
        self.assertEqual(name, "buildx")
        self.assertTrue(args.startswith("buildx build --load -f "), args)

    def test_no_usable_client_is_a_clear_error(self):
        newer = self.client("newer", has_buildx=0, builtin=0)
        r, calls = self.build([newer], docker=os.path.join(newer, "docker"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("no docker client that builds with BuildKit", r.stderr)
        self.assertIn("buildx", r.stderr)
        self.assertEqual(self.builds(calls), [])


if __name__ == "__main__":
    unittest.main()
