#!/usr/bin/env bash
# On one GPU: the same run as 1 process with 1 CPU thread, 1 process with 8 threads, and 2 and 3
# ranks sharing the GPU (gloo, 1 thread each), fp32, compared byte for byte: generations, the per-example
# file with BLEU, COMET and BERTScore, the same with XCOMET and MetricX (the test suite's tiny
# checkpoints), and pseudolabels with
# their sequence scores (2 beams, 2 candidates). One --max_tokens for every layout: without a budget
# flag a small set's default depends on the world size (docs/performance.md). About 3 minutes. Prints one line per file and
# layout; the run folders stay in $TMPDIR. Set-up as gpu.sh (gpu_env.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
work=${TMPDIR:-/tmp}/seq2seq_eval_invariance
rm -rf "$work"
mkdir -p "$work"
N=${N:-200}
scored=(--task translation --n_obs "$N" --max_tokens 2048 --metrics bleu,comet,bertscore
        --comet_model tests/data/comet_tiny/wmt22_like --bertscore_model tests/data/bertscore_tiny/bert
        --bertscore_num_layers 2)
# The WMT metrics: XCOMET (word tagger and spans) and MetricX-24, the suite's tiny checkpoints
# (MetricX's weights ship compressed).
mx="$work/metricx_tiny"
mkdir -p "$mx"
cp tests/data/metricx_tiny/float32/config.json "$mx/"
"$PYTHON" -c "import lzma, sys; open(sys.argv[2], 'wb').write(lzma.decompress(open(sys.argv[1], 'rb').read()))" \
  tests/data/metricx_tiny/float32/model.safetensors.xz "$mx/model.safetensors"
wmt=(--task translation --n_obs "$N" --max_tokens 2048 --metrics bleu,comet,metricx
     --comet_model tests/data/comet_tiny/xcomet_like --metricx_model "$mx"
     --metricx_tokenizer tests/data/metricx_tiny/tokenizer)
pseudo=(--task translation --n_obs "$N" --max_tokens 2048 --num_beams 2 --num_return_sequences 2)
KINDS=${KINDS:-scored wmt pseudo}
for kind in $KINDS; do
  declare -n args=$kind
  OMP_NUM_THREADS=1 timeout 120 "$PYTHON" -m seq2seq_eval "${args[@]}" --save_dir "$work/$kind/t1" >"$work.$kind.t1.log" 2>&1 || tail -3 "$work.$kind.t1.log"
  OMP_NUM_THREADS=8 timeout 120 "$PYTHON" -m seq2seq_eval "${args[@]}" --save_dir "$work/$kind/t8" >"$work.$kind.t8.log" 2>&1 || tail -3 "$work.$kind.t8.log"
  OMP_NUM_THREADS=1 timeout 150 "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 2 -m seq2seq_eval \
    "${args[@]}" --dist_backend gloo --save_dir "$work/$kind/r2" >"$work.$kind.r2.log" 2>&1 || tail -3 "$work.$kind.r2.log"
  OMP_NUM_THREADS=1 timeout 150 "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 3 -m seq2seq_eval \
    "${args[@]}" --dist_backend gloo --save_dir "$work/$kind/r3" >"$work.$kind.r3.log" 2>&1 || tail -3 "$work.$kind.r3.log"
done
"$PYTHON" - "$work" <<'PY' | tee "$OUT/invariance.txt"
import hashlib, sys
from pathlib import Path
work = Path(sys.argv[1])
files = {"scored": ["test_generations.txt", "test_examples.jsonl"], "wmt": ["test_examples.jsonl"],
         "pseudo": ["test_generations.txt", "test_pseudolabels.jsonl", "pseudolabel_results.json"]}
for kind, names in files.items():
    if not (work / kind).is_dir():
        continue
    for name in names:
        digests = {}
        for layout in ("t1", "t8", "r2", "r3"):
            f = work / kind / layout / name
            digests[layout] = hashlib.sha256(f.read_bytes()).hexdigest()[:12] if f.exists() else "missing"
        same = len(set(digests.values())) == 1 and "missing" not in digests.values()
        print(f"{kind:7} {name:26} {'identical' if same else 'DIFFER'}  " + "  ".join(f"{k} {v}" for k, v in digests.items()))
PY
