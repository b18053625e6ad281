"""Run in the side environment that holds mbrs 0.1.8 (docs/selection.md), not in the project's:
mbrs' MBR over a candidates file, printed as JSON for tests/test_selection.py to compare.

    python tests/mbrs_side.py CANDIDATES.jsonl [CANDIDATES.jsonl ...]

One process for every file and both utilities (mbrs' import costs seconds): printed as
{utility: {file: [one entry per example]}}, chrF and BLEU. Per example: `pairs` (mbrs' own utility, `Metric.score`, of every candidate against every
candidate, as the float64 sacrebleu returns it), `expected` (the expected utilities mbrs'
`DecoderMBR` selects from, float32) and `selected` (the index DecoderMBR.decode returns)."""

import json
import sys

from mbrs.decoders import DecoderMBR
from mbrs.metrics import MetricBLEU, MetricChrF



def run(metric, path: str) -> list[dict]:
    decoder = DecoderMBR(DecoderMBR.Config(), metric)
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            hyps = record["candidates"]
            expected = metric.expected_scores(hyps, hyps, record["source"])
            # DecoderMBR.decode's own two steps (decoders/mbr.py), the matrix computed once.
            chosen = decoder.select(hyps, expected, nbest=1, source=record["source"])
            out.append({"id": record["id"], "pairs": [[metric.score(h, r) for r in hyps] for h in hyps],
                        "expected": [float(x) for x in expected.tolist()], "selected": int(chosen.idx[0])})
    return out


# mbrs' defaults, but one worker: the pairwise scores do not depend on the pool's size.
METRICS = {"chrf": MetricChrF(MetricChrF.Config(num_workers=1)), "bleu": MetricBLEU(MetricBLEU.Config(num_workers=1))}
print(json.dumps({name: {path: run(metric, path) for path in sys.argv[1:]} for name, metric in METRICS.items()}))
