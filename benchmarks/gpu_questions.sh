#!/usr/bin/env bash
# The GPU questions docs/gpu.md left open, in one call on one single-GPU machine (about 9 minutes):
#   1. benchmarks/sdpa_probe.py: what beam search's attention calls cost per backend and dtype;
#   2. half precision on the opus-mt-sized Marian (gpu.py, fp16 and bf16, one round): the tutorial
#      loop with and without cuDNN's attention (a, ax), the legacy split (b), seq2seq_eval as it
#      is (d), with cuDNN's attention allowed as before (dk), and at --bs, the legacy split's
#      batches (db); the profile of the costliest batch with and without cuDNN's attention;
#   3. fp32 on the same model, two rounds of a, b, d, db: at equal batches, is the HF engine behind
#      the legacy split;
#   4. the whole suite on the GPU machine: `-m "not gpu"` on 10 workers beside `-m gpu` on 6.
# Results land in ${OUT:-bench_out} as at most 8 files (what the lent machine sends back): probe.txt,
# half.txt, half.json, fp32.txt, fp32.json, profiles.txt, suite.txt, suite_gpu.txt.
#   PYTHON, WHEELS as for gpu.sh; TOTAL: seconds for everything (default 540): the suite gets what
#   the earlier steps left.
set -uo pipefail
cd "$(dirname "$0")/.."
TOTAL=${TOTAL:-540}
. benchmarks/gpu_env.sh || exit 3
work=$(mktemp -d /tmp/gpu_questions.XXXXXX)

echo "== 1. attention probe, and the engine's own check"
timeout 60 "$PYTHON" benchmarks/sdpa_probe.py 2>&1 | tee "$OUT/probe.txt"
timeout 60 "$PYTHON" -m pytest -q -n0 -p no:cacheprovider tests/test_gpu.py -k cudnn 2>&1 | tail -3 | tee -a "$OUT/probe.txt"

echo "== 2. half precision"
timeout 210 "$PYTHON" benchmarks/gpu.py --out "$work/half" --budget 200 --skip_tests --rounds 1 --config_timeout 110 \
  --configs "marian-opus bf16,marian-opus fp16" --methods a,ax,b,d,dk,db 2>&1 | tee "$work/half.log"
cp "$work/half/table.txt" "$OUT/half.txt"; cp "$work/half/summary.json" "$OUT/half.json"
grep -h "samples/s" "$work"/half/configs/*/worker.log >> "$OUT/half.txt" 2>/dev/null
for f in "$work"/half/configs/*/profile_*.txt; do [ -f "$f" ] && { echo "== $f"; cat "$f"; }; done > "$OUT/profiles.txt"

echo "== 3. fp32, equal batches"
timeout 100 "$PYTHON" benchmarks/gpu.py --out "$work/fp32" --budget 90 --skip_tests --rounds 2 --config_timeout 85 \
  --configs "marian-opus fp32" --methods a,b,d,db --sweep "" --no_profile 2>&1 | tee "$work/fp32.log"
cp "$work/fp32/table.txt" "$OUT/fp32.txt"; cp "$work/fp32/summary.json" "$OUT/fp32.json"

left=$((TOTAL - SECONDS - 10))
echo "== 4. the suite (${left} s)"
run_suite "$left" 10 6
