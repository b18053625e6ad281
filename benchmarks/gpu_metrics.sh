#!/usr/bin/env bash
# On one GPU: the model metrics' speed. MetricX (a random checkpoint of mT5-small's size, float32
# and bfloat16) against the per-example loop in the same process (benchmarks/metricx.py), and
# COMET-22, CometKiwi and XCOMET (random XLM-R-base-size checkpoints) measured alone
# (benchmarks/comet.py: unbabel-comet does not install beside transformers 5). A few minutes.
# Results under $OUT/metricx_*/results.json and $OUT/comet/results.json. Set-up as gpu.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
work=${TMPDIR:-/tmp}/seq2seq_eval_metrics
mkdir -p "$work"
for dtype in float32 bfloat16; do
  echo "== MetricX, $dtype"
  timeout 150 "$PYTHON" benchmarks/metricx.py --device cuda --dtype "$dtype" --n "${N_METRICX:-512}" --rounds 2 \
    --threads 8 --out "$work/metricx" 2>&1 | grep -v "Loading weights\|tie" | tail -4
  cp "$work/metricx/results.json" "$OUT/metricx_$dtype.json" 2>/dev/null
done
echo "== COMET classes"
timeout 200 "$PYTHON" benchmarks/comet.py --device cuda --n "${N_COMET:-800}" --bs 64 --rounds 2 --threads 8 \
  --out "$work/comet" 2>&1 | tail -8
cp "$work/comet/results.json" "$OUT/comet.json" 2>/dev/null
true
