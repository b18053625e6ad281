# Sourced by every benchmarks/gpu*.sh, from the repository root: the settings they share (PYTHON,
# WHEELS and OUT from the environment or their defaults, OUT created and exported, unbuffered
# Python, no hub), then makes what the lent GPU machine lacks importable, lets CTranslate2 find a
# cuBLAS, puts the checkout on PYTHONPATH and checks that CUDA is there (exit 3 if not); defines
# run_suite.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
export OUT

# run_suite SECONDS CPU_WORKERS GPU_WORKERS: the whole suite, `-m "not gpu"` beside `-m gpu`, into
# $OUT/suite.txt and $OUT/suite_gpu.txt. -v: each result is printed when it comes, so a suite cut
# off at its timeout still says what ran.
run_suite() {
  timeout "$1" "$PYTHON" -m pytest tests -m gpu -v -rfE -p no:cacheprovider -n "$3" --dist load \
    --durations 10 > "$OUT/suite_gpu.txt" 2>&1 &
  local gpu_tests=$!
  timeout "$1" "$PYTHON" -m pytest tests -m "not gpu" -v -rfE -p no:cacheprovider -n "$2" \
    --durations 15 > "$OUT/suite.txt" 2>&1
  echo "not gpu: exit $?"; wait $gpu_tests; echo "gpu: exit $?"
  tail -n 5 "$OUT/suite.txt" "$OUT/suite_gpu.txt"
}

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

# `exit`, not a status: this file is sourced, and a script that goes on without a GPU would run
# its steps on the CPU and print CPU figures under a GPU's name.
timeout 120 "$PYTHON" - <<'EOF' || exit 3
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

