#!/usr/bin/env bash
# Evolution-strategies fine-tuning of the real SmolLM2-135M-Instruct on single-digit arithmetic
# (tests/data/train/digits.jsonl, answer log-probability reward), scored on held-out tasks of
# the same kind before and after. Too slow for the CI suite on two cores (~2-3 min); run by
# hand. Env: ITERATIONS (20), POPULATION (16), SIGMA (2e-3), LR (2e-3), THREADS (all).
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
ensure_apt_packages
ensure_rust
build_tree "$FUCINA_ROOT/build"
ensure_default_model
data="$FUCINA_ROOT/tests/data/train"
threads=()
[ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")
"$FUCINA_ROOT/build/tools/fucina" train es "$FUCINA_DEFAULT_MODEL" --data "$data/digits.jsonl" \
  --holdout "$data/digits_heldout.jsonl" --mode full --tensors 'blk\.[0-9]+\.attn_v\.weight' \
  --population "${POPULATION:-16}" --sigma "${SIGMA:-2e-3}" --lr "${LR:-2e-3}" \
  --iterations "${ITERATIONS:-20}" --seed 1 "${threads[@]}"
