#!/usr/bin/env bash
# The decoder-only benchmark (causal.py) on one GPU, in float16, in one call of a lent machine
# (about 6 minutes): the CPU benchmark's shape (59M Llama-style, 500 prompts, 32 new tokens), then
# a 310M one (1,000 prompts, 64 new tokens); each with lm-evaluation-harness's loop at batch 16
# (the baseline) and 64, the tool's HF engine (--fp16, its default budget), CTranslate2's
# Generator in float16 (and int8_float16), and CTranslate2 alone. One round each. The figures
# and logs land in $OUT (results_*.json, causal_*.log). Set-up as gpu.sh (gpu_env.sh: wheels from
# $WHEELS for what the machine lacks; CTranslate2's cuBLAS).
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
work=${TMPDIR:-/tmp}/seq2seq_eval_causal  # models and outputs stay here: only the figures go to $OUT
for job in "base 500 32 190" "large 1000 64 260"; do
  set -- $job
  timeout "$4" "$PYTHON" benchmarks/causal.py --device cuda --dtype float16 --size "$1" --n "$2" \
    --max_new_tokens "$3" --threads 4 --more_loops 64 --out "$work/$1" 2>&1 \
    | grep -v -e "Writing model" -e "Loading weights" | tee "$OUT/causal_$1.log"
  cp "$work/$1/results.json" "$OUT/results_$1.json" 2>/dev/null || echo "causal.py --size $1: no results"
done
