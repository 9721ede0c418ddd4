"""Docker for the deploy tests: the daemon, an offline Debian 12 base image, and the Fucina
image built from the suite's own binary.

No image registry is reachable, so the base is made with `debootstrap --variant=minbase
bookworm` and `docker import`, its tarball cached in $FUCINA_CACHE/docker. The image is
deploy/docker/Dockerfile's `prebuilt` target over deploy/docker/collect-runtime.sh's layout of
FUCINA_BIN: the runtime stage of the multi-stage file, with nothing compiled twice. BuildKit
builds only that target (Debian's docker.io client has it built in).
"""
import os
import shutil
import subprocess
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOCKERFILE = os.path.join(ROOT, "deploy", "docker", "Dockerfile")
COLLECT = os.path.join(ROOT, "deploy", "docker", "collect-runtime.sh")
CACHE = os.environ.get("FUCINA_CACHE", os.path.expanduser("~/.cache/fucina"))
BASE = "fucina-test/debian-minbase:bookworm"
# Debian's client: BuildKit without the buildx plugin, the daemon's own API version.
DOCKER = "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else shutil.which("docker")


def docker(*args, check=True, timeout=300, **kw):
    r = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])} ... failed ({r.returncode}):\n"
                             f"{r.stderr[-3000:]}")
    return r


def daemon_problem():
    """None when a Docker daemon answers, else why not."""
    if not DOCKER:
        return "docker is not installed (scripts/test.sh installs docker.io)"
    r = subprocess.run([DOCKER, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        return f"no Docker daemon answers (scripts/test.sh starts dockerd): {r.stderr.strip()}"
    return None


def ensure_base():
    """The Debian 12 minbase image, imported from the cached debootstrap tarball (made once)."""
    if docker("image", "inspect", BASE, check=False).returncode == 0:
        return
    tarball = os.path.join(CACHE, "docker", "debian-bookworm-minbase.tar.gz")
    if not os.path.exists(tarball):
        debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
        os.makedirs(os.path.dirname(tarball), exist_ok=True)
        with tempfile.TemporaryDirectory(dir=os.path.dirname(tarball)) as tmp:
            rootfs = os.path.join(tmp, "rootfs")
            r = subprocess.run([debootstrap, "--variant=minbase", "bookworm", rootfs],
                               capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                raise AssertionError(f"debootstrap failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
            subprocess.run(["tar", "-C", rootfs, "-czf", tarball + ".part", "."], check=True,
                           timeout=600)
            os.replace(tarball + ".part", tarball)
    docker("import", tarball, BASE, timeout=600)


def build_image(binary, tag):
    """The runtime image of `binary` (the suite's build), tagged `tag`."""
    with tempfile.TemporaryDirectory() as ctx:
        subprocess.run([COLLECT, binary, os.path.join(ctx, "dist")], check=True,
                       capture_output=True, timeout=300)
        docker("build", "-q", "-f", DOCKERFILE, "--target", "prebuilt",
               "--build-arg", f"BASE={BASE}", "-t", tag, ctx,
               env={**os.environ, "DOCKER_BUILDKIT": "1"}, timeout=600)
