#!/usr/bin/env bash
# Builds the Fucina image from source with the multi-stage Dockerfile (build stage: the
# README's Debian packages and one Release build; runtime stage: the binary and its libraries).
#
#   deploy/docker/build-image.sh [TAG] [docker build options...]
#
# TAG defaults to fucina:dev. Pass --build-arg BASE=IMAGE to build on another Debian 12 root file
# system than the official slim image (e.g. one made offline with debootstrap + docker import).
# DOCKER names the client (default: docker). The test suite does not run this (it packs its own build with --target prebuilt instead).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tag="${1:-fucina:dev}"
[ $# -gt 0 ] && shift
docker="${DOCKER:-docker}"
command -v "$docker" >/dev/null || { echo "build-image: $docker not found" >&2; exit 1; }
# BuildKit builds only the stages the target needs (the classic builder would also build the
# `prebuilt` stage, which wants a dist/ folder): through buildx where the client has it, else
# the engine's own (Debian's docker.io client).
if "$docker" buildx version >/dev/null 2>&1; then
  "$docker" buildx build --load -f "$root/deploy/docker/Dockerfile" -t "$tag" "$@" "$root"
else
  DOCKER_BUILDKIT=1 "$docker" build -f "$root/deploy/docker/Dockerfile" -t "$tag" "$@" "$root"
fi
"$docker" run --rm "$tag" --help >/dev/null
echo "built $tag: $("$docker" image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')"
