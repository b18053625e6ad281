"""Run in the side environment that holds mbrs 0.1.8 (docs/selection.md), not in the project's:
mbrs' COMET-MBR (`DecoderMBR` with `MetricCOMET`, the hypotheses as the references) or CometKiwi
reranking (`DecoderRerank` with `MetricCOMETkiwi`) over candidates files, printed as JSON for
tests/test_selection_models.py to compare.

    python tests/mbrs_models_side.py comet|cometkiwi MODEL_FOLDER CANDIDATES.jsonl [...]

mbrs loads its COMET models through comet.download_model(name), which goes to the hub: it is
bypassed here so that the metric loads the local checkpoint in COMET's layout
(MODEL_FOLDER/checkpoints/model.ckpt; the encoder folder hparams.yaml names is read relative to
MODEL_FOLDER). Per example: `expected` (the float32 expected utilities DecoderMBR selects from,
or the reranker's scores) and `selected` (the index decode returns); for COMET also `pairs` (mbrs'
pairwise utility matrix, Metric.pairwise_scores, float32)."""

import json
import os
import sys

import torch

import mbrs.metrics.comet as mbrs_comet
import mbrs.metrics.cometkiwi as mbrs_kiwi
from mbrs.decoders import DecoderMBR, DecoderRerank
from mbrs.metrics import MetricCOMET, MetricCOMETkiwi

kind, folder, paths = sys.argv[1], os.path.abspath(sys.argv[2]), [os.path.abspath(p) for p in sys.argv[3:]]
checkpoint = os.path.join(folder, "checkpoints", "model.ckpt")
mbrs_comet.download_model = mbrs_kiwi.download_model = lambda name, *a, **k: checkpoint
os.chdir(folder)
torch.set_num_threads(1)
if kind == "comet":
    metric = MetricCOMET(MetricCOMET.Config(model=folder, cpu=True))
    decoder = DecoderMBR(DecoderMBR.Config(), metric)
else:
    metric = MetricCOMETkiwi(MetricCOMETkiwi.Config(model=folder, cpu=True))
    decoder = DecoderRerank(DecoderRerank.Config(), metric)
out = {}
for path in paths:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            hyps, source = record["candidates"], record["source"]
            entry = {"id": record["id"]}
            with torch.inference_mode():
                if kind == "comet":
                    pairs = metric.pairwise_scores(hyps, hyps, source)
                    entry["pairs"] = pairs.double().tolist()
                    expected = metric.expected_scores(hyps, hyps, source)
                    chosen = decoder.decode(hyps, hyps, source=source, nbest=1)
                else:
                    expected = metric.scores(hyps, [source] * len(hyps))
                    chosen = decoder.decode(hyps, source, nbest=1)
            entry["expected"] = [float(x) for x in expected.tolist()]
            entry["selected"] = int(chosen.idx[0])
            rows.append(entry)
    out[path] = rows
print(json.dumps(out))
