#!/usr/bin/env bash
# Builds the Fucina image from source with the multi-stage Dockerfile (build stage: the
# README's Debian packages and one Release build; runtime stage: the binary and its libraries).
#
#   deploy/docker/build-image.sh [TAG] [docker build options...]
#
# TAG defaults to fucina:dev. Pass --build-arg BASE=IMAGE to build on another Debian 12 root file
# system than the official slim image (e.g. one made offline with debootstrap + docker import).
# DOCKER names the client; by default the first `docker` on PATH (then /usr/bin/docker) that
# can build with BuildKit, so a newer client without the buildx plugin ahead of Debian's
# docker.io on PATH is passed over. The pod tests pack the suite's own build with --target
# prebuilt instead; tests/deploy/image_build_test.py runs this script (`ctest -L deploy`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tag="${1:-fucina:dev}"
[ $# -gt 0 ] && shift

# BuildKit builds only the stages the target needs (the classic builder would also build the
# `prebuilt` stage, which wants a dist/ folder): through buildx where the client has it, else
# the engine's own, which Debian's docker.io client (20.10) enables with DOCKER_BUILDKIT=1 and
# clients from Docker 23 on refuse without buildx. Prints "buildx" or "builtin".
buildkit_mode() {
  if "$1" buildx version >/dev/null 2>&1; then
    echo buildx
  elif DOCKER_BUILDKIT=1 "$1" build --help >/dev/null 2>&1; then
    echo builtin
  else
    return 1
  fi
}

if [ -n "${DOCKER:-}" ]; then
  candidates=("$DOCKER")
else
  mapfile -t candidates < <(type -aP docker; [ -x /usr/bin/docker ] && echo /usr/bin/docker)
fi
[ ${#candidates[@]} -gt 0 ] || { echo "build-image: docker not found (install docker.io)" >&2; exit 1; }
docker="" mode=""
for c in "${candidates[@]}"; do
  command -v "$c" >/dev/null || continue
  if mode="$(buildkit_mode "$c")"; then docker="$c"; break; fi
done
if [ -z "$docker" ]; then
  echo "build-image: no docker client that builds with BuildKit among: ${candidates[*]}" \
       "(none has the buildx plugin or, like Debian's docker.io, BuildKit built in); install" \
       "docker-buildx or docker.io, or name one with DOCKER=" >&2
  exit 1
fi
if [ "$mode" = buildx ]; then
  "$docker" buildx build --load -f "$root/deploy/docker/Dockerfile" -t "$tag" "$@" "$root"
else
  DOCKER_BUILDKIT=1 "$docker" build -f "$root/deploy/docker/Dockerfile" -t "$tag" "$@" "$root"
fi
"$docker" run --rm "$tag" --help >/dev/null
echo "built $tag with $docker: $("$docker" image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')"
